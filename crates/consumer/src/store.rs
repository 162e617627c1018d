//! The SQL of the consumer side: the dedup mark (`event_dedup`, migration 0002) and the
//! quarantine (`consumer_quarantine`, migration 0005). Every function runs on the caller's
//! connection or transaction; none commits.

use super::event::ConsumedEvent;
use mysql_async::prelude::*;
use std::fmt;

/// MySQL/MariaDB `ER_DUP_ENTRY`.
const ER_DUP_ENTRY: u16 = 1062;
/// Longest reason stored (the column is TEXT; keep rows readable).
const MAX_REASON_CHARS: usize = 4000;

/// `event_dedup.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupStatus {
    /// Handled: the business change committed with the mark.
    Processed,
    /// Never processable: quarantined with a reason.
    Rejected,
}

impl DedupStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DedupStatus::Processed => "PROCESSED",
            DedupStatus::Rejected => "REJECTED",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "PROCESSED" => Some(DedupStatus::Processed),
            "REJECTED" => Some(DedupStatus::Rejected),
            _ => None,
        }
    }
}

impl fmt::Display for DedupStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Result of trying to write the dedup mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// The mark is ours (uncommitted): nobody handled this event before.
    New,
    /// Someone committed a mark first; its status (`None`: a value this build does not know).
    Exists(Option<DedupStatus>),
}

/// Inserts the dedup row with status PROCESSED. If another transaction holds an uncommitted
/// row with the same key, InnoDB makes this wait until that one commits (→ [`Mark::Exists`]) or
/// rolls back (→ [`Mark::New`]): two consumers can never both get `New`.
pub(crate) async fn insert_mark(
    tx: &mut impl Queryable,
    group: &str,
    key: &str,
    event: &ConsumedEvent,
) -> Result<Mark, mysql_async::Error> {
    let inserted = tx
        .exec_drop(
            "INSERT INTO event_dedup (consumer_group, event_id, status, topic, msg_id) \
             VALUES (?, ?, 'PROCESSED', ?, ?)",
            (group, key, &event.topic, non_empty(&event.msg_id)),
        )
        .await;
    match inserted {
        Ok(()) => Ok(Mark::New),
        Err(mysql_async::Error::Server(e)) if e.code == ER_DUP_ENTRY => {
            let status: Option<String> = tx
                .exec_first(
                    "SELECT status FROM event_dedup WHERE consumer_group = ? AND event_id = ?",
                    (group, key),
                )
                .await?;
            Ok(Mark::Exists(status.as_deref().and_then(DedupStatus::parse)))
        }
        Err(e) => Err(e),
    }
}

/// Turns our (uncommitted) PROCESSED mark into REJECTED.
pub(crate) async fn mark_rejected(
    tx: &mut impl Queryable,
    group: &str,
    key: &str,
) -> Result<(), mysql_async::Error> {
    tx.exec_drop(
        "UPDATE event_dedup SET status = 'REJECTED' WHERE consumer_group = ? AND event_id = ?",
        (group, key),
    )
    .await
}

/// Writes the whole message and the reason into `consumer_quarantine`.
pub(crate) async fn quarantine(
    conn: &mut impl Queryable,
    group: &str,
    key: Option<&str>,
    event: &ConsumedEvent,
    reason: &str,
) -> Result<(), mysql_async::Error> {
    let (payload, reason) = match event.payload_str() {
        Some(text) => (text.to_string(), reason.to_string()),
        None => (
            String::from_utf8_lossy(&event.payload).into_owned(),
            format!("{reason} (payload is not UTF-8; stored with replacement characters)"),
        ),
    };
    let properties =
        serde_json::to_string(&event.properties).expect("a string map always serialises");
    let keys = event.keys.join(" ");
    conn.exec_drop(
        "INSERT INTO consumer_quarantine (consumer_group, event_id, topic, msg_id, message_keys, \
         tags, properties, payload, reason, reconsume_times) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            group,
            key,
            &event.topic,
            non_empty(&event.msg_id),
            non_empty(&keys),
            event.tags.as_deref(),
            properties,
            payload,
            truncate(&reason, MAX_REASON_CHARS),
            event.reconsume_times,
        ),
    )
    .await
}

fn non_empty(text: &str) -> Option<&str> {
    (!text.is_empty()).then_some(text)
}

fn truncate(text: &str, max_chars: usize) -> &str {
    match text.char_indices().nth(max_chars) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_on_character_boundaries() {
        assert_eq!(truncate("héllo", 2), "hé");
        assert_eq!(truncate("abc", 10), "abc");
    }

    #[test]
    fn statuses_round_trip() {
        for status in [DedupStatus::Processed, DedupStatus::Rejected] {
            assert_eq!(DedupStatus::parse(status.as_str()), Some(status));
        }
        assert_eq!(DedupStatus::parse("PENDING"), None);
    }
}
