//! The latency run: writers at a fixed commit rate (one event per transaction, commits spread
//! evenly over several connections, as an application's requests arrive), each event's latency read from the
//! broker's store (its store timestamp minus the writer's commit time).

use super::{keep_trace, Bench, System};
use crate::procs::{self, CpuSplit};
use crate::stages::StageSplit;
use crate::workload;
use std::time::{Duration, Instant};

impl Bench {
    /// One latency run: `system` started on a database of its own, then a writer at `rate` for
    /// `seconds`. (Poll mode's claim scans past SENT rows, so rows of earlier runs would slow
    /// it down; see the README.)
    pub async fn latency(&self, system: System, rate: usize, seconds: u64) -> LatencyResult {
        let label = system.label();
        let topic = format!("bench_{}_{rate}", system.slug());
        let (pool, url) = self.database(&topic).await;
        let pool = &pool;
        let start = workload::gtid_now(pool).await;
        let mut running = self.spawn(system, &url, &topic, &format!("rate-{topic}"), &start);
        let watched = self.watch(&running, system.role());
        let mut stored = self.stored(system, &topic).await;
        let probes = Self::probe(pool, &topic, &mut stored, &mut running).await;
        running.start_profile();
        let before = watched.sample();
        let began = Instant::now();
        let pace = workload::Pace::Rate(rate);
        let written = workload::write_paced(pool, &topic, self.rate_writers, pace, seconds).await;
        let total = written.committed_at.len();
        let mut progress = workload::Progress::new();
        loop {
            let count = stored.events().await.unwrap_or(0);
            let left = (total as u64 + probes).saturating_sub(count);
            let relay_done = system.is_peer() || !workload::any_unfinished(pool).await;
            if left == 0 && relay_done {
                break;
            }
            if progress.due() {
                progress.observe(left, &running.log_path());
            }
            running.check_alive();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let tail_ms = written.last_commit.elapsed().as_secs_f64() * 1000.0;
        let split = before.until(&watched.sample(), began.elapsed().as_secs_f64());
        let rss_mib = procs::peak_rss_mib(running.pid());
        let trace = running.stage_trace();
        running.stop();
        keep_trace(trace.as_deref(), &topic);
        stored.close().await;
        // Every event is stored: read every message the topic holds.
        let mut reader = self.reader(&topic).await;
        let messages = reader.stored_count().await.unwrap() as usize;
        let messages = reader
            .read_at_least(messages, Duration::from_secs(300))
            .await
            .unwrap();
        reader.close().await;
        let events: Vec<(String, i64)> = messages
            .iter()
            .flat_map(|m| {
                let ids = system.event_ids(m);
                ids.into_iter().map(|id| (id, m.store_timestamp))
            })
            .collect();
        let stored_ms = events.iter().map(|(id, at)| (id.as_str(), *at)).collect();
        let stages = trace.and_then(|t| StageSplit::read(&t, &written.committed_at, &stored_ms));
        let mut latencies: Vec<i64> = events
            .iter()
            .filter_map(|(id, at)| Some(at - written.committed_at.get(id)? / 1000))
            .collect();
        assert!(
            latencies.len() >= total,
            "{label}: only {} of {total} events found in the stored messages",
            latencies.len()
        );
        latencies.sort_unstable();
        let poll_slack = if system == System::Poll {
            self.config.poll.interval.as_secs_f64() * 1000.0
        } else {
            0.0
        };
        let percentile = |p| crate::percentile(&latencies, p);
        LatencyResult {
            mode: label,
            rate,
            achieved: written.achieved_rate,
            p50: percentile(50.0),
            p95: percentile(95.0),
            p99: percentile(99.0),
            max: latencies.last().copied().unwrap_or(0),
            tail_ms,
            sustained: written.achieved_rate >= 0.95 * rate as f64 && tail_ms < 2000.0 + poll_slack,
            cpu_us_per_event: split.of(system.role()) * 1e6 / total as f64,
            rss_mib,
            split,
            stages,
        }
    }
}

/// What a latency run measured (rendered by `report`).
pub struct LatencyResult {
    pub mode: &'static str,
    pub rate: usize,
    pub achieved: f64,
    pub p50: i64,
    pub p95: i64,
    pub p99: i64,
    pub max: i64,
    /// Last commit → last row SENT.
    pub tail_ms: f64,
    pub sustained: bool,
    /// CPU of the system's process per event.
    pub cpu_us_per_event: f64,
    pub rss_mib: f64,
    pub split: CpuSplit,
    /// Where the latency went (relay runs).
    pub stages: Option<crate::stages::StageSplit>,
}
