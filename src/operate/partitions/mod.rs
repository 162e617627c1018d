//! Daily partitions of the outbox tables: `convert`, `maintain` and `status` (the library behind
//! `outbox-relay partitions …` and the `[cleanup] partitions = true` round inside `run`).
//!
//! Guarantees:
//! - **A producer's INSERT never fails for want of a partition**: every layout this module
//!   writes ends with the catch-all `p_future VALUES LESS THAN (MAXVALUE)`; new days are split
//!   off it with `REORGANIZE PARTITION p_future INTO (…, p_future)`, which moves any rows it
//!   holds into their days.
//! - **No unfinished row is ever dropped**: a day partition is dropped only when its whole day
//!   is older than the retention (database clock) and it holds no PENDING, SENDING or FAILED
//!   row. The check and the `DROP PARTITION` run under `LOCK TABLES <outbox> WRITE`, so no
//!   session (an operator's `resend`/`retry`, the relay, a producer) can change a row of that
//!   day in between; each drop writes one `outbox_audit` row in the same locked session.
//! - **Idempotent**: `convert` on a partitioned table changes nothing and says so; `maintain`
//!   creates only missing days and drops only what the rule allows, so repeating it is a no-op.
//!   Two instances maintaining at once are serialised by the table lock.
//!
//! Every DDL waits at most `lock_wait` for the table's metadata lock (`lock_wait_timeout`): a
//! pending DDL makes every new writer of the table wait behind it, so a long transaction on
//! the outbox makes maintenance give up (and retry at the next round) rather than stall writers.

pub mod plan;

pub use plan::{Layout, Partition};

use super::compensate::{check_operator_and_reason, AuditRow, CompensateError};
use super::{db_time_ago, Status};
use crate::config::TableName;
use chrono::{NaiveDate, NaiveDateTime};
use mysql_async::prelude::*;
use mysql_async::{Conn, Pool};
use plan::UniqueKey;
use serde::Serialize;
use serde_json::json;
use std::time::{Duration, Instant};

/// The statuses a row may still be sent or decided from: a partition holding one is kept.
const UNFINISHED: [Status; 3] = [Status::Pending, Status::Sending, Status::Failed];

/// Why a partition command could not run.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error(transparent)]
    Operator(#[from] CompensateError),
    #[error(
        "{table}: the account lacks a privilege for partition maintenance ({source}): \
         GRANT SELECT, INSERT, ALTER, DROP, LOCK TABLES ON <database>.* TO the maintenance user \
         (INSERT is for outbox_audit)"
    )]
    Privilege {
        table: String,
        source: mysql_async::Error,
    },
    #[error(
        "{table}: waited {waited:?} for the table's metadata lock ({source}); a long \
         transaction holds the table: try again (or raise --lock-wait)"
    )]
    LockWait {
        table: String,
        waited: Duration,
        source: mysql_async::Error,
    },
    #[error("{table}: {message}")]
    Schema { table: String, message: String },
    #[error("{table}: database error: {source}")]
    Database {
        table: String,
        source: mysql_async::Error,
    },
}

impl PartitionError {
    fn of(table: &TableName, lock_wait: Duration) -> impl Fn(mysql_async::Error) -> Self + '_ {
        move |source| {
            let table = table.to_string();
            match &source {
                mysql_async::Error::Server(e) if e.code == 1205 => PartitionError::LockWait {
                    table,
                    waited: lock_wait,
                    source,
                },
                _ if crate::db::permanent_fault(&source)
                    == Some(crate::db::PermanentFault::Privilege) =>
                {
                    PartitionError::Privilege { table, source }
                }
                _ => PartitionError::Database { table, source },
            }
        }
    }
}

/// `TABLE_SCHEMA = …` for `table` (its own schema, or the connection's database).
fn schema_of(table: &TableName) -> Option<&str> {
    table.schema.as_deref()
}

/// The table's partitions, or `None` when it is not partitioned.
pub async fn read_layout(
    conn: &mut impl Queryable,
    table: &TableName,
) -> Result<Option<Layout>, mysql_async::Error> {
    let rows: Vec<(Option<String>, Option<String>, Option<u64>)> = conn
        .exec(
            "SELECT PARTITION_NAME, PARTITION_DESCRIPTION, TABLE_ROWS \
             FROM information_schema.PARTITIONS \
             WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? \
             ORDER BY PARTITION_ORDINAL_POSITION",
            (schema_of(table), &table.table),
        )
        .await?;
    let mut partitions = Vec::with_capacity(rows.len());
    for (name, description, rows) in rows {
        let Some(name) = name else { return Ok(None) };
        let description = description.unwrap_or_default();
        // A partition this module cannot read (another method) counts as not a day.
        let partition =
            Partition::parse(&name, &description, rows.unwrap_or(0)).unwrap_or(Partition {
                name,
                below: Some(NaiveDate::MIN),
                day: None,
                rows_estimate: rows.unwrap_or(0),
            });
        partitions.push(partition);
    }
    Ok((!partitions.is_empty()).then_some(Layout { partitions }))
}

/// The database's current day (`CURDATE()`).
pub async fn db_today(conn: &mut impl Queryable) -> Result<NaiveDate, mysql_async::Error> {
    let today: Option<String> = conn.query_first("SELECT CAST(CURDATE() AS CHAR)").await?;
    Ok(today
        .and_then(|t| NaiveDate::parse_from_str(&t, "%Y-%m-%d").ok())
        .unwrap_or_default())
}

/// Rows of `partition` that are PENDING, SENDING or FAILED (served by `idx_status_created`).
async fn unfinished_rows(
    conn: &mut impl Queryable,
    table: &TableName,
    partition: &str,
) -> Result<u64, mysql_async::Error> {
    let codes = UNFINISHED.map(|s| s.code());
    let count: Option<u64> = conn
        .exec_first(
            format!(
                "SELECT COUNT(*) FROM {} PARTITION (`{partition}`) WHERE status IN ({})",
                table.sql(),
                super::placeholders(codes.len())
            ),
            codes.to_vec(),
        )
        .await?;
    Ok(count.unwrap_or(0))
}

async fn set_lock_wait(conn: &mut Conn, lock_wait: Duration) -> Result<(), mysql_async::Error> {
    let seconds = lock_wait.as_secs().max(1);
    conn.query_drop(format!("SET SESSION lock_wait_timeout = {seconds}"))
        .await
}

/// Runs `LOCK TABLES <table> WRITE[, outbox_audit WRITE]`; the caller must [`unlock`].
async fn lock(conn: &mut Conn, table: &TableName, audit: bool) -> Result<(), mysql_async::Error> {
    let audit = if audit { ", outbox_audit WRITE" } else { "" };
    conn.query_drop(format!("LOCK TABLES {} WRITE{audit}", table.sql()))
        .await
}

/// `UNLOCK TABLES`, keeping the first error of the locked work.
async fn unlock<T>(
    conn: &mut Conn,
    result: Result<T, mysql_async::Error>,
) -> Result<T, mysql_async::Error> {
    let unlocked = conn.query_drop("UNLOCK TABLES").await;
    let value = result?;
    unlocked?;
    Ok(value)
}

// ---------------------------------------------------------------------------------------------
// convert

/// `partitions convert`: partition each table by day (see the module doc).
#[derive(Debug, Clone)]
pub struct Convert {
    /// Days after today to create.
    pub ahead: u32,
    pub operator: String,
    pub reason: String,
    /// Say what would be done, change nothing.
    pub dry_run: bool,
    pub lock_wait: Duration,
}

/// What `convert` did to one table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableConvert {
    pub table: String,
    /// `converted`, `would_convert` (dry run) or `already_partitioned`.
    pub outcome: &'static str,
    /// Partitions the table has now (would have, in a dry run), the catch-all included.
    pub partitions: usize,
    pub first_day: Option<String>,
    pub last_day: Option<String>,
    /// The key changes made (`ALTER TABLE` clauses).
    pub key_changes: Vec<String>,
    pub rows: u64,
    pub took_ms: u64,
}

impl Convert {
    pub fn validate(&self) -> Result<(), PartitionError> {
        if !self.dry_run {
            check_operator_and_reason(&self.operator, &self.reason)?;
        }
        Ok(())
    }

    /// Converts every table not yet partitioned, one `ALTER TABLE` each (a table copy: writers
    /// of that table wait until it ends), calling `progress` before each.
    pub async fn run(
        &self,
        pool: &Pool,
        tables: &[TableName],
        mut progress: impl FnMut(&str),
    ) -> Result<Vec<TableConvert>, PartitionError> {
        self.validate()?;
        let mut done = Vec::new();
        for table in tables {
            let err = PartitionError::of(table, self.lock_wait);
            let mut conn = pool.get_conn().await.map_err(&err)?;
            set_lock_wait(&mut conn, self.lock_wait)
                .await
                .map_err(&err)?;
            done.push(self.convert(&mut conn, table, &mut progress).await?);
        }
        Ok(done)
    }

    async fn convert(
        &self,
        conn: &mut Conn,
        table: &TableName,
        progress: &mut impl FnMut(&str),
    ) -> Result<TableConvert, PartitionError> {
        let err = PartitionError::of(table, self.lock_wait);
        let schema = |message: String| PartitionError::Schema {
            table: table.to_string(),
            message,
        };
        let mut report = TableConvert {
            table: table.to_string(),
            outcome: "already_partitioned",
            partitions: 0,
            first_day: None,
            last_day: None,
            key_changes: Vec::new(),
            rows: 0,
            took_ms: 0,
        };
        if let Some(layout) = read_layout(conn, table).await.map_err(&err)? {
            report.partitions = layout.partitions.len();
            report.first_day = layout.days().next().map(|d| d.to_string());
            report.last_day = layout.days().last().map(|d| d.to_string());
            return Ok(report);
        }
        let foreign: Vec<String> = conn
            .exec(
                "SELECT CONSTRAINT_NAME FROM information_schema.REFERENTIAL_CONSTRAINTS \
                 WHERE (CONSTRAINT_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?) \
                 OR (UNIQUE_CONSTRAINT_SCHEMA = COALESCE(?, DATABASE()) \
                     AND REFERENCED_TABLE_NAME = ?)",
                (
                    schema_of(table),
                    &table.table,
                    schema_of(table),
                    &table.table,
                ),
            )
            .await
            .map_err(&err)?;
        if !foreign.is_empty() {
            return Err(schema(format!(
                "foreign keys {} involve this table, and partitioned InnoDB tables cannot have \
                 them: drop them (ALTER TABLE … DROP FOREIGN KEY …), then run convert again",
                foreign.join(", ")
            )));
        }
        let key_columns: Vec<(String, String)> = conn
            .exec(
                "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS \
                 WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? \
                 AND NON_UNIQUE = 0 ORDER BY INDEX_NAME, SEQ_IN_INDEX",
                (schema_of(table), &table.table),
            )
            .await
            .map_err(&err)?;
        let mut keys: Vec<UniqueKey> = Vec::new();
        for (name, column) in key_columns {
            match keys.last_mut() {
                Some(key) if key.name == name => key.columns.push(column),
                _ => keys.push(UniqueKey {
                    name,
                    columns: vec![column],
                }),
            }
        }
        report.key_changes = plan::key_changes(&keys).map_err(schema)?;
        let (oldest, rows): (Option<String>, u64) = conn
            .query_first(format!(
                "SELECT CAST(DATE(MIN(created_at)) AS CHAR), COUNT(*) FROM {}",
                table.sql()
            ))
            .await
            .map_err(&err)?
            .unwrap_or((None, 0));
        let oldest = oldest.and_then(|d| NaiveDate::parse_from_str(&d, "%Y-%m-%d").ok());
        let today = db_today(conn).await.map_err(&err)?;
        let days = plan::convert_days(oldest, today, self.ahead);
        if days.len() >= plan::MAX_PARTITIONS {
            return Err(schema(format!(
                "the oldest row is from {}: {} daily partitions would exceed MySQL's limit; \
                 delete old SENT rows first (outbox-relay cleanup)",
                days[0],
                days.len()
            )));
        }
        report.partitions = days.len() + 1;
        report.first_day = days.first().map(|d| d.to_string());
        report.last_day = days.last().map(|d| d.to_string());
        report.rows = rows;
        if self.dry_run {
            report.outcome = "would_convert";
            return Ok(report);
        }
        progress(&format!(
            "{table}: converting {rows} rows into {} daily partitions ({} .. {}) and {}",
            days.len(),
            days[0],
            days[days.len() - 1],
            plan::FUTURE
        ));
        let mut clauses = report.key_changes.join(", ");
        if !clauses.is_empty() {
            clauses.push(' ');
        }
        let started = Instant::now();
        conn.query_drop(format!(
            "ALTER TABLE {} {clauses}PARTITION BY RANGE COLUMNS ({}) ({})",
            table.sql(),
            plan::COLUMN,
            plan::definitions(&days)
        ))
        .await
        .map_err(&err)?;
        report.took_ms = started.elapsed().as_millis() as u64;
        report.outcome = "converted";
        AuditRow {
            operator: &self.operator,
            reason: &self.reason,
            action: "partition-convert",
            table,
            event_id: None,
            before: Some(json!({ "partitioned": false, "rows": rows })),
            after: Some(json!({
                "partitions": report.partitions,
                "first_day": report.first_day,
                "last_day": report.last_day,
                "key_changes": report.key_changes,
            })),
            result: format!(
                "converted: {} daily partitions and {}",
                days.len(),
                plan::FUTURE
            ),
        }
        .insert(conn)
        .await
        .map_err(&err)?;
        Ok(report)
    }
}

// ---------------------------------------------------------------------------------------------
// maintain

/// `partitions maintain`: create the coming days, drop the past clean ones.
#[derive(Debug, Clone)]
pub struct Maintain {
    /// Keep this many day partitions after today.
    pub ahead: u32,
    /// A day is dropped only when all of it is older than this.
    pub retention: Duration,
    pub operator: String,
    pub reason: String,
    pub dry_run: bool,
    pub lock_wait: Duration,
}

/// A day partition dropped (or, in a dry run, that would be).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Dropped {
    pub partition: String,
    pub rows_estimate: u64,
}

/// A past day kept because of its unfinished rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Kept {
    pub partition: String,
    /// PENDING, SENDING or FAILED rows in it.
    pub unfinished: u64,
}

/// What `maintain` did to one table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TableMaintain {
    pub table: String,
    /// `false`: the table is not partitioned (run `convert`); nothing was done.
    pub partitioned: bool,
    pub created: Vec<String>,
    pub dropped: Vec<Dropped>,
    pub kept: Vec<Kept>,
    /// Day partitions after today, afterwards.
    pub days_ahead: u32,
    /// `created_at` cutoff (database time): days wholly before it were candidates.
    pub cutoff: String,
}

impl Maintain {
    pub fn validate(&self) -> Result<(), PartitionError> {
        if !self.dry_run {
            check_operator_and_reason(&self.operator, &self.reason)?;
        }
        Ok(())
    }

    /// Maintains each table; tables that are not partitioned are reported and left alone.
    pub async fn run(
        &self,
        pool: &Pool,
        tables: &[TableName],
    ) -> Result<Vec<TableMaintain>, PartitionError> {
        self.validate()?;
        let mut done = Vec::new();
        for table in tables {
            let err = PartitionError::of(table, self.lock_wait);
            let mut conn = pool.get_conn().await.map_err(&err)?;
            set_lock_wait(&mut conn, self.lock_wait)
                .await
                .map_err(&err)?;
            let report = self.maintain(&mut conn, table).await;
            // A failure may leave the session locked: never give such a connection back.
            if report.is_err() {
                conn.disconnect().await.ok();
            }
            done.push(report.map_err(&err)?);
        }
        Ok(done)
    }

    async fn maintain(
        &self,
        conn: &mut Conn,
        table: &TableName,
    ) -> Result<TableMaintain, mysql_async::Error> {
        let mut report = TableMaintain {
            table: table.to_string(),
            ..TableMaintain::default()
        };
        let today = db_today(conn).await?;
        report.cutoff = db_time_ago(conn, self.retention).await?;
        let Some(layout) = read_layout(conn, table).await? else {
            return Ok(report);
        };
        report.partitioned = true;
        report.created = if self.dry_run {
            layout.to_create(today, self.ahead)
        } else {
            lock(conn, table, false).await?;
            let created = self.create_ahead(conn, table, today).await;
            unlock(conn, created).await?
        }
        .into_iter()
        .map(plan::day_name)
        .collect();
        let cutoff = NaiveDateTime::parse_from_str(&report.cutoff, "%Y-%m-%d %H:%M:%S%.f")
            .unwrap_or_default();
        let layout = read_layout(conn, table).await?.unwrap_or(layout);
        for partition in layout.past(cutoff) {
            if self.dry_run {
                match unfinished_rows(conn, table, &partition.name).await? {
                    0 => report.dropped.push(Dropped {
                        partition: partition.name.clone(),
                        rows_estimate: partition.rows_estimate,
                    }),
                    n => report.kept.push(Kept {
                        partition: partition.name.clone(),
                        unfinished: n,
                    }),
                }
                continue;
            }
            lock(conn, table, true).await?;
            let outcome = self
                .drop_if_clean(conn, table, partition, &report.cutoff)
                .await;
            match unlock(conn, outcome).await? {
                Ok(dropped) => report.dropped.push(dropped),
                Err(kept) => report.kept.push(kept),
            }
        }
        let after = read_layout(conn, table).await?.unwrap_or(layout);
        report.days_ahead = after.days_ahead(today);
        Ok(report)
    }

    /// Under the table lock: re-reads the layout and adds the missing days (split off the
    /// catch-all, or appended when there is none).
    async fn create_ahead(
        &self,
        conn: &mut Conn,
        table: &TableName,
        today: NaiveDate,
    ) -> Result<Vec<NaiveDate>, mysql_async::Error> {
        let Some(layout) = read_layout(conn, table).await? else {
            return Ok(Vec::new());
        };
        let days = layout.to_create(today, self.ahead);
        if days.is_empty() {
            return Ok(days);
        }
        let sql = match layout.catch_all() {
            Some(future) => format!(
                "ALTER TABLE {} REORGANIZE PARTITION `{future}` INTO ({})",
                table.sql(),
                plan::definitions(&days).replace(plan::FUTURE, future)
            ),
            None => format!(
                "ALTER TABLE {} ADD PARTITION ({})",
                table.sql(),
                days.iter()
                    .map(|d| plan::day_definition(*d))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        conn.query_drop(sql).await?;
        Ok(days)
    }

    /// Under the table and audit lock: drops `partition` if it holds no unfinished row, with
    /// its audit row; otherwise says how many it holds.
    async fn drop_if_clean(
        &self,
        conn: &mut Conn,
        table: &TableName,
        partition: &Partition,
        cutoff: &str,
    ) -> Result<Result<Dropped, Kept>, mysql_async::Error> {
        let name = &partition.name;
        let unfinished = unfinished_rows(conn, table, name).await?;
        if unfinished > 0 {
            return Ok(Err(Kept {
                partition: name.clone(),
                unfinished,
            }));
        }
        conn.query_drop(format!(
            "ALTER TABLE {} DROP PARTITION `{name}`",
            table.sql()
        ))
        .await?;
        let day = partition.day.map(|d| d.to_string());
        AuditRow {
            operator: &self.operator,
            reason: &self.reason,
            action: "partition-drop",
            table,
            event_id: None,
            before: Some(json!({
                "partition": name,
                "day": day,
                "rows_estimate": partition.rows_estimate,
                "unfinished": 0,
                "cutoff": cutoff,
            })),
            after: None,
            result: format!(
                "dropped {name}: day {} older than the retention, no PENDING, SENDING or \
                 FAILED row (~{} rows)",
                day.unwrap_or_default(),
                partition.rows_estimate
            ),
        }
        .insert(conn)
        .await?;
        Ok(Ok(Dropped {
            partition: name.clone(),
            rows_estimate: partition.rows_estimate,
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// status

/// One partition as `partitions status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionRow {
    pub name: String,
    /// `created_at` below this (`MAXVALUE` for the catch-all).
    pub below: String,
    pub rows_estimate: u64,
    /// PENDING, SENDING or FAILED rows (exact).
    pub unfinished: u64,
}

/// A table's partitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableStatus {
    pub table: String,
    pub partitioned: bool,
    pub today: String,
    pub days_ahead: u32,
    pub partitions: Vec<PartitionRow>,
}

/// Reads each table's partitions (read-only).
pub async fn status(pool: &Pool, tables: &[TableName]) -> Result<Vec<TableStatus>, PartitionError> {
    let mut out = Vec::new();
    for table in tables {
        let err = PartitionError::of(table, Duration::ZERO);
        let mut conn = pool.get_conn().await.map_err(&err)?;
        let today = db_today(&mut conn).await.map_err(&err)?;
        let layout = read_layout(&mut conn, table).await.map_err(&err)?;
        let mut partitions = Vec::new();
        for p in layout.iter().flat_map(|l| &l.partitions) {
            partitions.push(PartitionRow {
                name: p.name.clone(),
                below: p.below.map_or("MAXVALUE".to_string(), |b| b.to_string()),
                rows_estimate: p.rows_estimate,
                unfinished: unfinished_rows(&mut conn, table, &p.name)
                    .await
                    .map_err(&err)?,
            });
        }
        out.push(TableStatus {
            table: table.to_string(),
            partitioned: layout.is_some(),
            today: today.to_string(),
            days_ahead: layout.as_ref().map_or(0, |l| l.days_ahead(today)),
            partitions,
        });
    }
    Ok(out)
}
