//! The peer section of the report: the relay beside each peer (Debezium Server, Canal) on the
//! same backlog and the same fixed rates, the four goals as ratios of one run against each peer
//! (met / not met), what recording rows SENT costs the relay (no peer records anything in the
//! outbox table), and what the peers do not do that the relay does.

use crate::report::{verdict, Report};
use crate::runs::{DrainResult, PEERS};
use std::fmt::Write as _;

/// The systems of the comparison, as the report names them.
const ROWS: [(&str, &str); 4] = [
    ("cdc", "outbox-relay: stream, marks SENT"),
    ("cdc+sweeper", "outbox-relay: stream + sweeper (defaults)"),
    ("debezium", "Debezium Server: outbox router, RocketMQ sink"),
    ("canal", "Canal: MQ mode, flat JSON rows"),
];

/// The name of a peer in the goals' words.
fn peer_name(peer: &str) -> &'static str {
    match peer {
        "debezium" => "Debezium",
        _ => "Canal",
    }
}

/// A cost goal: its words, its limit (relay ÷ peer), the unit, the value of a drain.
type Cost = (&'static str, f64, &'static str, fn(&DrainResult) -> f64);

impl Report<'_> {
    /// The peers that drained, with their drains.
    fn peer_drains(&self) -> Vec<(&'static str, &DrainResult)> {
        PEERS
            .iter()
            .filter_map(|p| Some((p.label(), self.drain_of(p.label())?)))
            .collect()
    }

    /// The peer table and ratios; nothing when no peer ran.
    pub fn peers(&self, s: &mut String) {
        let peers = self.peer_drains();
        let Some(relay) = self.drain_of("cdc").filter(|_| !peers.is_empty()) else {
            return;
        };
        let mut rates: Vec<usize> = self
            .latencies
            .iter()
            .filter(|l| peers.iter().any(|(p, _)| l.mode == *p))
            .map(|l| l.rate)
            .collect();
        rates.sort_unstable();
        rates.dedup();
        let names: Vec<&str> = peers.iter().map(|(p, _)| peer_name(p)).collect();
        let _ = writeln!(s, "\n### Peers: {} beside the relay\n", names.join(" and "));
        let _ = writeln!(
            s,
            "Each system drains a backlog of {} events of its own, written while it was \
             stopped, from the same database server to an 8-queue topic of its own on the same \
             broker; then each runs the same fixed commit rates. Rates are read from the broker \
             (the topic's stored count, polled every 20 ms; for Canal, whose messages carry \
             several rows each, the rows of the messages read so far), latencies from its store \
             timestamps. The peers' settings: `bench/debezium/application.properties`, \
             `bench/canal/*.properties`.\n",
            relay.events
        );
        self.peer_table(s, &rates);

        let _ = writeln!(s, "\n#### Goals (ratios of this run)\n");
        let _ = writeln!(s, "| goal | measured | verdict |\n| --- | --- | --- |");
        for &(peer, drain) in &peers {
            self.goals_against(s, relay, peer, drain);
        }

        let database_cpu: Vec<String> = peers
            .iter()
            .map(|(p, d)| {
                format!(
                    "{:.1} µs during {}'s (binlog reading alone; the difference, {:.1} µs, is \
                     the marker's UPDATEs and their binlog)",
                    d.database_cpu_us_per_event,
                    peer_name(p),
                    relay.database_cpu_us_per_event - d.database_cpu_us_per_event
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "\n**What recording SENT costs the relay.** No peer writes to the outbox table; the \
             relay records each event SENT with its broker msg_id. In its drain the broker held \
             the last event after {:.1} s and the last row was SENT after {:.1} s. The database \
             server spent {:.1} µs of CPU per event during the relay's drain, {}. The marker \
             alone, with no stream and no broker, marks {:.0} rows/s (database ceiling above).",
            relay.secs_stored,
            relay.secs,
            relay.database_cpu_us_per_event,
            database_cpu.join(", and "),
            self.marking.rate()
        );
        if peers.iter().any(|(p, _)| *p == "canal") {
            let _ = writeln!(s, "\n{CANAL_LIMITS}");
        }
        let _ = writeln!(
            s,
            "\nCPU during the peer runs (seconds, % of one core; {} is the database server):\n",
            self.database_role
        );
        for d in self.drains.iter().filter(|d| d.mode != "poll") {
            let _ = writeln!(s, "- drain, {}: {}", d.mode, d.split.describe());
        }
    }

    /// One row a system: its drain, its costs and its latencies at `rates`.
    fn peer_table(&self, s: &mut String, rates: &[usize]) {
        let mut header = String::from(
            "| system | drain events/s (start → last stored) | first → last stored | CPU µs/event | peak RSS | database CPU µs/event | resent |",
        );
        let mut rule = String::from("| --- | --- | --- | --- | --- | --- | --- |");
        for rate in rates {
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
            for &rate in rates {
                match self.latency_of(system, rate) {
                    Some(l) => {
                        let _ = write!(s, " {} / {} / {} / {} ms |", l.p50, l.p95, l.p99, l.max);
                    }
                    None => s.push_str(" — |"),
                }
            }
            s.push('\n');
        }
    }

    /// The goals' rows against one peer: drain ≥ 2×, p99 at 5k/s ≤ 1/10, CPU per event at 500/s
    /// and 1k/s ≤ 1/5, CPU per drained event ≤ 1/3, peak RSS ≤ 1/5 (the relay's value ÷ the
    /// peer's).
    fn goals_against(&self, s: &mut String, relay: &DrainResult, peer: &str, theirs: &DrainResult) {
        let name = peer_name(peer);
        let with_sweeper = |value: &dyn Fn(&DrainResult) -> f64| {
            self.drain_of("cdc+sweeper")
                .map(|d| format!(" (with the sweeper {:.2}×)", value(d)))
                .unwrap_or_default()
        };
        let drain = |d: &DrainResult| d.stored_rate() / theirs.stored_rate();
        let _ = writeln!(
            s,
            "| relay drain ≥ 2× {name}'s | {:.0} / {:.0} = {:.2}×{} | {} |",
            relay.stored_rate(),
            theirs.stored_rate(),
            drain(relay),
            with_sweeper(&drain),
            verdict(drain(relay) >= 2.0)
        );
        if let (Some(ours), Some(their)) =
            (self.latency_of("cdc", 5000), self.latency_of(peer, 5000))
        {
            let ratio = ours.p99 as f64 / their.p99.max(1) as f64;
            let _ = writeln!(
                s,
                "| relay p99 at 5k/s ≤ 1/10 of {name}'s | {} ms / {} ms = {:.2}× | {} |",
                ours.p99,
                their.p99,
                ratio,
                verdict(ratio <= 0.1)
            );
        }
        // At the steady rates users run, as users run it (sweeper on) against each peer.
        for rate in [500, 1000] {
            let (Some(ours), Some(their)) = (
                self.latency_of("cdc+sweeper", rate),
                self.latency_of(peer, rate),
            ) else {
                continue;
            };
            let ratio = ours.cpu_us_per_event / their.cpu_us_per_event.max(0.001);
            let _ = writeln!(
                s,
                "| relay CPU per event at {rate}/s (defaults) ≤ 1/5 of {name}'s | {:.1} / {:.1} µs = {ratio:.2}× | {} |",
                ours.cpu_us_per_event,
                their.cpu_us_per_event,
                verdict(ratio <= 0.2)
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
            let ratio = |d: &DrainResult| value(d) / value(theirs);
            let _ = writeln!(
                s,
                "| relay {goal} of {name}'s (drain) | {:.1} / {:.1} {unit} = {:.2}×{} | {} |",
                value(relay),
                value(theirs),
                ratio(relay),
                with_sweeper(&ratio),
                verdict(ratio(relay) <= limit)
            );
        }
    }
}

/// What Canal 1.1.8 does not do that the relay does, each read in Canal's source (module and
/// class named).
const CANAL_LIMITS: &str = "**What Canal does not do that the relay does** (read in Canal \
1.1.8's source). It sends the row change, not the event: each message is a flat JSON document \
of one binlog rows event's rows that hash to one queue (`data`, `old`, `type`, `sqlType`, \
`mysqlType`...; `MQMessageUtils.messageConverter` and `messagePartition`), so a consumer gets \
several events per message and must parse the row to find the payload. It sets no message key \
and no user property (`new Message(topic, tag, body)` in `CanalRocketMQProducer`): there is no \
key to look an event up by and nothing a consumer can deduplicate on without parsing the body. \
It does not check a send's status: the `SendResult` is only logged at debug level, so a \
`FLUSH_DISK_TIMEOUT`, `FLUSH_SLAVE_TIMEOUT` or `SLAVE_NOT_AVAILABLE` result (which the RocketMQ \
client returns rather than throws) is acknowledged like `SEND_OK`. A send that throws rolls the \
whole batch back (`CanalMQStarter` → `CanalServerWithEmbedded.rollback`, which resets the event \
store to the last acknowledged position) and sends it again, every queue's part of it, also the \
parts already stored: duplicates, and a consumer that does not deduplicate sees a key's older \
events again after its newer ones. It records nothing in the outbox table: no SENT mark, no msg_id, no failure count.";
