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

mod convert;
mod maintain;
pub(crate) mod plan;

pub use convert::{Convert, ConvertOutcome, TableConvert};
pub use maintain::{Dropped, Kept, Maintain, TableMaintain};
pub use plan::{Layout, Partition};

use super::compensate::CompensateError;
use crate::outbox::Status;
use crate::outbox::TableName;
use chrono::NaiveDate;
use mysql_async::prelude::*;
use mysql_async::{Conn, Pool};
use serde::Serialize;
use std::time::Duration;

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
                _ if crate::db::is_lock_wait_timeout(&source) => PartitionError::LockWait {
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

/// A run that changes tables needs `--operator` and `--reason` (they go into the audit rows); a
/// dry run changes nothing and needs neither.
fn check_audited(dry_run: bool, operator: &str, reason: &str) -> Result<(), PartitionError> {
    if !dry_run {
        super::compensate::check_operator_and_reason(operator, reason)?;
    }
    Ok(())
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
    type PartitionRow = (
        Option<String>,
        Option<String>,
        Option<u64>,
        Option<String>,
        Option<String>,
    );
    let rows: Vec<PartitionRow> = conn
        .exec(
            "SELECT PARTITION_NAME, PARTITION_DESCRIPTION, TABLE_ROWS, PARTITION_METHOD, \
             PARTITION_EXPRESSION FROM information_schema.PARTITIONS \
             WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? \
             ORDER BY PARTITION_ORDINAL_POSITION",
            (schema_of(table), &table.table),
        )
        .await?;
    let mut layout = Layout {
        method: String::new(),
        expression: String::new(),
        partitions: Vec::with_capacity(rows.len()),
    };
    for (name, description, rows, method, expression) in rows {
        let Some(name) = name else { return Ok(None) };
        layout.method = method.unwrap_or_default();
        layout.expression = expression.unwrap_or_default();
        let description = description.unwrap_or_default();
        // A partition this module cannot read (another method) counts as not a day.
        let partition =
            Partition::parse(&name, &description, rows.unwrap_or(0)).unwrap_or(Partition {
                name,
                below: Some(NaiveDate::MIN),
                day: None,
                rows_estimate: rows.unwrap_or(0),
            });
        layout.partitions.push(partition);
    }
    Ok((!layout.partitions.is_empty()).then_some(layout))
}

/// The database's current day (`CURDATE()`).
pub async fn db_today(conn: &mut impl Queryable) -> Result<NaiveDate, mysql_async::Error> {
    let today: Option<String> = conn.query_first("SELECT CAST(CURDATE() AS CHAR)").await?;
    Ok(today
        .and_then(|t| NaiveDate::parse_from_str(&t, "%Y-%m-%d").ok())
        .unwrap_or_default())
}

/// Rows of `partition` that are PENDING, SENDING or FAILED (served by `idx_pending (status)`).
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
