//! Memory while something holds the relay back, measured on the relay process (`VmRSS`): a
//! prepared XA transaction that nobody ends while many more transactions commit, and a topic
//! that stays read-only while it is written at 200 events/s beside a healthy one. Each ends
//! with a `kill -9` and a restart that must resume delivery within 60 s.
//!
//! The suite runs short versions (30,000 transactions, 45 s stuck); the long ones (a
//! million transactions, 10 minutes stuck) are `scripts/demo-stuck-topic.sh`, which sets
//! `OUTBOX_MEMORY_TRANSACTIONS` and `OUTBOX_MEMORY_STUCK_FOR` (humantime).

use crate::common::http::free_addr;
use crate::common::process::{write_config_file, RelayProcess};
use crate::common::relay::{count_status, relay_fixture, wait_for};
use crate::common::rocketmq::new_topic;
use crate::common::TestDb;
use mysql_async::prelude::*;
use rocketmq_outbox::outbox::Status;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The most a held-back relay may grow.
const GROWTH_BOUND_MIB: f64 = 32.0;

/// The resident memory of process `pid`, MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Samples a process's RSS every second: the value once `warm` is set, and the peak after.
struct RssSampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(f64, f64)>,
}

impl RssSampler {
    fn start(pid: u32, warm: Arc<AtomicBool>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let (mut baseline, mut peak) = (None, 0.0f64);
            while !stopping.load(Ordering::SeqCst) {
                let rss = rss_mib(pid);
                if warm.load(Ordering::SeqCst) {
                    baseline.get_or_insert(rss);
                    peak = peak.max(rss);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            (baseline.unwrap_or(0.0), peak)
        });
        RssSampler { stop, task }
    }

    /// (baseline, peak) in MiB.
    async fn finish(self) -> (f64, f64) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

/// Commits `total` transactions of one event each to `topic` over 4 connections, as fast as
/// they go; sets `warm` after the first 5 % and prints progress every 10 %.
async fn write_transactions(db: &TestDb, topic: &str, total: u64, warm: &AtomicBool) {
    let written = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (db, topic, written) = (db.clone_handle(), topic.to_string(), written.clone());
            tokio::spawn(async move {
                let mut conn = db.conn().await;
                let sql = "INSERT INTO outbox_event (event_id, biz_key, topic, payload) \
                           VALUES (UUID(), ?, ?, '{}')";
                while written.fetch_add(1, Ordering::SeqCst) < total {
                    let key = format!("k{w}-{}", written.load(Ordering::Relaxed) % 100);
                    conn.exec_drop(sql, (key, &topic)).await.unwrap();
                }
            })
        })
        .collect();
    let mut reported = 0;
    while writers.iter().any(|w| !w.is_finished()) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let done = written.load(Ordering::SeqCst).min(total);
        if done * 20 >= total {
            warm.store(true, Ordering::SeqCst);
        }
        if done * 10 / total > reported {
            reported = done * 10 / total;
            let rate = done as f64 / started.elapsed().as_secs_f64();
            println!("memory: {done} of {total} transactions committed ({rate:.0}/s)");
        }
    }
    for w in writers {
        w.await.unwrap();
    }
}

/// Kills the relay (`kill -9`) and starts it again: a new event of `topic` must be SENT within
/// 60 s of the restart (delivery resumed), and every row waiting meanwhile (a stuck topic's
/// parked backlog) eventually, within 15 minutes.
async fn restart_resumes(db: &TestDb, relay: RelayProcess, file: &std::path::Path, topic: &str) {
    relay.kill();
    let log = file.with_file_name("relay-restarted.log");
    let mut relay = RelayProcess::spawn_serving(file, &free_addr(), &log, &[]);
    let restarted = Instant::now();
    let mut conn = db.conn().await;
    conn.exec_drop(
        "INSERT INTO outbox_event (event_id, biz_key, topic, payload) \
         VALUES ('after-restart', 'after', ?, '{}')",
        (topic,),
    )
    .await
    .unwrap();
    wait_for(
        "delivery resumed after the restart",
        Duration::from_secs(60),
        || async {
            let status: Option<i8> = db
                .conn()
                .await
                .query_first("SELECT status FROM outbox_event WHERE event_id = 'after-restart'")
                .await
                .unwrap();
            status == Some(Status::Sent.code())
        },
    )
    .await;
    let resumed = restarted.elapsed();
    let total = db.count("outbox_event").await;
    // At least 1,000 rows a second once it resumed (measured: 36,000 parked rows all SENT 7.4 s
    // after the restart; before the stream's look at its held keys was bounded, none moved).
    let waiting = total - count_status(db, Status::Sent).await;
    println!(
        "memory: {waiting} rows waiting when a new event was SENT {resumed:.1?} after the restart"
    );
    let deadline = Instant::now() + Duration::from_secs(60) + Duration::from_millis(waiting);
    let mut progress = Vec::new();
    loop {
        let sent = count_status(db, Status::Sent).await;
        if sent == total {
            break;
        }
        if progress
            .last()
            .is_none_or(|&(at, _): &(u64, u64)| restarted.elapsed().as_secs() >= at + 5)
        {
            progress.push((restarted.elapsed().as_secs(), total - sent));
        }
        if Instant::now() >= deadline {
            panic!(
                "not every waiting row SENT {:.1?} after the restart: {} of {total} left; \
                 (seconds after the restart, rows left) {progress:?}\n{}",
                restarted.elapsed(),
                total - sent,
                why_not_sent(db, &mut relay, &log).await
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "memory: after kill -9 and a restart a new event was SENT {resumed:.1?} later, every \
         row {:.1?} later; (seconds after the restart, rows left) {progress:?}",
        restarted.elapsed()
    );
    relay.stop();
}

/// Waits up to `timeout` until `total` rows are SENT; fails at once if the relay exits, and in
/// either case says why ([`why_not_sent`]).
async fn wait_all_sent(
    db: &TestDb,
    relay: &mut RelayProcess,
    log: &std::path::Path,
    total: u64,
    timeout: Duration,
) {
    let started = Instant::now();
    loop {
        let sent = count_status(db, Status::Sent).await;
        if sent == total {
            return;
        }
        if relay.exit_status().is_some() || started.elapsed() >= timeout {
            panic!(
                "{sent} of {total} rows SENT after {:.1?} (waiting up to {timeout:?})\n{}",
                started.elapsed(),
                why_not_sent(db, relay, log).await
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What a test that waited in vain for rows to be SENT shows: whether the relay still runs,
/// the rows left by topic, status and owner, and the relay's last warnings and errors.
async fn why_not_sent(db: &TestDb, relay: &mut RelayProcess, log: &std::path::Path) -> String {
    let left: Vec<(String, i8, Option<String>, u64, u64)> = db
        .conn()
        .await
        .exec(
            "SELECT topic, status, owner, COUNT(*), MIN(id) FROM outbox_event \
             WHERE status <> ? GROUP BY topic, status, owner",
            (Status::Sent.code(),),
        )
        .await
        .unwrap_or_default();
    let log = std::fs::read_to_string(log).unwrap_or_default();
    let mut warnings: Vec<&str> = (log.lines())
        .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
        .collect();
    let skipped = warnings.len().saturating_sub(30);
    warnings.drain(..skipped);
    format!(
        "the relay: {}\nrows left (topic, status, owner, count, lowest id): {left:?}\n\
         its last {} warnings and errors (of {}):\n{}",
        match relay.exit_status() {
            Some(status) => format!("exited, {status}"),
            None => "running".to_string(),
        },
        warnings.len(),
        warnings.len() + skipped,
        warnings.join("\n")
    )
}

/// What the relay's `/metrics` says it holds of `topic` in memory and has parked.
fn held_and_parked(metrics: &str, topic: &str) -> String {
    let body = crate::common::http::get(metrics, "/metrics").map_or(String::new(), |(_, b)| b);
    (body.lines())
        .filter(|line| line.contains(topic) && !line.starts_with('#'))
        .filter(|line| line.contains("held_events") || line.contains("parked_total"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The rows the server read from the outbox table over a stretch of the stuck-topic test, per
/// event of the healthy topic (written at [`HEALTHY_PER_SECOND`]): the relay's and its
/// sweeper's statements (the test's own queries run outside the stretch).
struct ReadsWindow {
    rows: Option<u64>,
    at: Instant,
}

/// The healthy topic's share of the stuck-topic test's load.
const HEALTHY_PER_SECOND: f64 = 200.0;

impl ReadsWindow {
    async fn open(db: &TestDb) -> Self {
        let rows = crate::common::reads::outbox_rows_read(db).await;
        ReadsWindow {
            rows,
            at: Instant::now(),
        }
    }

    /// What was read since [`ReadsWindow::open`], as a figure.
    async fn close(&self, db: &TestDb) -> String {
        let now = crate::common::reads::outbox_rows_read(db).await;
        let (Some(from), Some(to)) = (self.rows, now) else {
            return "outbox rows read: not counted by this server".into();
        };
        let seconds = self.at.elapsed().as_secs_f64();
        if seconds < 1.0 {
            return "outbox rows read: no stretch left".into();
        }
        let rows = to.saturating_sub(from);
        format!(
            "outbox rows read over {seconds:.0} s: {rows} ({:.1} per healthy event)",
            rows as f64 / (seconds * HEALTHY_PER_SECOND)
        )
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One XA branch prepared and never ended while `OUTBOX_MEMORY_TRANSACTIONS` more commit
/// (30,000 here; `scripts/demo-stuck-topic.sh` commits 1,000,000): held throughout (never
/// parked), it keeps the relay's memory flat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_xa_transaction_does_not_grow_the_relay() {
    let db = TestDb::migrated("memory_xa").await;
    let topic = new_topic("memory_xa");
    let total: u64 = env_or("OUTBOX_MEMORY_TRANSACTIONS", 30_000);
    let (mut config, dir) = relay_fixture(&db).at_current_end().await;
    // Held, not parked, however long the run: what is measured is the stream holding it.
    config.relay.park_prepared_after = Duration::from_secs(24 * 3600);
    let file = write_config_file(&config, dir.path());
    let mut relay =
        RelayProcess::spawn_serving(&file, &free_addr(), &dir.path().join("relay.log"), &[]);
    // One branch prepared and never ended meanwhile; its connection is kept (MariaDB ends a
    // prepared branch with its session).
    let mut xa = db.conn().await;
    xa.query_drop("XA START 'memory-xa'").await.unwrap();
    xa.exec_drop(
        "INSERT INTO outbox_event (event_id, biz_key, topic, payload) VALUES (UUID(), 'xa', ?, '{}')",
        (&topic,),
    )
    .await
    .unwrap();
    xa.query_drop("XA END 'memory-xa'").await.unwrap();
    xa.query_drop("XA PREPARE 'memory-xa'").await.unwrap();

    let warm = Arc::new(AtomicBool::new(false));
    let sampler = RssSampler::start(relay.pid(), Arc::clone(&warm));
    write_transactions(&db, &topic, total, &warm).await;
    let log = dir.path().join("relay.log");
    wait_all_sent(&db, &mut relay, &log, total, Duration::from_secs(900)).await;
    let (baseline, peak) = sampler.finish().await;
    println!(
        "memory: relay RSS {baseline:.1} MiB after 5 % of {total} transactions, peak {peak:.1} MiB \
         (+{:.1} MiB) with one XA branch prepared throughout",
        peak - baseline
    );
    assert!(
        peak - baseline < GROWTH_BOUND_MIB,
        "the relay grew {:.1} MiB while the XA branch was prepared",
        peak - baseline
    );
    xa.query_drop("XA COMMIT 'memory-xa'").await.unwrap();
    restart_resumes(&db, relay, &file, &topic).await;
}

/// A topic made read-only beside a healthy one, both written at 200 events/s, for
/// `OUTBOX_MEMORY_STUCK_FOR` (45 s here; `scripts/demo-stuck-topic.sh` holds it 10 min): the
/// relay's memory stays flat, the healthy topic's p99 within 2× its baseline, the checkpoint
/// mirror at most 10 s behind the server, the healthy rows only a sweeper can see SENT within
/// `sweeper.min_age` + `sweeper.interval` + 10 s; after the topic returns (and a `kill -9` and
/// restart), every event of both topics is stored, each key in commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_topic_holds_back_neither_memory_nor_the_checkpoint_nor_the_sweeper() {
    use crate::isolation::{mirror_behind, write_hidden_rows, HIDDEN_KEY};
    let db = TestDb::migrated("memory_stuck").await;
    let (stuck, healthy) = (new_topic("memory_stuck"), new_topic("memory_healthy"));
    let stuck_for = std::env::var("OUTBOX_MEMORY_STUCK_FOR")
        .ok()
        .and_then(|v| humantime::parse_duration(&v).ok())
        .unwrap_or(Duration::from_secs(45));
    let crate::isolation::ParkingRelay {
        relay,
        metrics,
        config,
        file,
        dir: _dir,
    } = crate::isolation::ParkingRelay::start(&db).await;
    let mut load =
        crate::isolation::SteadyLoad::start(&db, [stuck.clone(), healthy.clone()], 400).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    crate::isolation::set_permission(&stuck, "4");
    let fault_from = load.elapsed().await;
    // Held back once the relay looks the route up again (every 10 s) and parks (park_after);
    // then measured.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let warm = Arc::new(AtomicBool::new(true));
    let sampler = RssSampler::start(relay.pid(), warm);
    let hidden = tokio::spawn(write_hidden_rows(db.clone_handle(), healthy.clone()));
    let started = Instant::now();
    let (mut mirror_lag, mut last_report) = (0.0f64, Instant::now());
    let mut reads = ReadsWindow::open(&db).await;
    // What the key-order guard asked per stretch: the healthy topic's batches ask nothing by key.
    let asked = || {
        ["none", "gap", "keys"]
            .map(|how| crate::isolation::scraped(&metrics, "outbox_key_order_checks_total", how))
    };
    let mut asked_before = asked();
    while started.elapsed() < stuck_for {
        tokio::time::sleep(Duration::from_secs(1)).await;
        mirror_lag = mirror_lag.max(mirror_behind(&db).await);
        if last_report.elapsed() >= Duration::from_secs(30) {
            last_report = Instant::now();
            // Closed before the report's own count of the stuck topic's rows (a read of them all).
            let read = reads.close(&db).await;
            let now_asked = asked();
            let [none, gap, keys] = [0, 1, 2].map(|i| now_asked[i] - asked_before[i]);
            asked_before = now_asked;
            println!(
                "memory: {:.0?} stuck, {} rows of it waiting, relay RSS {:.1} MiB, checkpoint \
                 mirror at most {mirror_lag:.1} s behind; {}; {read}; key-order batches \
                 asked nothing {none}, a gap {gap}, by key {keys}",
                started.elapsed(),
                load.not_sent(&stuck).await,
                rss_mib(relay.pid()),
                held_and_parked(&metrics, &stuck)
            );
            reads = ReadsWindow::open(&db).await;
        }
    }
    println!("memory: to the end, {}", reads.close(&db).await);
    for (statement, rows) in crate::common::reads::rows_examined_by_statement(&db).await {
        println!("memory: rows examined over the run: {rows:>10}  {statement}");
    }
    let (baseline, peak) = sampler.finish().await;
    let fault_to = load.elapsed().await;
    assert_eq!(
        count_status(&db, Status::Failed).await,
        0,
        "an event of the stuck topic was FAILED for the topic's state"
    );
    crate::isolation::set_permission(&stuck, "6");
    load.stop().await;
    println!(
        "memory: relay RSS {baseline:.1} MiB when {stuck} stalled, peak {peak:.1} MiB (+{:.1} MiB) \
         over {stuck_for:?} of it written at 200 events/s; checkpoint mirror at most \
         {mirror_lag:.1} s behind the server",
        peak - baseline
    );
    assert!(
        peak - baseline < GROWTH_BOUND_MIB,
        "the relay grew {:.1} MiB while {stuck} was stuck",
        peak - baseline
    );
    assert!(
        mirror_lag <= 10.0,
        "the checkpoint mirror waited for the stuck topic: {mirror_lag:.1} s behind"
    );
    let bound = (config.sweeper.min_age + config.sweeper.interval).as_secs_f64() + 10.0;
    for (event_id, waited) in hidden.await.unwrap() {
        println!("memory: a healthy row only the sweeper saw, SENT after {waited:.1} s");
        assert!(
            waited <= bound,
            "row {event_id} waited {waited:.1} s (bound {bound:.1} s)"
        );
    }
    let streamed = |key: &str| !key.starts_with(HIDDEN_KEY);
    // From 5 s: the relay process starts with the load, and its first seconds are its start.
    let before = load.latencies_of(&healthy, streamed, 5.0, 10.0).await;
    let during = load
        .latencies_of(&healthy, streamed, fault_from + 20.0, fault_to)
        .await;
    crate::isolation::assert_healthy_latency_kept(&before, &during, "a topic read-only");
    restart_resumes(&db, relay, &file, &healthy).await;
    let namesrv = crate::common::rocketmq::rocketmq().namesrv_addr();
    crate::isolation::assert_delivered_in_key_order(&db, &namesrv, None, [&healthy, &stuck]).await;
}
