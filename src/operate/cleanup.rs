//! Cleanup: deletes SENT outbox rows older than a retention, by primary key, in small batches.
//!
//! Per table: take the cutoff once (`NOW(3) - retention` on the server); then repeatedly select
//! the next `batch_size` SENT rows created before it through `idx_created (created_at)` (id
//! implied) in `(created_at, id)` order, each row's status read on the row, continuing after the
//! last row seen (so a FAILED row is read once, not in every batch), and delete
//! exactly those ids with `DELETE … WHERE id IN (…) AND <SENT> AND created_at < cutoff`
//! (a row that stopped being SENT between the two statements, e.g. because an operator ran
//! `resend`, is not deleted). Each batch is one autocommit statement; between batches the cleanup
//! sleeps `pause` so replicas and the relay keep up. PENDING, SENDING and FAILED rows are never
//! deleted, whatever their age.

use super::{db_time_ago, placeholders};
use crate::outbox::Status;
use crate::outbox::TableName;
use mysql_async::prelude::*;
use mysql_async::{Conn, Pool, Value};
use std::time::Duration;

/// Cleanup settings; [`Cleanup::default`] is 7 days, 1,000 rows per batch, 100 ms pause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cleanup {
    /// SENT rows created longer ago than this are deleted.
    pub retention: Duration,
    /// Most rows per DELETE.
    pub batch_size: usize,
    /// Sleep between two batches.
    pub pause: Duration,
    /// Count what would be deleted, delete nothing.
    pub dry_run: bool,
}

impl Default for Cleanup {
    fn default() -> Self {
        Cleanup {
            retention: Duration::from_secs(7 * 24 * 3600),
            batch_size: 1000,
            pause: Duration::from_millis(100),
            dry_run: false,
        }
    }
}

/// Reported after each batch that deleted rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupProgress {
    pub table: TableName,
    /// 1 for the first batch of this table.
    pub batch: u64,
    /// Rows deleted by this batch.
    pub deleted: u64,
    /// Rows deleted from this table so far.
    pub table_total: u64,
}

/// What one table's cleanup did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TableCleanup {
    pub table: String,
    /// `created_at` cutoff (database time): SENT rows created before it were eligible.
    pub cutoff: String,
    /// Rows deleted (dry run: rows that would be deleted).
    pub deleted: u64,
    /// DELETE statements run (0 in a dry run).
    pub batches: u64,
}

/// What [`Cleanup::run_once`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CleanupSummary {
    pub dry_run: bool,
    pub tables: Vec<TableCleanup>,
}

impl CleanupSummary {
    /// Rows deleted (or, in a dry run, eligible) over all tables.
    pub fn deleted(&self) -> u64 {
        self.tables.iter().map(|t| t.deleted).sum()
    }

    /// DELETE statements over all tables.
    pub fn batches(&self) -> u64 {
        self.tables.iter().map(|t| t.batches).sum()
    }
}

/// Why a cleanup could not run.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    #[error("--batch-size must be between 1 and 100000 (got {0})")]
    BatchSize(usize),
    #[error("database error while cleaning up {table}: {source}")]
    Database {
        table: String,
        source: mysql_async::Error,
    },
}

impl Cleanup {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), CleanupError> {
        if self.batch_size == 0 || self.batch_size > 100_000 {
            return Err(CleanupError::BatchSize(self.batch_size));
        }
        Ok(())
    }

    /// Cleans each table once, calling `progress` after every batch that deleted rows.
    pub async fn run_once(
        &self,
        pool: &Pool,
        tables: &[TableName],
        mut progress: impl FnMut(&CleanupProgress),
    ) -> Result<CleanupSummary, CleanupError> {
        self.validate()?;
        let mut summary = CleanupSummary {
            dry_run: self.dry_run,
            tables: Vec::new(),
        };
        for table in tables {
            let done = self
                .clean_table(pool, table, &mut progress)
                .await
                .map_err(|source| CleanupError::Database {
                    table: table.to_string(),
                    source,
                })?;
            summary.tables.push(done);
        }
        Ok(summary)
    }

    async fn clean_table(
        &self,
        pool: &Pool,
        table: &TableName,
        progress: &mut impl FnMut(&CleanupProgress),
    ) -> Result<TableCleanup, mysql_async::Error> {
        let mut conn = pool.get_conn().await?;
        let cutoff = db_time_ago(&mut conn, self.retention).await?;
        let mut done = TableCleanup {
            table: table.to_string(),
            cutoff: cutoff.clone(),
            deleted: 0,
            batches: 0,
        };
        if self.dry_run {
            done.deleted = count_eligible(&mut conn, table, &cutoff).await?;
            return Ok(done);
        }
        // Where the previous batch ended, in (created_at, id) order.
        let mut after: Option<(String, i64)> = None;
        loop {
            let rows = self.next_batch(&mut conn, table, &cutoff, &after).await?;
            let Some(last) = rows.last().cloned() else {
                break;
            };
            let full = rows.len() == self.batch_size;
            let deleted = delete_batch(&mut conn, table, &cutoff, &rows).await?;
            done.batches += 1;
            done.deleted += deleted;
            progress(&CleanupProgress {
                table: table.clone(),
                batch: done.batches,
                deleted,
                table_total: done.deleted,
            });
            if !full {
                break;
            }
            after = Some((last.1, last.0));
            // Give the connection back while sleeping: a long cleanup must not hold one.
            drop(conn);
            tokio::time::sleep(self.pause).await;
            conn = pool.get_conn().await?;
        }
        Ok(done)
    }

    /// The next `batch_size` SENT rows created before `cutoff`, as `(id, created_at)` in
    /// `(created_at, id)` order, starting after the row `after` (the previous batch's last).
    async fn next_batch(
        &self,
        conn: &mut Conn,
        table: &TableName,
        cutoff: &str,
        after: &Option<(String, i64)>,
    ) -> Result<Vec<(i64, String)>, mysql_async::Error> {
        let sent = Status::Sent.code();
        let (sql, params): (String, Vec<Value>) = match after {
            None => (
                format!(
                    "SELECT id, CAST(created_at AS CHAR) FROM {} \
                     WHERE status = ? AND created_at < ? \
                     ORDER BY created_at, id LIMIT ?",
                    table.sql()
                ),
                vec![sent.into(), cutoff.into(), self.batch_size.into()],
            ),
            Some((created_at, id)) => (
                format!(
                    "SELECT id, CAST(created_at AS CHAR) FROM {} \
                     WHERE status = ? AND created_at < ? \
                     AND created_at >= ? AND (created_at > ? OR id > ?) \
                     ORDER BY created_at, id LIMIT ?",
                    table.sql()
                ),
                vec![
                    sent.into(),
                    cutoff.into(),
                    created_at.as_str().into(),
                    created_at.as_str().into(),
                    (*id).into(),
                    self.batch_size.into(),
                ],
            ),
        };
        conn.exec(sql, params).await
    }
}

/// The SENT rows of `table` created before `cutoff` (what a dry run reports).
async fn count_eligible(
    conn: &mut Conn,
    table: &TableName,
    cutoff: &str,
) -> Result<u64, mysql_async::Error> {
    let count: Option<u64> = conn
        .exec_first(
            format!(
                "SELECT COUNT(*) FROM {} WHERE status = ? AND created_at < ?",
                table.sql()
            ),
            (Status::Sent.code(), cutoff),
        )
        .await?;
    Ok(count.unwrap_or(0))
}

/// Deletes exactly the ids of `rows` that are still SENT and created before `cutoff` (a row that
/// stopped being SENT since it was selected stays); returns how many were deleted.
async fn delete_batch(
    conn: &mut Conn,
    table: &TableName,
    cutoff: &str,
    rows: &[(i64, String)],
) -> Result<u64, mysql_async::Error> {
    let mut params: Vec<Value> = rows.iter().map(|(id, _)| (*id).into()).collect();
    params.push(Status::Sent.code().into());
    params.push(cutoff.into());
    conn.exec_drop(
        format!(
            "DELETE FROM {} WHERE id IN ({}) AND status = ? AND created_at < ?",
            table.sql(),
            placeholders(rows.len())
        ),
        params,
    )
    .await?;
    Ok(conn.affected_rows())
}

/// Runs a cleanup round every `config.every` until `cancel` (the `[cleanup]` section inside
/// `run`). With `config.partitions`, partitioned tables get [`Maintain`] (days created ahead,
/// clean past days dropped and audited under `operator`) instead of row deletes, and the first
/// round runs at once, so a relay started after a pause creates the missing days first. A failed
/// round is logged and tried again at the next one.
///
/// [`Maintain`]: super::partitions::Maintain
pub(crate) async fn run_periodically(
    config: crate::config::CleanupConfig,
    pool: Pool,
    tables: Vec<TableName>,
    operator: String,
    cancel: tokio_util::sync::CancellationToken,
) {
    let cleanup = Cleanup {
        retention: config.retention,
        batch_size: config.batch_size,
        pause: config.pause,
        dry_run: false,
    };
    let maintain = config.partitions.then(|| super::partitions::Maintain {
        ahead: config.partitions_ahead,
        retention: config.retention,
        operator,
        reason: format!(
            "[cleanup] partitions: keep {} days ahead, drop days older than {} with no \
                 PENDING, SENDING or FAILED row",
            config.partitions_ahead,
            humantime::format_duration(config.retention)
        ),
        dry_run: false,
        lock_wait: Duration::from_secs(5),
    });
    let mut first = true;
    loop {
        if !(first && maintain.is_some()) {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(config.every) => {}
            }
        }
        first = false;
        let mut row_tables = tables.clone();
        if let Some(maintain) = &maintain {
            let round = tokio::select! {
                _ = cancel.cancelled() => return,
                round = maintain.run(&pool, &tables) => round,
            };
            match round {
                Ok(done) => {
                    for t in done.iter().filter(|t| t.partitioned && t.skipped.is_none()) {
                        tracing::info!(table = %t.table, created = ?t.created,
                            dropped = ?t.dropped.iter().map(|d| &d.partition).collect::<Vec<_>>(),
                            kept = ?t.kept, days_ahead = t.days_ahead,
                            "cleanup: partitions maintained");
                        row_tables.retain(|r| r.to_string() != t.table);
                    }
                }
                Err(e) => tracing::warn!(error = %e,
                    "cleanup: partition maintenance failed; retrying at the next round \
                     (old SENT rows are deleted row by row meanwhile)"),
            }
        }
        let round = tokio::select! {
            _ = cancel.cancelled() => return,
            round = cleanup.run_once(&pool, &row_tables, |_| {}) => round,
        };
        match round {
            Ok(summary) => tracing::info!(
                deleted = summary.deleted(),
                batches = summary.batches(),
                "cleanup: old SENT rows deleted"
            ),
            Err(e) => tracing::warn!(error = %e,
                "cleanup round failed (does the relay's user have DELETE on the outbox tables?); retrying at the next round"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_seven_days_1000_rows_100ms() {
        let c = Cleanup::default();
        assert_eq!(c.retention, Duration::from_secs(604_800));
        assert_eq!(c.batch_size, 1000);
        assert_eq!(c.pause, Duration::from_millis(100));
        assert!(!c.dry_run);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn a_zero_or_huge_batch_is_refused() {
        for batch_size in [0, 100_001] {
            let c = Cleanup {
                batch_size,
                ..Cleanup::default()
            };
            assert!(c.validate().is_err());
        }
    }
}
