//! End-to-end benchmark on this machine: a real database (MariaDB, or Oracle MySQL with
//! `OUTBOX_TEST_DB=mysql`), a real RocketMQ broker (Apache RocketMQ 5.x, or rocketmq-rust with
//! `OUTBOX_BROKER=rust`), the relay as a child process (`outbox-relay run`, release build), all
//! in one run on the same data shape (1 KiB JSON payloads over 10k keys):
//!
//!     cargo bench --bench relay                       # defaults below
//!     cargo bench --bench relay -- --peers            # and Debezium Server and Canal beside it
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
//!    timestamp − the millisecond the writer's COMMIT returned (same clock). Each fixed rate runs
//!    twice back to back, sweeper off and sweeper on (the defaults). CDC steps up past the fixed
//!    rates until a rate is not sustained; poll runs the fixed rates and CDC's highest.
//! 4. With `--peers`: the same drain (a backlog of its own, written while it is stopped) for
//!    the relay with its sweeper on and for each peer, Debezium Server (see [`debezium`]) and
//!    Canal (see [`canal`]), the fixed rates for each peer, then the ratios of the relay to each.
//!
//! Flags: `--backlog N` (200000) `--rates A,B` (500,1000,5000) `--steps C,D,..`
//! (7500,10000,12500,15000,20000,25000,30000; "" for none) `--seconds S` (10) `--shards N` (8)
//! `--poll-batch N` (100) `--poll-interval-ms N` (500) `--singles N` (3000) `--out DIR`
//! (bench/results) `--no-poll` (CDC only) `--peers` (Debezium, Canal and the sweeper's drain too)
//! `--cost-seconds S` (10; 0 skips the writer-cost runs) `--cost-writers N` (4) `--cost-rates
//! A,B` (1000,5000: writer-cost runs at those fixed rates too) `--rate-writers N` (8: the
//! connections the fixed-rate writers commit from, one event per transaction);
//! `BENCH_SENT_COLUMNS=nullable` makes `msg_id` and `sent_at` NULL until SENT (the form before
//! the in-place SENT mark) in every database of the run. `BENCH_PERF="-F 999 -g"` runs `perf record` on the
//! relay during each drain and latency run (`perf.data` in its run directory; `BENCH_PERF_ALL=1`:
//! the whole machine). Writes `results.md` and `latency.svg` there and prints the report.

#![recursion_limit = "256"] // the RocketMQ client futures are deeply nested

mod canal;
mod ceiling;
mod cost;
mod counters;
mod debezium;
mod goals;
mod peer;
mod peers;
mod procs;
mod report;
mod runs;
mod stages;
mod workload;

use ceiling::Sample;
use outbox_devenv::{scratch_dir, BrokerKind, Database, DatabaseKind, SqlServer};
use outbox_devenv::{RocketMq, RocketMqOptions};
use procs::Watched;
use report::{MarkCeiling, Report};
use rocketmq_outbox::config::Config;
use runs::{Bench, System};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use workload::Pace;

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
    peers: bool,
    cost_seconds: u64,
    cost_writers: usize,
    cost_rates: Vec<usize>,
    rate_writers: usize,
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
        rates: vec![500, 1000, 5000],
        steps: vec![7500, 10_000, 12_500, 15_000, 20_000, 25_000, 30_000],
        seconds: 10,
        shards: 8,
        poll_batch: 100,
        poll_interval_ms: 500,
        singles: 3000,
        poll: true,
        peers: false,
        cost_seconds: 10,
        cost_writers: 4,
        cost_rates: vec![1000, 5000],
        rate_writers: 8,
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
            "--peers" => args.peers = true,
            "--cost-seconds" => args.cost_seconds = value().parse().expect("--cost-seconds N"),
            "--cost-writers" => args.cost_writers = value().parse().expect("--cost-writers N"),
            "--cost-rates" => args.cost_rates = list(&value()),
            "--rate-writers" => args.rate_writers = value().parse().expect("--rate-writers N"),
            "--bench" => {}
            other => panic!("unknown flag {other}; see bench/relay.rs"),
        }
    }
    args
}

pub fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((p / 100.0) * (sorted.len() - 1) as f64).round() as usize]
}

/// The pids of the servers, by role (found by command line).
fn watch_servers(
    database: &Database,
    db_role: &'static str,
    rocketmq: &RocketMq,
    root: &str,
) -> Watched {
    let mut watched = Watched::default();
    let port = format!("--port={}", database.port());
    watched
        .pids
        .insert(db_role, procs::pids_matching(&[db_role, &port]));
    let (broker, namesrv) = match rocketmq.kind() {
        BrokerKind::Apache => ("BrokerStartup", "NamesrvStartup"),
        BrokerKind::Rust => ("rocketmq-broker-rust", "rocketmq-namesrv-rust"),
    };
    watched
        .pids
        .insert("broker", procs::pids_matching(&[broker, root]));
    watched
        .pids
        .insert("namesrv", procs::pids_matching(&[namesrv, root]));
    watched
        .pids
        .insert("bench (writer, reader, client)", vec![std::process::id()]);
    for (role, pids) in &watched.pids {
        assert!(!pids.is_empty(), "no process found for {role}");
    }
    watched
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = parse_args();
    eprintln!("relay binary: {}", workload::relay_binary().display());
    let load_before = procs::load_average();
    let db_kind = DatabaseKind::from_env().unwrap();
    // Fetched before the servers start: the first time Debezium downloads ~780 MB and Canal is
    // built from source.
    let debezium_home = args.peers.then(debezium::install);
    let canal_home = args.peers.then(canal::install);
    eprintln!(
        "starting {} and RocketMQ ... (load average {load_before})",
        db_kind.name()
    );
    let database_dir = scratch_dir("bench-database").unwrap();
    let database = Database::start(db_kind, &database_dir).unwrap();
    let rocketmq_dir = scratch_dir("bench-rocketmq").unwrap();
    let options = RocketMqOptions {
        auto_create_topics: false,
        ..RocketMqOptions::default()
    };
    let rocketmq = RocketMq::start_with(&rocketmq_dir, options).unwrap();
    let mut config = Config::default();
    config.rocketmq.namesrv_addr = Some(rocketmq.namesrv_addr());
    config.relay.shards = args.shards;
    config.mysql.heartbeat = Duration::from_secs(1);
    config.poll.batch_size = args.poll_batch;
    config.poll.interval = Duration::from_millis(args.poll_interval_ms);
    let db_role = match db_kind {
        DatabaseKind::MariaDb => "mariadbd",
        DatabaseKind::MySql => "mysqld",
    };
    let watched = watch_servers(
        &database,
        db_role,
        &rocketmq,
        rocketmq_dir.to_str().unwrap(),
    );
    if args.peers {
        canal::create_account(&database);
    }
    let relays_dir = scratch_dir("bench-relays").unwrap();
    let versions = versions(&database, &rocketmq, args.peers).await;
    let bench = Bench {
        rocketmq,
        database,
        config,
        watched,
        dir: relays_dir.clone(),
        debezium_home,
        canal_home,
        rate_writers: args.rate_writers,
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

    // 2. Drain: CDC, then (rows reset to PENDING) poll, of the same rows; with peers, the
    // relay with its sweeper and each peer drain a backlog of their own.
    let backlog = bench.backlog(System::Cdc, args.backlog).await;
    let mut drains = vec![bench.drain(System::Cdc, &backlog).await];
    eprintln!("  cdc: {:.0} events/s", drains[0].rate());
    if args.poll {
        eprintln!("resetting the rows to PENDING; poll drain ...");
        workload::reset_to_pending(&backlog.pool).await;
        drains.push(bench.drain(System::Poll, &backlog).await);
        eprintln!("  poll: {:.0} events/s", drains[1].rate());
    }
    if args.peers {
        for system in std::iter::once(System::CdcSweeper).chain(runs::PEERS) {
            let own = bench.backlog(system, args.backlog).await;
            let result = bench.drain(system, &own).await;
            eprintln!("  {}: {:.0} events/s", system.label(), result.stored_rate());
            drains.push(result);
            own.pool.disconnect().await.unwrap();
        }
    }
    // The database's side of a drain: the same rows marked SENT by the relay's marker alone.
    workload::reset_to_pending(&backlog.pool).await;
    eprintln!("database ceiling: the relay's marker alone marks the rows SENT ...");
    let before = bench.watched.sample();
    let marking = Instant::now();
    let mut mark_config = bench.config.clone();
    mark_config.mysql.url = Some(backlog.url.clone());
    let marked = workload::mark_all_sent(&mark_config).await;
    let marking = MarkCeiling {
        rows: marked,
        secs: marking.elapsed().as_secs_f64(),
        split: before.until(&bench.watched.sample(), marking.elapsed().as_secs_f64()),
    };
    eprintln!("  {:.0} rows/s", marking.rate());
    backlog.pool.disconnect().await.unwrap();

    // 3. Latency at fixed rates; CDC steps up until a rate is not sustained.
    let mut latencies = Vec::new();
    let mut highest = None;
    for (i, &rate) in args.rates.iter().chain(&args.steps).enumerate() {
        let result = latency_run(&bench, System::Cdc, rate, args.seconds).await;
        let sustained = result.sustained;
        if sustained {
            highest = Some(rate);
        }
        latencies.push(result);
        // At the fixed rates the relay runs again as users run it (its sweeper on), right after
        // the sweeper-off run so that both meet the same machine.
        if i < args.rates.len() {
            latencies.push(latency_run(&bench, System::CdcSweeper, rate, args.seconds).await);
        }
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
        let result = latency_run(&bench, System::Poll, rate, args.seconds).await;
        let sustained = result.sustained;
        latencies.push(result);
        if !sustained {
            break;
        }
    }
    // 4. The peers at the fixed rates.
    if args.peers {
        for &rate in &args.rates {
            for system in runs::PEERS {
                latencies.push(latency_run(&bench, system, rate, args.seconds).await);
            }
        }
    }

    // 5. What the relay costs the writers beside it (see `cost`).
    let mut costs = Vec::new();
    if args.cost_seconds > 0 {
        let flat_out = [
            (None, false, Pace::FlatOut),
            (Some(System::Cdc), false, Pace::FlatOut),
            (Some(System::CdcSweeper), false, Pace::FlatOut),
            (Some(System::CdcSweeper), true, Pace::FlatOut),
        ];
        let at_rates = (args.cost_rates.iter()).flat_map(|&rate| {
            [None, Some(System::CdcSweeper)].map(|system| (system, false, Pace::Rate(rate)))
        });
        for (system, full_row_image, pace) in flat_out.into_iter().chain(at_rates) {
            let writers = match pace {
                Pace::Rate(_) => args.rate_writers,
                Pace::FlatOut => args.cost_writers,
            };
            let seconds = args.cost_seconds;
            let result = (bench.writer_cost(system, full_row_image, writers, pace, seconds)).await;
            eprintln!(
                "writer cost, {}: {:.0} commits/s, database {:.1} µs/event, binlog {:.0} B/event",
                result.label(),
                result.commit_rate,
                result.database_cpu_us,
                result.binlog_bytes
            );
            costs.push(result);
        }
    }

    let report = Report {
        machine: procs::machine_description(),
        versions,
        load_before,
        load_after: procs::load_average(),
        settings: format!(
            "backlog {}, {} s per rate, fixed rates from {} connections (one event per \
             transaction, commits spread evenly), relay.shards {}, poll.interval {} ms, \
             poll.batch_size {}, sweeper off unless named, 8 queues per topic, relay log level warn",
            args.backlog,
            args.seconds,
            args.rate_writers,
            args.shards,
            args.poll_interval_ms,
            args.poll_batch
        ),
        database_role: db_role,
        ceiling: &ceiling,
        marking: &marking,
        drains: &drains,
        latencies: &latencies,
        costs: &costs,
    };
    let mut markdown = report.markdown();
    goals::write(&report, &mut markdown);
    report.peers(&mut markdown);
    std::fs::create_dir_all(&args.out).unwrap();
    std::fs::write(args.out.join("results.md"), &markdown).unwrap();
    std::fs::write(args.out.join("latency.svg"), report.svg()).unwrap();
    println!("\n{markdown}");
    eprintln!("written to {}", args.out.display());
    // The servers' data (~10 GB after a full run) is of no use once they stop; left behind it
    // fills the disk, and a broker on a fuller disk refuses sends.
    drop(bench);
    for dir in [database_dir, rocketmq_dir, relays_dir] {
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            eprintln!("could not remove {}: {e}", dir.display());
        }
    }
}

async fn latency_run(
    bench: &Bench,
    system: System,
    rate: usize,
    seconds: u64,
) -> runs::LatencyResult {
    eprintln!(
        "latency, {}, {rate} events/s for {seconds} s ...",
        system.label()
    );
    let result = bench.latency(system, rate, seconds).await;
    eprintln!(
        "  p50 {} p99 {} max {} ms, committed {:.0}/s, sustained {}",
        result.p50, result.p99, result.max, result.achieved, result.sustained
    );
    result
}

/// The software measured: database and broker versions, Java, Debezium.
async fn versions(database: &Database, rocketmq: &RocketMq, peers: bool) -> String {
    let url = database.url("mysql");
    let pool = mysql_async::Pool::new(url.as_str());
    let version: String = mysql_async::prelude::Queryable::query_first(
        &mut pool.get_conn().await.unwrap(),
        "SELECT VERSION()",
    )
    .await
    .unwrap()
    .unwrap_or_default();
    pool.disconnect().await.unwrap();
    let broker = match rocketmq.kind() {
        BrokerKind::Apache => format!(
            "Apache RocketMQ {}",
            outbox_devenv::rocketmq::apache::APACHE_ROCKETMQ_VERSION
        ),
        BrokerKind::Rust => "rocketmq-rust".to_string(),
    };
    let mut text = format!(
        "outbox-relay {}, {} {version}, {broker} (broker heap 384 MiB, as in the tests)",
        env!("CARGO_PKG_VERSION"),
        database.kind().name(),
    );
    if peers {
        text += &format!(
            ", Debezium Server {} on {}",
            debezium::DEBEZIUM_VERSION,
            debezium::java_version()
        );
        if let Some(extra) = debezium::extra_properties() {
            text += &format!(" with {}", extra.replace('\n', ", "));
        }
        text += &format!(
            ", Canal {} (built from source) on {}",
            canal::CANAL_VERSION,
            canal::java_version()
        );
    }
    text
}
