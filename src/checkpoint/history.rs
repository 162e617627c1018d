//! A history of checkpoints with the time each was saved, so `outbox-relay replay` can turn a
//! wall-clock time into a binlog position (`--from-time`) or start from an older checkpoint
//! (`--from-checkpoint N`).
//!
//! Kept in its own sled tree beside the checkpoint (same directory, same lock). Each entry is
//! `(number, unix_millis, position)`; numbers only grow, so the number an operator reads in
//! `replay --list-checkpoints` still names the same entry later. An entry is appended at most
//! once per [`CheckpointHistory::interval`] (default 60 s) and only when the position moved; the
//! oldest entries beyond [`CheckpointHistory::capacity`] (default 10,000, about a week at one a
//! minute) are dropped.
//!
//! Guarantee for replay: the entry saved at time `t` is a checkpoint, so every transaction
//! committed at or after `t` comes after its position. Starting from the newest entry at or
//! before a time therefore replays everything committed since that time (and possibly up to one
//! interval of earlier events: consumers de-duplicate by `event_id`).
//!
//! The history is best effort: it is not fsync'd on its own (it rides on the checkpoint's
//! flushes), and a failure to record is logged, never a reason to stop the relay.

use crate::binlog::BinlogPosition;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The sled tree name.
pub const TREE: &str = "checkpoint_history";

/// One saved checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// Stable entry number (1, 2, …; the oldest entries are dropped, numbers are never reused).
    pub number: u64,
    /// When it was saved, milliseconds since the Unix epoch (the relay machine's clock).
    pub at_millis: u64,
    pub position: BinlogPosition,
}

/// The stored value (the key is the big-endian entry number).
#[derive(Serialize, Deserialize)]
struct Stored {
    at_millis: u64,
    position: BinlogPosition,
}

/// Why the history could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("checkpoint history: {0}")]
    Sled(#[from] sled::Error),
    #[error("checkpoint history entry {0} is unreadable: {1}")]
    Corrupt(u64, String),
}

/// The checkpoint history in a sled tree.
pub struct CheckpointHistory {
    tree: sled::Tree,
    interval: Duration,
    capacity: u64,
    /// Time of the last entry (`None` until read from the tree).
    last_at: Mutex<Option<u64>>,
}

impl CheckpointHistory {
    /// The history in `tree`, one entry per minute at most, the last 10,000 kept.
    pub fn new(tree: sled::Tree) -> Self {
        Self::with_limits(tree, Duration::from_secs(60), 10_000)
    }

    /// With an explicit minimum `interval` between entries and `capacity` (at least 1).
    pub fn with_limits(tree: sled::Tree, interval: Duration, capacity: u64) -> Self {
        CheckpointHistory {
            tree,
            interval,
            capacity: capacity.max(1),
            last_at: Mutex::new(None),
        }
    }

    /// The minimum time between two entries.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Most entries kept.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Appends `position` now, unless the last entry is younger than the interval or holds the
    /// same position. Returns whether an entry was appended.
    pub fn record(&self, position: &BinlogPosition) -> Result<bool, HistoryError> {
        self.record_at(now_millis(), position)
    }

    /// [`CheckpointHistory::record`] at a given time (tests, replays of a log).
    pub fn record_at(
        &self,
        at_millis: u64,
        position: &BinlogPosition,
    ) -> Result<bool, HistoryError> {
        if position.is_unknown() {
            return Ok(false);
        }
        let interval = u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX);
        let too_soon = |last: u64| at_millis < last.saturating_add(interval);
        // Serialises recorders; the cached time spares a tree read on most calls.
        let mut last_at = self.last_at.lock().expect("not poisoned");
        if last_at.is_some_and(too_soon) {
            return Ok(false);
        }
        let last = self.last()?;
        if let Some(last) = &last {
            *last_at = Some(last.at_millis);
            if too_soon(last.at_millis) || last.position == *position {
                return Ok(false);
            }
        }
        let number = last.map_or(1, |e| e.number + 1);
        let value = serde_json::to_vec(&Stored {
            at_millis,
            position: position.clone(),
        })
        .expect("entry serialises");
        self.tree.insert(number.to_be_bytes(), value)?;
        *last_at = Some(at_millis);
        // Numbers are contiguous from the oldest kept one: drop from the front.
        while let Some(first) = self.first_number()? {
            if number - first < self.capacity {
                break;
            }
            self.tree.remove(first.to_be_bytes())?;
        }
        Ok(true)
    }

    /// Every entry, oldest first.
    pub fn list(&self) -> Result<Vec<HistoryEntry>, HistoryError> {
        self.tree
            .iter()
            .map(|kv| decode(kv?))
            .collect::<Result<Vec<_>, _>>()
    }

    /// The entry numbered `number`.
    pub fn get(&self, number: u64) -> Result<Option<HistoryEntry>, HistoryError> {
        match self.tree.get(number.to_be_bytes())? {
            Some(value) => decode((number.to_be_bytes().as_slice().into(), value)).map(Some),
            None => Ok(None),
        }
    }

    /// The newest entry saved at or before `at_millis`.
    pub fn at_or_before(&self, at_millis: u64) -> Result<Option<HistoryEntry>, HistoryError> {
        for kv in self.tree.iter().rev() {
            let entry = decode(kv?)?;
            if entry.at_millis <= at_millis {
                return Ok(Some(entry));
            }
        }
        Ok(None)
    }

    /// The newest entry.
    pub fn last(&self) -> Result<Option<HistoryEntry>, HistoryError> {
        self.tree.last()?.map(decode).transpose()
    }

    fn first_number(&self) -> Result<Option<u64>, HistoryError> {
        Ok(self.tree.first()?.map(|(key, _)| key_number(&key)))
    }
}

fn key_number(key: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    let n = key.len().min(8);
    bytes[8 - n..].copy_from_slice(&key[key.len() - n..]);
    u64::from_be_bytes(bytes)
}

fn decode((key, value): (sled::IVec, sled::IVec)) -> Result<HistoryEntry, HistoryError> {
    let number = key_number(&key);
    let stored: Stored =
        serde_json::from_slice(&value).map_err(|e| HistoryError::Corrupt(number, e.to_string()))?;
    Ok(HistoryEntry {
        number,
        at_millis: stored.at_millis,
        position: stored.position,
    })
}

/// Milliseconds since the Unix epoch, now.
pub fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::store::open_sled;

    fn tree() -> sled::Tree {
        let db = sled::Config::new().temporary(true).open().unwrap();
        db.open_tree(TREE).unwrap()
    }

    fn gtid(seq: u64) -> BinlogPosition {
        BinlogPosition {
            mariadb_gtid: Some(format!("0-1-{seq}").parse().unwrap()),
            ..BinlogPosition::default()
        }
    }

    #[test]
    fn records_at_most_once_per_interval_and_only_when_moved() {
        let h = CheckpointHistory::with_limits(tree(), Duration::from_secs(60), 100);
        assert!(h.record_at(1_000, &gtid(1)).unwrap());
        assert!(!h.record_at(30_000, &gtid(2)).unwrap(), "within a minute");
        assert!(!h.record_at(61_000, &gtid(1)).unwrap(), "same position");
        assert!(h.record_at(61_000, &gtid(3)).unwrap());
        assert!(!h.record_at(200_000, &BinlogPosition::default()).unwrap());
        let list = h.list().unwrap();
        let got: Vec<(u64, u64, String)> = list
            .iter()
            .map(|e| (e.number, e.at_millis, e.position.to_string()))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, 1_000, "gtid 0-1-1".into()),
                (2, 61_000, "gtid 0-1-3".into())
            ]
        );
    }

    #[test]
    fn keeps_the_last_entries_with_stable_numbers() {
        let h = CheckpointHistory::with_limits(tree(), Duration::ZERO, 3);
        for i in 1..=5 {
            assert!(h.record_at(i * 1000, &gtid(i)).unwrap());
        }
        let numbers: Vec<u64> = h.list().unwrap().iter().map(|e| e.number).collect();
        assert_eq!(numbers, vec![3, 4, 5]);
        assert_eq!(h.get(4).unwrap().unwrap().position, gtid(4));
        assert_eq!(h.get(1).unwrap(), None, "dropped");
        assert_eq!(h.last().unwrap().unwrap().number, 5);
    }

    #[test]
    fn maps_a_time_to_the_newest_entry_at_or_before_it() {
        let h = CheckpointHistory::with_limits(tree(), Duration::from_secs(60), 100);
        for (at, seq) in [(60_000, 10), (120_000, 20), (180_000, 30)] {
            h.record_at(at, &gtid(seq)).unwrap();
        }
        let at = |t| h.at_or_before(t).unwrap().map(|e| e.position);
        assert_eq!(at(59_999), None, "nothing that old");
        assert_eq!(at(60_000), Some(gtid(10)));
        assert_eq!(at(179_999), Some(gtid(20)));
        assert_eq!(at(u64::MAX), Some(gtid(30)));
    }

    #[test]
    fn survives_reopening_the_database() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = open_sled(dir.path()).unwrap();
            let h = CheckpointHistory::new(db.open_tree(TREE).unwrap());
            h.record_at(1_000, &gtid(7)).unwrap();
            db.flush().unwrap();
        }
        // Reopened at once: waits while the first handle's flusher still holds the lock.
        let db = open_sled(dir.path()).unwrap();
        let h = CheckpointHistory::new(db.open_tree(TREE).unwrap());
        assert!(
            !h.record_at(2_000, &gtid(8)).unwrap(),
            "the interval counts from the stored entry"
        );
        assert!(h.record_at(61_000, &gtid(8)).unwrap());
        assert_eq!(h.list().unwrap().len(), 2);
    }
}
