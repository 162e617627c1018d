//! The data and the actors: 1 KiB events over 10k keys, the backlog writer, the fixed-rate
//! writer, and the relay as a child process (`outbox-relay run`, release build).

use mysql_async::prelude::*;
use mysql_async::TxOpts;
use rocketmq_outbox::binlog::BinlogPosition;
use rocketmq_outbox::checkpoint::{CheckpointStore, SledStore};
use rocketmq_outbox::config::{Config, RelayMode};
use rocketmq_outbox::outbox::status::codes::{FAILED, PENDING, SENDING};
use rocketmq_outbox::producer::{NewEvent, Outbox, Payload};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const KEYS: usize = 10_000;

/// ~1 KiB of JSON: the payload of event `n`.
pub fn payload_text(n: usize) -> String {
    format!("{{\"n\":{n},\"pad\":\"{}\"}}", "x".repeat(1000))
}

pub fn key(n: usize) -> String {
    format!("key-{}", n % KEYS)
}

fn event(topic: &str, n: usize) -> NewEvent {
    NewEvent::new(topic, key(n), Payload::raw(payload_text(n)))
}

/// The server's current GTID position (where a relay started now would begin): MariaDB's
/// `gtid_binlog_pos` or MySQL's `gtid_executed`.
pub async fn gtid_now(pool: &mysql_async::Pool) -> BinlogPosition {
    let mut conn = pool.get_conn().await.unwrap();
    let version: String = conn.query_first("SELECT VERSION()").await.unwrap().unwrap();
    let mariadb = version.contains("MariaDB");
    let variable = if mariadb {
        "gtid_binlog_pos"
    } else {
        "gtid_executed"
    };
    let gtid: String = conn
        .query_first(format!("SELECT @@GLOBAL.{variable}"))
        .await
        .unwrap()
        .unwrap_or_default();
    let gtid = gtid.replace('\n', "");
    match mariadb {
        true => BinlogPosition {
            mariadb_gtid: Some(gtid.parse().unwrap()),
            ..BinlogPosition::default()
        },
        false => BinlogPosition {
            mysql_gtid_set: Some(gtid.parse().unwrap()),
            ..BinlogPosition::default()
        },
    }
}

/// Whether a row with one of `statuses` exists: what the bench polls every 20 ms. A `COUNT(*)`
/// there walked every PENDING row 50 times a second and took most of a core of mariadbd from
/// the relay being measured (poll mode's drains suffered most).
pub async fn any_with_status(pool: &mysql_async::Pool, statuses: &str) -> bool {
    pool.get_conn()
        .await
        .unwrap()
        .query_first::<u8, _>(format!(
            "SELECT 1 FROM outbox_event WHERE status IN ({statuses}) LIMIT 1"
        ))
        .await
        .unwrap()
        .is_some()
}

/// Fails the bench when nothing moved for 120 s: a system that cannot send (the broker
/// refusing writes, say, on a nearly full disk) would otherwise keep it waiting for half an
/// hour. Every 5 s ([`Progress::due`]) the caller counts what is left and reports it.
pub struct Progress {
    left: u64,
    since: Instant,
    checked: Instant,
}

impl Progress {
    pub fn new() -> Self {
        Progress {
            left: u64::MAX,
            since: Instant::now(),
            checked: Instant::now(),
        }
    }

    /// Whether 5 s have passed since the last count.
    pub fn due(&mut self) -> bool {
        if self.checked.elapsed() < Duration::from_secs(5) {
            return false;
        }
        self.checked = Instant::now();
        true
    }

    /// `left` events are not done yet; panics when that has not fallen for 120 s.
    pub fn observe(&mut self, left: u64, log: &Path) {
        const LIMIT: Duration = Duration::from_secs(120);
        if left < self.left {
            (self.left, self.since) = (left, Instant::now());
        }
        assert!(
            self.since.elapsed() < LIMIT,
            "nothing was delivered for {LIMIT:?} ({left} left): see {} (a broker refusing \
             writes makes the relay log `send not acknowledged`; check the disk)",
            log.display()
        );
    }
}

/// Whether any row is still PENDING or SENDING.
pub async fn any_unfinished(pool: &mysql_async::Pool) -> bool {
    any_with_status(pool, "0, 1").await
}

/// Rows not yet SENT or FAILED (PENDING or SENDING), counted: for progress lines only.
pub async fn unfinished(pool: &mysql_async::Pool) -> u64 {
    pool.get_conn()
        .await
        .unwrap()
        .query_first(format!(
            "SELECT COUNT(*) FROM outbox_event WHERE status IN ({PENDING}, {SENDING})"
        ))
        .await
        .unwrap()
        .unwrap_or_default()
}

pub async fn failed(pool: &mysql_async::Pool) -> u64 {
    pool.get_conn()
        .await
        .unwrap()
        .query_first(format!(
            "SELECT COUNT(*) FROM outbox_event WHERE status = {FAILED}"
        ))
        .await
        .unwrap()
        .unwrap_or_default()
}

/// Writes `count` events to `topic` in transactions of 1,000.
pub async fn write_backlog(pool: &mysql_async::Pool, topic: &str, count: usize) {
    let outbox = Outbox::default();
    let mut n = 0;
    while n < count {
        let end = (n + 1000).min(count);
        let mut tx = pool.start_transaction(TxOpts::default()).await.unwrap();
        let events = (n..end).map(|i| event(topic, i)).collect();
        outbox.enqueue_batch(&mut tx, events).await.unwrap();
        tx.commit().await.unwrap();
        n = end;
    }
}

/// Commits event `n` to `topic` in a transaction of its own on `conn`; returns its event id.
async fn commit_one(conn: &mut mysql_async::Conn, topic: &str, n: usize) -> String {
    let mut tx = conn.start_transaction(TxOpts::default()).await.unwrap();
    let mut ids = (Outbox::default().enqueue_batch(&mut tx, vec![event(topic, n)]))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    String::from(ids.remove(0))
}

/// Puts every row back to PENDING (for the next drain of the same rows).
pub async fn reset_to_pending(pool: &mysql_async::Pool) {
    pool.get_conn()
        .await
        .unwrap()
        .query_drop(
            format!("UPDATE outbox_event SET status = {PENDING}, msg_id = DEFAULT, sent_at = DEFAULT, owner = NULL, \
             lease_until = NULL, retry_count = 0, next_retry_at = NOW(3) - INTERVAL 1 SECOND"),
        )
        .await
        .unwrap();
}

/// What the writers did.
pub struct Written {
    /// event_id → wall-clock µs when its COMMIT returned.
    pub committed_at: HashMap<String, i64>,
    /// Events per second actually committed.
    pub achieved_rate: f64,
    pub last_commit: Instant,
}

/// How the writers commit: event `n` at `n / rate` seconds after they start (commits spread
/// evenly, as an application's requests arrive), or each as fast as it can.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    Rate(usize),
    FlatOut,
}

/// `writers` connections commit one-event transactions (the article's shape: one business
/// change, one outbox row) to `topic` for `seconds`, taking event numbers in turn, at `pace`;
/// records the microsecond each COMMIT returned.
pub async fn write_paced(
    pool: &mysql_async::Pool,
    topic: &str,
    writers: usize,
    pace: Pace,
    seconds: u64,
) -> Written {
    let total = match pace {
        Pace::Rate(rate) => rate * seconds as usize,
        Pace::FlatOut => usize::MAX,
    };
    let next = Arc::new(AtomicUsize::new(0));
    let began = tokio::time::Instant::now();
    let until = began + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..writers.max(1))
        .map(|_| {
            let (pool, topic, next) = (pool.clone(), topic.to_string(), Arc::clone(&next));
            tokio::spawn(async move {
                let mut conn = pool.get_conn().await.unwrap();
                let mut committed = Vec::new();
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    match pace {
                        Pace::Rate(rate) if n < total => {
                            let due =
                                Duration::from_nanos((n as u64 * 1_000_000_000) / rate as u64);
                            tokio::time::sleep_until(began + due).await;
                        }
                        Pace::FlatOut if tokio::time::Instant::now() < until => {}
                        _ => break,
                    }
                    let id = commit_one(&mut conn, &topic, n).await;
                    committed.push((id, rocketmq_outbox::event::now_us() as i64));
                }
                committed
            })
        })
        .collect();
    let mut committed_at = HashMap::new();
    for task in tasks {
        committed_at.extend(task.await.unwrap());
    }
    Written {
        achieved_rate: committed_at.len() as f64 / began.elapsed().as_secs_f64(),
        committed_at,
        last_commit: Instant::now(),
    }
}

/// The relay binary every run starts, chosen once by [`relay_binary`].
static RELAY_BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The relay binary the bench runs: `BENCH_RELAY_BIN` (another build, for before/after
/// comparisons of a change), else this workspace's `outbox-relay`, built here first with the
/// bench profile (release settings, and the same fingerprints as `cargo bench`'s: with
/// `--release` each would rebuild the other's dependencies). The binary lives in its own
/// package, which `cargo bench` does not build for this bench, so without the build a run would
/// measure whatever release binary an earlier build left.
pub fn relay_binary() -> &'static Path {
    RELAY_BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("BENCH_RELAY_BIN") {
            return PathBuf::from(bin);
        }
        let bin = outbox_devenv::workspace_binary_path("outbox-relay");
        // `<target>/release/outbox-relay`: the target directory this bench was built in.
        let target_dir = bin
            .parent()
            .and_then(Path::parent)
            .expect("a target directory");
        eprintln!(
            "building the relay (bench profile) into {} ...",
            target_dir.display()
        );
        let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        // Not passed on: what `cargo bench` set for this process (`CARGO_PKG_*`,
        // `CARGO_MANIFEST_*`, the library path ...). Some dependencies' build scripts watch such
        // variables: with them passed on, this build and the next `cargo bench` rebuilt `ring`,
        // `rustls`, `mysql_async` and the client for each other on every run (tried).
        for (name, _) in std::env::vars_os() {
            let name_text = name.to_string_lossy();
            let set_by_cargo = name_text.starts_with("CARGO_")
                && !["CARGO_HOME", "CARGO_TARGET_DIR"].contains(&name_text.as_ref());
            if set_by_cargo || ["LD_LIBRARY_PATH", "OUT_DIR"].contains(&name_text.as_ref()) {
                cargo.env_remove(&name);
            }
        }
        let status = cargo
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args([
                "build",
                "--profile",
                "bench",
                "-p",
                "rocketmq-outbox-relay",
                "--bin",
                "outbox-relay",
            ])
            .arg("--target-dir")
            .arg(target_dir)
            .status()
            .expect("cannot run cargo to build the relay");
        assert!(
            status.success(),
            "building the relay failed (see cargo's output above)"
        );
        bin
    })
}

/// A relay run by `outbox-relay -c FILE run` in a child process; killed if dropped running.
pub struct RelayChild {
    child: Child,
    pub checkpoint_dir: PathBuf,
    run_dir: PathBuf,
    perf: Option<Child>,
}

impl RelayChild {
    /// Writes `config` (with its own name, server id and checkpoint dir under `dir`) and starts
    /// the relay; in CDC mode it starts at `start`.
    pub fn spawn(config: &Config, dir: &Path, label: &str, start: Option<&BinlogPosition>) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut config = config.clone();
        let run_dir = dir.join(format!("{label}-{n}"));
        std::fs::create_dir_all(&run_dir).unwrap();
        config.relay.checkpoint_dir = run_dir.join("checkpoint");
        config.relay.name = format!("bench-{label}-{n}");
        config.relay.instance_id = Some(format!("bench-{label}-{n}"));
        config.mysql.server_id = 500_000 + n;
        config.metrics.listen = String::new();
        if let (RelayMode::Cdc, Some(start)) = (config.relay.mode, start) {
            SledStore::open(&config.relay.checkpoint_dir)
                .unwrap()
                .save(start)
                .unwrap();
        }
        let file = run_dir.join("relay.toml");
        std::fs::write(&file, toml::to_string(&config).unwrap()).unwrap();
        let log = std::fs::File::create(run_dir.join("relay.log")).unwrap();
        let mut command = Command::new(relay_binary());
        // SAFETY: prctl is async-signal-safe; the relay dies with the bench even on SIGKILL.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command
            .args(["-c", file.to_str().unwrap(), "--metrics-listen", "", "run"])
            .env("RUST_LOG", "warn")
            .env(
                rocketmq_outbox::metrics::stages::TRACE_ENV,
                run_dir.join("stages.trace"),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start outbox-relay run");
        RelayChild {
            child,
            checkpoint_dir: config.relay.checkpoint_dir,
            run_dir,
            perf: None,
        }
    }

    /// With `BENCH_PERF` set (e.g. `BENCH_PERF="-F 999 --call-graph dwarf"`), samples the relay
    /// with `perf record` into `<run dir>/perf.data` until [`Self::stop_profile`]. With
    /// `BENCH_PERF_ALL=1` it records the whole machine instead (`-a`: the broker and the database
    /// too, e.g. `BENCH_PERF="-e sched:sched_switch -g -k realtime"` for where their threads
    /// wait, on the clock of the stage trace).
    pub fn start_profile(&mut self) {
        let Ok(flags) = std::env::var("BENCH_PERF") else {
            return;
        };
        let out = self.run_dir.join("perf.data");
        let pid = self.child.id().to_string();
        let target: &[&str] = if std::env::var_os("BENCH_PERF_ALL").is_some() {
            &["-a"]
        } else {
            &["-p", &pid]
        };
        eprintln!("  profiling ({}) into {}", target.join(" "), out.display());
        self.perf = Command::new("perf")
            .arg("record")
            .args(flags.split_whitespace())
            .args(target)
            .args(["-o", out.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok();
    }

    pub fn stop_profile(&mut self) {
        if let Some(mut perf) = self.perf.take() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(perf.id() as libc::pid_t, libc::SIGINT) };
            let _ = perf.wait();
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The relay's stage trace (see `rocketmq_outbox::metrics::stages`).
    pub fn stage_trace(&self) -> PathBuf {
        self.run_dir.join("stages.trace")
    }

    /// The relay's log (stderr).
    pub fn log_path(&self) -> PathBuf {
        self.run_dir.join("relay.log")
    }

    /// SIGTERM (drain, final checkpoint) and wait; the final checkpoint from sled (CDC mode).
    pub fn stop(mut self) -> Option<BinlogPosition> {
        self.stop_profile();
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "relay exit: {status:?}");
        SledStore::open(&self.checkpoint_dir)
            .ok()
            .and_then(|s| s.load().ok().flatten())
    }
}

impl Drop for RelayChild {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The database's own limit for a drain: the relay's marker alone (same statements, same
/// session settings) records every PENDING row of `config`'s outbox SENT, with no stream and no
/// broker. Returns how many rows it marked.
pub async fn mark_all_sent(config: &Config) -> u64 {
    use rocketmq_outbox::checkpoint::Acknowledgements;
    use rocketmq_outbox::event::Origin;
    use rocketmq_outbox::mark::{run_marker, MarkerContext};
    use rocketmq_outbox::outbox::TableName;
    use rocketmq_outbox::send::{Completion, SendOutcome};
    use std::sync::Arc;
    let pool = rocketmq_outbox::db::writer_pool(config).await.unwrap();
    let ids: Vec<u64> = pool
        .get_conn()
        .await
        .unwrap()
        .query(format!(
            "SELECT id FROM outbox_event WHERE status = {PENDING} ORDER BY id"
        ))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(2048);
    let rule = MarkerContext::new("bench");
    // Streamed events (marked PENDING or SENDING → SENT, as in a CDC drain), each acknowledged
    // to one open transaction once recorded.
    let acks = Acknowledgements::new(BinlogPosition::default());
    let transaction = acks.begin();
    let stop = tokio_util::sync::CancellationToken::new();
    let marker = tokio::spawn(run_marker(pool.clone(), rx, rule, stop));
    let table = Arc::new(TableName::parse("outbox_event").unwrap());
    for id in ids {
        let completion = Completion {
            origin: Origin::Stream(acks.event(transaction)),
            table: Arc::clone(&table),
            id,
            event_id: String::new(),
            outcome: SendOutcome::Sent {
                msg_id: format!("7F00000100002A9F{id:016X}"),
            },
            stamps: Default::default(),
        };
        tx.send(completion).await.unwrap();
    }
    drop(tx);
    let stats = marker.await.unwrap().expect("marking");
    pool.disconnect().await.unwrap();
    stats.sent
}
