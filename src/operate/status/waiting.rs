//! What holds events back, as the database shows it: the topics whose rows wait (PENDING), the
//! keys that have waited longest, and the XA transactions left prepared.
//!
//! Read from the outbox table and the server, not from a relay's memory, so `status` names what
//! waits even when no relay runs. A topic (or one of its queues) the broker does not accept
//! shows as a topic whose oldest PENDING row keeps ageing while the others' do not: its rows are
//! held in a lane or parked (see the README, "A stuck topic"). A key held for order shows among
//! the oldest waiting keys. A prepared XA transaction holds the relay's checkpoint until it
//! is parked (`relay.park_prepared_after`) and its rows until XA COMMIT.

use crate::outbox::{Status, TableName};
use mysql_async::prelude::*;
use mysql_async::Conn;
use serde::Serialize;

/// Most topics listed per table.
const TOPICS_LISTED: usize = 10;
/// Most keys named per waiting topic.
const KEYS_NAMED: usize = 5;

/// One topic's PENDING rows in one table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WaitingTopic {
    pub topic: String,
    pub pending: u64,
    /// Seconds since the `created_at` of its oldest PENDING row.
    pub oldest_seconds: f64,
    /// The keys of its oldest PENDING rows, oldest first; named only for a topic waiting
    /// longer than the lag threshold.
    pub oldest_keys: Vec<String>,
}

/// The topics of `table` with PENDING rows, the longest waiting first (at most
/// [`TOPICS_LISTED`]); the oldest keys of those waiting longer than `lag_seconds`.
pub(super) async fn waiting_topics(
    conn: &mut Conn,
    table: &TableName,
    lag_seconds: f64,
) -> Result<Vec<WaitingTopic>, mysql_async::Error> {
    let sql = table.sql();
    let pending = Status::Pending.sql();
    let rows: Vec<(String, u64, i64)> = conn
        .exec(
            format!(
                "SELECT topic, COUNT(*), TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(3)) \
                 FROM {sql} WHERE {pending} GROUP BY topic \
                 ORDER BY MIN(created_at), topic LIMIT ?"
            ),
            (TOPICS_LISTED,),
        )
        .await?;
    let mut topics = Vec::with_capacity(rows.len());
    for (topic, count, micros) in rows {
        let oldest_seconds = micros.max(0) as f64 / 1e6;
        let oldest_keys = if oldest_seconds > lag_seconds {
            conn.exec(
                format!(
                    "SELECT biz_key FROM {sql} WHERE {pending} AND topic = ? \
                     GROUP BY biz_key ORDER BY MIN(created_at), biz_key LIMIT ?"
                ),
                (&topic, KEYS_NAMED),
            )
            .await?
        } else {
            Vec::new()
        };
        topics.push(WaitingTopic {
            topic,
            pending: count,
            oldest_seconds,
            oldest_keys,
        });
    }
    Ok(topics)
}

/// The XA transactions the server has prepared and not ended (`XA RECOVER`), as
/// `gtrid[,bqual]` text; `Err` with the server's words when the account may not list them
/// (MySQL 8+ needs `XA_RECOVER_ADMIN`).
pub(super) async fn prepared_xa(conn: &mut Conn) -> Result<Vec<String>, String> {
    let rows: Vec<(i64, i64, i64, Vec<u8>)> =
        conn.query("XA RECOVER").await.map_err(|e| e.to_string())?;
    Ok(rows
        .into_iter()
        .map(|(_, gtrid_length, _, data)| xid_text(gtrid_length, &data))
        .collect())
}

/// `gtrid` or `gtrid,bqual` of an `XA RECOVER` row, non-printable bytes as `\xNN`.
fn xid_text(gtrid_length: i64, data: &[u8]) -> String {
    let split = usize::try_from(gtrid_length).unwrap_or(0).min(data.len());
    let (gtrid, bqual) = data.split_at(split);
    let text = |bytes: &[u8]| -> String {
        bytes
            .iter()
            .map(|&b| match b {
                0x20..=0x7e => (b as char).to_string(),
                _ => format!("\\x{b:02x}"),
            })
            .collect()
    };
    match bqual.is_empty() {
        true => text(gtrid),
        false => format!("{},{}", text(gtrid), text(bqual)),
    }
}

/// The verdict's reason for a topic waiting longer than `lag_seconds`: where, how long, and
/// which keys.
pub(super) fn reason(table: &str, topic: &WaitingTopic, lag_seconds: f64) -> String {
    let keys = match topic.oldest_keys.is_empty() {
        true => String::new(),
        false => format!("; its oldest keys: {}", topic.oldest_keys.join(", ")),
    };
    format!(
        "{table}: topic {} has {} PENDING row(s), the oldest {:.1} s old (threshold {lag_seconds} s){keys}",
        topic.topic,
        crate::operate::thousands(topic.pending),
        topic.oldest_seconds,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xids_read_as_text() {
        assert_eq!(xid_text(3, b"abc"), "abc");
        assert_eq!(xid_text(3, b"abcde"), "abc,de");
        assert_eq!(xid_text(2, &[0x61, 0x01]), "a\\x01");
    }

    #[test]
    fn a_waiting_topic_is_named_with_its_oldest_keys() {
        let topic = WaitingTopic {
            topic: "orders".into(),
            pending: 1_307,
            oldest_seconds: 95.3,
            oldest_keys: vec!["order-1".into(), "order-7".into()],
        };
        assert_eq!(
            reason("outbox_event", &topic, 30.0),
            "outbox_event: topic orders has 1,307 PENDING row(s), the oldest 95.3 s old \
             (threshold 30 s); its oldest keys: order-1, order-7"
        );
    }
}
