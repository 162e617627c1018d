//! Reconciliation: which events the producer side SENT that a consumer group never recorded in
//! its `event_dedup` table (status PROCESSED or REJECTED), per hour and topic.
//!
//! The window is the SENT rows created in the last `since` (hours are `created_at` hours: the
//! column `idx_created (created_at)` indexes, and an event's hour never moves),
//! whose `sent_at` is at least `grace` old: an event sent a moment ago may still be on its way,
//! so it is not expected yet. The rows are read in `(created_at, id)` pages of `chunk_size`, and
//! each page's event_ids are looked up on the consumer side with one
//! `SELECT … WHERE consumer_group = ? AND event_id IN (…)` (the primary key), so the two sides
//! may be different servers and no side is scanned whole.
//!
//! Each missing event_id becomes (or stays) an open row of `outbox_reconcile_diff` (migration
//! 0007), unique per consumer group, outbox table and event_id: repeating a run updates
//! `last_run_id` / `last_checked_at` and never duplicates a row. An open row whose event is
//! later found downstream gets `resolved_at`. Nothing else is written: outbox rows and business
//! data are only read.
//!
//! The consumer must keep its `event_dedup` rows longer than `since`, otherwise events whose
//! rows it purged are reported as missing.

use super::{db_time_ago, placeholders};
use crate::outbox::Status;
use crate::outbox::TableName;
use mysql_async::prelude::*;
use mysql_async::{Conn, Pool, Value};
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

/// The diff table (migration 0007).
pub const DIFF_TABLE: &str = "outbox_reconcile_diff";
/// MySQL `ER_NO_SUCH_TABLE`.
const ER_NO_SUCH_TABLE: u16 = 1146;

/// Reconcile settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconcile {
    /// Compare SENT rows created this long ago or later.
    pub since: Duration,
    /// Rows sent less than this long ago are not expected downstream yet.
    pub grace: Duration,
    /// The consumer group whose `event_dedup` rows count.
    pub consumer_group: String,
    /// Only these topics (all when empty).
    pub topics: Vec<String>,
    /// The consumer's dedup table (on the consumer pool).
    pub consumer_table: TableName,
    /// Event ids per page and per `IN (…)` lookup.
    pub chunk_size: usize,
    /// Write the diff table (false: only report).
    pub record: bool,
}

impl Reconcile {
    /// 24 h window, 5 min grace, pages of 1,000, the `event_dedup` table, recording diffs.
    pub fn new(consumer_group: impl Into<String>) -> Self {
        Reconcile {
            since: Duration::from_secs(24 * 3600),
            grace: Duration::from_secs(300),
            consumer_group: consumer_group.into(),
            topics: Vec::new(),
            consumer_table: TableName::parse("event_dedup").expect("valid name"),
            chunk_size: 1000,
            record: true,
        }
    }
}

/// One line of the summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HourTopic {
    pub table: String,
    /// `YYYY-MM-DD HH:00:00` (database time) of `created_at`.
    pub hour: String,
    pub topic: String,
    /// SENT rows compared.
    pub sent: u64,
    /// Of those, recorded PROCESSED or REJECTED by the consumer group.
    pub seen: u64,
    /// Of those, not recorded: in the diff table.
    pub missing: u64,
}

/// What a run found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReconcileReport {
    pub run_id: String,
    pub consumer_group: String,
    /// Rows created from this time (database time)…
    pub window_start: String,
    /// …and sent until this time were compared.
    pub grace_cutoff: String,
    pub rows: Vec<HourTopic>,
    /// SENT rows in the window sent within the grace period: not compared.
    pub in_grace: u64,
    /// Missing events not already open in the diff table.
    pub newly_missing: u64,
    /// Open diff rows whose event is now recorded downstream.
    pub resolved: u64,
    pub recorded: bool,
}

impl ReconcileReport {
    pub fn sent(&self) -> u64 {
        self.rows.iter().map(|r| r.sent).sum()
    }
    pub fn seen(&self) -> u64 {
        self.rows.iter().map(|r| r.seen).sum()
    }
    pub fn missing(&self) -> u64 {
        self.rows.iter().map(|r| r.missing).sum()
    }
}

/// Why a reconciliation could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("--chunk-size must be between 1 and 10000 (got {0})")]
    ChunkSize(usize),
    #[error("--grace ({grace}) must be shorter than --since ({since})")]
    Window { grace: String, since: String },
    #[error(
        "the outbox database has no `{DIFF_TABLE}` table: run `outbox-relay migrate` \
         (migration 0007 creates it)"
    )]
    NoDiffTable,
    #[error(
        "the consumer database has no `{0}` table: pass --consumer-url with the consumer's \
         database (and --consumer-table if it is named differently)"
    )]
    NoDedupTable(String),
    #[error("database error on the outbox side: {0}")]
    Producer(mysql_async::Error),
    #[error("database error on the consumer side: {0}")]
    Consumer(mysql_async::Error),
}

/// `(table, hour, topic)` → counts.
type Tally = BTreeMap<(String, String, String), (u64, u64, u64)>;

/// One SENT outbox row of the window.
struct SentRow {
    id: i64,
    event_id: String,
    topic: String,
    created_at: String,
    hour: String,
    sent_at: Option<String>,
}

impl Reconcile {
    /// Compares each of `tables` (on `producer`) with the consumer table (on `consumer`, which
    /// may be the same pool).
    pub async fn run(
        &self,
        producer: &Pool,
        consumer: &Pool,
        tables: &[TableName],
    ) -> Result<ReconcileReport, ReconcileError> {
        if self.chunk_size == 0 || self.chunk_size > 10_000 {
            return Err(ReconcileError::ChunkSize(self.chunk_size));
        }
        if self.grace >= self.since {
            return Err(ReconcileError::Window {
                grace: humantime::format_duration(self.grace).to_string(),
                since: humantime::format_duration(self.since).to_string(),
            });
        }
        let mut out = producer
            .get_conn()
            .await
            .map_err(ReconcileError::Producer)?;
        let mut dedup = consumer
            .get_conn()
            .await
            .map_err(ReconcileError::Consumer)?;
        let consumer_table = self.consumer_table.sql();
        dedup
            .query_drop(format!("SELECT 1 FROM {consumer_table} LIMIT 0"))
            .await
            .map_err(|e| match e {
                mysql_async::Error::Server(ref s) if s.code == ER_NO_SUCH_TABLE => {
                    ReconcileError::NoDedupTable(self.consumer_table.to_string())
                }
                e => ReconcileError::Consumer(e),
            })?;
        out.query_drop(format!("SELECT 1 FROM {DIFF_TABLE} LIMIT 0"))
            .await
            .map_err(|e| match e {
                mysql_async::Error::Server(ref s) if s.code == ER_NO_SUCH_TABLE => {
                    ReconcileError::NoDiffTable
                }
                e => ReconcileError::Producer(e),
            })?;
        let window_start = db_time_ago(&mut out, self.since)
            .await
            .map_err(ReconcileError::Producer)?;
        let grace_cutoff = db_time_ago(&mut out, self.grace)
            .await
            .map_err(ReconcileError::Producer)?;
        let mut report = ReconcileReport {
            run_id: uuid::Uuid::now_v7().to_string(),
            consumer_group: self.consumer_group.clone(),
            window_start,
            grace_cutoff,
            rows: Vec::new(),
            in_grace: 0,
            newly_missing: 0,
            resolved: 0,
            recorded: self.record,
        };
        let mut tally = Tally::new();
        for table in tables {
            self.reconcile_table(&mut out, &mut dedup, table, &mut report, &mut tally)
                .await?;
        }
        report.rows = tally
            .into_iter()
            .map(|((table, hour, topic), (sent, seen, missing))| HourTopic {
                table,
                hour,
                topic,
                sent,
                seen,
                missing,
            })
            .collect();
        Ok(report)
    }

    async fn reconcile_table(
        &self,
        out: &mut Conn,
        dedup: &mut Conn,
        table: &TableName,
        report: &mut ReconcileReport,
        tally: &mut Tally,
    ) -> Result<(), ReconcileError> {
        let name = table.to_string();
        let (topic_sql, topic_params) = self.topic_condition();
        report.in_grace += self
            .count_in_grace(out, table, report, &topic_sql, &topic_params)
            .await?;
        let open = self.open_diffs(out, &name).await?;
        let mut after: Option<(String, i64)> = None;
        loop {
            let page = self
                .page(out, table, report, &topic_sql, &topic_params, &after)
                .await?;
            let Some(last) = page.last() else { break };
            after = Some((last.created_at.clone(), last.id));
            let full = page.len() == self.chunk_size;
            let seen = self.seen_downstream(dedup, &page).await?;
            let (missing, resolved) = compare_page(&name, &page, &seen, &open, report, tally);
            if self.record {
                self.record_missing(out, &name, &report.run_id, &missing)
                    .await
                    .map_err(ReconcileError::Producer)?;
                report.resolved += self
                    .resolve(out, &name, &resolved)
                    .await
                    .map_err(ReconcileError::Producer)?;
            }
            if !full {
                break;
            }
        }
        Ok(())
    }

    /// SENT rows of the window sent within the grace period (not compared).
    async fn count_in_grace(
        &self,
        out: &mut Conn,
        table: &TableName,
        report: &ReconcileReport,
        topic_sql: &str,
        topic_params: &[Value],
    ) -> Result<u64, ReconcileError> {
        let mut params: Vec<Value> = vec![
            Status::Sent.code().into(),
            report.window_start.as_str().into(),
            report.grace_cutoff.as_str().into(),
        ];
        params.extend(topic_params.iter().cloned());
        let in_grace: Option<u64> = out
            .exec_first(
                format!(
                    "SELECT COUNT(*) FROM {} WHERE status = ? AND created_at >= ? \
                     AND COALESCE(sent_at, created_at) > ?{topic_sql}",
                    table.sql()
                ),
                params,
            )
            .await
            .map_err(ReconcileError::Producer)?;
        Ok(in_grace.unwrap_or(0))
    }

    /// The event_ids of this consumer group's open diff rows of the outbox table `name`.
    async fn open_diffs(
        &self,
        out: &mut Conn,
        name: &str,
    ) -> Result<HashSet<String>, ReconcileError> {
        Ok(out
            .exec::<String, _, _>(
                format!(
                    "SELECT event_id FROM {DIFF_TABLE} \
                     WHERE consumer_group = ? AND outbox_table = ? AND resolved_at IS NULL"
                ),
                (&self.consumer_group, name),
            )
            .await
            .map_err(ReconcileError::Producer)?
            .into_iter()
            .collect())
    }

    /// ` AND topic IN (…)` and its values, or nothing.
    fn topic_condition(&self) -> (String, Vec<Value>) {
        if self.topics.is_empty() {
            return (String::new(), Vec::new());
        }
        (
            format!(" AND topic IN ({})", placeholders(self.topics.len())),
            self.topics
                .iter()
                .map(|t| Value::from(t.as_str()))
                .collect(),
        )
    }

    /// The next page of SENT rows of the window after `after` in `(created_at, id)` order.
    async fn page(
        &self,
        out: &mut Conn,
        table: &TableName,
        report: &ReconcileReport,
        topic_sql: &str,
        topic_params: &[Value],
        after: &Option<(String, i64)>,
    ) -> Result<Vec<SentRow>, ReconcileError> {
        let mut params: Vec<Value> = vec![
            Status::Sent.code().into(),
            report.window_start.as_str().into(),
            report.grace_cutoff.as_str().into(),
            report.grace_cutoff.as_str().into(),
        ];
        params.extend(topic_params.iter().cloned());
        let keyset = match after {
            None => "",
            Some((created_at, id)) => {
                params.push(created_at.as_str().into());
                params.push(created_at.as_str().into());
                params.push((*id).into());
                " AND created_at >= ? AND (created_at > ? OR id > ?)"
            }
        };
        params.push(self.chunk_size.into());
        let rows: Vec<(i64, String, String, String, String, Option<String>)> = out
            .exec(
                format!(
                    "SELECT id, event_id, topic, CAST(created_at AS CHAR), \
                     DATE_FORMAT(created_at, '%Y-%m-%d %H:00:00'), CAST(sent_at AS CHAR) \
                     FROM {} WHERE status = ? AND created_at >= ? AND created_at <= ? \
                     AND COALESCE(sent_at, created_at) <= ?{topic_sql}{keyset} \
                     ORDER BY created_at, id LIMIT ?",
                    table.sql()
                ),
                params,
            )
            .await
            .map_err(ReconcileError::Producer)?;
        Ok(rows
            .into_iter()
            .map(|(id, event_id, topic, created_at, hour, sent_at)| SentRow {
                id,
                event_id,
                topic,
                created_at,
                hour,
                sent_at,
            })
            .collect())
    }

    /// The page's event_ids the consumer group recorded as PROCESSED or REJECTED.
    async fn seen_downstream(
        &self,
        dedup: &mut Conn,
        page: &[SentRow],
    ) -> Result<HashSet<String>, ReconcileError> {
        let mut params: Vec<Value> = vec![self.consumer_group.as_str().into()];
        params.extend(page.iter().map(|r| Value::from(r.event_id.as_str())));
        let seen: Vec<String> = dedup
            .exec(
                format!(
                    "SELECT event_id FROM {} WHERE consumer_group = ? AND event_id IN ({}) \
                     AND status IN ('PROCESSED', 'REJECTED')",
                    self.consumer_table.sql(),
                    placeholders(page.len())
                ),
                params,
            )
            .await
            .map_err(ReconcileError::Consumer)?;
        Ok(seen.into_iter().collect())
    }

    /// Upserts one open diff row per missing event (one statement per page).
    async fn record_missing(
        &self,
        out: &mut Conn,
        table: &str,
        run_id: &str,
        missing: &[&SentRow],
    ) -> Result<(), mysql_async::Error> {
        if missing.is_empty() {
            return Ok(());
        }
        let mut params: Vec<Value> = Vec::with_capacity(missing.len() * 8 + 1);
        for row in missing {
            params.extend([
                Value::from(self.consumer_group.as_str()),
                table.into(),
                row.event_id.as_str().into(),
                row.topic.as_str().into(),
                row.hour.as_str().into(),
                row.sent_at.as_deref().into(),
                run_id.into(),
                run_id.into(),
            ]);
        }
        params.push(run_id.into());
        let values = vec!["(?, ?, ?, ?, ?, ?, ?, ?)"; missing.len()].join(", ");
        out.exec_drop(
            format!(
                "INSERT INTO {DIFF_TABLE} (consumer_group, outbox_table, event_id, topic, \
                 hour_start, sent_at, run_id, last_run_id) VALUES {values} \
                 ON DUPLICATE KEY UPDATE last_run_id = ?, last_checked_at = NOW(3), \
                 resolved_at = NULL"
            ),
            params,
        )
        .await
    }

    /// Closes the open diff rows of events now seen downstream; returns how many.
    async fn resolve(
        &self,
        out: &mut Conn,
        table: &str,
        seen: &[&SentRow],
    ) -> Result<u64, mysql_async::Error> {
        if seen.is_empty() {
            return Ok(0);
        }
        let mut params: Vec<Value> = vec![self.consumer_group.as_str().into(), table.into()];
        params.extend(seen.iter().map(|r| Value::from(r.event_id.as_str())));
        out.exec_drop(
            format!(
                "UPDATE {DIFF_TABLE} SET resolved_at = NOW(3), last_checked_at = NOW(3) \
                 WHERE consumer_group = ? AND outbox_table = ? AND event_id IN ({}) \
                 AND resolved_at IS NULL",
                placeholders(seen.len())
            ),
            params,
        )
        .await?;
        Ok(out.affected_rows())
    }
}

/// Counts each row of `page` in `tally` (sent; seen or missing downstream) and the missing
/// events not already open in `report.newly_missing`; returns the rows missing downstream and
/// the open ones now seen (to resolve).
fn compare_page<'a>(
    name: &str,
    page: &'a [SentRow],
    seen: &HashSet<String>,
    open: &HashSet<String>,
    report: &mut ReconcileReport,
    tally: &mut Tally,
) -> (Vec<&'a SentRow>, Vec<&'a SentRow>) {
    let mut missing = Vec::new();
    let mut resolved = Vec::new();
    for row in page {
        let counts = tally
            .entry((name.to_string(), row.hour.clone(), row.topic.clone()))
            .or_default();
        counts.0 += 1;
        if seen.contains(&row.event_id) {
            counts.1 += 1;
            if open.contains(&row.event_id) {
                resolved.push(row);
            }
        } else {
            counts.2 += 1;
            if !open.contains(&row.event_id) {
                report.newly_missing += 1;
            }
            missing.push(row);
        }
    }
    (missing, resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_a_day_with_five_minutes_grace() {
        let r = Reconcile::new("g");
        assert_eq!(r.since, Duration::from_secs(86_400));
        assert_eq!(r.grace, Duration::from_secs(300));
        assert_eq!(r.consumer_table.sql(), "`event_dedup`");
        assert_eq!(r.chunk_size, 1000);
        assert!(r.record);
    }

    #[test]
    fn topics_become_an_in_list() {
        let mut r = Reconcile::new("g");
        assert_eq!(r.topic_condition().0, "");
        r.topics = vec!["a".into(), "b".into()];
        let (sql, params) = r.topic_condition();
        assert_eq!(sql, " AND topic IN (?, ?)");
        assert_eq!(params.len(), 2);
    }
}
