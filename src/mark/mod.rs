//! Marking: records each event's outcome on its outbox row (SENT with `msg_id` and `sent_at`, or
//! FAILED with `last_error`) in batched UPDATEs, and only then lets the watermark pass it.
//!
//! Guarantees: an event is acknowledged to the watermark only after its row's UPDATE committed,
//! so the checkpoint never passes an event whose outcome is not recorded. A SENT row always has
//! its `msg_id`. Rows already SENT or FAILED are left as they are. Database errors are retried
//! for ever (with backoff) rather than acknowledging anything unrecorded.

use crate::checkpoint::Watermark;
use crate::config::TableName;
use crate::retry::RetryPolicy;
use crate::send::{Completion, Outcome};
use mysql_async::prelude::*;
use mysql_async::{Pool, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Most rows in one marking round.
const MAX_BATCH: usize = 1000;
/// Longest `last_error` kept (the column is VARCHAR(1024)).
const MAX_ERROR_CHARS: usize = 1000;

/// Counts of what the marker recorded.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MarkStats {
    pub sent: u64,
    pub failed: u64,
}

/// Records outcomes until `completions` closes; returns what it recorded.
pub async fn run_marker(
    pool: Pool,
    mut completions: mpsc::Receiver<Completion>,
    watermark: Arc<Mutex<Watermark>>,
) -> MarkStats {
    let mut stats = MarkStats::default();
    let policy = RetryPolicy::reconnect();
    while let Some(first) = completions.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match completions.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let mut failures = 0;
        loop {
            match write(&pool, &batch).await {
                Ok(()) => break,
                Err(e) => {
                    failures += 1;
                    let delay = policy.delay(failures).unwrap_or(policy.max);
                    tracing::warn!(error = %e, retry_in = ?delay, rows = batch.len(),
                        "cannot record outcomes in MySQL; retrying (the checkpoint waits)");
                    tokio::time::sleep(delay).await;
                }
            }
        }
        let mut watermark = watermark.lock().expect("not poisoned");
        for completion in &batch {
            match completion.outcome {
                Outcome::Sent { .. } => stats.sent += 1,
                Outcome::Failed { .. } => stats.failed += 1,
            }
            watermark.complete(completion.seq);
        }
    }
    stats
}

/// Writes one batch: one UPDATE per table for SENT rows, one per FAILED row.
async fn write(pool: &Pool, batch: &[Completion]) -> Result<(), mysql_async::Error> {
    let mut conn = pool.get_conn().await?;
    let mut sent: BTreeMap<&TableName, Vec<(u64, &str)>> = BTreeMap::new();
    for completion in batch {
        match &completion.outcome {
            Outcome::Sent { msg_id } => sent
                .entry(&*completion.table)
                .or_default()
                .push((completion.id, msg_id.as_str())),
            Outcome::Failed { reason, attempts } => {
                let reason: String = reason.chars().take(MAX_ERROR_CHARS).collect();
                conn.exec_drop(
                    format!(
                        "UPDATE {} SET status = 3, last_error = ?, retry_count = ?, owner = NULL, \
                         lease_until = NULL WHERE id = ? AND status IN (0, 1)",
                        completion.table.sql()
                    ),
                    (reason, attempts.saturating_sub(1), completion.id),
                )
                .await?;
            }
        }
    }
    for (table, rows) in sent {
        let cases = " WHEN ? THEN ?".repeat(rows.len());
        let ids = vec!["?"; rows.len()].join(", ");
        let mut params: Vec<Value> = Vec::with_capacity(rows.len() * 3);
        for (id, msg_id) in &rows {
            params.push(Value::from(*id));
            params.push(Value::from(*msg_id));
        }
        params.extend(rows.iter().map(|(id, _)| Value::from(*id)));
        conn.exec_drop(
            format!(
                "UPDATE {} SET status = 2, msg_id = CASE id{cases} END, sent_at = NOW(3), \
                 owner = NULL, lease_until = NULL, last_error = NULL \
                 WHERE id IN ({ids}) AND status IN (0, 1)",
                table.sql()
            ),
            params,
        )
        .await?;
    }
    Ok(())
}
