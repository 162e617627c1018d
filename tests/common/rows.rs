//! Rows as the table holds them, for the bad-input campaign, the marker and row-image tests: raw
//! inserts that bypass the producer API, a row's state by primary key, waiting for rows to
//! settle, and what reached a topic.

use crate::common::relay::{current_position, seed_checkpoint};
use crate::common::rocketmq::rocketmq;
use crate::common::TestDb;
use mysql_async::prelude::*;
use mysql_async::{TxOpts, Value};
use outbox_devenv::{ReceivedMessage, TopicReader};
use rocketmq_outbox::config::Config;
use rocketmq_outbox::outbox::TableName;
use rocketmq_outbox::pipeline::{RunOptions, RunSummary};
use rocketmq_outbox::producer::{NewEvent, Outbox};
use rocketmq_outbox::relay::RelayHandle;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[allow(unused_imports)] // the soak binary includes tests/common too, and uses none of them
pub use rocketmq_outbox::outbox::status::codes::{FAILED, PENDING, SENT};

/// One outbox row as the relay left it.
#[derive(Debug, Clone, PartialEq)]
pub struct RowState {
    /// NULL only in a test table that allows it.
    pub status: Option<i8>,
    pub event_id: Option<String>,
    pub last_error: Option<String>,
    pub retry_count: u32,
    /// None until SENT (the column holds `''` until then).
    pub msg_id: Option<String>,
}

/// Runs one INSERT (raw SQL: no producer rule is applied) and returns the new row's id.
pub async fn insert_raw(db: &TestDb, sql: &str, params: Vec<Value>) -> u64 {
    let mut conn = db.conn().await;
    conn.exec_drop(sql, params)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    conn.last_insert_id().expect("an AUTO_INCREMENT id")
}

/// Inserts an outbox row into `table` with the given columns, bypassing the producer API.
pub async fn insert_row(db: &TestDb, table: &str, columns: &[(&str, Value)]) -> u64 {
    let names: Vec<&str> = columns.iter().map(|c| c.0).collect();
    let sql = format!(
        "INSERT INTO {table} ({}) VALUES ({})",
        names.join(", "),
        vec!["?"; names.len()].join(", ")
    );
    insert_raw(db, &sql, columns.iter().map(|c| c.1.clone()).collect()).await
}

/// Enqueues `event` into `table` with the producer API (payloads up to 16 MiB) in its own
/// transaction; returns (id, event_id).
pub async fn enqueue(db: &TestDb, table: &str, event: NewEvent) -> (u64, String) {
    let outbox = Outbox::new(TableName::parse(table).unwrap(), 16 * 1024 * 1024);
    let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
    let event_id = outbox.enqueue(&mut tx, event).await.expect("enqueue");
    tx.commit().await.unwrap();
    let id: u64 = db
        .conn()
        .await
        .exec_first(
            format!("SELECT id FROM {table} WHERE event_id = ?"),
            (event_id.as_str(),),
        )
        .await
        .unwrap()
        .expect("the enqueued row");
    (id, event_id.to_string())
}

/// status, event_id, last_error, retry_count, msg_id.
type StateColumns = (
    Option<i8>,
    Option<String>,
    Option<String>,
    u32,
    Option<String>,
);

/// The state of row `id` of `table`.
pub async fn state(db: &TestDb, table: &str, id: u64) -> RowState {
    let row: Option<StateColumns> = db
        .conn()
        .await
        .exec_first(
            format!(
                "SELECT status, event_id, last_error, retry_count, NULLIF(msg_id, '') \
                 FROM {table} WHERE id = ?"
            ),
            (id,),
        )
        .await
        .unwrap();
    let (status, event_id, last_error, retry_count, msg_id) =
        row.unwrap_or_else(|| panic!("{table} has no row {id}"));
    RowState {
        status,
        event_id,
        last_error,
        retry_count,
        msg_id,
    }
}

/// Waits until every `(id, status)` of `table` holds; panics with the rows' states after
/// `timeout`.
pub async fn wait_statuses(db: &TestDb, table: &str, expected: &[(u64, i8)], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let mut states = Vec::new();
        for (id, _) in expected {
            states.push(state(db, table, *id).await);
        }
        if expected
            .iter()
            .zip(&states)
            .all(|((_, want), s)| s.status == Some(*want))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?}: expected {expected:?}, rows are {states:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Row `id` is FAILED at once (no retry), without a msg_id, for a reason containing `reason`.
pub async fn assert_failed(db: &TestDb, table: &str, id: u64, reason: &str) -> RowState {
    let s = state(db, table, id).await;
    assert_eq!(s.status, Some(FAILED), "row {id}: {s:?}");
    let error = s.last_error.as_deref().unwrap_or_default();
    assert!(
        error.contains(reason),
        "row {id}: last_error {error:?} should contain {reason:?}"
    );
    assert_eq!(s.msg_id, None, "a FAILED row has no msg_id: {s:?}");
    assert_eq!(s.retry_count, 0, "a bad row is not retried: {s:?}");
    println!("row {id}: FAILED with {error:?}");
    s
}

/// Row `id` is SENT with its broker msg_id.
pub async fn assert_sent(db: &TestDb, table: &str, id: u64) -> RowState {
    let s = state(db, table, id).await;
    assert_eq!(s.status, Some(SENT), "row {id}: {s:?}");
    assert!(
        s.msg_id.as_deref().is_some_and(|m| !m.is_empty()),
        "SENT without msg_id: {s:?}"
    );
    s
}

/// Every message of `topic` once at least `expected` have arrived and nothing more arrives for a
/// second, by event_id (a duplicate makes the test fail).
pub async fn messages_by_event(topic: &str, expected: usize) -> HashMap<String, ReceivedMessage> {
    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), topic)
        .await
        .unwrap();
    reader
        .read_at_least(expected, Duration::from_secs(60))
        .await
        .unwrap();
    let messages = reader.read_all_for(Duration::from_secs(1)).await.unwrap();
    reader.close().await;
    let mut by_event = HashMap::new();
    for m in messages {
        let event_id = m.properties["event_id"].clone();
        assert!(
            by_event.insert(event_id.clone(), m).is_none(),
            "{event_id} arrived twice"
        );
    }
    by_event
}

/// A relay running in this process (see [`start_relay_from_now`]).
pub struct Relay(RelayHandle);

impl Relay {
    /// Requests a graceful stop and returns the summary.
    pub async fn stop(self) -> RunSummary {
        self.0.stop().await.expect("relay run")
    }
}

/// Starts a relay at the current end of the binlog (seeded as its checkpoint). sled may hold the
/// lock of the seeding store a moment longer than the store waits for it on a loaded machine, so
/// a start refused for that reason is tried again.
pub async fn start_relay_from_now(db: &TestDb, config: &Config) -> Relay {
    seed_checkpoint(config, &current_position(db).await);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match RelayHandle::spawn(config, RunOptions::default(), CancellationToken::new()).await {
            Ok(handle) => return Relay(handle),
            Err(e) if format!("{e:#}").contains("could not acquire lock") => {
                assert!(Instant::now() < deadline, "relay starts: {e:#}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("relay starts: {e:#}"),
        }
    }
}
