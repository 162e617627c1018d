//! Marking: records each event's outcome on its outbox row (SENT with `msg_id` and `sent_at`, or
//! FAILED with `last_error`) in batched UPDATEs, and only then acknowledges it (a streamed
//! event's [`crate::event::Ack`]: the checkpoint may pass it).
//!
//! Guarantees: an event is acknowledged only after its row's UPDATE committed,
//! so the checkpoint never passes an event whose outcome is not recorded. A SENT row always has
//! its `msg_id`. Rows already SENT or FAILED are left as they are. Database errors that may pass
//! (a cut connection, a lock wait, a timeout) are retried for ever (with backoff) rather than
//! acknowledging anything unrecorded. An error retrying cannot fix ([`crate::db::PermanentFault`]:
//! the UPDATE privilege revoked, a missing column, a value that no longer fits its column) stops
//! the marker with a [`MarkError`] saying what to fix, and it stops the relay (the `stop` token):
//! the batch that met it stays unacknowledged, so the checkpoint stays before it and a restart
//! after the fix sends and records it again. Nothing is lost; nothing stalls silently.
//!
//! Which rows an UPDATE may touch depends on where the event came from (one marker serves both
//! when the sweeper runs beside the stream):
//! - An event read from the binlog ([`Origin::Stream`], or [`Origin::Released`]: its
//!   acknowledgement given back during a stall) marks its row SENT while still
//!   PENDING or SENDING (or with a NULL status, in a hand-made table, which the decoder
//!   fails): it was delivered, so it also settles a row a sweeper claimed meanwhile.
//! - Its FAILED mark never touches a row that a sweeper (of any instance, this one included)
//!   holds under a live lease (SENDING and `lease_until` not yet past): that sweeper is
//!   delivering the row at this moment and records its own outcome. A FAILED row is therefore
//!   never one that was delivered (an operator's `retry` of it would duplicate it).
//! - An event claimed under a lease (poll mode, sweeper) marks its row only while this instance
//!   still owns it (SENDING with its `owner`). A claimed row whose lease expired and was taken
//!   back (PENDING again, claimed by another instance, or already SENT by the stream) is not
//!   overwritten: whoever holds it now records that outcome. That costs a duplicate, never a loss.

mod fault;

pub use fault::MarkError;

use crate::event::Origin;
use crate::leader::Fence;
use crate::outbox::{Status, TableName};
use crate::retry::RetryPolicy;
use crate::send::{Completion, SendOutcome};
use fault::WriteFailure;
use mysql_async::prelude::*;
use mysql_async::{Pool, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

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

/// What the marker needs besides the completions.
#[derive(Debug, Clone)]
pub struct MarkerContext {
    /// This instance's `owner` in claimed rows.
    pub owner: String,
    /// Checked before each batch: once it no longer holds (a leadership that is over), the
    /// marker stops, leaving the batch unacknowledged. With an epoch, every UPDATE is also
    /// fenced in the database, as the checkpoint mirror is (see [`MarkerContext::relay_name`]).
    pub fence: Fence,
    /// The deployment's row in `outbox_relay_state`: where the fence's epoch must still be the
    /// leader's for a mark to be written (`None`, or an open fence: not fenced in the database).
    pub relay_name: Option<String>,
    /// How long a batch waits for more outcomes after its first (`relay.mark_linger`).
    pub linger: std::time::Duration,
}

impl MarkerContext {
    /// The context of instance `owner`, with no leadership to end.
    #[cfg(any(test, feature = "test-utils"))]
    pub fn new(owner: impl Into<String>) -> Self {
        MarkerContext {
            owner: owner.into(),
            fence: Fence::open(),
            relay_name: None,
            linger: crate::config::DEFAULT_MARK_LINGER,
        }
    }

    /// The condition every UPDATE of a leader's marks carries: its epoch still leads in the
    /// deployment's row (a new leader raised it, so a frozen old leader's late marks touch
    /// nothing). The name is written as a hex literal: any name, no quoting to get wrong.
    fn epoch_condition(&self) -> Option<(String, u64)> {
        let (name, epoch) = (self.relay_name.as_ref()?, self.fence.epoch()?);
        let hex: String = name.bytes().map(|b| format!("{b:02X}")).collect();
        // A scalar subquery, evaluated once: with `EXISTS`, MySQL 9.7 planned the UPDATE as a
        // semi-join that scanned the outbox, and waited on the row lock of a prepared XA
        // transaction (tests/xa.rs) instead of reading the named ids by primary key.
        let condition = format!(
            " AND (SELECT leader_epoch FROM outbox_relay_state \
             WHERE name = CONVERT(X'{hex}' USING utf8mb4)) = {epoch}"
        );
        Some((condition, epoch))
    }

    /// The WHERE condition after `id …` for `completion`, and the owner to bind for it (if any);
    /// see the module documentation.
    fn condition(&self, completion: &Completion) -> (&'static str, Option<&str>) {
        // NULL status: a hand-made table without the NOT NULL; the decoder fails such a row.
        static STREAMED_SENT: LazyLock<String> = LazyLock::new(|| {
            format!(
                "({} OR status IS NULL)",
                Status::sql_in(&Status::UNDELIVERED)
            )
        });
        static STREAMED_FAILED: LazyLock<String> = LazyLock::new(|| {
            format!(
                "({} OR status IS NULL \
                  OR ({} AND (lease_until IS NULL OR lease_until < NOW(3))))",
                Status::Pending.sql(),
                Status::Sending.sql()
            )
        });
        static CLAIMED: LazyLock<String> =
            LazyLock::new(|| format!("{} AND owner = ?", Status::Sending.sql()));
        match (&completion.origin, &completion.outcome) {
            (Origin::Stream(_) | Origin::Released, SendOutcome::Sent { .. }) => {
                (STREAMED_SENT.as_str(), None)
            }
            (Origin::Stream(_) | Origin::Released, SendOutcome::Failed { .. }) => {
                (STREAMED_FAILED.as_str(), None)
            }
            (Origin::Claimed, _) => (CLAIMED.as_str(), Some(&self.owner)),
        }
    }
}

/// Records outcomes until `completions` closes; returns what it recorded. On a permanent error
/// it cancels `stop` (the relay's run) and returns the error, leaving the batch unacknowledged.
/// Once `rule.fence` no longer holds it returns before writing its next batch (unacknowledged).
pub async fn run_marker(
    pool: Pool,
    mut completions: mpsc::Receiver<Completion>,
    rule: MarkerContext,
    stop: CancellationToken,
) -> Result<MarkStats, MarkError> {
    let mut stats = MarkStats::default();
    let policy = RetryPolicy::database();
    let mut last_sample = None;
    let fenced = rule.epoch_condition();
    while let Some(first) = completions.recv().await {
        let batch = gather(first, &mut completions, rule.linger).await;
        match record(&pool, &batch, &rule, fenced.as_ref(), &policy, &stop).await? {
            Recorded::Yes => {}
            Recorded::LeadershipOver => return Ok(stats),
        }
        count(&mut stats, &batch);
        // At most one batch a second, off the marking loop: the next batch's UPDATE does not
        // wait for a metric's query, and a steady trickle of small batches does not double the
        // statements the database runs per event.
        if last_sample.is_none_or(|at: Instant| at.elapsed() >= LATENCY_SAMPLE_EVERY) {
            last_sample = Some(Instant::now());
            tokio::spawn(observe_latencies(pool.clone(), sent_ids(&batch)));
        }
        // Recorded: the checkpoint may pass the batch's streamed events.
        for completion in batch {
            completion.origin.acknowledge();
        }
    }
    Ok(stats)
}

/// Whether a batch's outcomes were recorded.
enum Recorded {
    Yes,
    /// Another instance leads now: the batch is left unacknowledged (and maybe unrecorded).
    LeadershipOver,
}

/// Writes `batch`'s marks, retrying errors that may pass for ever (with backoff), until they are
/// recorded or the leadership is over. A permanent error cancels `stop` and is returned; the
/// batch is then left unacknowledged.
async fn record(
    pool: &Pool,
    batch: &[Completion],
    rule: &MarkerContext,
    fenced: Option<&(String, u64)>,
    policy: &RetryPolicy,
    stop: &CancellationToken,
) -> Result<Recorded, MarkError> {
    let mut failures = 0;
    loop {
        if !rule.fence.holds() {
            // Another instance leads now: it records these outcomes (or sends them again).
            tracing::warn!(
                rows = batch.len(),
                "leadership is over: leaving this batch of outcomes unrecorded and unacknowledged"
            );
            return Ok(Recorded::LeadershipOver);
        }
        // Bounded: a connection cut mid-statement must turn into a retry, not a hang.
        let written = write(pool, batch, rule, fenced);
        let written = tokio::time::timeout(WRITE_TIMEOUT, written)
            .await
            .unwrap_or_else(|_| Err(WriteFailure::timed_out()));
        match written {
            // A mark its epoch no longer allowed (another instance leads): unacknowledged.
            Ok(()) if !rule.fence.holds() => {
                tracing::warn!(
                    rows = batch.len(),
                    "leadership is over: leaving this batch of outcomes unacknowledged"
                );
                return Ok(Recorded::LeadershipOver);
            }
            Ok(()) => return Ok(Recorded::Yes),
            Err(failure) => {
                if let Some(error) = failure.permanent(pool).await {
                    tracing::error!(%error, rows = batch.len(), "the relay stops");
                    stop.cancel();
                    return Err(error);
                }
                failures += 1;
                let delay = policy.delay(failures).unwrap_or(policy.max);
                tracing::warn!(error = %failure, retry_in = ?delay, rows = batch.len(),
                    "cannot record outcomes in MySQL; retrying (the checkpoint waits)");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Counts `batch`'s recorded outcomes in `stats` and the metrics (with the stage timings of
/// the SENT ones).
fn count(stats: &mut MarkStats, batch: &[Completion]) {
    crate::metrics::stages::record(
        batch
            .iter()
            .filter(|c| matches!(c.outcome, SendOutcome::Sent { .. }))
            .map(|c| (c.event_id.as_str(), &c.stamps)),
    );
    let metrics = crate::metrics::relay();
    for completion in batch {
        match completion.outcome {
            SendOutcome::Sent { .. } => {
                stats.sent += 1;
                metrics.events_sent.inc();
            }
            SendOutcome::Failed { .. } => {
                stats.failed += 1;
                metrics.events_failed.inc();
            }
        }
    }
}

/// `first` and the outcomes that follow it within `linger`, at most [`MAX_BATCH`].
async fn gather(
    first: Completion,
    completions: &mut mpsc::Receiver<Completion>,
    linger: std::time::Duration,
) -> Vec<Completion> {
    let deadline = tokio::time::Instant::now() + linger;
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH {
        let next = match completions.try_recv() {
            Ok(next) => Some(next),
            Err(mpsc::error::TryRecvError::Empty) => {
                tokio::time::timeout_at(deadline, completions.recv())
                    .await
                    .ok()
                    .flatten()
            }
            Err(_) => None,
        };
        match next {
            Some(next) => batch.push(next),
            None => break,
        }
    }
    batch
}

/// Most SENT rows of one marking batch whose latency is read back for the histogram: a sample
/// keeps its shape while a full 1,000-row read per batch would cost the server more than it is
/// worth during a catch-up.
const LATENCY_SAMPLE: usize = 50;
/// Least time between two batches whose latencies are read back.
const LATENCY_SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The ids of (up to [`LATENCY_SAMPLE`] of) the batch's SENT rows, by table.
fn sent_ids(batch: &[Completion]) -> BTreeMap<Arc<TableName>, Vec<u64>> {
    let mut sent: BTreeMap<Arc<TableName>, Vec<u64>> = BTreeMap::new();
    let step = batch.len().div_ceil(LATENCY_SAMPLE).max(1);
    for completion in batch.iter().step_by(step) {
        if let SendOutcome::Sent { .. } = completion.outcome {
            sent.entry(Arc::clone(&completion.table))
                .or_default()
                .push(completion.id);
        }
    }
    sent
}

/// Records created → SENT latencies of the sampled SENT rows in `outbox_commit_to_sent_seconds`
/// (both times from the database clock, in milliseconds). Best effort: a failed query is skipped.
async fn observe_latencies(pool: Pool, sent: BTreeMap<Arc<TableName>, Vec<u64>>) {
    let pool = &pool;
    let histogram = &crate::metrics::relay().commit_to_sent;
    for (table, ids) in sent {
        let sql = format!(
            "SELECT TIMESTAMPDIFF(MICROSECOND, created_at, sent_at) FROM {} \
             WHERE id IN ({}) AND {}",
            table.sql(),
            crate::db::id_list(ids),
            Status::Sent.sql()
        );
        let micros: Result<Vec<Option<i64>>, _> = crate::db::bounded(async {
            let mut conn = pool.get_conn().await?;
            conn.query(sql).await
        })
        .await;
        match micros {
            Ok(micros) => {
                for m in micros.into_iter().flatten() {
                    histogram.observe(m.max(0) as f64 / 1e6);
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot read SENT latencies"),
        }
    }
}

/// Writes one batch: one UPDATE per table for SENT rows, one per FAILED row.
/// `fenced`: the epoch condition every UPDATE carries and its epoch (built once per marker,
/// [`MarkerContext::epoch_condition`]).
async fn write(
    pool: &Pool,
    batch: &[Completion],
    rule: &MarkerContext,
    fenced: Option<&(String, u64)>,
) -> Result<(), WriteFailure> {
    let mut conn = pool.get_conn().await.map_err(WriteFailure::connect)?;
    let fence_sql = fenced.as_ref().map_or("", |(sql, _)| sql.as_str());
    // Whether an UPDATE changed fewer rows than it named (rows SENT or FAILED already, a lease
    // taken back: or the epoch fence).
    let mut short = false;
    // SENT rows grouped by table and by rule (stream or claimed), one UPDATE per group.
    type Group<'a> = (&'a TableName, (&'static str, Option<&'a str>));
    let mut sent: BTreeMap<Group<'_>, Vec<(u64, &str)>> = BTreeMap::new();
    for completion in batch {
        let (condition, owner) = rule.condition(completion);
        match &completion.outcome {
            SendOutcome::Sent { msg_id } => sent
                .entry((&*completion.table, (condition, owner)))
                .or_default()
                .push((completion.id, msg_id.as_str())),
            SendOutcome::Failed { reason, attempts } => {
                let reason: String = reason.chars().take(MAX_ERROR_CHARS).collect();
                let mut params = vec![
                    Value::from(reason),
                    Value::from(attempts.saturating_sub(1)),
                    Value::from(completion.id),
                ];
                params.extend(owner.map(Value::from));
                conn.exec_drop(
                    format!(
                        "UPDATE {} SET {}, last_error = ?, retry_count = ?, owner = NULL, \
                         lease_until = NULL WHERE id = ? AND {condition}{fence_sql}",
                        completion.table.sql(),
                        Status::Failed.sql()
                    ),
                    params,
                )
                .await
                .map_err(|e| WriteFailure::on(&completion.table, e))?;
                short |= conn.affected_rows() == 0;
            }
        }
    }
    for ((table, (condition, owner)), rows) in sent {
        let failed = |e| WriteFailure::on(table, e);
        let condition = format!("{condition}{fence_sql}");
        if let Some(sql) = inline_sent_update(table, &condition, owner, &rows) {
            conn.query_drop(sql).await.map_err(failed)?;
            short |= conn.affected_rows() < rows.len() as u64;
            continue;
        }
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
                "UPDATE {} SET {}, msg_id = CASE id{cases} END, sent_at = NOW(3), \
                 owner = NULL, lease_until = NULL, last_error = NULL \
                 WHERE id IN ({ids}) AND {condition}",
                table.sql(),
                Status::Sent.sql()
            ),
            params,
        )
        .await
        .map_err(failed)?;
        short |= conn.affected_rows() < rows.len() as u64;
    }
    if let (true, Some((_, epoch))) = (short, fenced) {
        check_epoch(&mut conn, rule, *epoch).await;
    }
    Ok(())
}

/// After an UPDATE that changed fewer rows than it named: ends the fence if the deployment's
/// row no longer names `epoch` (another instance leads; the marks it refused stay unrecorded).
async fn check_epoch(conn: &mut mysql_async::Conn, rule: &MarkerContext, epoch: u64) {
    let Some(name) = &rule.relay_name else { return };
    let now: Result<Option<u64>, _> = conn
        .exec_first(
            "SELECT leader_epoch FROM outbox_relay_state WHERE name = ?",
            (name,),
        )
        .await;
    match now {
        Ok(now) if now != Some(epoch) => rule.fence.end(
            crate::metrics::LeadershipEnd::MARK_REFUSED,
            format_args!(
                "a SENT/FAILED mark found epoch {now:?} leading, not this leadership's {epoch} \
                 (another instance took over)"
            ),
        ),
        Ok(_) => {}
        Err(e) => tracing::debug!(error = %e, "cannot read the leader's epoch after a short mark"),
    }
}

/// `'text'` when `text` is safe to inline as is (broker message ids are hex; instance ids are
/// host names and pids), else `None`.
fn plain_literal(text: &str) -> Option<String> {
    text.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"#,-_.:".contains(&b))
        .then(|| format!("'{text}'"))
}

/// The SENT UPDATE of `rows` as one text-protocol statement (a single round trip, no statement to
/// prepare: its placeholder count would change with every batch size), or `None` when a value is
/// not plain enough to inline (then the prepared form is used).
fn inline_sent_update(
    table: &TableName,
    condition: &str,
    owner: Option<&str>,
    rows: &[(u64, &str)],
) -> Option<String> {
    let mut cases = String::with_capacity(rows.len() * 48);
    for (id, msg_id) in rows {
        cases.push_str(&format!(" WHEN {id} THEN {}", plain_literal(msg_id)?));
    }
    let ids = crate::db::id_list(rows.iter().map(|(id, _)| *id));
    let condition = match owner {
        Some(owner) => condition.replacen('?', &plain_literal(owner)?, 1),
        None => condition.to_string(),
    };
    Some(format!(
        "UPDATE {} SET {}, msg_id = CASE id{cases} END, sent_at = NOW(3), \
         owner = NULL, lease_until = NULL, last_error = NULL \
         WHERE id IN ({ids}) AND {condition}",
        table.sql(),
        Status::Sent.sql()
    ))
}

#[cfg(test)]
mod tests;
