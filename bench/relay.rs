//! End-to-end benchmark of the CDC relay on this machine: real MariaDB, real RocketMQ broker.
//!
//!     cargo bench --bench relay                 # defaults: 100k backlog, rates 1000 and 5000/s
//!     cargo bench --bench relay -- --backlog 200000 --rates 1000,5000,10000 --seconds 10
//!
//! 1. Drain: a backlog of 1 KiB events over 10k keys, written while the relay is stopped, then
//!    drained: events/s until every row is SENT.
//! 2. Latency: writers commit at a fixed rate; commit→SEND_OK per event = broker store time of
//!    the message − the millisecond the writer's COMMIT returned (both on this machine's clock).
//!
//! Prints a markdown table for the README.

#![recursion_limit = "256"] // the RocketMQ client futures are deeply nested

use mysql_async::prelude::*;
use mysql_async::TxOpts;
use outbox_relay::binlog::BinlogPosition;
use outbox_relay::checkpoint::{CheckpointStore, SledStore};
use outbox_relay::config::Config;
use outbox_relay::devenv::{scratch_dir, MariaDb, MariaDbOptions, RocketMq, TopicReader};
use outbox_relay::producer::{NewEvent, Outbox, Payload};
use outbox_relay::relay::{RelayHandle, RunOptions};
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

struct Args {
    backlog: usize,
    rates: Vec<usize>,
    seconds: u64,
}

fn parse_args() -> Args {
    let mut args = Args {
        backlog: 100_000,
        rates: vec![1000, 5000],
        seconds: 10,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--backlog" => args.backlog = value().parse().expect("--backlog N"),
            "--rates" => {
                args.rates = value()
                    .split(',')
                    .map(|r| r.parse().expect("--rates A,B"))
                    .collect()
            }
            "--seconds" => args.seconds = value().parse().expect("--seconds N"),
            "--bench" => {}
            other => panic!("unknown flag {other}; see bench/relay.rs"),
        }
    }
    args
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn payload(n: usize) -> Payload {
    // ~1 KiB of JSON.
    Payload::raw(format!("{{\"n\":{n},\"pad\":\"{}\"}}", "x".repeat(1000)))
}

async fn gtid_now(pool: &mysql_async::Pool) -> BinlogPosition {
    let gtid: String = pool
        .get_conn()
        .await
        .unwrap()
        .query_first("SELECT @@GLOBAL.gtid_binlog_pos")
        .await
        .unwrap()
        .unwrap_or_default();
    BinlogPosition {
        mariadb_gtid: Some(gtid.parse().unwrap()),
        ..BinlogPosition::default()
    }
}

async fn sent_count(pool: &mysql_async::Pool, topic: &str) -> u64 {
    pool.get_conn()
        .await
        .unwrap()
        .exec_first(
            "SELECT COUNT(*) FROM outbox_event WHERE status = 2 AND topic = ?",
            (topic,),
        )
        .await
        .unwrap()
        .unwrap_or_default()
}

/// Runs the relay from `start` until `expected` rows of `topic` are SENT; returns the time taken.
async fn relay_until(
    config: &Config,
    start: &BinlogPosition,
    pool: &mysql_async::Pool,
    topic: &str,
    expected: u64,
) -> Duration {
    let mut config = config.clone();
    config.relay.checkpoint_dir = scratch_dir("bench-checkpoint").unwrap();
    SledStore::open(&config.relay.checkpoint_dir)
        .unwrap()
        .save(start)
        .unwrap();
    let began = Instant::now();
    let relay = RelayHandle::spawn(&config, RunOptions::default(), CancellationToken::new())
        .await
        .unwrap();
    let mut last_report = Instant::now();
    loop {
        let sent = sent_count(pool, topic).await;
        if sent >= expected {
            break;
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            eprintln!("  ... {sent}/{expected} SENT");
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = began.elapsed();
    relay.stop().await.unwrap();
    elapsed
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank]
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = parse_args();
    eprintln!("starting MariaDB and RocketMQ ...");
    let mariadb =
        MariaDb::start(MariaDbOptions::new(scratch_dir("bench-mariadb").unwrap())).unwrap();
    let rocketmq = RocketMq::start(&scratch_dir("bench-rocketmq").unwrap()).unwrap();
    let url = mariadb.create_database("bench").unwrap();
    let mut config = Config::default();
    config.mysql.url = Some(url);
    config.rocketmq.namesrv_addr = Some(rocketmq.namesrv_addr());
    config.relay.shards = 8;
    let pool = outbox_relay::db::pool(&config).unwrap();
    outbox_relay::schema::migrate(&mut pool.get_conn().await.unwrap(), &config.outbox_tables())
        .await
        .unwrap();
    let outbox = Outbox::default();

    // 1. Drain.
    let topic = "bench_drain";
    rocketmq.create_topic(topic, 8).unwrap();
    let start = gtid_now(&pool).await;
    eprintln!(
        "writing a backlog of {} events (1 KiB, 10k keys) ...",
        args.backlog
    );
    let written = Instant::now();
    for chunk in (0..args.backlog).collect::<Vec<_>>().chunks(1000) {
        let mut tx = pool.start_transaction(TxOpts::default()).await.unwrap();
        let events = chunk
            .iter()
            .map(|&n| NewEvent::new(topic, format!("key-{}", n % 10_000), payload(n)))
            .collect();
        outbox.enqueue_batch(&mut tx, events).await.unwrap();
        tx.commit().await.unwrap();
    }
    eprintln!(
        "  written in {:.1} s; draining with the relay ...",
        written.elapsed().as_secs_f64()
    );
    let drain = relay_until(&config, &start, &pool, topic, args.backlog as u64).await;
    let drain_rate = args.backlog as f64 / drain.as_secs_f64();

    // 2. Latency at fixed rates.
    let mut rows = Vec::new();
    for &rate in &args.rates {
        let topic = format!("bench_rate_{rate}");
        rocketmq.create_topic(&topic, 8).unwrap();
        let start = gtid_now(&pool).await;
        let total = rate * args.seconds as usize;
        eprintln!("latency at {rate} events/s for {} s ...", args.seconds);
        let relay = {
            let (config, pool, topic) = (config.clone(), pool.clone(), topic.clone());
            tokio::spawn(
                async move { relay_until(&config, &start, &pool, &topic, total as u64).await },
            )
        };
        tokio::time::sleep(Duration::from_secs(2)).await; // the relay connects
                                                          // Commit every 10 ms a transaction of rate/100 events.
        let per_tick = (rate / 100).max(1);
        let mut committed_at: HashMap<String, i64> = HashMap::with_capacity(total);
        let mut ticker = tokio::time::interval(Duration::from_millis(10));
        let mut n = 0;
        while n < total {
            ticker.tick().await;
            let mut tx = pool.start_transaction(TxOpts::default()).await.unwrap();
            let events = (n..(n + per_tick).min(total))
                .map(|i| NewEvent::new(topic.as_str(), format!("key-{}", i % 10_000), payload(i)))
                .collect();
            let ids = outbox.enqueue_batch(&mut tx, events).await.unwrap();
            tx.commit().await.unwrap();
            let at = now_ms();
            n += ids.len();
            committed_at.extend(ids.into_iter().map(|id| (String::from(id), at)));
        }
        relay.await.unwrap();
        let mut reader = TopicReader::new(&rocketmq.namesrv_addr(), &topic)
            .await
            .unwrap();
        let messages = reader
            .read_at_least(total, Duration::from_secs(120))
            .await
            .unwrap();
        reader.close().await;
        let mut latencies: Vec<i64> = messages
            .iter()
            .filter_map(|m| {
                committed_at
                    .get(&m.properties["event_id"])
                    .map(|c| m.store_timestamp - c)
            })
            .collect();
        latencies.sort_unstable();
        rows.push((
            rate,
            percentile(&latencies, 50.0),
            percentile(&latencies, 95.0),
            percentile(&latencies, 99.0),
            *latencies.last().unwrap_or(&0),
        ));
    }

    println!(
        "\n## outbox-relay benchmark (CDC mode, {} cores)\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    println!("| measurement | result |\n| --- | --- |");
    println!(
        "| drain of {} × 1 KiB events, 10k keys, 8 shards | {:.0} events/s ({:.1} s) |",
        args.backlog,
        drain_rate,
        drain.as_secs_f64()
    );
    println!(
        "| peak RSS of the bench process (relay + writer) | {:.0} MiB |",
        peak_rss_mib()
    );
    println!("\n| rate (events/s) | commit→SEND_OK p50 | p95 | p99 | max |\n| --- | --- | --- | --- | --- |");
    for (rate, p50, p95, p99, max) in rows {
        println!("| {rate} | {p50} ms | {p95} ms | {p99} ms | {max} ms |");
    }
}
