//! The soak's isolation checks: a fault that holds back only some keys (a read-only side
//! topic, one frozen broker group of two) must leave the other keys' commit → SENT latency
//! within the bound of their latency just before the fault, and the side topic's events must
//! all arrive, each key in commit order.

use super::audit::FaultRecord;
use super::servers::{Servers, SIDE_TOPIC, TOPIC};
use rocketmq_outbox::outbox::status::codes::SENT;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

/// The healthy keys' p99 during a fault may be 2× their p99 just before it, or 250 ms more
/// (this machine's noise), whichever is larger.
fn within_bound(before: f64, during: f64) -> bool {
    during <= (2.0 * before).max(before + 250.0)
}

fn p99(sorted: &[f64]) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    Some(sorted[(sorted.len() * 99 / 100).min(last)])
}

/// For each fault with an isolation window: the healthy keys' p99 during it (once the relay
/// has noticed it) against their p99 in the calm seconds just before it. Returns failures and
/// report lines.
pub async fn check_latency(servers: &Servers, faults: &[FaultRecord]) -> (Vec<String>, String) {
    let (mut failures, mut report) = (Vec::new(), String::new());
    if faults.iter().all(|f| f.isolation.is_none()) {
        return (failures, report);
    }
    let rows = servers.latencies(TOPIC).await;
    report.push_str(&timeline(&rows, faults));
    for f in faults {
        let Some(window) = f.isolation else { continue };
        let healthy = |at: &dyn Fn(f64) -> bool| {
            let mut latencies: Vec<f64> = (rows.iter())
                .filter(|(key, created, _)| at(*created) && window.healthy.contains(key))
                .map(|(_, _, ms)| *ms)
                .collect();
            latencies.sort_by(f64::total_cmp);
            latencies
        };
        // Not the last second: those events may be in flight when the fault begins.
        let before = healthy(&|created| (window.calm.0..window.calm.1 - 1.0).contains(&created));
        let noticed = window.from + window.noticed_within;
        let during = healthy(&|created| (noticed..window.to).contains(&created));
        let (Some(b), Some(d)) = (p99(&before), p99(&during)) else {
            failures.push(format!(
                "{} at {:?}: too few healthy events to judge ({} before, {} during): the fault \
                 came while no writes flowed",
                f.kind.name(),
                f.at,
                before.len(),
                during.len()
            ));
            continue;
        };
        let _ = writeln!(
            report,
            "    {:>8.1?} {}: healthy keys' commit → SENT p99 {b:.0} ms just before ({} events), {d:.0} ms during ({} events)",
            f.at,
            f.kind.name(),
            before.len(),
            during.len()
        );
        if !within_bound(b, d) {
            failures.push(format!(
                "{} at {:?} held back keys it does not touch: their p99 was {d:.0} ms during it \
                 against {b:.0} ms just before",
                f.kind.name(),
                f.at
            ));
        }
    }
    (failures, report)
}

/// The workload topic's commit → SENT latency through the run, per [`TIMELINE_STEP`] of commit
/// time, with the faults that began in each: what a judgement's "before" and "during" stood on.
fn timeline(rows: &[(String, f64, f64)], faults: &[FaultRecord]) -> String {
    let Some(start) = rows.iter().map(|r| r.1).min_by(f64::total_cmp) else {
        return String::new();
    };
    let step = TIMELINE_STEP.as_secs_f64();
    let mut buckets: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for (_, created, ms) in rows {
        let bucket = ((created - start) / step) as u64;
        buckets.entry(bucket).or_default().push(*ms);
    }
    let mut out = format!(
        "    workload topic (all its keys), commit → SENT per {step:.0} s of commit time, ms:\n"
    );
    for (bucket, mut latencies) in buckets {
        latencies.sort_by(f64::total_cmp);
        let from = bucket as f64 * step;
        let began: Vec<&str> = (faults.iter())
            .filter(|f| {
                (f.isolation.as_ref())
                    .is_some_and(|w| (from..from + step).contains(&(w.from - start)))
            })
            .map(|f| f.kind.name())
            .collect();
        let _ = writeln!(
            out,
            "      {from:>6.0} s {:>6} events  p50 {:>7.0}  p99 {:>7.0}  {}",
            latencies.len(),
            latencies[latencies.len() / 2],
            p99(&latencies).unwrap_or_default(),
            began.join(", ")
        );
    }
    out
}

/// The step of [`timeline`].
const TIMELINE_STEP: Duration = Duration::from_secs(5);

/// Every side-topic row SENT, its msg_id stored on the broker, each key's events stored in
/// commit order (first arrivals by queue offset).
pub async fn check_side_topic(servers: &Servers) -> Vec<String> {
    let rows: Vec<(u64, String, String, i8, Option<String>)> = servers
        .query(&format!(
            "SELECT id, event_id, biz_key, status, NULLIF(msg_id, '') FROM outbox_event \
             WHERE topic = '{SIDE_TOPIC}' ORDER BY id"
        ))
        .await;
    let mut failures = Vec::new();
    let unsent: Vec<&String> = (rows.iter())
        .filter(|r| r.3 != SENT)
        .map(|r| &r.1)
        .collect();
    if !unsent.is_empty() {
        failures.push(format!(
            "{} of {} {SIDE_TOPIC} events not SENT, e.g. {:?}",
            unsent.len(),
            rows.len(),
            &unsent[..unsent.len().min(5)]
        ));
    }
    let messages = match read_side_topic(servers, rows.len()).await {
        Ok(messages) => messages,
        Err(e) => return [failures, vec![format!("cannot read {SIDE_TOPIC}: {e}")]].concat(),
    };
    let stored: HashSet<(&str, &str)> = (messages.iter())
        .map(|m| (m.properties["event_id"].as_str(), m.msg_id.as_str()))
        .collect();
    let unproven = (rows.iter())
        .filter(|r| !stored.contains(&(r.1.as_str(), r.4.as_deref().unwrap_or_default())))
        .count();
    if unproven > 0 {
        failures.push(format!(
            "{unproven} {SIDE_TOPIC} rows have a msg_id no stored message carries"
        ));
    }
    let id_of: HashMap<&str, u64> = rows.iter().map(|r| (r.1.as_str(), r.0)).collect();
    // (key, broker group, queue) → (queue offset, row id) of each stored message.
    type Arrivals<'a> = BTreeMap<(&'a str, &'a str, i32), Vec<(i64, u64)>>;
    let mut by_queue: Arrivals = BTreeMap::new();
    for m in &messages {
        let Some(&id) = id_of.get(m.properties["event_id"].as_str()) else {
            continue;
        };
        let key = m.properties["biz_key"].as_str();
        (by_queue
            .entry((key, m.broker_name.as_str(), m.queue_id))
            .or_default())
        .push((m.queue_offset, id));
    }
    for (queue, mut arrivals) in by_queue {
        arrivals.sort();
        let mut first: Vec<u64> = Vec::new();
        for (_, id) in arrivals {
            if !first.contains(&id) {
                first.push(id);
            }
        }
        if first.windows(2).any(|w| w[0] > w[1]) {
            failures.push(format!(
                "{SIDE_TOPIC} {queue:?}: out of commit order: {first:?}"
            ));
        }
    }
    failures
}

async fn read_side_topic(
    servers: &Servers,
    at_least: usize,
) -> Result<Vec<outbox_devenv::ReceivedMessage>, String> {
    let mut reader = outbox_devenv::TopicReader::new(&servers.namesrv_addr(), SIDE_TOPIC)
        .await
        .map_err(|e| e.to_string())?;
    let messages = reader
        .read_at_least(at_least, Duration::from_secs(60))
        .await
        .map_err(|e| e.to_string());
    reader.close().await;
    messages
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_twice_the_p99_or_250_ms_more() {
        assert!(within_bound(20.0, 40.0));
        assert!(within_bound(20.0, 270.0));
        assert!(!within_bound(20.0, 271.0));
        assert!(within_bound(400.0, 800.0));
        assert!(!within_bound(400.0, 801.0));
        assert_eq!(p99(&[]), None);
    }
}
