//! The workload: concurrent writers, each committing business rows (`soak_account`) and outbox
//! events in one transaction, some rolled back on purpose, at a target rate.
//!
//! Keys are owned by writers (`key-K` belongs to writer `K % writers`), so a key's commit order
//! is its events' id order: the order the audit expects at the consumer. Every event_id is
//! recorded with what became of its transaction: committed, rolled back on purpose, or unknown
//! (an error at COMMIT, e.g. the server restarted: the audit asks the table).

use mysql_async::prelude::*;
use mysql_async::{Pool, TxOpts};
use rocketmq_outbox::producer::{EventId, NewEvent, Outbox};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::rng::Rng;

/// What the writers did, by event_id.
#[derive(Debug, Default)]
pub struct WriteLog {
    pub committed: Vec<String>,
    pub rolled_back: Vec<String>,
    /// Transactions whose COMMIT (or an earlier statement) failed: committed or not, the table
    /// knows.
    pub unknown: Vec<String>,
    /// Events for a topic the broker does not have: they must end FAILED, nothing else.
    pub poison: Vec<String>,
    pub transactions: u64,
    pub errors: u64,
}

#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    pub events: usize,
    pub writers: usize,
    pub keys: usize,
    /// Target events per second over all writers.
    pub rate: f64,
    /// One transaction in `rollback_every` is rolled back on purpose.
    pub rollback_every: u64,
    /// Events to a missing topic (the only FAILED rows the audit allows).
    pub poison: usize,
    pub topic: String,
    pub seed: u64,
}

/// Runs the writers until `spec.events` events are committed, and past that, at the same pace,
/// while `keep_writing` is set: a fault whose isolation is judged needs writes in flight before
/// and during it, however long the faults before it took to recover from.
pub async fn run(pool: Pool, spec: WorkloadSpec, keep_writing: Arc<AtomicBool>) -> WriteLog {
    let log = Arc::new(Mutex::new(WriteLog::default()));
    let per_writer = spec.events / spec.writers;
    let tasks: Vec<_> = (0..spec.writers)
        .map(|w| {
            let (pool, spec, log) = (pool.clone(), spec.clone(), log.clone());
            let keep_writing = keep_writing.clone();
            tokio::spawn(async move { writer(w, pool, spec, per_writer, log, keep_writing).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    Arc::try_unwrap(log).unwrap().into_inner().unwrap()
}

async fn writer(
    w: usize,
    pool: Pool,
    spec: WorkloadSpec,
    target: usize,
    log: Arc<Mutex<WriteLog>>,
    keep_writing: Arc<AtomicBool>,
) {
    let mut rng = Rng::new(spec.seed ^ (w as u64 + 1).wrapping_mul(0x9E37_79B9));
    let outbox = Outbox::default();
    let own_keys: Vec<usize> = (w..spec.keys).step_by(spec.writers).collect();
    let per_second = spec.rate / spec.writers as f64;
    let started = Instant::now();
    let (mut written, mut n) = (0usize, 0u64);
    // A few poison events per writer, spread over the run.
    let poison_at = spec.poison / spec.writers + usize::from(w < spec.poison % spec.writers);
    let mut poisoned = 0usize;
    while written < target || keep_writing.load(Ordering::Relaxed) {
        n += 1;
        // Pace: event `written` is due at written / per_second.
        let due = Duration::from_secs_f64(written as f64 / per_second);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let poison = poisoned < poison_at && written >= (poisoned + 1) * target / (poison_at + 1);
        let events: Vec<NewEvent> = if poison {
            let key = format!("poison-{w}-{poisoned}");
            vec![event("soak_no_such_topic", key, json!({"poison": true}))]
        } else {
            let size = 1 + rng.below(4) as usize;
            (0..size.min(target.saturating_sub(written).max(1)))
                .map(|i| {
                    let key = own_keys[rng.below(own_keys.len() as u64) as usize];
                    let payload = json!({"w": w, "n": n, "i": i, "pad": "x".repeat(64)});
                    event(&spec.topic, format!("key-{key}"), payload)
                })
                .collect()
        };
        let rollback = !poison && n % spec.rollback_every == 0;
        let result = transaction(&pool, &outbox, events, rollback).await;
        let failed = {
            let mut log = log.lock().unwrap();
            log.transactions += 1;
            match result {
                Ok(ids) if poison => {
                    log.poison.extend(ids);
                    poisoned += 1;
                    false
                }
                Ok(ids) if rollback => {
                    log.rolled_back.extend(ids);
                    false
                }
                Ok(ids) => {
                    written += ids.len();
                    log.committed.extend(ids);
                    false
                }
                Err((ids, e)) => {
                    log.errors += 1;
                    log.unknown.extend(ids);
                    tracing::debug!(writer = w, error = %e, "transaction failed; the next one retries");
                    true
                }
            }
        };
        if failed {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// An event with an id chosen here, so it is known even if COMMIT fails.
fn event(topic: &str, key: String, payload: serde_json::Value) -> NewEvent {
    NewEvent::new(topic, key, payload).with_event_id(EventId::generate().to_string())
}

type TxError = (Vec<String>, String);

/// One business transaction: each event's key gets its account row bumped, then the events are
/// enqueued; commit (or roll back on purpose). Returns the event ids; on an error, the ids that
/// may have been committed with the error.
async fn transaction(
    pool: &Pool,
    outbox: &Outbox,
    events: Vec<NewEvent>,
    rollback: bool,
) -> Result<Vec<String>, TxError> {
    let keys: Vec<String> = events.iter().map(|e| e.biz_key.clone()).collect();
    let ids: Vec<String> = events.iter().filter_map(|e| e.event_id.clone()).collect();
    let fail = |e: &dyn std::fmt::Display| (ids.clone(), e.to_string());
    let mut tx = pool
        .start_transaction(TxOpts::default())
        .await
        .map_err(|e| fail(&e))?;
    for key in &keys {
        tx.exec_drop(
            "INSERT INTO soak_account (biz_key, balance, version) VALUES (?, 1, 1) \
             ON DUPLICATE KEY UPDATE balance = balance + 1, version = version + 1",
            (key,),
        )
        .await
        .map_err(|e| fail(&e))?;
    }
    let enqueued = outbox
        .enqueue_batch(&mut tx, events)
        .await
        .map_err(|e| fail(&e))?;
    let enqueued: Vec<String> = enqueued.iter().map(|id| id.to_string()).collect();
    assert_eq!(enqueued, ids, "the producer keeps the event ids we chose");
    if rollback {
        tx.rollback().await.map_err(|e| fail(&e))?;
    } else {
        tx.commit().await.map_err(|e| fail(&e))?;
    }
    Ok(ids)
}

/// Writes 20 events/s to `topic` (keys `side-0` … `side-9`, one per transaction) until `done`;
/// a write that fails (the database restarting) is skipped: the audit judges the rows there are.
pub async fn side_topic(pool: Pool, topic: &'static str, done: Arc<AtomicBool>) {
    let outbox = Outbox::default();
    let mut n = 0u64;
    while !done.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let Ok(mut conn) = pool.get_conn().await else {
            continue;
        };
        let Ok(mut tx) = conn.start_transaction(TxOpts::default()).await else {
            continue;
        };
        let event = NewEvent::new(topic, format!("side-{}", n % 10), json!({ "n": n }));
        if outbox.enqueue(&mut tx, event).await.is_ok() && tx.commit().await.is_ok() {
            n += 1;
        }
    }
}
