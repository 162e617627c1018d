//! End-to-end benchmark on this machine: real MariaDB, real RocketMQ broker, the relay as a
//! child process (`outbox-relay run`, release build), all in one run on the same data shape
//! (1 KiB JSON payloads over 10k keys):
//!
//!     cargo bench --bench relay                       # defaults below
//!     cargo bench --bench relay -- --backlog 20000 --seconds 5 --steps ""   # quick run
//!
//! 1. Broker ceiling: the same messages sent by the RocketMQ Rust client alone: synchronous
//!    single sends (msg/s, p50), batches of 100 (one in flight, and one stream per queue).
//! 2. Drain: a backlog written while no relay runs, drained in CDC mode, then (rows reset to
//!    PENDING) in poll mode: events/s until every row is SENT; CDC: the final checkpoint must
//!    cover the last event. Relay CPU (utime+stime of its process) per event, its peak RSS
//!    (VmHWM), and the CPU split between relay, mariadbd, broker, namesrv, this process and the
//!    rest of the machine.
//! 3. Latency: a writer commits at fixed rates; commit→SEND_OK per event = the broker's store
//!    timestamp − the millisecond the writer's COMMIT returned (same clock). CDC steps up past
//!    the fixed rates until a rate is not sustained; poll runs the fixed rates and CDC's highest.
//!
//! Flags: `--backlog N` (200000) `--rates A,B` (1000,5000) `--steps C,D,..`
//! (7500,10000,12500,15000,20000,25000,30000; "" for none) `--seconds S` (10) `--shards N` (8)
//! `--poll-batch N` (100) `--poll-interval-ms N` (500) `--singles N` (3000) `--out DIR`
//! (bench/results) `--no-poll` (CDC only). `BENCH_PERF="-F 999 -g"` runs `perf record` on the
//! relay during each drain and latency run (`perf.data` in its run directory). Writes `results.md` and `latency.svg` there and prints the report.

#![recursion_limit = "256"] // the RocketMQ client futures are deeply nested

mod ceiling;
mod procs;
mod report;
mod workload;

use ceiling::Sample;
use outbox_relay::config::{Config, RelayMode};
use outbox_relay::devenv::SqlServer;
use outbox_relay::devenv::{scratch_dir, MariaDb, MariaDbOptions, RocketMq, TopicReader};
use procs::Watched;
use report::{DrainResult, LatencyResult, MarkCeiling, Report};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use workload::RelayChild;

struct Args {
    backlog: usize,
    rates: Vec<usize>,
    steps: Vec<usize>,
    seconds: u64,
    shards: usize,
    poll_batch: u32,
    poll_interval_ms: u64,
    singles: usize,
    poll: bool,
    out: PathBuf,
}

fn list(text: &str) -> Vec<usize> {
    text.split(',')
        .filter(|r| !r.trim().is_empty())
        .map(|r| r.trim().parse().expect("a comma-separated list of numbers"))
        .collect()
}

fn parse_args() -> Args {
    let mut args = Args {
        backlog: 200_000,
        rates: vec![1000, 5000],
        steps: vec![7500, 10_000, 12_500, 15_000, 20_000, 25_000, 30_000],
        seconds: 10,
        shards: 8,
        poll_batch: 100,
        poll_interval_ms: 500,
        singles: 3000,
        poll: true,
        out: PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/bench/results")),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--backlog" => args.backlog = value().parse().expect("--backlog N"),
            "--rates" => args.rates = list(&value()),
            "--steps" => args.steps = list(&value()),
            "--seconds" => args.seconds = value().parse().expect("--seconds N"),
            "--shards" => args.shards = value().parse().expect("--shards N"),
            "--poll-batch" => args.poll_batch = value().parse().expect("--poll-batch N"),
            "--poll-interval-ms" => args.poll_interval_ms = value().parse().expect("ms"),
            "--singles" => args.singles = value().parse().expect("--singles N"),
            "--out" => args.out = PathBuf::from(value()),
            "--no-poll" => args.poll = false,
            "--bench" => {}
            other => panic!("unknown flag {other}; see bench/relay.rs"),
        }
    }
    args
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((p / 100.0) * (sorted.len() - 1) as f64).round() as usize]
}

/// Everything the phases share.
struct Bench {
    rocketmq: RocketMq,
    mariadb: MariaDb,
    config: Config,
    watched: Watched,
    dir: PathBuf,
}

impl Bench {
    fn watch_relay(&self, relay: &RelayChild) -> Watched {
        let mut watched = self.watched.clone();
        watched.pids.insert("relay", vec![relay.pid()]);
        watched
    }

    async fn database(&self, name: &str) -> (mysql_async::Pool, String) {
        let url = self.mariadb.create_database(name).unwrap();
        let mut config = self.config.clone();
        config.mysql.url = Some(url.clone());
        let pool = outbox_relay::db::pool(&config).unwrap();
        outbox_relay::schema::migrate(&mut pool.get_conn().await.unwrap(), &config.outbox_tables())
            .await
            .unwrap();
        (pool, url)
    }

    fn config_for(&self, pool_url: &str, mode: RelayMode) -> Config {
        let mut config = self.config.clone();
        config.mysql.url = Some(pool_url.to_string());
        config.relay.mode = mode;
        config
    }

    /// Drains every unfinished row of the database with a relay in `mode`.
    async fn drain(
        &self,
        url: &str,
        pool: &mysql_async::Pool,
        mode: RelayMode,
        start: &outbox_relay::binlog::BinlogPosition,
        end: &outbox_relay::binlog::BinlogPosition,
        events: usize,
    ) -> DrainResult {
        let config = self.config_for(url, mode);
        let label = mode_name(mode);
        let before = self.watched.sample();
        let began = Instant::now();
        let mut relay =
            RelayChild::spawn(&config, &self.dir, &format!("drain-{label}"), Some(start));
        relay.start_profile();
        let watched = self.watch_relay(&relay);
        let mut first_sent = None;
        let mut progress = workload::Progress::new();
        loop {
            if first_sent.is_none() && workload::any_with_status(pool, "2, 3").await {
                first_sent = Some(began.elapsed().as_secs_f64());
            }
            if !workload::any_unfinished(pool).await {
                break;
            }
            if let Some(left) = progress.check(pool, &relay.log_path()).await {
                eprintln!("  ... {label}: {left} rows left");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let secs = began.elapsed().as_secs_f64();
        let after = watched.sample();
        let split = before.until(&after, secs);
        let relay_rss_mib = procs::peak_rss_mib(relay.pid());
        let stopping = Instant::now();
        let checkpoint = relay.stop();
        let stop_secs = stopping.elapsed().as_secs_f64();
        DrainResult {
            mode: label,
            events,
            secs,
            secs_from_first: secs - first_sent.unwrap_or(0.0),
            stop_secs,
            relay_cpu_us_per_event: split.of("relay") * 1e6 / events as f64,
            relay_rss_mib,
            split,
            checkpoint_ok: (mode == RelayMode::Cdc)
                .then(|| checkpoint.is_some_and(|c| c.covers(end))),
            failed: workload::failed(pool).await,
        }
    }

    /// One latency run: a relay in `mode`, a writer at `rate` for `seconds`.
    /// Each run has a database of its own: poll mode's claim scans past SENT rows, so rows left
    /// by earlier runs would slow it down (see the README).
    async fn latency(&self, mode: RelayMode, rate: usize, seconds: u64) -> LatencyResult {
        let label = mode_name(mode);
        let topic = format!("bench_{label}_{rate}");
        self.rocketmq.create_topic(&topic, 8).unwrap();
        let (pool, url) = self.database(&format!("bench_{label}_{rate}")).await;
        let (pool, url) = (&pool, url.as_str());
        let config = self.config_for(url, mode);
        let start = workload::gtid_now(pool).await;
        let mut relay = RelayChild::spawn(
            &config,
            &self.dir,
            &format!("rate-{label}-{rate}"),
            Some(&start),
        );
        let watched = self.watch_relay(&relay);
        // A probe event: the relay is connected and sending once it is SENT.
        workload::write_backlog(pool, &topic, 1).await;
        let waiting = Instant::now();
        while workload::any_unfinished(pool).await {
            assert!(
                waiting.elapsed() < Duration::from_secs(60),
                "relay did not start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        relay.start_profile();
        let before = watched.sample();
        let began = Instant::now();
        let written = workload::write_at_rate(pool, &topic, rate, seconds).await;
        let mut progress = workload::Progress::new();
        while workload::any_unfinished(pool).await {
            progress.check(pool, &relay.log_path()).await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let tail_ms = written.last_commit.elapsed().as_secs_f64() * 1000.0;
        let after = watched.sample();
        let split = before.until(&after, began.elapsed().as_secs_f64());
        let relay_rss_mib = procs::peak_rss_mib(relay.pid());
        relay.stop();
        let total = written.committed_at.len();
        let mut reader = TopicReader::new(&self.rocketmq.namesrv_addr(), &topic)
            .await
            .unwrap();
        let messages = reader
            .read_at_least(total + 1, Duration::from_secs(300))
            .await
            .unwrap();
        reader.close().await;
        let mut latencies: Vec<i64> = messages
            .iter()
            .filter_map(|m| {
                let committed = written.committed_at.get(&m.properties["event_id"])?;
                Some(m.store_timestamp - committed)
            })
            .collect();
        latencies.sort_unstable();
        let poll_slack = if mode == RelayMode::Poll {
            self.config.poll.interval.as_secs_f64() * 1000.0
        } else {
            0.0
        };
        LatencyResult {
            mode: label,
            rate,
            achieved: written.achieved_rate,
            p50: percentile(&latencies, 50.0),
            p95: percentile(&latencies, 95.0),
            p99: percentile(&latencies, 99.0),
            max: latencies.last().copied().unwrap_or(0),
            tail_ms,
            sustained: written.achieved_rate >= 0.95 * rate as f64 && tail_ms < 2000.0 + poll_slack,
            relay_cpu_us_per_event: split.of("relay") * 1e6 / total as f64,
            relay_rss_mib,
            split,
        }
    }
}

fn mode_name(mode: RelayMode) -> &'static str {
    match mode {
        RelayMode::Cdc => "cdc",
        RelayMode::Poll => "poll",
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = parse_args();
    let load_before = procs::load_average();
    eprintln!("starting MariaDB and RocketMQ ... (load average {load_before})");
    let mariadb_dir = scratch_dir("bench-mariadb").unwrap();
    let mariadb = MariaDb::start(MariaDbOptions::new(mariadb_dir.clone())).unwrap();
    let rocketmq_dir = scratch_dir("bench-rocketmq").unwrap();
    let rocketmq = RocketMq::start(&rocketmq_dir).unwrap();
    let mut config = Config::default();
    config.rocketmq.namesrv_addr = Some(rocketmq.namesrv_addr());
    config.relay.shards = args.shards;
    config.mysql.heartbeat = Duration::from_secs(1);
    // The stream alone: a sweeper looking for rows PENDING > 30 s would race the drain of a
    // backlog written long before (the relay would send those rows twice).
    config.sweeper.enabled = false;
    config.poll.batch_size = args.poll_batch;
    config.poll.interval = Duration::from_millis(args.poll_interval_ms);
    let mut watched = Watched::default();
    let find = |bin: &str, dir: &PathBuf| procs::pids_matching(&[bin, dir.to_str().unwrap()]);
    watched
        .pids
        .insert("mariadbd", find("mariadbd", &mariadb_dir));
    watched
        .pids
        .insert("broker", find("rocketmq-broker-rust", &rocketmq_dir));
    watched
        .pids
        .insert("namesrv", find("rocketmq-namesrv-rust", &rocketmq_dir));
    watched
        .pids
        .insert("bench (writer, reader, client)", vec![std::process::id()]);
    for (role, pids) in &watched.pids {
        assert!(!pids.is_empty(), "no process found for {role}");
    }
    let relays_dir = scratch_dir("bench-relays").unwrap();
    let bench = Bench {
        rocketmq,
        mariadb,
        config,
        watched,
        dir: relays_dir.clone(),
    };

    // 1. Broker ceiling.
    eprintln!(
        "broker ceiling: {} single sends, {} in batches ...",
        args.singles, args.backlog
    );
    bench.rocketmq.create_topic("bench_ceiling", 8).unwrap();
    let samples: Vec<Sample> = (0..args.backlog)
        .map(|n| Sample {
            key: workload::key(n),
            event_id: uuid::Uuid::now_v7().to_string(),
            body: Arc::new(workload::payload_text(n)),
        })
        .collect();
    let ceiling = ceiling::measure(
        &bench.rocketmq.namesrv_addr(),
        "bench_ceiling",
        samples,
        args.singles,
    )
    .await;
    eprintln!("  {ceiling:?}");

    // 2. Drain, CDC then poll, of the same rows.
    let (pool, url) = bench.database("bench_drain").await;
    bench.rocketmq.create_topic("bench_drain", 8).unwrap();
    let start = workload::gtid_now(&pool).await;
    eprintln!("writing a backlog of {} events ...", args.backlog);
    let writing = Instant::now();
    workload::write_backlog(&pool, "bench_drain", args.backlog).await;
    let end = workload::gtid_now(&pool).await;
    eprintln!(
        "  written in {:.1} s; CDC drain ...",
        writing.elapsed().as_secs_f64()
    );
    let mut drains = vec![
        bench
            .drain(&url, &pool, RelayMode::Cdc, &start, &end, args.backlog)
            .await,
    ];
    eprintln!("  {:.0} events/s", drains[0].rate());
    if args.poll {
        eprintln!("resetting the rows to PENDING; poll drain ...");
        workload::reset_to_pending(&pool).await;
        drains.push(
            bench
                .drain(&url, &pool, RelayMode::Poll, &start, &end, args.backlog)
                .await,
        );
        eprintln!("  poll: {:.0} events/s", drains[1].rate());
    }
    // The database's side of a drain: the same rows marked SENT by the relay's marker alone.
    workload::reset_to_pending(&pool).await;
    eprintln!("database ceiling: the relay's marker alone marks the rows SENT ...");
    let before = bench.watched.sample();
    let marking = Instant::now();
    let marked = workload::mark_all_sent(&bench.config_for(&url, RelayMode::Cdc)).await;
    let marking = MarkCeiling {
        rows: marked,
        secs: marking.elapsed().as_secs_f64(),
        split: before.until(&bench.watched.sample(), marking.elapsed().as_secs_f64()),
    };
    eprintln!("  {:.0} rows/s", marking.rate());
    pool.disconnect().await.unwrap();

    // 3. Latency at fixed rates; CDC steps up until a rate is not sustained.
    let mut latencies = Vec::new();
    let mut highest = None;
    for (i, &rate) in args.rates.iter().chain(&args.steps).enumerate() {
        eprintln!("latency, CDC, {rate} events/s for {} s ...", args.seconds);
        let result = bench.latency(RelayMode::Cdc, rate, args.seconds).await;
        eprintln!(
            "  p50 {} p99 {} max {} ms, committed {:.0}/s, sustained {}",
            result.p50, result.p99, result.max, result.achieved, result.sustained
        );
        let sustained = result.sustained;
        if sustained {
            highest = Some(rate);
        }
        latencies.push(result);
        if !sustained && i >= args.rates.len() {
            break;
        }
    }
    let mut poll_rates = if args.poll {
        args.rates.clone()
    } else {
        Vec::new()
    };
    if let Some(h) = highest.filter(|h| args.poll && !poll_rates.contains(h)) {
        poll_rates.push(h);
    }
    // Poll mode stops after the first rate it does not sustain (a growing backlog drains slowly).
    for rate in poll_rates {
        eprintln!("latency, poll, {rate} events/s for {} s ...", args.seconds);
        let result = bench.latency(RelayMode::Poll, rate, args.seconds).await;
        eprintln!(
            "  p50 {} p99 {} max {} ms, sustained {}",
            result.p50, result.p99, result.max, result.sustained
        );
        let sustained = result.sustained;
        latencies.push(result);
        if !sustained {
            break;
        }
    }

    let report = Report {
        machine: procs::machine_description(),
        load_before,
        load_after: procs::load_average(),
        settings: format!(
            "backlog {}, {} s per rate, relay.shards {}, poll.interval {} ms, poll.batch_size {}, \
             sweeper off, 8 queues per topic, relay log level warn",
            args.backlog, args.seconds, args.shards, args.poll_interval_ms, args.poll_batch
        ),
        ceiling: &ceiling,
        marking: &marking,
        drains: &drains,
        latencies: &latencies,
    };
    let markdown = report.markdown();
    std::fs::create_dir_all(&args.out).unwrap();
    std::fs::write(args.out.join("results.md"), &markdown).unwrap();
    std::fs::write(args.out.join("latency.svg"), report.svg()).unwrap();
    println!("\n{markdown}");
    eprintln!("written to {}", args.out.display());
    // The servers' data (~10 GB after a full run) is of no use once they stop; left behind it
    // fills the disk, and a broker on a fuller disk refuses sends.
    drop(bench);
    for dir in [mariadb_dir, rocketmq_dir, relays_dir] {
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            eprintln!("could not remove {}: {e}", dir.display());
        }
    }
}
