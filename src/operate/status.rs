//! `outbox-relay status`: one snapshot of the outbox and the relay, and a one-line verdict.
//!
//! [`StatusReport::gather`] reads (never writes) per outbox table: counts by status, the oldest
//! PENDING row (its age is `outbox_oldest_pending_seconds`: seconds since its `created_at`, 0
//! when there is none), SENDING rows whose lease has expired, FAILED rows grouped by
//! `last_error` (the 10 most frequent reasons, truncated) and how many became FAILED recently;
//! then the relay's row of `outbox_relay_state` (the checkpoint mirror, its time and age, the
//! leader and its epoch) and the binlog lag: the server's current position against the mirrored
//! checkpoint (transactions behind per GTID domain on MariaDB, transactions missing from the GTID
//! set on MySQL, and bytes behind when both are in the same binlog file). Every time is the
//! database's clock. The report is serde-serialisable (`--json`, and reusable by `/metrics`).
//!
//! # Verdict rules
//!
//! The most severe that applies wins; every one that applies is listed as a reason.
//!
//! 1. **stuck**: some SENDING row's lease has expired (its sender died and lease recovery has
//!    not put it back), or the oldest PENDING row is older than the lag threshold **and** the
//!    checkpoint has not moved for `stuck_after` (60 s). One snapshot cannot see the oldest row
//!    "growing"; a PENDING row older than the threshold is one the relay has not sent, and a
//!    checkpoint that does not move while rows wait means the stream is not progressing. In CDC
//!    mode a missing checkpoint counts as not moving; in poll mode there is no checkpoint and
//!    only the lease rule applies. Also stuck in CDC mode: **no instance streams**, because
//!    `outbox_relay_state` names no leader (every instance stopped, or none has run here) or
//!    the leader's election lease ran out more than 30 s ago with no takeover. Whatever the
//!    rows look like at that moment, nothing reads the binlog, so new events wait for the
//!    sweeper at best.
//! 2. **failing**: rows became FAILED within the failing window (1 h): their `updated_at`, the
//!    time they were marked, is in the window (a row created earlier that failed after its
//!    retries counts too). FAILED rows older than the window are listed but do not fail the
//!    check: an operator has seen them (or `retry` / `mark-failed` decides).
//! 3. **lagging**: the oldest PENDING row is older than the lag threshold (30 s), or the
//!    mirrored checkpoint is more than `behind_threshold` (10,000) transactions behind the
//!    server's end of binlog (a restart would read them all again; a checkpoint held by a
//!    prepared XA transaction or a held key shows here while other events still flow). The
//!    mirror is written every 2 s, so a busy healthy relay is always somewhat behind: the
//!    default is 2 s of a server committing 5,000 transactions/s; raise it for busier servers.
//! 4. **healthy**: none of the above.
//!
//! Exit code of the command: 0 when healthy, 1 otherwise.
//!
//! Cost: the counts by status read `idx_pending (status)` whole; on a very large outbox run
//! `cleanup` (or partition) so SENT rows do not pile up. The oldest PENDING row is one entry of
//! it (the lowest PENDING id).

use crate::binlog::reader::server_position;
use crate::binlog::{BinlogPosition, MariaDbGtid};
use crate::config::{Config, RelayMode};
use mysql_async::prelude::*;
use mysql_async::Conn;
use serde::Serialize;
use std::time::Duration;

mod judge;
mod table;
mod waiting;

use judge::judge;
pub(crate) use table::oldest_pending;
use table::table_status;
#[cfg(test)]
use table::truncate_reason;
pub use waiting::WaitingTopic;

/// Longest FAILED reason shown (characters).
const MAX_REASON_DISPLAY: usize = 120;

/// Most FAILED reasons listed per table.
const TOP_REASONS: usize = 10;

/// Thresholds of the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusOptions {
    /// The oldest PENDING row older than this is `lagging`.
    #[serde(with = "humantime_serde")]
    pub lag_threshold: Duration,
    /// A checkpoint unchanged for this long while rows wait is `stuck`.
    #[serde(with = "humantime_serde")]
    pub stuck_after: Duration,
    /// Rows marked FAILED within this window are `failing`.
    #[serde(with = "humantime_serde")]
    pub failing_window: Duration,
    /// The mirrored checkpoint more than this many transactions behind the server is
    /// `lagging`.
    pub behind_threshold: u64,
}

/// The default [`StatusOptions::behind_threshold`]: 2 s (the mirror's period) of a server
/// committing 5,000 transactions/s.
pub const DEFAULT_BEHIND_THRESHOLD: u64 = 10_000;

impl Default for StatusOptions {
    fn default() -> Self {
        StatusOptions {
            lag_threshold: Duration::from_secs(30),
            stuck_after: Duration::from_secs(60),
            failing_window: Duration::from_secs(3600),
            behind_threshold: DEFAULT_BEHIND_THRESHOLD,
        }
    }
}

/// The one-line answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Healthy,
    Lagging,
    Failing,
    Stuck,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Healthy => "healthy",
            Verdict::Lagging => "lagging",
            Verdict::Failing => "failing",
            Verdict::Stuck => "stuck",
        }
    }
}

/// The oldest PENDING row of a table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OldestPending {
    pub id: i64,
    pub event_id: String,
    pub topic: String,
    pub created_at: String,
    pub age_seconds: f64,
}

/// FAILED rows with one (truncated) reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailedReason {
    pub reason: String,
    pub count: u64,
}

/// One outbox table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TableStatus {
    pub table: String,
    pub pending: u64,
    pub sending: u64,
    pub sent: u64,
    pub failed: u64,
    /// `outbox_oldest_pending_seconds`: 0 when no row is PENDING.
    pub oldest_pending_seconds: f64,
    pub oldest_pending: Option<OldestPending>,
    /// SENDING rows whose `lease_until` has passed.
    pub expired_leases: u64,
    /// FAILED rows whose `updated_at` is within the failing window.
    pub failed_recently: u64,
    /// The most frequent `last_error` values of FAILED rows, most frequent first.
    pub failed_reasons: Vec<FailedReason>,
    /// The topics whose rows wait (PENDING), the longest waiting first.
    pub waiting: Vec<WaitingTopic>,
}

/// The relay's row of `outbox_relay_state`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RelayState {
    pub name: String,
    /// Is there a row at all (a relay of this name has run here)?
    pub found: bool,
    /// The mirrored checkpoint, readable (`gtid 0-1-42, binlog.000003:1234`).
    pub checkpoint: Option<String>,
    pub checkpoint_at: Option<String>,
    pub checkpoint_age_seconds: Option<f64>,
    /// The instance that streams, if one does.
    pub leader: Option<String>,
    pub leader_epoch: i64,
    /// Elected by lease (`relay.election`): seconds until the leader's lease runs out unless it
    /// renews (negative: it ran out that long ago). `None` when elected by lock, or no leader.
    pub lease_left_seconds: Option<f64>,
    /// Elected by lock: whether a connection holds the election lock now (`IS_USED_LOCK` on the
    /// server `status` asked: the lock is local to one server). `None` when elected by lease,
    /// or no leader.
    pub lock_held: Option<bool>,
    #[serde(skip)]
    pub position: Option<BinlogPosition>,
}

/// How far the mirrored checkpoint is behind the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BinlogLag {
    pub server_version: String,
    /// The server's current position (`SHOW MASTER STATUS`, `gtid_binlog_pos` / `gtid_executed`).
    pub server_position: String,
    /// MariaDB: per GTID domain, the server's and the checkpoint's last sequence numbers.
    pub domains: Vec<DomainLag>,
    /// Transactions the checkpoint is behind (sum over domains, or the GTID set difference);
    /// `None` without GTIDs or without a checkpoint.
    pub transactions_behind: Option<u64>,
    /// Bytes behind, when the checkpoint and the server are in the same binlog file.
    pub bytes_behind: Option<u64>,
}

/// One MariaDB replication domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DomainLag {
    pub domain: u32,
    pub server_seq: u64,
    pub checkpoint_seq: Option<u64>,
    pub behind: u64,
}

/// Everything `status` shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusReport {
    pub database_time: String,
    pub mode: RelayMode,
    pub tables: Vec<TableStatus>,
    /// The largest of the tables' `oldest_pending_seconds`.
    pub oldest_pending_seconds: f64,
    pub relay: RelayState,
    /// `None` when the server position could not be read (see `binlog_error`).
    pub binlog: Option<BinlogLag>,
    pub binlog_error: Option<String>,
    /// The XA transactions the server has prepared and not ended (`XA RECOVER`): each holds its
    /// events, and the relay's checkpoint until it is parked.
    pub prepared_xa: Vec<String>,
    /// Why they could not be listed (MySQL 8+ needs `XA_RECOVER_ADMIN`).
    pub prepared_xa_error: Option<String>,
    /// The dead-letter queues of `rocketmq.dead_letter_groups`, from the broker: events those
    /// consumers gave up on. Shown, not judged: the verdict is the relay's.
    pub dead_letters: Vec<super::dead_letters::DeadLetterQueue>,
    /// Why they could not be read.
    pub dead_letters_error: Option<String>,
    pub thresholds: StatusOptions,
    pub verdict: Verdict,
    /// Why the verdict is not `healthy` (empty when it is).
    pub reasons: Vec<String>,
}

impl StatusReport {
    /// Reads the status of every table in `outbox.tables` and of the relay `relay.name`.
    pub async fn gather(config: &Config, options: &StatusOptions) -> anyhow::Result<Self> {
        let opts = crate::db::opts(config)?;
        let mut conn = Conn::new(opts.clone())
            .await
            .map_err(|e| anyhow::anyhow!("cannot connect to MySQL: {e}"))?;
        let report = Self::gather_on(&mut conn, config, options).await;
        conn.disconnect().await.ok();
        let mut report = report?;
        match server_position(&opts).await {
            Ok(server) => {
                report.binlog = Some(binlog_lag(
                    server.version,
                    &server.current,
                    report.relay.position.as_ref(),
                ));
                // Judged again: how far the checkpoint is behind counts too.
                (report.verdict, report.reasons) = judge(
                    &report.tables,
                    &report.relay,
                    report.binlog.as_ref(),
                    report.mode,
                    options,
                );
            }
            Err(e) => report.binlog_error = Some(e.to_string()),
        }
        let groups = &config.rocketmq.dead_letter_groups;
        if !groups.is_empty() {
            match super::dead_letters::read(&config.rocketmq, groups).await {
                Ok(queues) => report.dead_letters = queues,
                Err(e) => report.dead_letters_error = Some(format!("{e:#}")),
            }
        }
        Ok(report)
    }

    /// The database part of [`StatusReport::gather`] on an open connection (no binlog lag).
    pub async fn gather_on(
        conn: &mut Conn,
        config: &Config,
        options: &StatusOptions,
    ) -> Result<Self, mysql_async::Error> {
        let database_time: Option<String> = conn.query_first("SELECT CAST(NOW(3) AS CHAR)").await?;
        let mut tables = Vec::new();
        for table in config.outbox_tables() {
            let lag = options.lag_threshold.as_secs_f64();
            tables.push(table_status(conn, &table, options.failing_window, lag).await?);
        }
        let relay = relay_state(conn, &config.relay.name).await?;
        let (prepared_xa, prepared_xa_error) = match waiting::prepared_xa(conn).await {
            Ok(xids) => (xids, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        let oldest_pending_seconds = tables
            .iter()
            .map(|t| t.oldest_pending_seconds)
            .fold(0.0, f64::max);
        let (verdict, reasons) = judge(&tables, &relay, None, config.relay.mode, options);
        Ok(StatusReport {
            database_time: database_time.unwrap_or_default(),
            mode: config.relay.mode,
            tables,
            oldest_pending_seconds,
            relay,
            binlog: None,
            binlog_error: None,
            prepared_xa,
            prepared_xa_error,
            dead_letters: Vec::new(),
            dead_letters_error: None,
            thresholds: options.clone(),
            verdict,
            reasons,
        })
    }

    /// `0` when healthy, `1` otherwise (the command's exit code).
    pub fn exit_code(&self) -> u8 {
        u8::from(self.verdict != Verdict::Healthy)
    }

    /// `verdict: lagging — oldest PENDING row is 95.2 s old (threshold 30 s)`.
    pub fn verdict_line(&self) -> String {
        match self.reasons.is_empty() {
            true => format!("verdict: {}", self.verdict.name()),
            false => format!(
                "verdict: {} — {}",
                self.verdict.name(),
                self.reasons.join("; ")
            ),
        }
    }
}

async fn relay_state(conn: &mut Conn, name: &str) -> Result<RelayState, mysql_async::Error> {
    type Row = (
        Option<String>,
        Option<String>,
        Option<i64>,
        Option<String>,
        i64,
        Option<i64>,
    );
    let row: Option<Row> = conn
        .exec_first(
            "SELECT checkpoint, CAST(checkpoint_at AS CHAR), \
             TIMESTAMPDIFF(MICROSECOND, checkpoint_at, NOW(3)), leader, leader_epoch, \
             TIMESTAMPDIFF(MICROSECOND, NOW(3), lease_until) \
             FROM outbox_relay_state WHERE name = ?",
            (name,),
        )
        .await?;
    let mut state = RelayState {
        name: name.to_string(),
        found: row.is_some(),
        checkpoint: None,
        checkpoint_at: None,
        checkpoint_age_seconds: None,
        leader: None,
        leader_epoch: 0,
        lease_left_seconds: None,
        lock_held: None,
        position: None,
    };
    if let Some((checkpoint, at, age, leader, epoch, lease_left)) = row {
        state.position = checkpoint
            .as_deref()
            .and_then(|text| BinlogPosition::from_json(text).ok());
        state.checkpoint = match (&state.position, checkpoint) {
            (Some(position), _) => Some(position.to_string()),
            (None, Some(text)) => Some(format!("(unreadable) {text}")),
            (None, None) => None,
        };
        state.checkpoint_at = at;
        state.checkpoint_age_seconds = age.map(|micros| micros.max(0) as f64 / 1e6);
        state.lease_left_seconds = leader
            .is_some()
            .then_some(lease_left)
            .flatten()
            .map(|micros| micros as f64 / 1e6);
        if state.lease_left_seconds.is_none() && leader.is_some() {
            // No lease: elected by lock. Does anyone hold it now?
            let database: Option<Option<String>> = conn.query_first("SELECT DATABASE()").await?;
            let database = database.flatten().unwrap_or_default();
            let lock = crate::leader::lock::lock_name(&database, name);
            let holder: Option<Option<u64>> =
                conn.exec_first("SELECT IS_USED_LOCK(?)", (lock,)).await?;
            state.lock_held = Some(holder.flatten().is_some());
        }
        state.leader = leader;
        state.leader_epoch = epoch;
    }
    Ok(state)
}

/// The checkpoint's distance from the server's `current` position.
pub(crate) fn binlog_lag(
    server_version: String,
    current: &BinlogPosition,
    checkpoint: Option<&BinlogPosition>,
) -> BinlogLag {
    let mut lag = BinlogLag {
        server_version,
        server_position: current.to_string(),
        domains: Vec::new(),
        transactions_behind: None,
        bytes_behind: None,
    };
    let Some(checkpoint) = checkpoint else {
        return lag;
    };
    if let Some(server) = &current.mariadb_gtid {
        let gtids = server.to_string();
        for gtid in gtids
            .split(',')
            .filter_map(|g| g.parse::<MariaDbGtid>().ok())
        {
            let mine = checkpoint
                .mariadb_gtid
                .as_ref()
                .and_then(|p| p.get(gtid.domain))
                .map(|g| g.seq);
            lag.domains.push(DomainLag {
                domain: gtid.domain,
                server_seq: gtid.seq,
                checkpoint_seq: mine,
                behind: gtid.seq.saturating_sub(mine.unwrap_or(0)),
            });
        }
        lag.transactions_behind = Some(lag.domains.iter().map(|d| d.behind).sum());
    }
    if let Some(server) = &current.mysql_gtid_set {
        let mine = checkpoint.mysql_gtid_set.clone().unwrap_or_default();
        let missing = server
            .intervals()
            .map(|(source, start, end)| {
                let covered: u64 = mine
                    .intervals()
                    .filter(|(s, _, _)| *s == source)
                    .map(|(_, s, e)| end.min(e).saturating_sub(start.max(s)))
                    .sum();
                (end - start).saturating_sub(covered)
            })
            .sum();
        lag.transactions_behind = Some(missing);
    }
    if current.file.is_some() && current.file == checkpoint.file {
        lag.bytes_behind = Some(current.pos.saturating_sub(checkpoint.pos));
    }
    lag
}

#[cfg(test)]
mod tests;
