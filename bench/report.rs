//! The results: a markdown report (tables, ratios against the targets, CPU split) and an SVG
//! chart of commit→SEND_OK latency against the committed rate, both modes.

use crate::ceiling::Ceiling;
use crate::procs::CpuSplit;
use crate::runs::{DrainResult, LatencyResult};
use std::fmt::Write as _;

/// A chart line: mode, label, colour, the value plotted.
type Series = (
    &'static str,
    &'static str,
    &'static str,
    fn(&LatencyResult) -> i64,
);

/// The database's limit for a drain: the relay's marker alone marking every row SENT.
pub struct MarkCeiling {
    pub rows: u64,
    pub secs: f64,
    pub split: CpuSplit,
}

impl MarkCeiling {
    pub fn rate(&self) -> f64 {
        self.rows as f64 / self.secs
    }
}

pub struct Report<'a> {
    pub machine: String,
    /// The software measured, with versions.
    pub versions: String,
    pub load_before: String,
    pub load_after: String,
    pub settings: String,
    /// The database server's role in the CPU split (`mariadbd` or `mysqld`).
    pub database_role: &'static str,
    pub ceiling: &'a Ceiling,
    pub marking: &'a MarkCeiling,
    pub drains: &'a [DrainResult],
    pub latencies: &'a [LatencyResult],
    pub costs: &'a [crate::cost::CostResult],
}

/// How a goal's row ends: met or not met.
pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "**met**"
    } else {
        "**not met**"
    }
}

impl Report<'_> {
    /// The drain of `system` (its label), if it ran.
    pub fn drain_of(&self, system: &str) -> Option<&DrainResult> {
        self.drains.iter().find(|d| d.mode == system)
    }

    /// The latency run of `system` (its label) at `rate`, if it ran.
    pub fn latency_of(&self, system: &str, rate: usize) -> Option<&LatencyResult> {
        self.latencies
            .iter()
            .find(|l| l.mode == system && l.rate == rate)
    }

    /// The measurements, up to the cost section; the goals (`goals::write`) and the peers
    /// (`Report::peers`) follow it in `results.md`.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let c = self.ceiling;
        let _ = writeln!(s, "## outbox-relay benchmark\n");
        let _ = writeln!(
            s,
            "Machine: {}. Load average before {}, after {}.",
            self.machine, self.load_before, self.load_after
        );
        let _ = writeln!(s, "Software: {}.", self.versions);
        let _ = writeln!(s, "Settings: {}.\n", self.settings);
        let _ = writeln!(
            s,
            "### Broker ceiling (RocketMQ Rust client alone, same messages)\n"
        );
        let _ = writeln!(s, "| send pattern | msg/s | latency |\n| --- | --- | --- |");
        let _ = writeln!(
            s,
            "| sync single sends, one at a time ({}) | {:.0} | p50 {:.2} ms, p99 {:.2} ms; client CPU {:.0} µs per send |",
            c.single_count, c.single_rate, c.single_p50_ms, c.single_p99_ms, c.single_cpu_us
        );
        let _ = writeln!(
            s,
            "| batches of 100, one in flight ({}) | {:.0} | |",
            c.batch_count, c.batch_rate
        );
        let _ = writeln!(
            s,
            "| batches of 100, one stream per queue (8) | {:.0} | |",
            c.batch_parallel_rate
        );
        let _ = writeln!(
            s,
            "\nBatches refused by the broker (busy, sent again after 10 ms): {}.\n",
            c.refused
        );

        let m = self.marking;
        let _ = writeln!(
            s,
            "### Database ceiling (the relay's SENT marker alone, same rows)\n\n\
             Every drain must record each event SENT: the relay's marker, fed the ids with no \
             stream and no broker, marks {} rows in {:.1} s = **{:.0} rows/s**. CPU: {}.\n",
            m.rows,
            m.secs,
            m.rate(),
            m.split.describe()
        );
        let _ = writeln!(
            s,
            "### Drain of a backlog (relay = `outbox-relay run` child process)\n"
        );
        let _ = writeln!(s, "| system | events | events/s (start → done) | events/s (first → last stored) | stop | CPU µs/event | database CPU µs/event | peak RSS | resent | checkpoint past last event |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        for d in self.drains {
            let _ = writeln!(
                s,
                "| {} | {} | {:.0} ({:.1} s) | {:.0} | {:.2} s | {:.1} | {:.1} | {:.0} MiB | {} | {} |",
                d.mode,
                d.events,
                d.rate(),
                d.secs,
                d.events as f64 / (d.secs_stored - d.secs_first_stored),
                d.stop_secs,
                d.cpu_us_per_event,
                d.database_cpu_us_per_event,
                d.rss_mib,
                d.duplicates,
                match d.checkpoint_ok {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "n/a",
                }
            );
        }
        let _ = writeln!(
            s,
            "\nDone: every row SENT for the relay; every event stored on the broker for Debezium \
             (it records nothing in the table). Resent: messages stored beyond one per event."
        );
        let _ = writeln!(
            s,
            "\nCPU during each drain (seconds of CPU, % of one core over the drain):\n"
        );
        for d in self.drains {
            let _ = writeln!(
                s,
                "- {}: {}{}",
                d.mode,
                d.split.describe(),
                if d.failed > 0 {
                    format!(" — {} rows FAILED", d.failed)
                } else {
                    String::new()
                }
            );
        }

        let runs: Vec<_> = (self.drains.iter())
            .map(|d| (d.mode.to_string(), d.counters.clone()))
            .collect();
        let _ = writeln!(
            s,
            "\nThe database's work per event in each drain (its `SHOW GLOBAL STATUS` counters):\n\n{}",
            crate::counters::table(&runs)
        );

        let _ = writeln!(s, "\n### Commit → SEND_OK latency at fixed commit rates\n");
        let _ = writeln!(s, "| system | target rate | committed rate | p50 | p95 | p99 | max | last commit → done | sustained | CPU µs/event | RSS |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        for l in self.latencies {
            let _ = writeln!(s, "| {} | {} | {:.0} | {} ms | {} ms | {} ms | {} ms | {:.0} ms | {} | {:.1} | {:.0} MiB |",
                l.mode, l.rate, l.achieved, l.p50, l.p95, l.p99, l.max, l.tail_ms,
                if l.sustained { "yes" } else { "no" }, l.cpu_us_per_event, l.rss_mib);
        }
        let _ = writeln!(s, "\nCPU during each latency run:\n");
        for l in self.latencies {
            let _ = writeln!(s, "- {} {}/s: {}", l.mode, l.rate, l.split.describe());
        }

        self.stages(&mut s);
        crate::cost::write_section(self.costs, self.database_role, &mut s);
        s
    }

    /// Where the relay's latency goes: the p99 of each step for every relay run, and the whole
    /// split of CDC at 5k/s.
    fn stages(&self, s: &mut String) {
        let traced: Vec<_> = self
            .latencies
            .iter()
            .filter_map(|l| Some((l, l.stages.as_ref()?)))
            .collect();
        if traced.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "\n### Where the latency goes (relay stage trace)\n\nEach SENT event's moments, from \
             `OUTBOX_STAGE_TRACE` (relay clock, µs), joined with the moment its COMMIT returned to \
             the writer (same machine clock). A binlog read may come before COMMIT returns: that \
             step then counts 0.\n\np99 of each step (ms):\n"
        );
        let _ = write!(s, "| system | rate |");
        for step in crate::stages::STEPS {
            let _ = write!(s, " {step} |");
        }
        let _ = writeln!(
            s,
            " events | events per send | events per SENT UPDATE |\n|{}",
            " --- |".repeat(crate::stages::STEPS.len() + 5)
        );
        for (l, split) in &traced {
            let _ = write!(s, "| {} | {} |", l.mode, l.rate);
            for i in 0..crate::stages::STEPS.len() {
                let _ = write!(s, " {:.2} |", split.step_ms(i, 99.0));
            }
            let per = |n: usize| split.events as f64 / n.max(1) as f64;
            let _ = writeln!(
                s,
                " {} | {:.1} | {:.1} |",
                split.events,
                per(split.sends),
                per(split.marks)
            );
        }
        for (l, split) in traced
            .iter()
            .filter(|(l, _)| l.mode == "cdc" && l.rate == 5000)
        {
            let _ = writeln!(s, "\n{} at {}/s, every percentile (ms):\n", l.mode, l.rate);
            split.table(s);
        }
    }

    /// Latency (log scale) against committed rate: p50 and p99 of each mode.
    pub fn svg(&self) -> String {
        let (w, h, left, right, top, bottom) = (760.0, 440.0, 70.0, 170.0, 30.0, 50.0);
        let plot_w = w - left - right;
        let plot_h = h - top - bottom;
        let max_rate = self.latencies.iter().map(|l| l.rate).max().unwrap_or(1000) as f64 * 1.05;
        let (y_lo, y_hi) = (0.0f64, 4.0f64); // 1 ms .. 10 s
        let x = |rate: f64| left + plot_w * rate / max_rate;
        let y = |ms: i64| {
            let v = (ms.max(1) as f64).log10().clamp(y_lo, y_hi);
            top + plot_h * (1.0 - (v - y_lo) / (y_hi - y_lo))
        };
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="18" text-anchor="middle" font-size="14">commit → SEND_OK latency vs committed rate (log scale)</text>"#,
            left + plot_w / 2.0
        );
        for (i, label) in ["1 ms", "10 ms", "100 ms", "1 s", "10 s"]
            .iter()
            .enumerate()
        {
            let yy = top + plot_h * (1.0 - i as f64 / 4.0);
            let _ = writeln!(
                s,
                r##"<line x1="{left}" x2="{}" y1="{yy}" y2="{yy}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{label}</text>"##,
                left + plot_w,
                left - 6.0,
                yy + 4.0
            );
        }
        let step = if max_rate > 20_000.0 { 5000 } else { 2500 };
        let mut r = 0;
        while (r as f64) <= max_rate {
            let xx = x(r as f64);
            let _ = writeln!(
                s,
                r##"<line x1="{xx}" x2="{xx}" y1="{top}" y2="{}" stroke="#eee"/><text x="{xx}" y="{}" text-anchor="middle">{r}</text>"##,
                top + plot_h,
                top + plot_h + 16.0
            );
            r += step;
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">committed events/s</text>"#,
            left + plot_w / 2.0,
            h - 10.0
        );
        let _ = writeln!(
            s,
            r##"<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>"##
        );
        let series: [Series; 8] = [
            ("cdc", "CDC p50", "#1f77b4", |l| l.p50),
            ("cdc", "CDC p99", "#1f77b4", |l| l.p99),
            ("poll", "poll p50", "#d62728", |l| l.p50),
            ("poll", "poll p99", "#d62728", |l| l.p99),
            ("debezium", "Debezium p50", "#2ca02c", |l| l.p50),
            ("debezium", "Debezium p99", "#2ca02c", |l| l.p99),
            ("canal", "Canal p50", "#9467bd", |l| l.p50),
            ("canal", "Canal p99", "#9467bd", |l| l.p99),
        ];
        for (i, (mode, name, color, value)) in series.iter().enumerate() {
            let mut points: Vec<&LatencyResult> =
                self.latencies.iter().filter(|l| l.mode == *mode).collect();
            if points.is_empty() {
                continue;
            }
            points.sort_by_key(|l| l.rate);
            let dash = if i % 2 == 1 {
                r#" stroke-dasharray="6 4""#
            } else {
                ""
            };
            let coords: Vec<String> = points
                .iter()
                .map(|l| format!("{:.1},{:.1}", x(l.rate as f64), y(value(l))))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
                coords.join(" ")
            );
            for l in &points {
                let fill = if l.sustained { *color } else { "white" };
                let _ = writeln!(
                    s,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{fill}" stroke="{color}"><title>{name} at {}/s: {} ms</title></circle>"#,
                    x(l.rate as f64),
                    y(value(l)),
                    l.rate,
                    value(l)
                );
            }
            let ly = top + 20.0 + 20.0 * i as f64;
            let lx = left + plot_w + 15.0;
            let _ = writeln!(
                s,
                r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/><text x="{}" y="{}">{name}</text>"#,
                lx + 30.0,
                lx + 36.0,
                ly + 4.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" font-size="11">hollow: rate not sustained</text>"#,
            left + plot_w + 15.0,
            top + 30.0 + 20.0 * series.len() as f64
        );
        let _ = writeln!(s, "</svg>");
        s
    }
}
