//! An optional in-memory set of recently handled dedup keys: a fast path, never the truth.
//!
//! Guarantee: a key is added only after the transaction that wrote its dedup row committed, so
//! a hit always means "handled and committed" and the delivery can be ACKed without a database
//! round trip. A miss proves nothing: the database's primary key on `event_dedup` still decides.
//! The set is bounded; the oldest keys are forgotten first.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

/// The most recently committed dedup keys of one consumer, up to a fixed capacity.
#[derive(Debug)]
pub struct RecentKeys {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    keys: HashSet<String>,
    order: VecDeque<String>,
}

impl RecentKeys {
    /// Remembers at most `capacity` keys (`0` remembers nothing).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// True if `key` was recorded and not yet forgotten.
    pub fn contains(&self, key: &str) -> bool {
        self.lock().keys.contains(key)
    }

    /// Records `key`; call only after its dedup row committed.
    pub fn insert(&self, key: &str) {
        if self.capacity == 0 {
            return;
        }
        let mut inner = self.lock();
        if !inner.keys.insert(key.to_string()) {
            return;
        }
        inner.order.push_back(key.to_string());
        while inner.order.len() > self.capacity {
            if let Some(oldest) = inner.order.pop_front() {
                inner.keys.remove(&oldest);
            }
        }
    }

    /// How many keys are remembered.
    pub fn len(&self) -> usize {
        self.lock().order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave the set inconsistent in a harmful way
        // (worst case a key is missing: a database check instead of a fast hit).
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgets_the_oldest_keys_beyond_capacity() {
        let recent = RecentKeys::new(2);
        recent.insert("a");
        recent.insert("b");
        recent.insert("a"); // already there: no reordering, no growth
        assert_eq!(recent.len(), 2);
        recent.insert("c");
        assert!(!recent.contains("a"));
        assert!(recent.contains("b") && recent.contains("c"));
        assert_eq!(recent.len(), 2);
    }

    #[test]
    fn zero_capacity_remembers_nothing() {
        let recent = RecentKeys::new(0);
        recent.insert("a");
        assert!(!recent.contains("a"));
        assert!(recent.is_empty());
    }
}
