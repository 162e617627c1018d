//! Relay fixtures: a config for a test's database and topic, an in-process relay, and waiting.

use super::rocketmq::rocketmq;
use super::TestDb;
use mysql_async::prelude::*;
use mysql_async::TxOpts;
use outbox_devenv::{DatabaseKind, ReceivedMessage, TopicReader};
use rocketmq_outbox::binlog::reader::server_position;
use rocketmq_outbox::binlog::{BinlogPosition, MariaDbGtidPos};
use rocketmq_outbox::checkpoint::{CheckpointStore, SledStore};
use rocketmq_outbox::config::Config;
use rocketmq_outbox::operate::Watchers;
use rocketmq_outbox::outbox::status::codes::SENT;
use rocketmq_outbox::pipeline::{RunOptions, RunSummary};
use rocketmq_outbox::producer::{EnqueueError, NewEvent, Outbox};
use rocketmq_outbox::relay::RelayHandle;
use serde_json::json;
use std::collections::HashMap;
use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A config for `db` and the binary's broker, with its own replica server id and a temporary
/// checkpoint directory (kept alive by the returned guard).
pub fn relay_config(db: &TestDb) -> (Config, tempfile::TempDir) {
    relay_config_on(db, &rocketmq().namesrv_addr())
}

/// [`relay_config`] for the cluster of name server `namesrv` (the binary's broker is not
/// started).
/// Source of the replica server ids of this test binary (and of `relay.name`s).
static NEXT_SERVER_ID: AtomicU32 = AtomicU32::new(1000);

/// A replica `server_id` no other relay of this test binary is given (of the last thousand: the
/// suite's tests run side by side, and some start several relays): two binlog dumps with one id
/// make the server drop one of them, over and over.
pub fn next_server_id() -> u32 {
    100_000
        + std::process::id() % 4_000 * 1_000
        + NEXT_SERVER_ID.fetch_add(1, Ordering::Relaxed) % 1_000
}

pub fn relay_config_on(db: &TestDb, namesrv: &str) -> (Config, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("checkpoint dir");
    let mut config = db.config.clone();
    config.rocketmq.namesrv_addr = Some(namesrv.to_string());
    config.rocketmq.producer_group = format!("relay_test_{}", std::process::id());
    config.relay.shards = 4;
    config.relay.checkpoint_dir = dir.path().to_path_buf();
    config.relay.name = format!("test-{}", NEXT_SERVER_ID.load(Ordering::Relaxed));
    config.mysql.server_id = next_server_id();
    config.mysql.heartbeat = Duration::from_secs(1);
    (config, dir)
}

/// A relay config for a test, from [`relay_config`] with the changes tests make most, in one
/// place: `relay_fixture(&db).stream_only().at_current_end().await`.
pub struct RelayFixture<'a> {
    db: &'a TestDb,
    config: Config,
    dir: tempfile::TempDir,
}

/// Starts a [`RelayFixture`] for `db` and the binary's broker.
pub fn relay_fixture(db: &TestDb) -> RelayFixture<'_> {
    let (config, dir) = relay_config(db);
    RelayFixture { db, config, dir }
}

impl RelayFixture<'_> {
    /// Publishes to the cluster of name server `namesrv` instead of the binary's broker.
    pub fn on(mut self, namesrv: &str) -> Self {
        self.config.rocketmq.namesrv_addr = Some(namesrv.to_string());
        self
    }

    /// No sweeper beside the stream: what a test sees was sent by the stream.
    pub fn stream_only(mut self) -> Self {
        self.config.sweeper.enabled = false;
        self
    }

    /// A sweeper that claims rows older than `min_age` every `interval`, under `lease`.
    pub fn sweeper(mut self, interval: Duration, min_age: Duration, lease: Duration) -> Self {
        self.config.sweeper.interval = interval;
        self.config.sweeper.min_age = min_age;
        self.config.sweeper.lease = lease;
        self
    }

    /// Sends time out after `send_timeout` and are retried from `initial` up to `max` backoff,
    /// `retries` times (the broker-fault tests).
    pub fn broker_retries(
        mut self,
        send_timeout: Duration,
        initial: Duration,
        max: Duration,
        retries: u32,
    ) -> Self {
        self.config.rocketmq.send_timeout = send_timeout;
        self.config.retry.initial_backoff = initial;
        self.config.retry.max_backoff = max;
        self.config.retry.max_retry = retries;
        self
    }

    /// The config and its checkpoint directory (kept while the guard lives).
    pub fn build(self) -> (Config, tempfile::TempDir) {
        (self.config, self.dir)
    }

    /// [`RelayFixture::build`], with the checkpoint saved at the server's current end: a relay
    /// started from it streams what is written after this call, and nothing older.
    pub async fn at_current_end(self) -> (Config, tempfile::TempDir) {
        seed_checkpoint(&self.config, &current_position(self.db).await);
        self.build()
    }
}

/// The server's current GTID position (where a relay started now would begin), as the relay
/// itself reads it: MariaDB's `gtid_binlog_pos` or MySQL's `gtid_executed`. Only the GTID form
/// is kept (the relay resumes by it); file/offset only on a server without GTIDs.
pub async fn current_position(db: &TestDb) -> BinlogPosition {
    let opts = rocketmq_outbox::db::opts(&db.config).unwrap();
    let current = server_position(&opts).await.unwrap().current;
    if current.mariadb_gtid.is_none() && current.mysql_gtid_set.is_none() {
        return current;
    }
    BinlogPosition {
        mariadb_gtid: current.mariadb_gtid,
        mysql_gtid_set: current.mysql_gtid_set,
        ..BinlogPosition::default()
    }
}

/// The GTID of the transaction `conn` committed last, as a position that holds it alone: a
/// checkpoint [`BinlogPosition::covers`] it once it has passed that transaction. MariaDB:
/// `@@last_gtid`; MySQL: the session's newest committed transaction in
/// `performance_schema.events_transactions_history`.
pub async fn last_committed_gtid(conn: &mut mysql_async::Conn) -> BinlogPosition {
    match super::database().kind() {
        DatabaseKind::MariaDb => {
            let gtid: String = conn
                .query_first("SELECT @@last_gtid")
                .await
                .unwrap()
                .unwrap();
            let mut position = MariaDbGtidPos::default();
            position.apply(gtid.parse().unwrap());
            BinlogPosition {
                mariadb_gtid: Some(position),
                ..BinlogPosition::default()
            }
        }
        DatabaseKind::MySql => {
            let gtid: String = conn
                .query_first(
                    "SELECT GTID FROM performance_schema.events_transactions_history \
                     WHERE THREAD_ID = PS_CURRENT_THREAD_ID() AND STATE = 'COMMITTED' \
                     AND GTID LIKE '%:%' ORDER BY EVENT_ID DESC LIMIT 1",
                )
                .await
                .unwrap()
                .expect("the session committed a transaction with a GTID");
            BinlogPosition {
                mysql_gtid_set: Some(gtid.parse().unwrap()),
                ..BinlogPosition::default()
            }
        }
    }
}

/// Saves `position` as the relay's local checkpoint, so it starts exactly there.
pub fn seed_checkpoint(config: &Config, position: &BinlogPosition) {
    let store = SledStore::open(&config.relay.checkpoint_dir).unwrap();
    store.save(position).unwrap();
}

/// A relay running in this process. If it ends before [`RunningRelay::stop`] (a permanent
/// error), the error is recorded, and any [`wait_for`] that then times out shows it.
pub struct RunningRelay {
    cancel: CancellationToken,
    run: tokio::task::JoinHandle<anyhow::Result<RunSummary>>,
}

impl RunningRelay {
    /// Starts the relay with its sled store in `config.relay.checkpoint_dir`.
    pub async fn start(config: &Config) -> Self {
        Self::start_with(config, RunOptions::default()).await
    }

    /// Starts the relay (of `config.relay.mode`) with `options`.
    pub async fn start_with(config: &Config, options: RunOptions) -> Self {
        let cancel = CancellationToken::new();
        let handle = RelayHandle::spawn(config, options, cancel.clone())
            .await
            .expect("relay starts");
        // What an `outbox-relay run` process runs beside the relay (crates/outbox-relay's
        // run_relay): the tables' metrics, dead letters, periodic cleanup.
        let watchers = Watchers::spawn(config, &cancel).expect("watchers start");
        let (name, stopping) = (config.relay.name.clone(), cancel.clone());
        let run = tokio::spawn(async move {
            let result = handle.join().await;
            watchers.stop();
            if !stopping.is_cancelled() {
                let how = match &result {
                    Ok(_) => "without an error".to_string(),
                    Err(e) => format!("{e:#}"),
                };
                super::note_for_timeouts(format!(
                    "relay {name} ended before it was stopped: {how}"
                ));
            }
            result
        });
        RunningRelay { cancel, run }
    }

    /// Requests a graceful stop and returns the summary.
    pub async fn stop(self) -> RunSummary {
        self.cancel.cancel();
        self.run.await.expect("relay task").expect("relay run")
    }
}

/// [`super::wait_until_every`] polling every 100 ms: for checks that query the database.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    super::wait_until_every(what, timeout, Duration::from_millis(100), check).await
}

/// Waits (see [`wait_for`]) until exactly `total` rows of the outbox are SENT.
pub async fn wait_until_sent(db: &TestDb, total: u64, timeout: Duration) {
    let deadline = std::time::Instant::now() + timeout;
    while count_status(db, rocketmq_outbox::outbox::Status::Sent).await != total {
        if std::time::Instant::now() >= deadline {
            let by_status: Vec<(i8, u64)> = (db.conn().await)
                .query("SELECT status, COUNT(*) FROM outbox_event GROUP BY status")
                .await
                .unwrap_or_default();
            let what = format!("{total} rows SENT; (status, rows) now: {by_status:?}");
            super::timed_out(&what, timeout);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits up to `timeout` for `total` SENT rows, stops `relay`, and checks that nothing was
/// marked FAILED and that every event reached `topic` (of the broker at `namesrv`). Returns how
/// many times each event arrived.
pub async fn stop_when_all_sent(
    relay: RunningRelay,
    db: &TestDb,
    (namesrv, topic): (&str, &str),
    total: usize,
    timeout: Duration,
) -> HashMap<String, usize> {
    wait_until_sent(db, total as u64, timeout).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.failed, 0);
    let per_event = deliveries(namesrv, topic, total).await;
    assert_eq!(per_event.len(), total, "every event arrived");
    per_event
}

/// Rows of the outbox with `status`.
pub async fn count_status(db: &TestDb, status: rocketmq_outbox::outbox::Status) -> u64 {
    db.conn()
        .await
        .exec_first(
            "SELECT COUNT(*) FROM outbox_event WHERE status = ?",
            (status.code(),),
        )
        .await
        .unwrap()
        .unwrap_or_default()
}

/// Rows of the outbox matching `condition` (SQL).
pub async fn count_where(db: &TestDb, condition: &str) -> u64 {
    db.conn()
        .await
        .query_first(format!(
            "SELECT COUNT(*) FROM outbox_event WHERE {condition}"
        ))
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
    reader.close().await;
    copies_per_event(&messages)
}

/// How many of `messages` carry each event_id.
pub fn copies_per_event(messages: &[ReceivedMessage]) -> HashMap<String, usize> {
    let mut per_event = HashMap::new();
    for m in messages {
        *per_event
            .entry(m.properties["event_id"].clone())
            .or_insert(0) += 1;
    }
    per_event
}

/// Every message stored in `topic` of the binary's broker, once at least `at_least` arrived and
/// then nothing more for 3 s (so duplicates and late sends are counted too).
pub async fn stored_messages(topic: &str, at_least: usize) -> Vec<ReceivedMessage> {
    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), topic)
        .await
        .unwrap();
    reader
        .read_at_least(at_least, Duration::from_secs(120))
        .await
        .unwrap();
    let messages = reader.read_all_for(Duration::from_secs(3)).await.unwrap();
    reader.close().await;
    messages
}

/// Writes `per_writer` events from each of `writers` concurrent writers; key `k` belongs to writer
/// `k % writers`, so each key's commit order is its id order. Returns (event_id, key) by id.
pub async fn write_events(
    db: &TestDb,
    topic: &str,
    writers: usize,
    per_writer: usize,
    keys: usize,
) {
    let tasks = (0..writers).map(|w| {
        let pool = db.pool.clone();
        let topic = topic.to_string();
        tokio::spawn(async move {
            let outbox = Outbox::default();
            let mut written = 0;
            let mut n = 0usize;
            while written < per_writer {
                let size = 1 + n % 5;
                let mut tx = pool.start_transaction(TxOpts::default()).await.unwrap();
                let batch: Vec<NewEvent> = (0..size.min(per_writer - written))
                    .map(|i| {
                        let key = (w + writers * ((n * 7 + i * 13) % (keys / writers))) % keys;
                        NewEvent::new(
                            topic.clone(),
                            format!("key-{key}"),
                            json!({"w": w, "n": n, "i": i}),
                        )
                    })
                    .collect();
                let len = batch.len();
                match outbox.enqueue_batch(&mut tx, batch).await {
                    Ok(_) => {
                        tx.commit().await.unwrap();
                        written += len;
                        n += 1;
                    }
                    // As business code does: a deadlock victim (1213) or a lock wait timeout
                    // (1205) retries its whole transaction.
                    Err(EnqueueError::Database(mysql_async::Error::Server(e)))
                        if e.code == 1213 || e.code == 1205 =>
                    {
                        eprintln!(
                            "writer {w}: {} ({}); retrying the transaction",
                            e.message, e.code
                        );
                        drop(tx);
                    }
                    Err(e) => panic!("enqueue failed: {e}"),
                }
            }
        })
    });
    for t in tasks {
        t.await.unwrap();
    }
}

/// Writes single-event transactions on `topic` at `per_second` for `seconds`, as applications
/// do: commits spread evenly over eight writers, keys `key-0 .. key-{keys}` in turn. Returns
/// how many were written (a writer that falls behind catches up, so it is `per_second * seconds`).
pub async fn write_at_rate(
    db: &TestDb,
    topic: &str,
    per_second: u32,
    seconds: u32,
    keys: usize,
) -> usize {
    const WRITERS: u32 = 8;
    let per_writer = (per_second * seconds / WRITERS) as usize;
    let period = Duration::from_secs(1) * WRITERS / per_second;
    let tasks = (0..WRITERS as usize).map(|w| {
        let pool = db.pool.clone();
        let topic = topic.to_string();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            for n in 0..per_writer {
                ticks.tick().await;
                let key = format!("key-{}", (n * WRITERS as usize + w) % keys);
                let event = NewEvent::new(topic.clone(), key, json!({"w": w, "n": n}));
                // A connection per commit, as a request handler takes one from its pool.
                commit_events(&mut pool.get_conn().await.unwrap(), vec![event]).await;
            }
        })
    });
    // Spawned all at once (collected), then awaited.
    let tasks: Vec<_> = tasks.collect();
    for t in tasks {
        t.await.unwrap();
    }
    per_writer * WRITERS as usize
}

/// Commits `events` in one transaction on `conn`; their event_ids.
pub async fn commit_events(conn: &mut mysql_async::Conn, events: Vec<NewEvent>) -> Vec<String> {
    let mut tx = conn.start_transaction(TxOpts::default()).await.unwrap();
    let ids = Outbox::default()
        .enqueue_batch(&mut tx, events)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    ids.into_iter().map(|id| id.to_string()).collect()
}

/// One arrival of a key's message: ((broker group, queue id), queue offset, row id).
type Arrival<'a> = ((&'a str, i32), i64, u64);

/// Checks the arrival order: every key went to one queue, and its messages arrived (by queue
/// offset, first delivery of each event) in commit (id) order. `rows` are (id, event_id, …).
pub fn assert_key_order(rows: &[OutboxRow], messages: &[ReceivedMessage]) {
    let id_of: HashMap<&str, u64> = rows.iter().map(|r| (r.1.as_str(), r.0)).collect();
    let mut by_key: BTreeMap<&str, Vec<Arrival>> = BTreeMap::new();
    for m in messages {
        let key = m.properties["biz_key"].as_str();
        by_key.entry(key).or_default().push((
            (m.broker_name.as_str(), m.queue_id),
            m.queue_offset,
            id_of[m.properties["event_id"].as_str()],
        ));
        assert_eq!(
            m.keys,
            vec![m.properties["event_id"].clone(), key.to_string()],
            "KEYS = event_id biz_key"
        );
    }
    for (key, mut seen) in by_key {
        let queues: HashSet<(&str, i32)> = seen.iter().map(|s| s.0).collect();
        assert_eq!(queues.len(), 1, "{key} went to several queues");
        seen.sort_by_key(|s| s.1);
        let ids: Vec<u64> = seen.iter().map(|s| s.2).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        let mut first_seen = ids.clone();
        let mut seen_set = HashSet::new();
        first_seen.retain(|id| seen_set.insert(*id));
        assert_eq!(
            first_seen, sorted,
            "{key} arrived out of commit order (queue offsets and ids: {seen:?})"
        );
    }
}

/// A CDC relay config whose sweeper looks every 300 ms for rows PENDING for over a second.
pub fn sweeping_config(db: &TestDb) -> (Config, tempfile::TempDir) {
    let (mut config, dir) = relay_config(db);
    config.sweeper.interval = Duration::from_millis(300);
    config.sweeper.min_age = Duration::from_secs(1);
    config.sweeper.lease = Duration::from_secs(10);
    (config, dir)
}

/// A poll-mode config for `db`: short lease (`lease`), 100 ms poll interval, own instance id.
pub fn poll_config(db: &TestDb, instance: &str, lease: Duration) -> (Config, tempfile::TempDir) {
    let (mut config, dir) = relay_config(db);
    config.relay.mode = rocketmq_outbox::config::RelayMode::Poll;
    config.relay.instance_id = Some(instance.to_string());
    config.rocketmq.producer_group = format!("poll_test_{}_{instance}", std::process::id());
    config.poll.interval = Duration::from_millis(100);
    config.sweeper.lease = lease;
    config.sweeper.interval = Duration::from_secs(1);
    (config, dir)
}

/// Commit → SENT latencies of the SENT rows, in ms, sorted.
pub async fn sent_latencies_ms(db: &TestDb) -> Vec<f64> {
    let mut micros: Vec<i64> = db
        .conn()
        .await
        .query(format!(
            "SELECT TIMESTAMPDIFF(MICROSECOND, created_at, sent_at) FROM outbox_event \
             WHERE status = {SENT}"
        ))
        .await
        .unwrap();
    micros.sort();
    micros.into_iter().map(|m| m as f64 / 1000.0).collect()
}

/// Checks a finished run of `total` events to `topic`: every row SENT with its `msg_id`, every
/// event_id arrived, each key on one queue in commit order; prints the duplicates.
pub async fn assert_every_event_arrived_in_key_order(db: &TestDb, topic: &str, total: usize) {
    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), topic)
        .await
        .unwrap();
    assert_read_every_event_in_key_order(db, &mut reader, total).await;
    reader.close().await;
}

/// [`assert_every_event_arrived_in_key_order`] with what `reader` (of the run's topic, on any
/// cluster) reads; returns the stored messages.
pub async fn assert_read_every_event_in_key_order(
    db: &TestDb,
    reader: &mut TopicReader,
    total: usize,
) -> Vec<ReceivedMessage> {
    let rows = outbox_rows(db).await;
    assert!(
        rows.iter()
            .all(|r| r.3.as_deref().is_some_and(|m| !m.is_empty())),
        "a SENT row lacks its msg_id"
    );
    let messages = reader
        .read_at_least(total, Duration::from_secs(120))
        .await
        .unwrap();
    let arrived: HashSet<&str> = messages
        .iter()
        .map(|m| m.properties["event_id"].as_str())
        .collect();
    let expected: HashSet<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(arrived, expected, "every event_id arrives");
    assert_msg_ids_stored(&rows, &messages);
    println!("duplicates: {}", messages.len() - arrived.len());
    assert_key_order(&rows, &messages);
    messages
}

/// An outbox row as the delivery checks read it: (id, event_id, biz_key, msg_id).
pub type OutboxRow = (u64, String, String, Option<String>);

/// Every row of `outbox_event`, in id order.
pub async fn outbox_rows(db: &TestDb) -> Vec<OutboxRow> {
    db.conn()
        .await
        .query("SELECT id, event_id, biz_key, NULLIF(msg_id, '') FROM outbox_event ORDER BY id")
        .await
        .unwrap()
}

/// Contract 5: each of `rows` (SENT) carries the id of a stored message of its event.
pub fn assert_msg_ids_stored(rows: &[OutboxRow], messages: &[ReceivedMessage]) {
    let stored_ids: HashSet<(&str, &str)> = messages
        .iter()
        .map(|m| (m.properties["event_id"].as_str(), m.msg_id.as_str()))
        .collect();
    let unproven: Vec<&OutboxRow> = rows
        .iter()
        .filter(|r| !stored_ids.contains(&(r.1.as_str(), r.3.as_deref().unwrap_or_default())))
        .collect();
    assert!(
        unproven.is_empty(),
        "{} SENT rows have a msg_id no stored message of their event carries: {:?}",
        unproven.len(),
        unproven.iter().take(5).collect::<Vec<_>>()
    );
}

/// How many deliveries beyond the first, over all events.
pub fn duplicates(per_event: &std::collections::HashMap<String, usize>) -> usize {
    per_event.values().map(|n| n - 1).sum()
}

/// `PURGE BINARY LOGS TO` the newest file until only it is left: the server keeps a file that a
/// dump thread still reads, and a stopped relay's thread ends only when it notices its closed
/// connection.
pub async fn purge_all_but_the_newest_binlog(db: &TestDb) {
    wait_for("older binlogs purged", Duration::from_secs(30), || {
        let pool = db.pool.clone();
        async move {
            let mut conn = pool.get_conn().await.unwrap();
            let logs: Vec<mysql_async::Row> = conn.query("SHOW BINARY LOGS").await.unwrap();
            let newest: String = logs.last().and_then(|row| row.get(0)).unwrap();
            conn.query_drop(format!("PURGE BINARY LOGS TO '{newest}'"))
                .await
                .unwrap();
            let left: Vec<mysql_async::Row> = conn.query("SHOW BINARY LOGS").await.unwrap();
            left.len() == 1
        }
    })
    .await;
}
