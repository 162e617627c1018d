//! Relay fixtures: a config for a test's database and topic, an in-process relay, and waiting.

use super::rocketmq::rocketmq;
use super::TestDb;
use mysql_async::prelude::*;
use outbox_relay::binlog::BinlogPosition;
use outbox_relay::checkpoint::{CheckpointStore, SledStore};
use outbox_relay::config::Config;
use outbox_relay::devenv::TopicReader;
use outbox_relay::relay::{RelayHandle, RunOptions, RunSummary};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// A config for `db` and the binary's broker, with its own replica server id and a temporary
/// checkpoint directory (kept alive by the returned guard).
pub fn relay_config(db: &TestDb) -> (Config, tempfile::TempDir) {
    static NEXT_SERVER_ID: AtomicU32 = AtomicU32::new(1000);
    let dir = tempfile::tempdir().expect("checkpoint dir");
    let mut config = db.config.clone();
    config.rocketmq.namesrv_addr = Some(rocketmq().namesrv_addr());
    config.rocketmq.producer_group = format!("relay_test_{}", std::process::id());
    config.relay.shards = 4;
    config.relay.checkpoint_dir = dir.path().to_path_buf();
    config.relay.name = format!("test-{}", NEXT_SERVER_ID.load(Ordering::Relaxed));
    config.mysql.server_id = 100_000
        + std::process::id() % 10_000 * 10
        + NEXT_SERVER_ID.fetch_add(1, Ordering::Relaxed) % 10;
    config.mysql.heartbeat = Duration::from_secs(1);
    (config, dir)
}

/// The server's current GTID position (where a relay started now would begin).
pub async fn current_position(db: &TestDb) -> BinlogPosition {
    let gtid: String = db
        .conn()
        .await
        .query_first("SELECT @@GLOBAL.gtid_binlog_pos")
        .await
        .unwrap()
        .unwrap_or_default();
    BinlogPosition {
        mariadb_gtid: Some(gtid.parse().unwrap()),
        ..BinlogPosition::default()
    }
}

/// Saves `position` as the relay's local checkpoint, so it starts exactly there.
pub fn seed_checkpoint(config: &Config, position: &BinlogPosition) {
    let store = SledStore::open(&config.relay.checkpoint_dir).unwrap();
    store.save(position).unwrap();
}

/// A relay running in this process.
pub struct RunningRelay(RelayHandle);

impl RunningRelay {
    /// Starts the relay with its sled store in `config.relay.checkpoint_dir`.
    pub async fn start(config: &Config) -> Self {
        let handle = RelayHandle::spawn(config, RunOptions::default(), CancellationToken::new())
            .await
            .expect("relay starts");
        RunningRelay(handle)
    }

    /// Requests a graceful stop and returns the summary.
    pub async fn stop(self) -> RunSummary {
        self.0.stop().await.expect("relay run")
    }
}

/// Polls `check` every 100 ms until it returns true; panics with `what` after `timeout`.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Rows of the outbox with `status`.
pub async fn count_status(db: &TestDb, status: u8) -> u64 {
    db.conn()
        .await
        .exec_first(
            "SELECT COUNT(*) FROM outbox_event WHERE status = ?",
            (status,),
        )
        .await
        .unwrap()
        .unwrap_or_default()
}

/// How many times each event_id reached the topic.
pub async fn deliveries(namesrv: &str, topic: &str, expected: usize) -> HashMap<String, usize> {
    let mut reader = TopicReader::new(namesrv, topic).await.unwrap();
    let messages = reader
        .read_at_least(expected, Duration::from_secs(120))
        .await
        .unwrap();
    let mut per_event = HashMap::new();
    for m in &messages {
        *per_event
            .entry(m.properties["event_id"].clone())
            .or_insert(0) += 1;
    }
    reader.close().await;
    per_event
}
