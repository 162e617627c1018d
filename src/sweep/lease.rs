//! Leases on claimed rows: recovery of expired ones, renewal and release of this instance's own.
//!
//! Guarantees: a SENDING row whose `lease_until` has passed goes back to PENDING (whoever owned
//! it), so an instance that crashed while holding rows leaves nothing stuck: the rows are claimed
//! and sent again (a duplicate if the crashed instance had already sent them). A live instance
//! renews the leases of the rows it still holds well before they expire ([`renew_every`]), so a
//! long in-memory retry does not hand its rows to another instance. On shutdown an instance
//! releases the rows it still holds at once instead of waiting for their leases.

use crate::config::TableName;
use mysql_async::prelude::*;
use mysql_async::{Conn, Pool};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often leases are renewed and expired ones recovered: a third of the lease (so two
/// renewals can fail before a lease expires), at most `ceiling`, at least 100 ms.
pub fn renew_every(lease: Duration, ceiling: Duration) -> Duration {
    (lease / 3).min(ceiling).max(Duration::from_millis(100))
}

/// Returns the SENDING rows of `table` whose lease expired to PENDING; how many.
pub async fn recover_expired(
    conn: &mut Conn,
    table: &TableName,
) -> Result<u64, mysql_async::Error> {
    conn.query_drop(format!(
        "UPDATE {} SET status = 0, owner = NULL, lease_until = NULL \
         WHERE status = 1 AND lease_until < NOW(3)",
        table.sql()
    ))
    .await?;
    Ok(conn.affected_rows())
}

/// Extends the leases of the rows of `table` that `owner` still holds; how many.
pub async fn renew(
    conn: &mut Conn,
    table: &TableName,
    owner: &str,
    lease: Duration,
) -> Result<u64, mysql_async::Error> {
    let micros = u64::try_from(lease.as_micros()).unwrap_or(u64::MAX);
    conn.exec_drop(
        format!(
            "UPDATE {} SET lease_until = NOW(3) + INTERVAL ? MICROSECOND \
             WHERE status = 1 AND owner = ?",
            table.sql()
        ),
        (micros, owner),
    )
    .await?;
    Ok(conn.affected_rows())
}

/// Returns every row of `table` that `owner` still holds to PENDING (graceful shutdown); how many.
pub async fn release(
    conn: &mut Conn,
    table: &TableName,
    owner: &str,
) -> Result<u64, mysql_async::Error> {
    conn.exec_drop(
        format!(
            "UPDATE {} SET status = 0, owner = NULL, lease_until = NULL \
             WHERE status = 1 AND owner = ?",
            table.sql()
        ),
        (owner,),
    )
    .await?;
    Ok(conn.affected_rows())
}

/// Every `every` until `stop`: renews the leases `owner` holds and returns expired ones (anyone's)
/// to PENDING.
pub async fn keep(
    pool: Pool,
    tables: Vec<TableName>,
    owner: String,
    lease_length: Duration,
    every: Duration,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let mut conn = match crate::db::bounded(pool.get_conn()).await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "cannot renew or recover leases; retrying");
                continue;
            }
        };
        for table in &tables {
            let renewed = crate::db::bounded(renew(&mut conn, table, &owner, lease_length)).await;
            if let Err(e) = renewed {
                tracing::warn!(%table, error = %e, "cannot renew leases; retrying");
            }
            match crate::db::bounded(recover_expired(&mut conn, table)).await {
                Ok(0) => {}
                Ok(n) => {
                    crate::metrics::relay().leases_recovered.inc_by(n);
                    tracing::warn!(%table, rows = n,
                        "SENDING rows with an expired lease returned to PENDING (an instance stopped or stalled)")
                }
                Err(e) => {
                    tracing::warn!(%table, error = %e, "cannot recover expired leases; retrying")
                }
            }
        }
    }
}

/// Returns every row `owner` still holds in `tables` to PENDING (graceful shutdown, after every
/// outcome was recorded); on failure they return when their lease expires.
pub async fn release_all(pool: &Pool, tables: &[TableName], owner: &str) {
    let later = "cannot release claimed rows; they return when their lease expires";
    let mut conn = match crate::db::bounded(pool.get_conn()).await {
        Ok(conn) => conn,
        Err(e) => return tracing::warn!(error = %e, "{later}"),
    };
    for table in tables {
        match crate::db::bounded(release(&mut conn, table, owner)).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(%table, rows = n, "released unsent claimed rows"),
            Err(e) => tracing::warn!(%table, error = %e, "{later}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_renewed_three_times_per_lease_within_bounds() {
        let five = Duration::from_secs(5);
        assert_eq!(
            renew_every(Duration::from_secs(30), five),
            Duration::from_secs(5)
        );
        assert_eq!(
            renew_every(Duration::from_secs(3), five),
            Duration::from_secs(1)
        );
        assert_eq!(
            renew_every(Duration::from_millis(30), five),
            Duration::from_millis(100)
        );
    }
}
