//! Where a claim starts reading each topic's PENDING rows.
//!
//! A drain claims the lowest PENDING ids of a topic, batch after batch (claims read
//! `idx_pending (status, topic)`, one range per topic: see `sweep::claim`). A claim that starts
//! from a topic's first PENDING id first walks, in the index, the entries of the rows claimed just
//! before, which InnoDB has marked deleted but not yet purged: with 100-row batches that walk cost
//! about a third of the database's CPU per event (86 → 55 µs per claimed and marked row on a
//! scratch MariaDB, 100k rows of 1 KiB). So while a topic's batches come back full, its next claim
//! starts past the highest id the previous one read; a batch that is not full, or
//! [`RESCAN_AFTER`] since the topic's last claim from the start, sends its next claim back to the
//! start.
//!
//! Guarantee: no PENDING row waits for long behind a cursor. Rows below it (returned by lease
//! recovery, due for a retry, passed over by SKIP LOCKED, held back for key order) are read by
//! the next claim of their topic from the start, at most [`RESCAN_AFTER`] later; meanwhile the
//! claim's key-order check still sees them waiting, so their keys' later rows are not claimed
//! before them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Longest a claimer reads past a topic's cursor before starting from its first PENDING row
/// again.
pub const RESCAN_AFTER: Duration = Duration::from_secs(1);

/// One claimer's position among each topic's PENDING rows (shared by its clones).
#[derive(Debug)]
pub struct ClaimCursor {
    rescan_after: Duration,
    topics: Mutex<HashMap<String, Position>>,
}

impl Default for ClaimCursor {
    fn default() -> Self {
        Self::with_rescan(RESCAN_AFTER)
    }
}

/// Where the claims of one topic stand.
#[derive(Debug, Default, Clone, Copy)]
struct Position {
    /// The highest id the last full batch read (0: start from the first row).
    after: u64,
    /// When a claim last started from the first row.
    last_from_start: Option<Instant>,
}

impl ClaimCursor {
    /// A cursor that starts each topic from its first row again at least every `rescan_after`.
    pub fn with_rescan(rescan_after: Duration) -> Self {
        ClaimCursor {
            rescan_after,
            topics: Mutex::default(),
        }
    }

    /// The id the next claim of `topic` reads past (0: from its first PENDING row).
    pub fn start(&self, topic: &str) -> u64 {
        self.start_at(topic, Instant::now())
    }

    /// Records a claim of `topic` that read past `from` and found `read` rows, the highest id
    /// `highest`, when it asked for `batch`.
    pub fn record(&self, topic: &str, from: u64, read: usize, highest: u64, batch: usize) {
        self.record_at(topic, Instant::now(), from, read, highest, batch);
    }

    /// Forgets the topics not in `pending` (they have no PENDING row left): the cursor holds
    /// only topics with rows to claim.
    pub(crate) fn keep_only(&self, pending: &[String]) {
        let mut topics = self.topics.lock().expect("not poisoned");
        if topics.len() > pending.len() || topics.keys().any(|t| !pending.contains(t)) {
            topics.retain(|topic, _| pending.contains(topic));
        }
    }

    fn start_at(&self, topic: &str, now: Instant) -> u64 {
        let topics = self.topics.lock().expect("not poisoned");
        match topics.get(topic) {
            Some(Position {
                after,
                last_from_start: Some(at),
            }) if now.saturating_duration_since(*at) < self.rescan_after => *after,
            _ => 0,
        }
    }

    fn record_at(&self, topic: &str, now: Instant, from: u64, read: usize, highest: u64, batch: usize) {
        let mut topics = self.topics.lock().expect("not poisoned");
        let position = topics.entry(topic.to_string()).or_default();
        if from == 0 {
            position.last_from_start = Some(now);
        }
        position.after = if read >= batch.max(1) { highest } else { 0 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_batches_move_the_cursor_and_anything_else_returns_it_to_the_start() {
        let cursor = ClaimCursor::default();
        let t0 = Instant::now();
        assert_eq!(
            cursor.start_at("t", t0),
            0,
            "the first claim starts at the start"
        );
        cursor.record_at("t", t0, 0, 100, 250, 100);
        assert_eq!(
            cursor.start_at("t", t0),
            250,
            "a full batch: past its highest id"
        );
        assert_eq!(cursor.start_at("u", t0), 0, "each topic has its own");
        cursor.record_at("t", t0, 250, 100, 400, 100);
        assert_eq!(cursor.start_at("t", t0), 400);
        cursor.record_at("t", t0, 400, 40, 460, 100);
        assert_eq!(
            cursor.start_at("t", t0),
            0,
            "a batch that was not full: from the start"
        );
    }

    #[test]
    fn the_start_is_read_again_at_least_every_rescan_period() {
        let cursor = ClaimCursor::default();
        let t0 = Instant::now();
        cursor.record_at("t", t0, 0, 100, 250, 100);
        let later = t0 + RESCAN_AFTER / 2;
        cursor.record_at("t", later, 250, 100, 400, 100);
        assert_eq!(cursor.start_at("t", later), 400);
        let due = t0 + RESCAN_AFTER;
        assert_eq!(
            cursor.start_at("t", due),
            0,
            "a second after the last claim from the start"
        );
        cursor.record_at("t", due, 0, 100, 150, 100);
        assert_eq!(cursor.start_at("t", due), 150, "the period starts again");
    }

    #[test]
    fn topics_without_pending_rows_are_forgotten() {
        let cursor = ClaimCursor::default();
        let t0 = Instant::now();
        cursor.record_at("t", t0, 0, 100, 250, 100);
        cursor.record_at("u", t0, 0, 100, 260, 100);
        cursor.keep_only(&["u".to_string()]);
        assert_eq!(cursor.start_at("t", t0), 0);
        assert_eq!(cursor.start_at("u", t0), 260);
        assert_eq!(cursor.topics.lock().unwrap().len(), 1);
    }
}
