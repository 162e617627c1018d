//! `outbox-relay replay`: publish the outbox INSERTs of a binlog range again, through the same
//! ordered shard senders as the relay.
//!
//! The range is `(from, to]`, like a checkpoint: `from` is the last transaction **not** replayed
//! (a GTID position such as `gtid_binlog_pos` printed after a batch, a saved checkpoint, or the
//! newest saved checkpoint at or before a time), `to` the last one replayed (default: the
//! server's end of binlog when the replay starts). A `--to-time` bound stops at the first
//! transaction whose commit event's binlog timestamp (the server's clock, whole seconds) is
//! past it.
//!
//! Guarantees:
//! - Every outbox INSERT committed in the range is sent once more, whatever its row's status is
//!   now (replay is an explicit operator action), with its original `event_id`, to the queue of
//!   its `biz_key`, in commit order per key (the relay's `route::Router` and `send::Shards`, from the `PipelineBuilder`); only
//!   `SEND_OK` counts as sent, and retryable errors are retried like the relay does.
//! - Transactions outside the range send nothing: the reader starts after `from`, and a
//!   transaction past `to` (or past `--to-time`) ends the replay before its events are sent.
//! - Outbox rows are never changed (replay marks nothing). A real run writes one summary row to
//!   `outbox_audit` (operator, reason, range, counts), so it requires an operator and a reason.
//! - Rows that cannot become messages (the relay marked them FAILED) are counted, not sent.
//!
//! The reader connects as a replica with its own `server_id` (it must differ from the relay's
//! and every real replica's: a second connection with the same id makes the server drop the
//! first).

use crate::binlog::reader::{check_server, BinlogReader, ReaderOptions};
use crate::binlog::BinlogPosition;
pub use crate::binlog::{TxEnd, TxGtid};
use crate::config::Config;
use crate::db::Deployment;
use crate::event::OutboxRow;
use crate::pipeline::{PipelineBuilder, SendStage};
use crate::send::{Completion, SendInputs, SendOutcome, ShardEvent, Sink};
use mysql_async::prelude::*;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod bounds;
mod read;

use bounds::format_unix;
pub use bounds::{
    checkpoint_at_or_before, format_millis, open_history_store, parse_gtid_position, parse_time,
    unix_seconds,
};
use read::{OpenTransactions, Run};

const CHANNEL_CAPACITY: usize = 4096;
/// Failed events listed in the summary (all are counted).
const MAX_LISTED_FAILURES: usize = 20;
/// How long in-flight sends may take after Ctrl-C.
const INTERRUPT_DRAIN: Duration = Duration::from_secs(10);
/// Longest `outbox_audit.operator` / `reason` / `outbox_table` / `result`.
const AUDIT_LIMITS: (usize, usize, usize, usize) = (128, 1024, 130, 255);

/// One replay: the range, who and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// The last transaction not replayed.
    pub from: BinlogPosition,
    /// The last transaction replayed; `None`: the server's end of binlog at the start.
    pub to: Option<BinlogPosition>,
    /// Stop at the first transaction committed after this (Unix seconds).
    pub to_time: Option<u32>,
    pub operator: String,
    pub reason: String,
    /// The replica id of the reader.
    pub server_id: u32,
}

/// Why a replay could not start or ended early.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("--operator and --reason are required (they are written to outbox_audit), e.g. --operator alice --reason \"INC-42: consumer restore\"; --dry-run needs neither")]
    MissingAudit,
    #[error("--operator is longer than {0} characters or --reason longer than {1}")]
    AuditTooLong(usize, usize),
    #[error("nothing to start from: give --from-gtid, --from-time or --from-checkpoint")]
    NoStart,
    #[error("the end of the range ({to}) is past the server's current position ({current})")]
    PastTheEnd { to: String, current: String },
    #[error("--server-id {0} is the relay's own replica id: pick another (the server would drop the relay's stream)")]
    RelayServerId(u32),
}

/// What the caller sees while a replay runs.
#[derive(Debug)]
pub enum ReplayEvent<'a> {
    /// An event in the range (sent, or only listed in a dry run).
    Event {
        row: &'a OutboxRow,
        commit: &'a TxEnd,
    },
    /// After each transaction read.
    Progress(&'a Progress),
}

/// Counters while running.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Progress {
    pub transactions: u64,
    pub events: u64,
    pub sent: u64,
    pub failed: u64,
    /// The position read so far.
    pub position: String,
}

/// Why reading stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// Every transaction up to `to` was read.
    ReachedEnd,
    /// A transaction committed after `--to-time` was reached (and not replayed).
    PassedTime,
    /// Cancelled (Ctrl-C): what was read so far was sent.
    Interrupted,
    /// The range was empty.
    Empty,
}

/// One event that did not get `SEND_OK`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayFailure {
    pub event_id: String,
    pub reason: String,
}

/// What a replay did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplaySummary {
    pub dry_run: bool,
    pub from: String,
    pub to: String,
    pub to_time: Option<String>,
    pub stopped: Stop,
    /// Transactions read, and events in them (sent, or listed in a dry run).
    pub transactions: u64,
    pub events: u64,
    pub sent: u64,
    pub failed: u64,
    pub failures: Vec<ReplayFailure>,
    /// Rows that cannot become messages (marked FAILED by the relay): not sent.
    pub unpublishable: u64,
    /// Transactions read but outside `to` (other GTID domains or sources): not sent.
    pub outside_range: u64,
    /// The position read up to.
    pub reached: String,
}

impl ReplaySummary {
    /// `replayed 40 events (40 sent, 0 failed) of 12 transactions in (gtid 0-1-10, gtid 0-1-22]`.
    pub fn line(&self) -> String {
        let mut line = match self.dry_run {
            true => format!("dry run: {} events would be sent", self.events),
            false => format!(
                "replayed {} events ({} sent, {} failed)",
                self.events, self.sent, self.failed
            ),
        };
        line.push_str(&format!(
            " of {} transactions in ({}, {}]",
            self.transactions, self.from, self.to
        ));
        if let Some(t) = &self.to_time {
            line.push_str(&format!(" committed up to {t}"));
        }
        let stopped = match self.stopped {
            Stop::ReachedEnd | Stop::Empty => "",
            Stop::PassedTime => "; stopped at the first transaction past --to-time",
            Stop::Interrupted => "; INTERRUPTED: the rest of the range was not replayed",
        };
        line.push_str(stopped);
        if self.unpublishable > 0 {
            line.push_str(&format!(
                "; {} unpublishable rows skipped",
                self.unpublishable
            ));
        }
        line
    }
}

impl Replay {
    /// Checks what can be checked without a server; `dry_run` needs no operator or reason.
    pub fn validate(&self, config: &Config, dry_run: bool) -> Result<(), ReplayError> {
        if self.from.is_unknown() {
            return Err(ReplayError::NoStart);
        }
        if self.server_id == config.mysql.server_id {
            return Err(ReplayError::RelayServerId(self.server_id));
        }
        if dry_run {
            return Ok(());
        }
        let (operator, reason) = (self.operator.trim(), self.reason.trim());
        if operator.is_empty() || reason.is_empty() {
            return Err(ReplayError::MissingAudit);
        }
        let (max_operator, max_reason, ..) = AUDIT_LIMITS;
        if operator.chars().count() > max_operator || reason.chars().count() > max_reason {
            return Err(ReplayError::AuditTooLong(max_operator, max_reason));
        }
        Ok(())
    }

    /// Sends the range through `sink` and writes the audit row.
    pub async fn run<S: Sink>(
        &self,
        config: &Config,
        sink: Arc<S>,
        observer: impl FnMut(ReplayEvent<'_>),
        cancel: CancellationToken,
    ) -> anyhow::Result<ReplaySummary> {
        self.validate(config, false)?;
        let deployment = Deployment::resolve(config)?;
        let pipeline = PipelineBuilder::new(config, &deployment, sink);
        let sending = Sending::start(&pipeline.shard_capacity(CHANNEL_CAPACITY));
        let summary = self
            .execute(config, &deployment, Some(sending), observer, cancel)
            .await;
        let audited = self.audit(config, &summary).await;
        let summary = summary?; // the replay's own error first
        audited?;
        Ok(summary)
    }

    /// Lists the events of the range; sends and writes nothing.
    pub async fn dry_run(
        &self,
        config: &Config,
        observer: impl FnMut(ReplayEvent<'_>),
        cancel: CancellationToken,
    ) -> anyhow::Result<ReplaySummary> {
        self.validate(config, true)?;
        let deployment = Deployment::resolve(config)?;
        self.execute(config, &deployment, None, observer, cancel)
            .await
    }

    /// Checks the range against the server, reads it, and hands its events to `sending` (none
    /// in a dry run).
    async fn execute(
        &self,
        config: &Config,
        deployment: &Deployment,
        sending: Option<Sending>,
        mut observer: impl FnMut(ReplayEvent<'_>),
        cancel: CancellationToken,
    ) -> anyhow::Result<ReplaySummary> {
        let Deployment { opts, tables } = deployment.clone();
        let server = check_server(&opts, &tables).await?;
        let to = self.end_of_range(&server.current)?;
        let mut summary = self.first_summary(&to, sending.is_none());
        if self.from.covers(&to) {
            if let Some(sending) = sending {
                sending.finish(&mut summary, false).await;
            }
            return Ok(summary);
        }
        let mut options =
            ReaderOptions::from_config(config, opts, tables, server.flavor, Default::default());
        options.server_id = self.server_id;
        let (items_tx, mut items) = mpsc::channel(CHANNEL_CAPACITY);
        let reading = cancel.child_token();
        let reader = tokio::spawn(BinlogReader::new(options).run(
            self.from.clone(),
            items_tx,
            reading.clone(),
        ));
        let mut run = Run {
            to,
            to_time: self.to_time,
            sending,
            summary,
            position: self.from.clone(),
            progress: Progress::default(),
            open: OpenTransactions::default(),
        };
        run.summary.stopped = Stop::Interrupted;
        while let Some(item) = tokio::select! {
            _ = cancel.cancelled() => None,
            item = items.recv() => item,
        } {
            let Some(end) = run.open.take(item) else {
                continue;
            };
            if let Some(stopped) = run.end_transaction(end, &mut observer).await? {
                run.summary.stopped = stopped;
                break;
            }
        }
        reading.cancel();
        drop(items);
        let read = reader.await?;
        let summary = run.conclude(&mut observer).await;
        if summary.stopped == Stop::Interrupted && !cancel.is_cancelled() {
            read?; // the reader ended on its own: a permanent error
            anyhow::bail!("the binlog stream ended before the end of the range");
        }
        Ok(summary)
    }

    /// The last transaction to replay: `to`, or the server's `current` end of binlog; an error
    /// when it is past `current`.
    fn end_of_range(&self, current: &BinlogPosition) -> Result<BinlogPosition, ReplayError> {
        let mut to = self.to.clone().unwrap_or_else(|| current.clone());
        let same_gtids = (self.from.mariadb_gtid.is_some() && to.mariadb_gtid.is_some())
            || (self.from.mysql_gtid_set.is_some() && to.mysql_gtid_set.is_some());
        if same_gtids {
            // Compare GTIDs only: a `from` given as a GTID has no file to compare with.
            (to.file, to.pos) = (None, 0);
        }
        if !current.covers(&to) {
            return Err(ReplayError::PastTheEnd {
                to: to.to_string(),
                current: current.to_string(),
            });
        }
        Ok(to)
    }

    /// The summary of the range `(from, to]` before anything is read.
    fn first_summary(&self, to: &BinlogPosition, dry_run: bool) -> ReplaySummary {
        ReplaySummary {
            dry_run,
            from: self.from.to_string(),
            to: to.to_string(),
            to_time: self.to_time.map(format_unix),
            stopped: Stop::Empty,
            transactions: 0,
            events: 0,
            sent: 0,
            failed: 0,
            failures: Vec::new(),
            unpublishable: 0,
            outside_range: 0,
            reached: self.from.to_string(),
        }
    }

    /// One `outbox_audit` row for a real run (also when it failed).
    async fn audit(
        &self,
        config: &Config,
        summary: &anyhow::Result<ReplaySummary>,
    ) -> anyhow::Result<()> {
        let (_, _, max_table, max_result) = AUDIT_LIMITS;
        let tables: Vec<String> = config
            .outbox_tables()
            .iter()
            .map(ToString::to_string)
            .collect();
        let request = serde_json::json!({
            "from": self.from.to_string(),
            "to": self.to.as_ref().map(ToString::to_string),
            "to_time": self.to_time.map(format_unix),
            "server_id": self.server_id,
        });
        let (after, result) = match summary {
            Ok(s) => (serde_json::to_value(s)?, s.line()),
            Err(e) => (serde_json::Value::Null, format!("error: {e:#}")),
        };
        let pool = crate::db::pool(config)?;
        let written = pool
            .get_conn()
            .await?
            .exec_drop(
                "INSERT INTO outbox_audit \
                 (operator, reason, action, outbox_table, event_id, before_state, after_state, result) \
                 VALUES (?, ?, 'replay', ?, NULL, ?, ?, ?)",
                (
                    self.operator.trim(),
                    self.reason.trim(),
                    truncate(&tables.join(","), max_table),
                    request.to_string(),
                    after.to_string(),
                    truncate(&result, max_result),
                ),
            )
            .await;
        pool.disconnect().await.ok();
        written.map_err(|e| anyhow::anyhow!("cannot write the outbox_audit row: {e}"))
    }
}

/// Is the transaction ending at `end` inside the range ending at `to`?
fn within(to: &BinlogPosition, end: &TxEnd) -> bool {
    match (&end.gtid, &to.mariadb_gtid, &to.mysql_gtid_set) {
        (Some(TxGtid::MariaDb(g)), Some(bound), _) => {
            bound.get(g.domain).is_some_and(|b| b.seq >= g.seq)
        }
        (Some(TxGtid::MySql(source, gno)), _, Some(bound)) => bound.contains(source, *gno),
        _ => match &to.file {
            Some(file) => (end.file.as_str(), end.end_pos) <= (file.as_str(), to.pos),
            None => true,
        },
    }
}

/// The sending side of a real replay: the relay's router and shards, and a task counting the
/// outcomes.
struct Sending {
    inputs: SendInputs,
    stage: SendStage<Vec<ReplayFailure>>,
    counts: Arc<(AtomicU64, AtomicU64)>,
}

impl Sending {
    fn start<S: Sink>(pipeline: &PipelineBuilder<'_, S>) -> Self {
        let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let tally = Arc::clone(&counts);
        let (stage, inputs) =
            pipeline.send_stage(|mut completions: mpsc::Receiver<Completion>| async move {
                let mut failures = Vec::new();
                while let Some(done) = completions.recv().await {
                    match done.outcome {
                        SendOutcome::Sent { .. } => tally.0.fetch_add(1, Ordering::Relaxed),
                        SendOutcome::Failed { reason, .. } => {
                            if failures.len() < MAX_LISTED_FAILURES {
                                failures.push(ReplayFailure {
                                    event_id: done.event_id,
                                    reason,
                                });
                            }
                            tally.1.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
                failures
            });
        Sending {
            inputs,
            stage,
            counts,
        }
    }

    async fn send(&self, row: OutboxRow) -> anyhow::Result<()> {
        Ok(self.inputs.send(ShardEvent::claimed(row)).await?)
    }

    fn counts(&self) -> (u64, u64) {
        (
            self.counts.0.load(Ordering::Relaxed),
            self.counts.1.load(Ordering::Relaxed),
        )
    }

    /// Waits until every event handed over has its outcome (a short while when interrupted).
    async fn finish(self, summary: &mut ReplaySummary, interrupted: bool) {
        let Sending {
            inputs,
            stage,
            counts,
        } = self;
        drop(inputs);
        let timeout = match interrupted {
            true => INTERRUPT_DRAIN,
            false => Duration::MAX,
        };
        summary.failures = stage
            .finish(timeout, "they were not replayed: run the replay again")
            .await
            .unwrap_or_default();
        summary.sent = counts.0.load(Ordering::Relaxed);
        summary.failed = counts.1.load(Ordering::Relaxed);
    }
}

fn truncate(text: &str, max_chars: usize) -> String {
    text.chars().take(max_chars).collect()
}

#[cfg(test)]
mod tests;
