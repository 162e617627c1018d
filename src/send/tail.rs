//! What a topic's queues already hold of the relay's recent messages, read when a relay starts
//! streaming (a restart or a takeover), so it does not send again what the previous run stored
//! but had not recorded SENT.
//!
//! Guarantee: an event is taken for stored only when a message of the same topic carries both its
//! event id and its key (the relay's messages carry both, `rocketmq::message`); the message id
//! kept for it is the one the broker stored, as a send would have returned it. A read that fails
//! or is cut short by its bound finds less, never more: the events it misses are sent again (at
//! least once).

use std::collections::HashMap;
use std::time::SystemTime;

/// The relay's messages found in one topic's tail, by event id and key.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StoredTail {
    found: HashMap<(String, String), String>,
    /// Queues read.
    pub queues: usize,
    /// Messages read, the relay's and any others'.
    pub messages: u64,
    /// Queues whose tail since the bound's time held more than the bound allows: only their
    /// newest messages were read.
    pub capped: usize,
}

impl StoredTail {
    /// Records one stored message: its event id, key and message id (other messages are only
    /// counted: `event_id` or `biz_key` `None`).
    pub fn record(&mut self, event_id: Option<String>, biz_key: Option<String>, msg_id: String) {
        self.messages += 1;
        if let (Some(event_id), Some(biz_key)) = (event_id, biz_key) {
            if !msg_id.is_empty() {
                self.found.insert((event_id, biz_key), msg_id);
            }
        }
    }

    /// Adds what `other` (another queue's read) found and read.
    pub(crate) fn merge(&mut self, other: StoredTail) {
        self.messages += other.messages;
        self.found.extend(other.found);
    }

    /// The stored message id of event `event_id` of key `biz_key`, if the tail holds it.
    pub fn msg_id(&self, event_id: &str, biz_key: &str) -> Option<&str> {
        // One allocation per look-up only while catching up, for the events not yet recorded.
        let key = (event_id.to_string(), biz_key.to_string());
        self.found.get(&key).map(String::as_str)
    }

    /// How many of the relay's messages the tail holds.
    pub fn len(&self) -> usize {
        self.found.len()
    }

    /// Whether it holds none of the relay's messages.
    pub fn is_empty(&self) -> bool {
        self.found.is_empty()
    }
}

/// How far back a tail is read: from the first message stored at or after `since`, but at most the
/// newest `per_queue` messages of each queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailBound {
    pub since: SystemTime,
    pub per_queue: u64,
}

/// Where one queue's read starts: at `since`'s offset, unless more than `per_queue` messages
/// follow it, then `per_queue` before the end; and whether the bound cut it.
pub(crate) fn tail_start(since_offset: i64, max_offset: i64, per_queue: u64) -> (i64, bool) {
    let floor = max_offset.saturating_sub(i64::try_from(per_queue).unwrap_or(i64::MAX));
    if since_offset < floor {
        (floor.max(0), true)
    } else {
        (since_offset.clamp(0, max_offset.max(0)), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_starts_at_its_time_unless_more_than_the_bound_follows() {
        assert_eq!(tail_start(90, 100, 50), (90, false));
        assert_eq!(tail_start(10, 100, 50), (50, true));
        assert_eq!(tail_start(0, 30, 50), (0, false));
        assert_eq!(tail_start(-1, 30, 50), (0, false), "no message at or after the time");
        assert_eq!(tail_start(100, 100, 50), (100, false), "nothing newer");
    }

    #[test]
    fn only_a_message_with_the_events_id_and_key_counts_as_stored() {
        let mut tail = StoredTail::default();
        tail.record(Some("e1".into()), Some("k".into()), "m1".into());
        tail.record(Some("e2".into()), None, "m2".into());
        tail.record(None, None, "m3".into());
        assert_eq!(tail.msg_id("e1", "k"), Some("m1"));
        assert_eq!(tail.msg_id("e1", "other"), None, "same id, another key");
        assert_eq!(tail.msg_id("e2", "k"), None);
        assert_eq!((tail.len(), tail.messages), (1, 3));
    }
}
