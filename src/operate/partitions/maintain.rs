//! `partitions maintain`: days created ahead (split off the catch-all), and past days dropped
//! only when wholly older than the retention and free of unfinished rows, checked and dropped
//! under the table lock with one `outbox_audit` row per drop (see the parent module's doc).

use super::plan;
use super::{
    check_audited, db_today, lock, read_layout, set_lock_wait, unfinished_rows, unlock, Partition,
    PartitionError,
};
use crate::operate::compensate::AuditRow;
use crate::operate::db_time_ago;
use crate::outbox::TableName;
use chrono::{NaiveDate, NaiveDateTime};
use mysql_async::prelude::*;
use mysql_async::{Conn, Pool};
use serde::Serialize;
use serde_json::json;
use std::time::Duration;

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
    /// Why a partitioned table was left alone (partitioned some other way).
    pub skipped: Option<String>,
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
        check_audited(self.dry_run, &self.operator, &self.reason)
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
        if !layout.by_day() {
            report.skipped = Some(format!(
                "partitioned by {} ({}), not by day of {}: left alone",
                layout.method,
                layout.expression,
                plan::COLUMN
            ));
            return Ok(report);
        }
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
