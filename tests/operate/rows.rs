//! Outbox rows for the operations tests (tests/operate.rs).
#![allow(dead_code)]

use crate::common::TestDb;
use mysql_async::prelude::*;
use rocketmq_outbox::outbox::{Status, TableName};

pub use rocketmq_outbox::outbox::status::codes::{FAILED, PENDING, SENDING, SENT};

/// Inserts `n` rows `{prefix}-{i}` on `topic` with `status` (SENT rows get a msg_id and
/// sent_at, FAILED rows a last_error), in multi-row INSERTs.
pub async fn insert_rows(db: &TestDb, prefix: &str, n: usize, status: i8, topic: &str) {
    let mut conn = db.conn().await;
    for chunk_start in (0..n).step_by(500) {
        let end = (chunk_start + 500).min(n);
        let values: Vec<String> = (chunk_start..end)
            .map(|i| {
                let (msg_id, sent_at, error) = match status {
                    SENT => (format!("'msg-{prefix}-{i}'"), "NOW(3)", "NULL"),
                    FAILED => ("DEFAULT".to_string(), "DEFAULT", "'no route for topic'"),
                    _ => ("DEFAULT".to_string(), "DEFAULT", "NULL"),
                };
                format!(
                    "('{prefix}-{i}', 'key-{i}', '{topic}', '{{\"n\": {i}}}', {status}, \
                     {msg_id}, {sent_at}, {error}, 2)"
                )
            })
            .collect();
        conn.query_drop(format!(
            "INSERT INTO outbox_event (event_id, biz_key, topic, payload, status, msg_id, \
             sent_at, last_error, retry_count) VALUES {}",
            values.join(", ")
        ))
        .await
        .unwrap();
    }
}

/// Moves `created_at` (and `sent_at` of SENT rows) of the rows `{prefix}-%` into the past.
pub async fn age_rows(db: &TestDb, prefix: &str, interval: &str) {
    db.conn()
        .await
        .query_drop(format!(
            "UPDATE outbox_event SET created_at = NOW(3) - INTERVAL {interval}, \
             sent_at = IF(status = {}, NOW(3) - INTERVAL {interval}, sent_at) \
             WHERE event_id LIKE '{prefix}-%'",
            Status::Sent.code()
        ))
        .await
        .unwrap();
}

pub use crate::common::relay::count_where;

pub async fn id_of(db: &TestDb, event_id: &str) -> i64 {
    db.conn()
        .await
        .exec_first(
            "SELECT id FROM outbox_event WHERE event_id = ?",
            (event_id,),
        )
        .await
        .unwrap()
        .expect("row exists")
}

pub fn outbox_tables() -> Vec<TableName> {
    vec![TableName::parse("outbox_event").unwrap()]
}
