//! What the relay costs the database its application shares: writers commit single-event
//! transactions for a while, at a fixed rate (spread evenly) or as fast as they can, once with no
//! relay and once with the relay running beside them (CDC, with and without its sweeper). Each
//! run measures the commit rate
//! the writers sustained, the database server's CPU per event and the binlog bytes per event,
//! counted until the relay has recorded every event SENT: the difference between a run with the
//! relay and the run without is what the relay adds.

use crate::counters::{self, Counters};
use crate::procs::CpuSplit;
use crate::runs::{Bench, System};
use crate::workload::{self, Pace, RelayChild};
use mysql_async::prelude::*;
use std::time::{Duration, Instant};

/// One writer-cost run.
#[derive(Debug, Clone)]
pub struct CostResult {
    /// `None`: the writers alone.
    pub system: Option<System>,
    /// The relay logged its own updates with the server's full row image (as without the
    /// session privilege `relay.minimal_row_image` needs).
    pub full_row_image: bool,
    pub pace: Pace,
    /// The connections the writers committed from.
    pub writers: usize,
    pub events: usize,
    /// Commits per second while the writers ran (one event each).
    pub commit_rate: f64,
    /// Database server CPU per event, until every event was SENT.
    pub database_cpu_us: f64,
    /// Binlog bytes per event, until every event was SENT.
    pub binlog_bytes: f64,
    /// The relay's own CPU per event (0 without a relay).
    pub relay_cpu_us: f64,
    pub split: CpuSplit,
    /// The server's counters per event (see [`crate::counters`]).
    pub counters: Vec<(&'static str, f64)>,
}

impl CostResult {
    pub fn label(&self) -> String {
        let system = match self.system {
            None => "no relay".to_string(),
            Some(system) if self.full_row_image => format!("{} (full row image)", system.label()),
            Some(system) => system.label().to_string(),
        };
        match self.pace {
            Pace::Rate(rate) => format!("{system} at {rate}/s"),
            Pace::FlatOut => system,
        }
    }
}

/// The binlog's total size on the server now (`SHOW BINARY LOGS`).
async fn binlog_bytes(pool: &mysql_async::Pool) -> u64 {
    let mut conn = pool.get_conn().await.unwrap();
    let logs: Vec<mysql_async::Row> = conn.query("SHOW BINARY LOGS").await.unwrap();
    logs.iter()
        .map(|row| row.get::<u64, _>(1).unwrap_or(0))
        .sum()
}

impl Bench {
    /// One writer-cost run on a database of its own: the writers alone (`system` `None`) or
    /// beside `system`, which is streaming before the writers start (with the server's row
    /// image for its own updates if `full_row_image`).
    pub async fn writer_cost(
        &self,
        system: Option<System>,
        full_row_image: bool,
        writers: usize,
        pace: Pace,
        seconds: u64,
    ) -> CostResult {
        let slug = system.map_or("none", System::slug);
        let image = if full_row_image { "_full" } else { "" };
        let rate = match pace {
            Pace::Rate(rate) => format!("_{rate}"),
            Pace::FlatOut => String::new(),
        };
        let topic = format!("bench_cost_{slug}{image}{rate}");
        let (pool, url) = self.database(&topic).await;
        let start = workload::gtid_now(&pool).await;
        let relay = system.map(|system| {
            let mut config = self.config_for(&url, system);
            config.relay.minimal_row_image = !full_row_image;
            RelayChild::spawn(&config, &self.dir, &topic, Some(&start))
        });
        let mut watched = self.watched.clone();
        if let Some(relay) = &relay {
            watched.pids.insert("relay", vec![relay.pid()]);
        }
        if relay.is_some() {
            // Streaming before the writers start: one event through, then every row SENT.
            workload::write_backlog(&pool, &topic, 1).await;
            let deadline = Instant::now() + Duration::from_secs(120);
            while workload::any_unfinished(&pool).await {
                assert!(
                    Instant::now() < deadline,
                    "the relay sent nothing within 120 s"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let (bytes_before, before) = (binlog_bytes(&pool).await, watched.sample());
        let counted = Counters::read(&pool).await;
        let began = Instant::now();
        let events = (workload::write_paced(&pool, &topic, writers, pace, seconds).await)
            .committed_at
            .len();
        let commit_rate = events as f64 / began.elapsed().as_secs_f64();
        if relay.is_some() {
            let deadline = Instant::now() + Duration::from_secs(300);
            while workload::any_unfinished(&pool).await {
                assert!(
                    Instant::now() < deadline,
                    "the relay left rows unsent for 300 s"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let split = before.until(&watched.sample(), began.elapsed().as_secs_f64());
        let bytes = binlog_bytes(&pool).await - bytes_before;
        let counters = counted.per_event(&Counters::read(&pool).await, events);
        if let Some(relay) = relay {
            relay.stop();
        }
        pool.disconnect().await.unwrap();
        let per_event = |seconds: f64| seconds * 1e6 / events.max(1) as f64;
        CostResult {
            system,
            full_row_image,
            pace,
            writers,
            events,
            commit_rate,
            database_cpu_us: per_event(split.of(self.database_role())),
            binlog_bytes: bytes as f64 / events.max(1) as f64,
            relay_cpu_us: per_event(split.of("relay")),
            split,
            counters,
        }
    }
}

/// The writers' commit rate with the relay (sweeper on) at least this share of theirs alone.
const RATE_WITH_RELAY: f64 = 0.8;
/// Binlog bytes the relay adds per event at most this share of the INSERT's own.
const BINLOG_ADDED: f64 = 0.25;

/// Database CPU the relay adds per event at most this share of the application's INSERT's, at
/// fixed rates of single-event transactions.
const DATABASE_ADDED: f64 = 0.5;

/// The run without a relay at `run`'s pace.
fn alone_of<'a>(costs: &'a [CostResult], run: &CostResult) -> Option<&'a CostResult> {
    (costs.iter()).find(|c| c.system.is_none() && c.pace == run.pace)
}

/// The run without a relay, and `label`'s run.
fn pair<'a>(costs: &'a [CostResult], label: &str) -> Option<(&'a CostResult, &'a CostResult)> {
    let with = costs.iter().find(|c| c.label() == label)?;
    Some((alone_of(costs, with)?, with))
}

/// The report's section: one row per run, and what each relay adds per event.
pub fn write_section(costs: &[CostResult], database: &str, s: &mut String) {
    use std::fmt::Write as _;
    if costs.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\n### What the relay costs the application's writers\n\nWriters commit \
         one-event transactions (the latency runs' events), at a fixed rate spread evenly (\"at \
         N/s\") or as fast as they can, alone and with the relay streaming beside them; CPU and \
         binlog are counted until every event is SENT. \"Added\" is the run's figure less the \
         writers' alone at the same pace.\n\n\
         | run | writers | events | commits/s | × alone | {database} CPU µs/event | added | binlog B/event | added | relay CPU µs/event |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for c in costs {
        let Some(alone) = alone_of(costs, c) else {
            continue;
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.0} | {:.2}× | {:.1} | {:.1} | {:.0} | {:.0} | {:.1} |",
            c.label(),
            c.writers,
            c.events,
            c.commit_rate,
            c.commit_rate / alone.commit_rate,
            c.database_cpu_us,
            c.database_cpu_us - alone.database_cpu_us,
            c.binlog_bytes,
            c.binlog_bytes - alone.binlog_bytes,
            c.relay_cpu_us
        );
    }
    let _ = writeln!(s, "\nCPU during each run:\n");
    for c in costs {
        let _ = writeln!(s, "- {}: {}", c.label(), c.split.describe());
    }
    let runs: Vec<_> = (costs.iter())
        .map(|c| (c.label(), c.counters.clone()))
        .collect();
    let _ = writeln!(
        s,
        "\nThe database's work per event in each run (its `SHOW GLOBAL STATUS` counters):\n\n{}",
        counters::table(&runs)
    );
}

/// The goals rows (goal, measured, met) of the writer-cost runs.
pub fn goals(costs: &[CostResult]) -> Vec<(String, String, bool)> {
    let mut rows = Vec::new();
    let defaults =
        (costs.iter()).filter(|c| c.system == Some(System::CdcSweeper) && !c.full_row_image);
    for with in defaults {
        // The fixed-rate runs: not at saturation, or it measures contention for the cores
        // rather than the relay.
        let (Pace::Rate(rate), Some(alone)) = (with.pace, alone_of(costs, with)) else {
            continue;
        };
        let added = with.database_cpu_us - alone.database_cpu_us;
        let ratio = added / alone.database_cpu_us;
        let reached = |c: &CostResult| c.commit_rate >= 0.95 * rate as f64;
        let saturated = match reached(alone) && reached(with) {
            true => String::new(),
            false => format!(
                " (saturated, not a verdict: the writers committed {:.0}/s alone, {:.0}/s \
                 beside the relay)",
                alone.commit_rate, with.commit_rate
            ),
        };
        rows.push((
            format!(
                "database CPU the relay adds per event ≤ {DATABASE_ADDED}× the INSERT's ({})",
                with.label()
            ),
            format!(
                "{added:.1} / {:.1} µs = {ratio:.2}×{saturated}",
                alone.database_cpu_us
            ),
            ratio <= DATABASE_ADDED && saturated.is_empty(),
        ));
    }
    if let Some((alone, with)) = pair(costs, System::CdcSweeper.label()) {
        let ratio = with.commit_rate / alone.commit_rate;
        rows.push((
            format!("writers' commit rate with the relay (defaults) ≥ {RATE_WITH_RELAY}× alone"),
            format!(
                "{:.0} / {:.0} = {ratio:.2}×",
                with.commit_rate, alone.commit_rate
            ),
            ratio >= RATE_WITH_RELAY,
        ));
    }
    for label in [
        System::CdcSweeper.label().to_string(),
        format!("{} (full row image)", System::CdcSweeper.label()),
    ] {
        if let Some((alone, with)) = pair(costs, &label) {
            let ratio = (with.binlog_bytes - alone.binlog_bytes) / alone.binlog_bytes;
            rows.push((
                format!("binlog the relay adds per event ≤ {BINLOG_ADDED}× the INSERT's ({label})"),
                format!(
                    "{:.0} / {:.0} B = {ratio:.2}×",
                    with.binlog_bytes - alone.binlog_bytes,
                    alone.binlog_bytes
                ),
                ratio <= BINLOG_ADDED,
            ));
        }
    }
    rows
}
