//! Helpers of tests/partitions.rs: commands with test settings, rows on chosen days (the
//! session's `SET TIMESTAMP` moves `CURRENT_TIMESTAMP(3)` and `NOW(3)` on both servers), and
//! what a partition or the audit holds.

use crate::common::relay::commit_events;
use crate::common::TestDb;
use mysql_async::prelude::*;
use mysql_async::Conn;
use rocketmq_outbox::operate::partitions::{Convert, Maintain, TableMaintain};
use rocketmq_outbox::outbox::TableName;
use rocketmq_outbox::producer::NewEvent;
use serde_json::json;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const DAY: i64 = 86_400;

pub fn outbox() -> Vec<TableName> {
    vec![TableName::parse("outbox_event").unwrap()]
}

pub fn convert(ahead: u32) -> Convert {
    Convert {
        ahead,
        operator: "tester".into(),
        reason: "partition the outbox".into(),
        dry_run: false,
        lock_wait: Duration::from_secs(5),
    }
}

pub fn maintain(ahead: u32, retention_days: u64) -> Maintain {
    Maintain {
        ahead,
        retention: Duration::from_secs(retention_days * DAY as u64),
        operator: "tester".into(),
        reason: "daily maintenance".into(),
        dry_run: false,
        lock_wait: Duration::from_secs(5),
    }
}

pub async fn maintain_once(db: &TestDb, m: &Maintain) -> TableMaintain {
    m.run(&db.pool, &outbox()).await.unwrap().remove(0)
}

/// The database's midnight of today, as a unix time.
pub async fn midnight(conn: &mut Conn) -> i64 {
    conn.query_first("SELECT UNIX_TIMESTAMP(CURDATE())")
        .await
        .unwrap()
        .unwrap()
}

/// Commits `events` with `CURRENT_TIMESTAMP(3)` moved to `unix` (seconds, fractions allowed).
pub async fn commit_at(conn: &mut Conn, unix: f64, events: Vec<NewEvent>) -> Vec<String> {
    conn.query_drop(format!("SET TIMESTAMP = {unix:.3}"))
        .await
        .unwrap();
    let ids = commit_events(conn, events).await;
    conn.query_drop("SET TIMESTAMP = DEFAULT").await.unwrap();
    ids
}

/// `count` SENT rows (with a msg_id) created on the day `days_ago` before today, at noon.
pub async fn sent_rows_on(
    conn: &mut Conn,
    topic: &str,
    days_ago: i64,
    count: usize,
) -> Vec<String> {
    let noon = midnight(conn).await - days_ago * DAY + DAY / 2;
    let events = (0..count)
        .map(|i| NewEvent::new(topic, format!("old-{i}"), json!({ "seed": days_ago })))
        .collect();
    let ids = commit_at(conn, noon as f64, events).await;
    set_status(conn, &ids, "2, msg_id = 'seeded', sent_at = created_at").await;
    ids
}

pub async fn set_status(conn: &mut Conn, event_ids: &[String], set: &str) {
    let list = event_ids
        .iter()
        .map(|e| format!("'{e}'"))
        .collect::<Vec<_>>()
        .join(",");
    conn.query_drop(format!(
        "UPDATE outbox_event SET status = {set} WHERE event_id IN ({list})"
    ))
    .await
    .unwrap();
}

/// Rows in `partition`.
pub async fn rows_in(conn: &mut Conn, partition: &str) -> u64 {
    conn.query_first(format!(
        "SELECT COUNT(*) FROM outbox_event PARTITION ({partition})"
    ))
    .await
    .unwrap()
    .unwrap()
}

pub async fn day_name(conn: &mut Conn, days_from_today: i64) -> String {
    let day: String = conn
        .query_first(format!(
            "SELECT DATE_FORMAT(CURDATE() + INTERVAL {days_from_today} DAY, 'p%Y%m%d')"
        ))
        .await
        .unwrap()
        .unwrap();
    day
}

/// The `partition-drop` audit rows: (partition, operator).
pub async fn drop_audits(conn: &mut Conn) -> Vec<(String, String)> {
    conn.query(
        "SELECT JSON_UNQUOTE(JSON_EXTRACT(before_state, '$.partition')), operator \
         FROM outbox_audit WHERE action = 'partition-drop' ORDER BY id",
    )
    .await
    .unwrap()
}

pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

pub fn names(done: &TableMaintain) -> Vec<String> {
    done.dropped.iter().map(|d| d.partition.clone()).collect()
}

pub fn outbox_relay(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(outbox_devenv::workspace_binary("outbox-relay"))
        .args(args)
        .env_remove("OUTBOX_RELAY_CONFIG")
        .output()
        .expect("run outbox-relay");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}
