//! Marking: records each event's outcome on its outbox row (SENT with `msg_id` and `sent_at`, or
//! FAILED with `last_error`) in batched UPDATEs, and only then lets the watermark pass it.
//!
//! Guarantees: an event is acknowledged to the watermark only after its row's UPDATE committed,
//! so the checkpoint never passes an event whose outcome is not recorded. A SENT row always has
//! its `msg_id`. Rows already SENT or FAILED are left as they are. Database errors are retried
//! for ever (with backoff) rather than acknowledging anything unrecorded.
//!
//! Which rows an UPDATE may touch is the [`MarkRule`]: the CDC stream marks rows still PENDING or
//! SENDING (`status IN (0, 1)`); rows claimed under a lease (poll mode, sweeper) are marked only
//! while this instance still owns them (`status = 1 AND owner = ?`). A claimed row whose lease
//! expired and was taken back (PENDING again, or claimed by another instance) is not overwritten:
//! its new owner sends it again and records that outcome. That costs a duplicate, never a loss.

use crate::checkpoint::Watermark;
use crate::config::TableName;
use crate::retry::RetryPolicy;
use crate::send::{Completion, Outcome};
use mysql_async::prelude::*;
use mysql_async::{Pool, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Longest one marking round may take before it is retried.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
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

/// Which rows the marker may update, and what it acknowledges afterwards.
#[derive(Debug, Clone)]
pub enum MarkRule {
    /// The CDC stream: rows in status PENDING or SENDING; each recorded completion with a `seq`
    /// is acknowledged to the watermark.
    Stream(Arc<Mutex<Watermark>>),
    /// Rows claimed under a lease by `owner`: only rows still SENDING and owned by it.
    Claimed { owner: String },
}

impl MarkRule {
    /// The WHERE condition after `id …`, and the owner to bind for it (if any).
    fn condition(&self) -> (&'static str, Option<&str>) {
        match self {
            MarkRule::Stream(_) => ("status IN (0, 1)", None),
            MarkRule::Claimed { owner } => ("status = 1 AND owner = ?", Some(owner)),
        }
    }
}

/// Records outcomes until `completions` closes; returns what it recorded.
pub async fn run_marker(
    pool: Pool,
    mut completions: mpsc::Receiver<Completion>,
    rule: MarkRule,
) -> MarkStats {
    let mut stats = MarkStats::default();
    let policy = RetryPolicy::database();
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
            // Bounded: a connection cut mid-statement must turn into a retry, not a hang.
            let written = tokio::time::timeout(WRITE_TIMEOUT, write(&pool, &batch, &rule))
                .await
                .unwrap_or_else(|_| Err(mysql_async::Error::Other("marking timed out".into())));
            match written {
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
        for completion in &batch {
            match completion.outcome {
                Outcome::Sent { .. } => stats.sent += 1,
                Outcome::Failed { .. } => stats.failed += 1,
            }
        }
        if let MarkRule::Stream(watermark) = &rule {
            let mut watermark = watermark.lock().expect("not poisoned");
            for seq in batch.iter().filter_map(|c| c.seq) {
                watermark.complete(seq);
            }
        }
    }
    stats
}

/// Writes one batch: one UPDATE per table for SENT rows, one per FAILED row.
async fn write(
    pool: &Pool,
    batch: &[Completion],
    rule: &MarkRule,
) -> Result<(), mysql_async::Error> {
    let (condition, owner) = rule.condition();
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
                let mut params = vec![
                    Value::from(reason),
                    Value::from(attempts.saturating_sub(1)),
                    Value::from(completion.id),
                ];
                params.extend(owner.map(Value::from));
                conn.exec_drop(
                    format!(
                        "UPDATE {} SET status = 3, last_error = ?, retry_count = ?, owner = NULL, \
                         lease_until = NULL WHERE id = ? AND {condition}",
                        completion.table.sql()
                    ),
                    params,
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
        params.extend(owner.map(Value::from));
        conn.exec_drop(
            format!(
                "UPDATE {} SET status = 2, msg_id = CASE id{cases} END, sent_at = NOW(3), \
                 owner = NULL, lease_until = NULL, last_error = NULL \
                 WHERE id IN ({ids}) AND {condition}",
                table.sql()
            ),
            params,
        )
        .await?;
    }
    Ok(())
}
