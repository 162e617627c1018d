//! Where the latency goes: the relay's stage trace (`OUTBOX_STAGE_TRACE`, one line per SENT event:
//! read, dispatched, sent, SEND_OK and marked, µs since the epoch) joined with the writer's commit
//! times and the broker's store timestamps (ms), as percentiles of each step.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;
use std::path::Path;

/// The steps of one event, in order, with the names the report prints.
pub const STEPS: [&str; 6] = [
    "commit → binlog read",
    "binlog read → dispatched",
    "dispatched → sent (queued)",
    "sent → stored (broker clock, ms)",
    "stored → SEND_OK",
    "SEND_OK → marked SENT",
];
const N: usize = STEPS.len();

/// The split of one latency run: per step, the sorted durations (µs) of every traced event.
pub struct StageSplit {
    /// `steps[i]`: durations of [`STEPS`]`[i]`, sorted.
    steps: Vec<Vec<i64>>,
    /// commit → SEND_OK of each event (µs, relay clock), sorted.
    total: Vec<i64>,
    /// The mean of each step over the events whose commit → SEND_OK is at or above its p99.
    slowest: [f64; N],
    pub events: usize,
    /// Send requests (distinct "sent" moments: the events of one batch share theirs).
    pub sends: usize,
    /// SENT UPDATEs (distinct "marked" moments).
    pub marks: usize,
}

impl StageSplit {
    /// Reads the trace at `path` and joins it with `committed_us` (event id → µs its COMMIT
    /// returned) and `stored_ms` (event id → the broker's store timestamp). `None` when the file
    /// is missing or holds none of the events.
    pub fn read(
        path: &Path,
        committed_us: &HashMap<String, i64>,
        stored_ms: &HashMap<&str, i64>,
    ) -> Option<Self> {
        let text = std::fs::read_to_string(path).ok()?;
        let mut rows: Vec<([i64; N], i64)> = Vec::new();
        let (mut sends, mut marks) = (HashSet::new(), HashSet::new());
        for line in text.lines() {
            let mut fields = line.split(' ');
            let Some(id) = fields.next() else { continue };
            let (Some(&commit), Some(&stored)) = (committed_us.get(id), stored_ms.get(id)) else {
                continue;
            };
            let moments: Vec<i64> = fields.filter_map(|f| f.parse().ok()).collect();
            let [read, dispatched, sent, ack, marked] = moments[..] else {
                continue;
            };
            sends.insert(sent);
            marks.insert(marked);
            // The store timestamp has ms resolution: within the ms of the send, or after.
            let stored = (stored * 1000).clamp(sent, ack.max(sent));
            let all = [commit, read, dispatched, sent, stored, ack, marked];
            let steps: [i64; N] = std::array::from_fn(|i| (all[i + 1] - all[i]).max(0));
            rows.push((steps, ack - commit));
        }
        if rows.is_empty() {
            return None;
        }
        let mut total: Vec<i64> = rows.iter().map(|(_, t)| *t).collect();
        total.sort_unstable();
        let p99 = crate::percentile(&total, 99.0);
        let tail: Vec<&[i64; N]> = rows
            .iter()
            .filter(|(_, t)| *t >= p99)
            .map(|(s, _)| s)
            .collect();
        let slowest = std::array::from_fn(|i| {
            tail.iter().map(|s| s[i] as f64).sum::<f64>() / tail.len().max(1) as f64
        });
        let steps = (0..N)
            .map(|i| {
                let mut v: Vec<i64> = rows.iter().map(|(s, _)| s[i]).collect();
                v.sort_unstable();
                v
            })
            .collect();
        Some(StageSplit {
            steps,
            total,
            slowest,
            events: rows.len(),
            sends: sends.len(),
            marks: marks.len(),
        })
    }

    /// Percentile `p` of commit → SEND_OK in ms (µs resolution, the relay's and the writer's
    /// clock: one machine).
    pub fn total_ms(&self, p: f64) -> f64 {
        crate::percentile(&self.total, p) as f64 / 1000.0
    }

    /// Percentile `p` of step `i` in ms.
    pub fn step_ms(&self, i: usize, p: f64) -> f64 {
        crate::percentile(&self.steps[i], p) as f64 / 1000.0
    }

    /// The markdown table: one row per step and for the total, p50 / p95 / p99 / max, and the
    /// mean split of the slowest 1 %.
    pub fn table(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "| step | p50 | p95 | p99 | max | mean in the slowest 1 % |\n| --- | --- | --- | --- | --- | --- |"
        );
        let ms = |us: i64| us as f64 / 1000.0;
        let row = |s: &mut String, name: &str, sorted: &[i64], slow: f64| {
            let _ = writeln!(
                s,
                "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                ms(crate::percentile(sorted, 50.0)),
                ms(crate::percentile(sorted, 95.0)),
                ms(crate::percentile(sorted, 99.0)),
                ms(*sorted.last().unwrap_or(&0)),
                slow / 1000.0
            );
        };
        for (i, name) in STEPS.iter().enumerate() {
            row(s, name, &self.steps[i], self.slowest[i]);
        }
        let slow_total: f64 = self.slowest[..N - 1].iter().sum();
        row(s, "**commit → SEND_OK**", &self.total, slow_total);
    }
}
