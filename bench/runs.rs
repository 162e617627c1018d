//! The measured runs: which system carries the events ([`System`]), a drain of a backlog
//! written while it was stopped, and a latency run at a fixed commit rate. Each run reads the
//! broker: a drain ends when the topic holds every event, a latency is the broker's store
//! timestamp minus the writer's commit time.

use crate::counters::Counters;
use crate::peer::{PeerChild, PeerTarget};
use crate::procs::{self, CpuSplit, Watched};
use crate::workload::{self, RelayChild};
use crate::{canal, debezium};
use mysql_async::prelude::*;
use outbox_devenv::{Database, ReceivedMessage, RocketMq, SqlServer, TopicReader};
use rocketmq_outbox::binlog::BinlogPosition;
use rocketmq_outbox::config::{Config, RelayMode};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

mod latency;
pub use latency::LatencyResult;

/// What carries the events from the outbox table to the broker in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    /// `outbox-relay run` streaming the binlog (sweeper off: the stream alone).
    Cdc,
    /// The same with the sweeper on, as users run it (defaults: rows PENDING > 30 s).
    CdcSweeper,
    /// `outbox-relay run` in poll mode.
    Poll,
    /// Debezium Server: connector + outbox event router + RocketMQ sink.
    Debezium,
    /// Canal's server in MQ mode: each row change as a flat JSON message.
    Canal,
}

/// The peers of the comparison, in the report's order.
pub const PEERS: [System; 2] = [System::Debezium, System::Canal];

impl System {
    /// The name in the report's tables.
    pub fn label(self) -> &'static str {
        match self {
            System::Cdc => "cdc",
            System::CdcSweeper => "cdc+sweeper",
            System::Poll => "poll",
            System::Debezium => "debezium",
            System::Canal => "canal",
        }
    }

    /// A name usable in database and topic names.
    pub fn slug(self) -> &'static str {
        match self {
            System::CdcSweeper => "cdc_sweeper",
            other => other.label(),
        }
    }

    /// The role its process has in the CPU split.
    pub fn role(self) -> &'static str {
        match self {
            System::Cdc | System::CdcSweeper | System::Poll => "relay",
            peer => peer.label(),
        }
    }

    fn relay_mode(self) -> Option<RelayMode> {
        match self {
            System::Cdc | System::CdcSweeper => Some(RelayMode::Cdc),
            System::Poll => Some(RelayMode::Poll),
            System::Debezium | System::Canal => None,
        }
    }

    /// A peer: it records nothing in the outbox table (done once the broker holds every event).
    pub fn is_peer(self) -> bool {
        self.relay_mode().is_none()
    }

    /// The outbox rows' `event_id`s a stored message carries: the relay sets the user property
    /// `event_id`; Debezium's outbox router puts the id column in the header `id` (as a JSON
    /// string, quotes included); Canal sets no key and no property: its flat JSON body holds
    /// the rows (several) of one binlog rows event that hash to one queue.
    fn event_ids(self, message: &ReceivedMessage) -> Vec<String> {
        let property = |name: &str| message.properties.get(name).cloned();
        match self {
            System::Canal => canal::event_ids(&message.body),
            System::Debezium => property("id")
                .map(|id| id.trim_matches('"').to_string())
                .into_iter()
                .collect(),
            _ => property("event_id").into_iter().collect(),
        }
    }
}

/// Counts a system's events on its topic while it runs: the topic's stored count (one message
/// an event), or for Canal (one message carries several events) the outbox rows of the
/// messages read so far, a pull behind the broker.
struct Stored {
    reader: TopicReader,
    /// Canal: the rows read so far.
    rows: Option<u64>,
}

impl Stored {
    /// The events the topic holds; `None` while the broker does not answer (or the topic does
    /// not exist yet).
    async fn events(&mut self) -> Option<u64> {
        match &mut self.rows {
            None => self.reader.stored_count().await.ok(),
            Some(rows) => {
                let new = self.reader.read_new().await.ok()?;
                *rows += new
                    .iter()
                    .map(|m| canal::event_ids(&m.body).len() as u64)
                    .sum::<u64>();
                Some(*rows)
            }
        }
    }

    async fn close(self) {
        self.reader.close().await;
    }
}

/// A system's process while it runs.
enum Running {
    Relay(RelayChild),
    Peer(PeerChild),
}

/// With `BENCH_TRACES_DIR`, copies a stopped relay's stage trace (and its `BENCH_PERF` profile,
/// when there is one) there as `NAME.trace` and `NAME.perf.data`, for a closer look at one run:
/// the scratch directory goes with the bench.
fn keep_trace(trace: Option<&std::path::Path>, name: &str) {
    let (Some(trace), Ok(keep)) = (trace, std::env::var("BENCH_TRACES_DIR")) else {
        return;
    };
    let keep = PathBuf::from(keep);
    let _ = std::fs::create_dir_all(&keep);
    let _ = std::fs::copy(trace, keep.join(format!("{name}.trace")));
    if let Some(perf) = trace.parent().map(|d| d.join("perf.data")) {
        let _ = std::fs::copy(perf, keep.join(format!("{name}.perf.data")));
    }
}

impl Running {
    fn pid(&self) -> u32 {
        match self {
            Running::Relay(r) => r.pid(),
            Running::Peer(p) => p.pid(),
        }
    }

    /// The relay's stage trace; `None` for a peer.
    fn stage_trace(&self) -> Option<PathBuf> {
        match self {
            Running::Relay(r) => Some(r.stage_trace()),
            Running::Peer(_) => None,
        }
    }

    fn log_path(&self) -> PathBuf {
        match self {
            Running::Relay(r) => r.log_path(),
            Running::Peer(p) => p.log_path(),
        }
    }

    fn start_profile(&mut self) {
        if let Running::Relay(r) = self {
            r.start_profile();
        }
    }

    fn check_alive(&mut self) {
        if let Running::Peer(p) = self {
            p.check_alive();
        }
    }

    /// Stops it cleanly; the relay's final checkpoint (CDC mode).
    fn stop(self) -> Option<BinlogPosition> {
        match self {
            Running::Relay(r) => r.stop(),
            Running::Peer(p) => {
                p.stop();
                None
            }
        }
    }
}

/// A backlog of events in a database of its own, written while its system was stopped.
pub struct Backlog {
    pub pool: mysql_async::Pool,
    pub url: String,
    pub topic: String,
    /// Where a CDC relay starts (before the first event) and what its checkpoint must cover.
    pub start: BinlogPosition,
    pub end: BinlogPosition,
    pub events: usize,
    /// A peer's run label (its position was stored before the backlog was written).
    peer_label: Option<String>,
}

/// Everything the runs share.
pub struct Bench {
    pub rocketmq: RocketMq,
    pub database: Database,
    pub config: Config,
    pub watched: Watched,
    pub dir: PathBuf,
    /// Debezium Server's unpacked distribution, when peers run.
    pub debezium_home: Option<PathBuf>,
    /// Canal's built distribution, when peers run.
    pub canal_home: Option<PathBuf>,
    /// The connections the fixed-rate writers commit from.
    pub rate_writers: usize,
}

impl Bench {
    fn watch(&self, running: &Running, role: &'static str) -> Watched {
        let mut watched = self.watched.clone();
        watched.pids.insert(role, vec![running.pid()]);
        watched
    }

    /// A new database with the outbox tables, and an 8-queue topic of the same name.
    pub async fn database(&self, name: &str) -> (mysql_async::Pool, String) {
        let url = self.database.create_database(name).unwrap();
        let mut config = self.config.clone();
        config.mysql.url = Some(url.clone());
        let pool = rocketmq_outbox::db::pool(&config).unwrap();
        rocketmq_outbox::schema::migrate(
            &mut pool.get_conn().await.unwrap(),
            &config.outbox_tables(),
        )
        .await
        .unwrap();
        // `BENCH_SENT_COLUMNS=nullable`: `msg_id` and `sent_at` as migration 0001 made them
        // (NULL until SENT, so every SENT mark rewrites its row), for a before/after of the
        // in-place form on the same build.
        if std::env::var("BENCH_SENT_COLUMNS").is_ok_and(|v| v == "nullable") {
            pool.get_conn()
                .await
                .unwrap()
                .query_drop(
                    "ALTER TABLE outbox_event MODIFY COLUMN msg_id VARCHAR(128) NULL, \
                     MODIFY COLUMN sent_at DATETIME(3) NULL",
                )
                .await
                .unwrap();
        }
        self.rocketmq.create_topic(name, 8).unwrap();
        (pool, url)
    }

    pub fn config_for(&self, url: &str, system: System) -> Config {
        let mut config = self.config.clone();
        config.mysql.url = Some(url.to_string());
        config.relay.mode = system.relay_mode().unwrap_or(RelayMode::Cdc);
        config.sweeper.enabled = system == System::CdcSweeper;
        config
    }

    async fn reader(&self, topic: &str) -> TopicReader {
        TopicReader::new(&self.rocketmq.namesrv_addr(), topic)
            .await
            .unwrap()
    }

    async fn stored(&self, system: System, topic: &str) -> Stored {
        Stored {
            reader: self.reader(topic).await,
            rows: (system == System::Canal).then_some(0),
        }
    }

    /// Starts `system` on the database at `url`, sending to `topic`. `label` names its run
    /// directory under the bench's: a peer keeps its position there, so a second start with the
    /// same label resumes where the first stopped.
    fn spawn(
        &self,
        system: System,
        url: &str,
        topic: &str,
        label: &str,
        start: &BinlogPosition,
    ) -> Running {
        match system {
            System::Debezium | System::Canal => {
                static NEXT: AtomicU32 = AtomicU32::new(0);
                let database = url.rsplit('/').next().unwrap().to_string();
                // Replication client ids: 600000 + n for Debezium, 700000 + n for Canal.
                let ids = if system == System::Canal {
                    700_000
                } else {
                    600_000
                };
                let target = PeerTarget {
                    database_kind: self.database.kind(),
                    database_port: self.database.port(),
                    database: &database,
                    topic,
                    namesrv: &self.rocketmq.namesrv_addr(),
                    server_id: ids + NEXT.fetch_add(1, Ordering::Relaxed),
                };
                let run_dir = self.dir.join(label);
                Running::Peer(match system {
                    System::Canal => {
                        let home = self.canal_home.as_ref().expect("Canal installed");
                        canal::spawn(home, &run_dir, &target)
                    }
                    _ => {
                        let home = self.debezium_home.as_ref().expect("Debezium installed");
                        debezium::spawn(home, &run_dir, &target)
                    }
                })
            }
            relay => {
                let config = self.config_for(url, relay);
                Running::Relay(RelayChild::spawn(&config, &self.dir, label, Some(start)))
            }
        }
    }

    /// Writes probe events until one reaches the broker (the system is connected and
    /// streaming: Debezium misses a probe written before its snapshot took its position, so
    /// one is written again every 10 s), then returns the topic's count of events once it is
    /// quiet.
    async fn probe(
        pool: &mysql_async::Pool,
        topic: &str,
        stored: &mut Stored,
        running: &mut Running,
    ) -> u64 {
        let waiting = Instant::now();
        let mut written = None;
        while stored.events().await.unwrap_or(0) == 0 {
            if written.is_none_or(|at: Instant| at.elapsed() > Duration::from_secs(10)) {
                workload::write_backlog(pool, topic, 1).await;
                written = Some(Instant::now());
            }
            running.check_alive();
            assert!(
                waiting.elapsed() < Duration::from_secs(180),
                "no event reached the broker within 180 s: see {}",
                running.log_path().display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        stored.events().await.expect("the broker's stored count")
    }

    /// A database named for `system` with `events` events written while `system` was stopped.
    /// A peer runs once before (Debezium: snapshot of the schema, no rows; Canal: from the end
    /// of the binlog) until a probe event reaches the broker, and is stopped; its position then
    /// points before the backlog.
    pub async fn backlog(&self, system: System, events: usize) -> Backlog {
        let name = format!("bench_drain_{}", system.slug());
        let (pool, url) = self.database(&name).await;
        let mut peer_label = None;
        if system.is_peer() {
            let label = format!("{name}-{}", system.slug());
            let start = BinlogPosition::default();
            let mut running = self.spawn(system, &url, &name, &label, &start);
            let mut stored = self.stored(system, &name).await;
            Self::probe(&pool, &name, &mut stored, &mut running).await;
            stored.close().await;
            running.stop();
            peer_label = Some(label);
        }
        let start = workload::gtid_now(&pool).await;
        eprintln!(
            "writing a backlog of {events} events for {} ...",
            system.label()
        );
        let writing = Instant::now();
        workload::write_backlog(&pool, &name, events).await;
        eprintln!("  written in {:.1} s", writing.elapsed().as_secs_f64());
        Backlog {
            end: workload::gtid_now(&pool).await,
            pool,
            url,
            topic: name,
            start,
            events,
            peer_label,
        }
    }

    /// Starts `system` on `backlog` and measures until the broker holds every event (and, for
    /// the relay, every row is SENT).
    pub async fn drain(&self, system: System, backlog: &Backlog) -> DrainResult {
        let label = system.label();
        let mut stored = self.stored(system, &backlog.topic).await;
        let stored_before = stored.events().await.expect("the broker's stored count");
        let events = backlog.events as u64;
        let run_label = match &backlog.peer_label {
            Some(resumed) if system.is_peer() => resumed.clone(),
            _ => format!("drain-{}", system.slug()),
        };
        let counted = Counters::read(&backlog.pool).await;
        let before = self.watched.sample();
        let began = Instant::now();
        let mut running = self.spawn(
            system,
            &backlog.url,
            &backlog.topic,
            &run_label,
            &backlog.start,
        );
        running.start_profile();
        let watched = self.watch(&running, system.role());
        let (mut first_stored, mut all_stored, mut all_sent) = (None, None, None);
        let mut progress = workload::Progress::new();
        loop {
            let stored = Self::since(&mut stored, stored_before).await;
            let at = began.elapsed().as_secs_f64();
            if first_stored.is_none() && stored > 0 {
                first_stored = Some(at);
            }
            if all_stored.is_none() && stored >= events {
                all_stored = Some(at);
            }
            let done = match system.is_peer() {
                true => all_stored.is_some(),
                false => {
                    if all_stored.is_some() && !workload::any_unfinished(&backlog.pool).await {
                        all_sent = Some(at);
                    }
                    all_sent.is_some()
                }
            };
            if done {
                break;
            }
            if progress.due() {
                let left = match system.is_peer() {
                    true => events.saturating_sub(stored),
                    false => workload::unfinished(&backlog.pool).await,
                };
                progress.observe(left, &running.log_path());
                eprintln!("  ... {label}: {left} events left");
            }
            running.check_alive();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let secs = began.elapsed().as_secs_f64();
        let split = before.until(&watched.sample(), secs);
        let counters = counted.per_event(&Counters::read(&backlog.pool).await, backlog.events);
        let rss_mib = procs::peak_rss_mib(running.pid());
        let stopping = Instant::now();
        let trace = running.stage_trace();
        let checkpoint = running.stop();
        keep_trace(trace.as_deref(), &format!("drain_{run_label}"));
        let stop_secs = stopping.elapsed().as_secs_f64();
        let stored_after = Self::since(&mut stored, stored_before).await;
        stored.close().await;
        let all_stored = all_stored.unwrap();
        DrainResult {
            mode: label,
            events: backlog.events,
            secs: all_sent.unwrap_or(all_stored),
            secs_stored: all_stored,
            secs_first_stored: first_stored.unwrap_or(0.0),
            stop_secs,
            cpu_us_per_event: split.of(system.role()) * 1e6 / events as f64,
            database_cpu_us_per_event: split.of(self.database_role()) * 1e6 / events as f64,
            rss_mib,
            split,
            checkpoint_ok: (system.relay_mode() == Some(RelayMode::Cdc))
                .then(|| checkpoint.is_some_and(|c| c.covers(&backlog.end))),
            failed: workload::failed(&backlog.pool).await,
            duplicates: stored_after.saturating_sub(events),
            counters,
        }
    }

    /// The events stored less `before`; 0 while the broker does not answer (a drain is then
    /// not done yet).
    async fn since(stored: &mut Stored, before: u64) -> u64 {
        stored
            .events()
            .await
            .map(|count| count.saturating_sub(before))
            .unwrap_or(0)
    }

    /// The database server's role in the CPU split.
    pub fn database_role(&self) -> &'static str {
        match self.database.kind() {
            outbox_devenv::DatabaseKind::MariaDb => "mariadbd",
            outbox_devenv::DatabaseKind::MySql => "mysqld",
        }
    }
}

/// What a drain run measured (rendered by `report`).
pub struct DrainResult {
    pub mode: &'static str,
    pub events: usize,
    /// From starting the system until it is done: every row SENT (the relay), every event
    /// stored on the broker (a peer, which records nothing in the table).
    pub secs: f64,
    /// From starting the system until the broker holds every event.
    pub secs_stored: f64,
    /// From starting the system until the broker holds its first event.
    pub secs_first_stored: f64,
    /// SIGTERM → exit (drain, final checkpoint or offsets, shutdown).
    pub stop_secs: f64,
    /// CPU (utime + stime) of the system's process per event.
    pub cpu_us_per_event: f64,
    /// CPU of the database server per event over the same time.
    pub database_cpu_us_per_event: f64,
    pub rss_mib: f64,
    pub split: CpuSplit,
    /// CDC: the final checkpoint covers the last event's transaction.
    pub checkpoint_ok: Option<bool>,
    pub failed: u64,
    /// Messages the broker stored beyond one per event (resends).
    pub duplicates: u64,
    /// The database server's counters per event (see [`crate::counters`]).
    pub counters: Vec<(&'static str, f64)>,
}

impl DrainResult {
    pub fn rate(&self) -> f64 {
        self.events as f64 / self.secs
    }

    /// Events per second until the broker held the last one.
    pub fn stored_rate(&self) -> f64 {
        self.events as f64 / self.secs_stored
    }
}
