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
//!   its `biz_key`, in commit order per key (the relay's [`Router`] and [`Shards`]); only
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

use crate::binlog::reader::{check_server, BinlogReader};
use crate::binlog::{BinlogItem, BinlogPosition, DecodedRow, OutboxRow, TxEnd, TxGtid};
use crate::checkpoint::history::{CheckpointHistory, HistoryEntry};
use crate::checkpoint::store::StoreError;
use crate::checkpoint::SledStore;
use crate::config::Config;
use crate::relay::Shards;
use crate::retry::RetryPolicy;
use crate::route::Router;
use crate::send::{Completion, Outcome, ShardEvent, Sink};
use mysql_async::prelude::*;
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

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
        let sending = Sending::start(&sink, config);
        let summary = self.execute(config, Some(sending), observer, cancel).await;
        self.audit(config, &summary).await?;
        summary
    }

    /// Lists the events of the range; sends and writes nothing.
    pub async fn dry_run(
        &self,
        config: &Config,
        observer: impl FnMut(ReplayEvent<'_>),
        cancel: CancellationToken,
    ) -> anyhow::Result<ReplaySummary> {
        self.validate(config, true)?;
        self.execute(config, None, observer, cancel).await
    }

    async fn execute(
        &self,
        config: &Config,
        sending: Option<Sending>,
        mut observer: impl FnMut(ReplayEvent<'_>),
        cancel: CancellationToken,
    ) -> anyhow::Result<ReplaySummary> {
        let opts = crate::db::opts(config)?;
        let tables = crate::relay::qualified_tables(config)?;
        let server = check_server(&opts, &tables).await?;
        let to = self.to.clone().unwrap_or_else(|| server.current.clone());
        if !server.current.covers(&to) {
            return Err(ReplayError::PastTheEnd {
                to: to.to_string(),
                current: server.current.to_string(),
            }
            .into());
        }
        let mut summary = ReplaySummary {
            dry_run: sending.is_none(),
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
        };
        if self.from.covers(&to) {
            if let Some(sending) = sending {
                sending.finish(&mut summary, false).await;
            }
            return Ok(summary);
        }
        let mut options = crate::relay::reader_options(config, opts, tables, server.flavor);
        options.server_id = self.server_id;
        let (items_tx, mut items) = mpsc::channel(CHANNEL_CAPACITY);
        let reading = cancel.child_token();
        let reader = tokio::spawn(BinlogReader::new(options).run(
            self.from.clone(),
            items_tx,
            reading.clone(),
        ));
        let mut position = self.from.clone();
        let mut progress = Progress::default();
        let mut buffered: Vec<OutboxRow> = Vec::new();
        let mut unpublishable = 0;
        summary.stopped = Stop::Interrupted;
        while let Some(item) = tokio::select! {
            _ = cancel.cancelled() => None,
            item = items.recv() => item,
        } {
            let end = match item {
                BinlogItem::TxBegin | BinlogItem::Restart => {
                    buffered.clear();
                    unpublishable = 0;
                    continue;
                }
                BinlogItem::Row(DecodedRow::Event(row)) => {
                    buffered.push(row);
                    continue;
                }
                BinlogItem::Row(DecodedRow::Problem(_)) => {
                    unpublishable += 1;
                    continue;
                }
                BinlogItem::Row(DecodedRow::NotPending | DecodedRow::Unidentifiable(_)) => continue,
                BinlogItem::TxEnd(end) => end,
            };
            if self.to_time.is_some_and(|t| end.timestamp > t) {
                summary.stopped = Stop::PassedTime;
                break;
            }
            if within(&to, &end) {
                summary.unpublishable += unpublishable;
                for row in buffered.drain(..) {
                    observer(ReplayEvent::Event {
                        row: &row,
                        commit: &end,
                    });
                    progress.events += 1;
                    if let Some(sending) = &sending {
                        sending.send(row).await?;
                    }
                }
            } else {
                summary.outside_range += 1;
            }
            buffered.clear();
            unpublishable = 0;
            position.advance(&end);
            progress.transactions += 1;
            progress.position = position.to_string();
            if let Some(sending) = &sending {
                (progress.sent, progress.failed) = sending.counts();
            }
            observer(ReplayEvent::Progress(&progress));
            if position.covers(&to) {
                summary.stopped = Stop::ReachedEnd;
                break;
            }
        }
        reading.cancel();
        drop(items);
        let read = reader.await?;
        summary.transactions = progress.transactions;
        summary.events = progress.events;
        summary.reached = position.to_string();
        if let Some(sending) = sending {
            let interrupted = summary.stopped == Stop::Interrupted;
            sending.finish(&mut summary, interrupted).await;
            (progress.sent, progress.failed) = (summary.sent, summary.failed);
            observer(ReplayEvent::Progress(&progress));
        }
        if summary.stopped == Stop::Interrupted && !cancel.is_cancelled() {
            read?; // the reader ended on its own: a permanent error
            anyhow::bail!("the binlog stream ended before the end of the range");
        }
        Ok(summary)
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
    router: Router,
    inputs: Vec<mpsc::Sender<ShardEvent>>,
    shards: Shards,
    counts: Arc<(AtomicU64, AtomicU64)>,
    collector: JoinHandle<Vec<ReplayFailure>>,
}

impl Sending {
    fn start<S: Sink>(sink: &Arc<S>, config: &Config) -> Self {
        let (done_tx, mut done) = mpsc::channel::<Completion>(CHANNEL_CAPACITY);
        let (shards, inputs) = Shards::start(
            sink,
            config.relay.shards,
            CHANNEL_CAPACITY,
            RetryPolicy::from_config(&config.retry),
            &done_tx,
        );
        let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let tally = Arc::clone(&counts);
        let collector = tokio::spawn(async move {
            let mut failures = Vec::new();
            while let Some(done) = done.recv().await {
                match done.outcome {
                    Outcome::Sent { .. } => tally.0.fetch_add(1, Ordering::Relaxed),
                    Outcome::Failed { reason, .. } => {
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
            router: Router::new(config.relay.shards),
            inputs,
            shards,
            counts,
            collector,
        }
    }

    async fn send(&self, row: OutboxRow) -> anyhow::Result<()> {
        let event = ShardEvent::claimed(row);
        let shard = self.router.shard(event.key_hash);
        self.inputs[shard]
            .send(event)
            .await
            .map_err(|_| anyhow::anyhow!("a shard sender stopped"))
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
            shards,
            counts,
            collector,
            ..
        } = self;
        drop(inputs);
        let timeout = match interrupted {
            true => INTERRUPT_DRAIN,
            false => Duration::MAX,
        };
        shards
            .drain(timeout, "they were not replayed: run the replay again")
            .await;
        summary.failures = collector.await.unwrap_or_default();
        summary.sent = counts.0.load(Ordering::Relaxed);
        summary.failed = counts.1.load(Ordering::Relaxed);
    }
}

/// Parses `--from-gtid` / `--to-gtid`: a MariaDB GTID position (`0-1-100[,1-2-7]`) or a MySQL
/// GTID set (`uuid:1-100[,…]`).
pub fn parse_gtid_position(text: &str) -> Result<BinlogPosition, String> {
    let mut position = BinlogPosition::default();
    if text.contains(':') {
        position.mysql_gtid_set = Some(text.parse().map_err(|e| format!("{e}"))?);
    } else {
        position.mariadb_gtid = Some(text.parse().map_err(|e| format!("{e}"))?);
    }
    if position.is_unknown() {
        return Err(format!("{text:?} is an empty GTID position"));
    }
    Ok(position)
}

/// Parses `--from-time` / `--to-time`: a UTC time (`2025-06-01 13:00:00`, or RFC 3339 ending
/// in `Z`; other offsets are refused) or a duration ago (`90m`).
pub fn parse_time(text: &str) -> Result<SystemTime, String> {
    if let Ok(time) = humantime::parse_rfc3339_weak(text.trim()) {
        return Ok(time);
    }
    match humantime::parse_duration(text.trim()) {
        Ok(ago) => Ok(SystemTime::now() - ago),
        Err(_) => Err(format!(
            "{text:?} is neither a UTC time (2025-06-01 13:00:00, or …T13:00:00Z) nor a duration ago (90m)"
        )),
    }
}

/// Unix seconds of `time` (for `Replay::to_time`).
pub fn unix_seconds(time: SystemTime) -> u32 {
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    u32::try_from(secs).unwrap_or(u32::MAX)
}

fn format_unix(secs: u32) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs.into())).to_string()
}

/// The newest saved checkpoint at or before `time` (where `--from-time` starts).
pub fn checkpoint_at_or_before(
    history: &CheckpointHistory,
    time: SystemTime,
) -> anyhow::Result<HistoryEntry> {
    let millis = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    if let Some(entry) = history.at_or_before(millis)? {
        return Ok(entry);
    }
    let oldest = history.list()?.into_iter().next();
    match oldest {
        Some(oldest) => anyhow::bail!(
            "no checkpoint was saved at or before {}: the oldest in the history is #{} at {}; \
             use --from-checkpoint {} or --from-gtid",
            humantime::format_rfc3339_seconds(time),
            oldest.number,
            format_millis(oldest.at_millis),
            oldest.number
        ),
        None => anyhow::bail!(
            "the checkpoint history is empty (the relay records one entry per minute while it \
             runs): use --from-gtid"
        ),
    }
}

/// Opens the sled store in `dir` to read its checkpoint history; a directory locked by a
/// running relay is an error that says what to do.
pub fn open_history_store(dir: &Path) -> anyhow::Result<SledStore> {
    if !dir.is_dir() {
        anyhow::bail!(
            "no checkpoint directory at {}: the history is kept in the relay's relay.checkpoint_dir \
             (pass the relay's config with -c, or --checkpoint-dir)",
            dir.display()
        );
    }
    SledStore::open(dir).map_err(|e| match e {
        StoreError::Sled {
            source: sled::Error::Io(io),
            ..
        } if is_lock_conflict(&io) => anyhow::anyhow!(
            "the checkpoint directory {0} is locked by a running relay: stop the relay or copy \
             the directory (cp -r {0} /tmp/relay-state-copy) and pass \
             --checkpoint-dir /tmp/relay-state-copy",
            dir.display()
        ),
        other => other.into(),
    })
}

/// sled reports a directory locked by another process as an `Other` error whose text says so
/// (wrapping the `WouldBlock` of the file lock).
fn is_lock_conflict(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::WouldBlock
        || error.to_string().contains("could not acquire lock")
}

/// A history time for people: `2025-06-01T13:00:00.123Z`.
pub fn format_millis(millis: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(millis)).to_string()
}

fn truncate(text: &str, max_chars: usize) -> String {
    text.chars().take(max_chars).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end_maria(seq: u64) -> TxEnd {
        TxEnd {
            gtid: Some(TxGtid::MariaDb(format!("0-1-{seq}").parse().unwrap())),
            file: "binlog.000001".into(),
            end_pos: 100 * seq,
            timestamp: 0,
        }
    }

    #[test]
    fn the_range_ends_at_the_bound_inclusive() {
        let to = parse_gtid_position("0-1-20").unwrap();
        assert!(within(&to, &end_maria(20)));
        assert!(!within(&to, &end_maria(21)));
        let other_domain = TxEnd {
            gtid: Some(TxGtid::MariaDb("1-1-5".parse().unwrap())),
            ..end_maria(5)
        };
        assert!(!within(&to, &other_domain), "a domain the bound lacks");
        let by_file = BinlogPosition {
            file: Some("binlog.000001".into()),
            pos: 2000,
            ..BinlogPosition::default()
        };
        let no_gtid = |pos| TxEnd {
            gtid: None,
            end_pos: pos,
            ..end_maria(1)
        };
        assert!(within(&by_file, &no_gtid(2000)));
        assert!(!within(&by_file, &no_gtid(2001)));
        let uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        let set = parse_gtid_position(&format!("{uuid}:1-10")).unwrap();
        let source = crate::binlog::MySqlSource {
            uuid: uuid.into(),
            tag: None,
        };
        let mysql = |gno| TxEnd {
            gtid: Some(TxGtid::MySql(source.clone(), gno)),
            ..end_maria(1)
        };
        assert!(within(&set, &mysql(10)) && !within(&set, &mysql(11)));
    }

    #[test]
    fn gtid_and_time_arguments() {
        assert_eq!(
            parse_gtid_position("0-1-100").unwrap().to_string(),
            "gtid 0-1-100"
        );
        assert!(parse_gtid_position("").is_err());
        assert!(parse_gtid_position("x-y").is_err());
        let t = parse_time("2025-06-01 13:00:00").unwrap();
        assert_eq!(unix_seconds(t), 1_748_782_800);
        assert_eq!(parse_time("2025-06-01T13:00:00Z").unwrap(), t);
        assert!(parse_time("2025-06-01T15:00:00+02:00").is_err(), "UTC only");
        let ago = parse_time("10m").unwrap();
        let diff = SystemTime::now().duration_since(ago).unwrap();
        assert!(diff >= Duration::from_secs(600) && diff < Duration::from_secs(660));
        assert!(parse_time("yesterday-ish").is_err());
        assert_eq!(format_unix(1_748_782_800), "2025-06-01T13:00:00Z");
    }

    #[test]
    fn a_real_run_needs_operator_and_reason() {
        let config = Config::default();
        let replay = Replay {
            from: parse_gtid_position("0-1-1").unwrap(),
            to: None,
            to_time: None,
            operator: String::new(),
            reason: "why".into(),
            server_id: config.mysql.server_id + 1,
        };
        assert!(replay.validate(&config, true).is_ok());
        let err = replay.validate(&config, false).unwrap_err();
        assert!(err
            .to_string()
            .contains("--operator and --reason are required"));
        let own_id = Replay {
            server_id: config.mysql.server_id,
            ..replay.clone()
        };
        assert!(matches!(
            own_id.validate(&config, true),
            Err(ReplayError::RelayServerId(_))
        ));
        let no_start = Replay {
            from: BinlogPosition::default(),
            ..replay
        };
        assert!(matches!(
            no_start.validate(&config, true),
            Err(ReplayError::NoStart)
        ));
    }

    #[test]
    fn a_time_maps_to_the_newest_checkpoint_before_it() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let history = CheckpointHistory::new(db.open_tree("h").unwrap());
        let err = checkpoint_at_or_before(&history, SystemTime::now()).unwrap_err();
        assert!(err.to_string().contains("history is empty"), "{err}");
        history
            .record_at(1_748_782_800_000, &parse_gtid_position("0-1-5").unwrap())
            .unwrap();
        let entry =
            checkpoint_at_or_before(&history, parse_time("2025-06-01 13:30:00").unwrap()).unwrap();
        assert_eq!(entry.position.to_string(), "gtid 0-1-5");
        let err = checkpoint_at_or_before(&history, parse_time("2025-06-01 12:00:00").unwrap())
            .unwrap_err();
        assert!(err.to_string().contains("--from-checkpoint 1"), "{err}");
    }
}
