//! The outbox table gauges (`outbox_oldest_pending_seconds`, PENDING / SENDING / FAILED rows,
//! and for partitioned tables `outbox_partitions_ahead`), refreshed from MySQL on a timer by
//! every running instance (leader, standby or poller).

use crate::outbox::{Status, TableName};
use mysql_async::prelude::*;
use mysql_async::Pool;
use std::time::{Duration, Instant};
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
    let mut counts_due = Instant::now();
    loop {
        let count = Instant::now() >= counts_due;
        let refreshed = crate::db::bounded(refresh(&pool, &tables, count)).await;
        if let (Ok(counted), true) = (&refreshed, count) {
            counts_due = Instant::now() + count_again_after(*counted, every);
        }
        let mut refreshed = refreshed.map(|_| ());
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

/// Index entries the row counts may read per second, averaged: the counts read every waiting
/// and FAILED row, so with a stalled topic's backlog they would cost the database more with
/// every minute of the stall (a 5-minute stall at 200 events/s: 63,000 rows counted every 5 s,
/// as many reads as the sweeper's claims). Above `COUNT_RATE × metrics.refresh` rows the counts
/// are refreshed less often; the oldest PENDING row's age stays on `metrics.refresh`.
const COUNT_RATE: u64 = 1_000;

/// When to count again after counting `counted` rows: after `every`, or later for a large count
/// (see [`COUNT_RATE`]).
fn count_again_after(counted: u64, every: Duration) -> Duration {
    every.max(Duration::from_secs(counted / COUNT_RATE))
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

/// One refresh: per table, with `count`, counts of PENDING, SENDING and FAILED rows (served by
/// the `idx_pending (status)` index); the age of the oldest PENDING row, and for a partitioned
/// table the day partitions starting after today (database clock;
/// `information_schema.PARTITIONS`). Returns the rows counted.
pub async fn refresh(
    pool: &Pool,
    tables: &[TableName],
    count: bool,
) -> Result<u64, mysql_async::Error> {
    use crate::operate::partitions;
    let metrics = crate::metrics::relay();
    let mut conn = pool.get_conn().await?;
    let today = partitions::db_today(&mut conn).await?;
    let mut counted = 0;
    for table in tables {
        let label = crate::metrics::TableLabel {
            table: table.to_string(),
        };
        if count {
            counted += refresh_counts(&mut conn, table, &label).await?;
        }
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
    Ok(counted)
}

/// Sets the PENDING, SENDING and FAILED row gauges of `table`; returns the rows counted.
async fn refresh_counts(
    conn: &mut mysql_async::Conn,
    table: &TableName,
    label: &crate::metrics::TableLabel,
) -> Result<u64, mysql_async::Error> {
    let metrics = crate::metrics::relay();
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
    for (gauge, status) in [
        (&metrics.pending, Status::Pending),
        (&metrics.sending, Status::Sending),
        (&metrics.failed, Status::Failed),
    ] {
        gauge.get_or_create(label).set(count(status));
    }
    Ok(counts.iter().map(|(_, n)| *n as u64).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_counts_are_refreshed_less_often() {
        let every = Duration::from_secs(5);
        assert_eq!(count_again_after(0, every), every);
        assert_eq!(count_again_after(5_000, every), every);
        assert_eq!(
            count_again_after(63_000, every),
            Duration::from_secs(63),
            "a 5-minute stall's backlog: about 1,000 rows read a second"
        );
    }
}
