//! `partitions convert`: one `ALTER TABLE` per table not yet partitioned, with the key changes
//! partitioning needs, daily partitions from the oldest row's day through today + ahead, and the
//! catch-all; one `outbox_audit` row per converted table. A partitioned table is left alone.

use super::plan::{self, UniqueKey};
use super::{check_audited, db_today, read_layout, schema_of, set_lock_wait, PartitionError};
use crate::operate::compensate::AuditRow;
use crate::outbox::TableName;
use chrono::NaiveDate;
use mysql_async::prelude::*;
use mysql_async::{Conn, Pool};
use serde::Serialize;
use serde_json::json;
use std::time::{Duration, Instant};

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
    pub outcome: ConvertOutcome,
    /// Partitions the table has now (would have, in a dry run), the catch-all included.
    pub partitions: usize,
    pub first_day: Option<String>,
    pub last_day: Option<String>,
    /// The key changes made (`ALTER TABLE` clauses).
    pub key_changes: Vec<String>,
    pub rows: u64,
    pub took_ms: u64,
}

/// What `convert` did to a table (serialised as `converted`, `would_convert`,
/// `already_partitioned`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvertOutcome {
    Converted,
    /// A dry run: what `convert` would do.
    WouldConvert,
    /// The table was partitioned already: nothing was done.
    AlreadyPartitioned,
}

impl Convert {
    pub fn validate(&self) -> Result<(), PartitionError> {
        check_audited(self.dry_run, &self.operator, &self.reason)
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

    /// Converts `table` unless it is partitioned already: refuses foreign keys, plans the key
    /// changes and the days, then (unless a dry run) alters the table and audits it.
    async fn convert(
        &self,
        conn: &mut Conn,
        table: &TableName,
        progress: &mut impl FnMut(&str),
    ) -> Result<TableConvert, PartitionError> {
        let err = PartitionError::of(table, self.lock_wait);
        let mut report = TableConvert {
            table: table.to_string(),
            outcome: ConvertOutcome::AlreadyPartitioned,
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
        self.refuse_foreign_keys(conn, table).await?;
        let keys = self.unique_keys(conn, table).await?;
        report.key_changes = plan::key_changes(&keys).map_err(schema_error(table))?;
        let (days, rows) = self.plan_days(conn, table).await?;
        report.partitions = days.len() + 1;
        report.first_day = days.first().map(|d| d.to_string());
        report.last_day = days.last().map(|d| d.to_string());
        report.rows = rows;
        if self.dry_run {
            report.outcome = ConvertOutcome::WouldConvert;
            return Ok(report);
        }
        progress(&format!(
            "{table}: converting {rows} rows into {} daily partitions ({} .. {}) and {}",
            days.len(),
            days[0],
            days[days.len() - 1],
            plan::FUTURE
        ));
        let started = Instant::now();
        self.partition(conn, table, &report.key_changes, &days)
            .await?;
        report.took_ms = started.elapsed().as_millis() as u64;
        report.outcome = ConvertOutcome::Converted;
        self.audit(conn, table, &report, days.len()).await?;
        Ok(report)
    }

    /// Partitioned InnoDB tables cannot have foreign keys: one that involves `table` (either
    /// side) stops the conversion before anything changes.
    async fn refuse_foreign_keys(
        &self,
        conn: &mut Conn,
        table: &TableName,
    ) -> Result<(), PartitionError> {
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
            .map_err(PartitionError::of(table, self.lock_wait))?;
        if !foreign.is_empty() {
            return Err(schema_error(table)(format!(
                "foreign keys {} involve this table, and partitioned InnoDB tables cannot have \
                 them: drop them (ALTER TABLE … DROP FOREIGN KEY …), then run convert again",
                foreign.join(", ")
            )));
        }
        Ok(())
    }

    /// The unique keys of `table`, each with its columns in order.
    async fn unique_keys(
        &self,
        conn: &mut Conn,
        table: &TableName,
    ) -> Result<Vec<UniqueKey>, PartitionError> {
        let key_columns: Vec<(String, String)> = conn
            .exec(
                "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS \
                 WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? \
                 AND NON_UNIQUE = 0 ORDER BY INDEX_NAME, SEQ_IN_INDEX",
                (schema_of(table), &table.table),
            )
            .await
            .map_err(PartitionError::of(table, self.lock_wait))?;
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
        Ok(keys)
    }

    /// The daily partitions `table` gets (its oldest row's day through today + ahead) and its
    /// row count; too many days for MySQL's partition limit is an error.
    async fn plan_days(
        &self,
        conn: &mut Conn,
        table: &TableName,
    ) -> Result<(Vec<NaiveDate>, u64), PartitionError> {
        let err = PartitionError::of(table, self.lock_wait);
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
            return Err(schema_error(table)(format!(
                "the oldest row is from {}: {} daily partitions would exceed MySQL's limit; \
                 delete old SENT rows first (outbox-relay cleanup)",
                days[0],
                days.len()
            )));
        }
        Ok((days, rows))
    }

    /// The one `ALTER TABLE`: the key changes, then partitioning by day with the catch-all.
    async fn partition(
        &self,
        conn: &mut Conn,
        table: &TableName,
        key_changes: &[String],
        days: &[NaiveDate],
    ) -> Result<(), PartitionError> {
        let mut clauses = key_changes.join(", ");
        if !clauses.is_empty() {
            clauses.push(' ');
        }
        conn.query_drop(format!(
            "ALTER TABLE {} {clauses}PARTITION BY RANGE COLUMNS ({}) ({})",
            table.sql(),
            plan::COLUMN,
            plan::definitions(days)
        ))
        .await
        .map_err(PartitionError::of(table, self.lock_wait))
    }

    /// The `outbox_audit` row of a converted table.
    async fn audit(
        &self,
        conn: &mut Conn,
        table: &TableName,
        report: &TableConvert,
        days: usize,
    ) -> Result<(), PartitionError> {
        AuditRow {
            operator: &self.operator,
            reason: &self.reason,
            action: "partition-convert",
            table,
            event_id: None,
            before: Some(json!({ "partitioned": false, "rows": report.rows })),
            after: Some(json!({
                "partitions": report.partitions,
                "first_day": report.first_day,
                "last_day": report.last_day,
                "key_changes": report.key_changes,
            })),
            result: format!("converted: {days} daily partitions and {}", plan::FUTURE),
        }
        .insert(conn)
        .await
        .map_err(PartitionError::of(table, self.lock_wait))
    }
}

/// A problem with `table`'s schema, as `convert` reports it.
fn schema_error(table: &TableName) -> impl Fn(String) -> PartitionError + '_ {
    |message| PartitionError::Schema {
        table: table.to_string(),
        message,
    }
}
