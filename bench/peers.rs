//! The peer section of the report: the relay beside Debezium Server on the same backlog and
//! the same fixed rates, the four goals as ratios of one run (met / not met), and what
//! recording rows SENT costs the relay (Debezium records nothing in the outbox table).

use crate::report::{verdict, Report};
use crate::runs::{DrainResult, LatencyResult};
use std::fmt::Write as _;

/// The systems of the comparison, as the report names them.
const ROWS: [(&str, &str); 3] = [
    ("cdc", "outbox-relay: stream, marks SENT"),
    ("cdc+sweeper", "outbox-relay: stream + sweeper (defaults)"),
    ("debezium", "Debezium Server: outbox router, RocketMQ sink"),
];

/// A cost goal: its words, its limit (relay ÷ Debezium), the unit, the value of a drain.
type Cost = (&'static str, f64, &'static str, fn(&DrainResult) -> f64);

impl Report<'_> {
    fn drain_of(&self, system: &str) -> Option<&DrainResult> {
        self.drains.iter().find(|d| d.mode == system)
    }

    fn latency_of(&self, system: &str, rate: usize) -> Option<&LatencyResult> {
        self.latencies
            .iter()
            .find(|l| l.mode == system && l.rate == rate)
    }

    /// The peer table and ratios; nothing when Debezium did not run.
    pub fn peers(&self, s: &mut String) {
        let (Some(relay), Some(peer)) = (self.drain_of("cdc"), self.drain_of("debezium")) else {
            return;
        };
        let mut rates: Vec<usize> = self
            .latencies
            .iter()
            .filter(|l| l.mode == "debezium")
            .map(|l| l.rate)
            .collect();
        rates.sort_unstable();
        let _ = writeln!(s, "\n### Peer: Debezium Server beside the relay\n");
        let _ = writeln!(
            s,
            "Each system drains a backlog of {} events of its own, written while it was \
             stopped, from the same database server to an 8-queue topic of its own on the same \
             broker; then each runs the same fixed commit rates. Rates are read from the broker \
             (the topic's stored count, polled every 20 ms), latencies from its store \
             timestamps. Debezium's settings: `bench/debezium/application.properties`.\n",
            relay.events
        );
        let mut header = String::from(
            "| system | drain events/s (start → last stored) | first → last stored | CPU µs/event | peak RSS | database CPU µs/event | resent |",
        );
        let mut rule = String::from("| --- | --- | --- | --- | --- | --- | --- |");
        for rate in &rates {
            let _ = write!(header, " p50 / p95 / p99 / max at {rate}/s |");
            rule.push_str(" --- |");
        }
        let _ = writeln!(s, "{header}\n{rule}");
        for (system, name) in ROWS {
            let Some(d) = self.drain_of(system) else {
                continue;
            };
            let _ = write!(
                s,
                "| {name} | {:.0} ({:.1} s) | {:.0} | {:.1} | {:.0} MiB | {:.1} | {} |",
                d.stored_rate(),
                d.secs_stored,
                d.events as f64 / (d.secs_stored - d.secs_first_stored),
                d.cpu_us_per_event,
                d.rss_mib,
                d.database_cpu_us_per_event,
                d.duplicates
            );
            for &rate in &rates {
                match self.latency_of(system, rate) {
                    Some(l) => {
                        let _ = write!(s, " {} / {} / {} / {} ms |", l.p50, l.p95, l.p99, l.max);
                    }
                    None => s.push_str(" — |"),
                }
            }
            s.push('\n');
        }

        let _ = writeln!(s, "\n#### Goals (ratios of this run)\n");
        let _ = writeln!(s, "| goal | measured | verdict |\n| --- | --- | --- |");
        let with_sweeper = |value: &dyn Fn(&DrainResult) -> f64| {
            self.drain_of("cdc+sweeper")
                .map(|d| format!(" (with the sweeper {:.2}×)", value(d)))
                .unwrap_or_default()
        };
        let drain = |d: &DrainResult| d.stored_rate() / peer.stored_rate();
        let _ = writeln!(
            s,
            "| relay drain ≥ 2× Debezium's | {:.0} / {:.0} = {:.2}×{} | {} |",
            relay.stored_rate(),
            peer.stored_rate(),
            drain(relay),
            with_sweeper(&drain),
            verdict(drain(relay) >= 2.0)
        );
        if let (Some(ours), Some(theirs)) = (
            self.latency_of("cdc", 5000),
            self.latency_of("debezium", 5000),
        ) {
            let ratio = ours.p99 as f64 / theirs.p99.max(1) as f64;
            let _ = writeln!(
                s,
                "| relay p99 at 5k/s ≤ 1/10 of Debezium's | {} ms / {} ms = {:.2}× | {} |",
                ours.p99,
                theirs.p99,
                ratio,
                verdict(ratio <= 0.1)
            );
        }
        // Per event and at peak, over the drain: the goal's name, its limit, the unit, a value.
        let costs: [Cost; 2] = [
            ("CPU per event ≤ 1/3", 1.0 / 3.0, "µs", |d| {
                d.cpu_us_per_event
            }),
            ("peak RSS ≤ 1/5", 0.2, "MiB", |d| d.rss_mib),
        ];
        for (goal, limit, unit, value) in costs {
            let ratio = |d: &DrainResult| value(d) / value(peer);
            let _ = writeln!(
                s,
                "| relay {goal} of Debezium's (drain) | {:.1} / {:.1} {unit} = {:.2}×{} | {} |",
                value(relay),
                value(peer),
                ratio(relay),
                with_sweeper(&ratio),
                verdict(ratio(relay) <= limit)
            );
        }
        let _ = writeln!(
            s,
            "\n**What recording SENT costs the relay.** Debezium writes nothing to the outbox \
             table; the relay records each event SENT with its broker msg_id. In its drain the \
             broker held the last event after {:.1} s and the last row was SENT after {:.1} s. \
             The database server spent {:.1} µs of CPU per event during the relay's drain and \
             {:.1} µs during Debezium's (binlog reading alone); the difference, {:.1} µs, is \
             the marker's UPDATEs and their binlog. The marker alone, with no stream and no \
             broker, marks {:.0} rows/s (database ceiling above).",
            relay.secs_stored,
            relay.secs,
            relay.database_cpu_us_per_event,
            peer.database_cpu_us_per_event,
            relay.database_cpu_us_per_event - peer.database_cpu_us_per_event,
            self.marking.rate()
        );
        let _ = writeln!(
            s,
            "\nCPU during the peer runs (seconds, % of one core; {} is the database server):\n",
            self.database_role
        );
        for d in self.drains.iter().filter(|d| d.mode != "poll") {
            let _ = writeln!(s, "- drain, {}: {}", d.mode, d.split.describe());
        }
    }
}
