//! The outbox table gauges (`outbox_oldest_pending_seconds`, PENDING / SENDING / FAILED rows,
//! and for partitioned tables `outbox_partitions_ahead`), refreshed from MySQL on a timer by
//! every running instance (leader, standby or poller).

use crate::outbox::{Status, TableName};
use mysql_async::prelude::*;
use mysql_async::Pool;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Refreshes the gauges every `every` until `cancel`; a failed refresh marks MySQL unreachable
/// in `/readyz`. With `deployment` (CDC mode: the connection options and `relay.name`), also how
/// far the mirrored checkpoint is behind the server.
pub async fn watch(
    pool: Pool,
    tables: Vec<TableName>,
    deployment: Option<(mysql_async::Opts, String)>,
    every: Duration,
    cancel: CancellationToken,
) {
    loop {
        let mut refreshed = crate::db::bounded(refresh(&pool, &tables)).await;
        if let (Ok(()), Some((opts, name))) = (&refreshed, &deployment) {
            refreshed = crate::db::bounded(refresh_binlog(&pool, opts, name)).await;
        }
        if let Err(e) = &refreshed {
            tracing::warn!(error = %e, "cannot read the outbox table metrics");
        }
        crate::metrics::health().set_mysql(refreshed.is_ok());
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// How far the mirrored checkpoint of deployment `name` is behind the server's end of binlog.
async fn refresh_binlog(
    pool: &Pool,
    opts: &mysql_async::Opts,
    name: &str,
) -> Result<(), mysql_async::Error> {
    let mirror = crate::checkpoint::MysqlMirror::new(name);
    let checkpoint = {
        let mut conn = pool.get_conn().await?;
        mirror.load(&mut conn).await.ok().flatten()
    };
    let Ok(server) = crate::binlog::reader::server_position(opts).await else {
        return Ok(()); // no BINLOG MONITOR: the checks at start-up say so
    };
    let lag =
        crate::operate::status::binlog_lag(server.version, &server.current, checkpoint.as_ref());
    let metrics = crate::metrics::relay();
    metrics
        .binlog_behind_transactions
        .set(lag.transactions_behind.unwrap_or(0) as i64);
    metrics
        .binlog_behind_bytes
        .set(lag.bytes_behind.unwrap_or(0) as i64);
    Ok(())
}

/// One refresh: per table, counts of PENDING, SENDING and FAILED rows (served by the
/// `idx_pending (status)` index), the age of the oldest PENDING row, and for a partitioned table
/// the day partitions starting after today (database clock; `information_schema.PARTITIONS`).
pub async fn refresh(pool: &Pool, tables: &[TableName]) -> Result<(), mysql_async::Error> {
    use crate::operate::partitions;
    let metrics = crate::metrics::relay();
    let mut conn = pool.get_conn().await?;
    let today = partitions::db_today(&mut conn).await?;
    for table in tables {
        let label = crate::metrics::TableLabel {
            table: table.to_string(),
        };
        let counts: Vec<(i8, i64)> = conn
            .query(format!(
                "SELECT status, COUNT(*) FROM {} WHERE {} GROUP BY status",
                table.sql(),
                Status::sql_in(&[Status::Pending, Status::Sending, Status::Failed])
            ))
            .await?;
        let count = |status: Status| {
            counts
                .iter()
                .find(|(s, _)| *s == status.code())
                .map_or(0, |(_, n)| *n)
        };
        metrics
            .pending
            .get_or_create(&label)
            .set(count(Status::Pending));
        metrics
            .sending
            .get_or_create(&label)
            .set(count(Status::Sending));
        metrics
            .failed
            .get_or_create(&label)
            .set(count(Status::Failed));
        let oldest = crate::operate::status::oldest_pending(&mut conn, table).await?;
        let seconds = oldest.map_or(0.0, |o| o.age_seconds);
        metrics
            .oldest_pending_seconds
            .get_or_create(&label)
            .set(seconds);
        let layout = partitions::read_layout(&mut conn, table).await?;
        if let Some(layout) = layout.filter(|l| l.by_day()) {
            metrics
                .partitions_ahead
                .get_or_create(&label)
                .set(layout.days_ahead(today).into());
        }
    }
    Ok(())
}
