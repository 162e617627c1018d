//! Streamed events the send stage leaves PENDING for the sweeper (*released*: a stalled topic's
//! lane lets go of what it holds, a shard lets go of an event bound for a queue that parks), and
//! what keeps the keys of those events in order.
//!
//! The key-order guard (`pipeline::key_order`) checks each streamed event before the dispatcher
//! hands it on: it waits while an older row of its key waits that the stream does not carry.
//! A release happens later, in a shard or a lane, while later events of the same key may have
//! been checked already (the released row was the stream's then) and be on their way to the
//! shard. Sending those would put them before the released one, which the sweeper sends later.
//!
//! Guarantee: after the send stage releases an event of a key, every later streamed event of
//! that key is either checked by the guard knowing of the release (then it waits for the
//! released row, [`ReleaseLog::take`]) or released as well when its shard takes it
//! ([`ReleasedKeys::follows_release`]), so the sweeper sends it after the released one. Every
//! event the dispatcher hands on carries the [`ReleaseLog`] generation its check knew of
//! (`ShardEvent::released_seen`); a shard releases an event whose key was released at a later
//! generation than that.

use crate::outbox::TableName;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A released event's row: PENDING, no longer carried by the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReleasedRow {
    pub table: Arc<TableName>,
    pub id: u64,
    pub topic: String,
}

/// Every release of the send stage, numbered, for the key-order guard (shared by the shards and
/// the dispatcher, in [`crate::send::Stalls`]).
#[derive(Debug, Default)]
pub(crate) struct ReleaseLog {
    inner: Mutex<LogInner>,
}

#[derive(Debug, Default)]
struct LogInner {
    /// How many releases there were.
    generation: u64,
    /// The rows released since the guard last took them.
    rows: Vec<ReleasedRow>,
}

impl ReleaseLog {
    /// Records one release; returns its generation.
    pub(crate) fn note(&self, row: ReleasedRow) -> u64 {
        let mut inner = self.inner.lock().expect("not poisoned");
        inner.generation += 1;
        inner.rows.push(row);
        inner.generation
    }

    /// The rows released since the last call, and the generation they bring the caller to: the
    /// events it checks from now on are checked knowing of every release up to it.
    pub(crate) fn take(&self) -> (u64, Vec<ReleasedRow>) {
        let mut inner = self.inner.lock().expect("not poisoned");
        (inner.generation, std::mem::take(&mut inner.rows))
    }
}

/// One shard's keys whose events it (or one of its lanes) released, each with the generation of
/// its latest release. Only streamed events checked before that generation are released after
/// it; an entry is forgotten once the shard has taken an event checked at or after it (the
/// dispatcher stamps its events in the order it hands them on, so none older can follow).
#[derive(Debug, Default)]
pub(crate) struct ReleasedKeys {
    keys: Mutex<Keys>,
    /// How many keys are remembered, read without the lock on every event.
    count: AtomicUsize,
}

#[derive(Debug, Default)]
struct Keys {
    /// Per topic, per `biz_key`, the generation of its latest release.
    of_topic: HashMap<String, HashMap<String, u64>>,
    /// Releases up to this generation are forgotten already.
    forgotten_up_to: u64,
}

impl Keys {
    fn len(&self) -> usize {
        self.of_topic.values().map(HashMap::len).sum()
    }
}

impl ReleasedKeys {
    /// Whether a streamed event of `topic` and `biz_key`, checked knowing of releases up to
    /// `seen`, follows a release of its key it was not checked against: it must be released
    /// too. Forgets the releases `seen` covers.
    pub(crate) fn follows_release(&self, topic: &str, biz_key: &str, seen: u64) -> bool {
        if self.count.load(Ordering::Acquire) == 0 {
            return false;
        }
        let mut keys = self.keys.lock().expect("not poisoned");
        if seen > keys.forgotten_up_to {
            keys.forgotten_up_to = seen;
            for of_key in keys.of_topic.values_mut() {
                of_key.retain(|_, generation| *generation > seen);
            }
            keys.of_topic.retain(|_, of_key| !of_key.is_empty());
            self.count.store(keys.len(), Ordering::Release);
        }
        (keys.of_topic.get(topic)).is_some_and(|of_key| of_key.contains_key(biz_key))
    }

    fn note(&self, topic: &str, biz_key: &str, generation: u64) {
        let mut keys = self.keys.lock().expect("not poisoned");
        let of_key = keys.of_topic.entry(topic.to_string()).or_default();
        of_key.insert(biz_key.to_string(), generation);
        self.count.store(keys.len(), Ordering::Release);
    }

    /// Whether no key is remembered now.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.count.load(Ordering::Acquire) == 0
    }
}

/// Releases `event`, a streamed event the send stage lets go of: its acknowledgement is given
/// back (the checkpoint may pass it), its row stays PENDING for the sweeper, and the release is
/// recorded for the key-order guard (`log`) and for the later events of its key (`keys`). Does
/// nothing (false) for an event without an acknowledgement to give back (claimed, or released
/// already).
pub(crate) fn release(event: &mut super::ShardEvent, log: &ReleaseLog, keys: &ReleasedKeys) -> bool {
    if !event.origin.release() {
        return false;
    }
    let message = &event.row.message;
    crate::send::stall::count_parked(&message.topic);
    let generation = log.note(ReleasedRow {
        table: Arc::clone(&event.row.table),
        id: event.row.id,
        topic: message.topic.clone(),
    });
    keys.note(&message.topic, &message.biz_key, generation);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_checked_before_a_release_of_its_key_follows_it() {
        let (log, keys) = (ReleaseLog::default(), ReleasedKeys::default());
        assert!(!keys.follows_release("t", "k", 0));
        let table = Arc::new(TableName::parse("outbox_event").unwrap());
        let row = |id| ReleasedRow {
            table: Arc::clone(&table),
            id,
            topic: "t".into(),
        };
        let generation = log.note(row(7));
        keys.note("t", "k", generation);
        // Checked before the release: released too. Another key, another topic: not.
        assert!(keys.follows_release("t", "k", generation - 1));
        assert!(!keys.follows_release("t", "other", generation - 1));
        assert!(!keys.follows_release("u", "k", generation - 1));
        // The guard takes the release; what it checks from then on waits for the row itself.
        assert_eq!(log.take(), (generation, vec![row(7)]));
        assert_eq!(log.take(), (generation, vec![]));
        assert!(!keys.follows_release("t", "k", generation));
        assert!(keys.is_empty(), "forgotten once an event checked after it came");
    }

    #[test]
    fn a_later_release_of_the_key_is_kept_when_an_earlier_one_is_covered() {
        let keys = ReleasedKeys::default();
        keys.note("t", "k", 3);
        keys.note("t", "k", 5);
        assert!(keys.follows_release("t", "k", 4));
        assert!(!keys.follows_release("t", "k", 5));
    }
}
