//! Leases on claimed rows: recovery of expired ones, renewal and release of this process's own.
//!
//! Guarantees: a SENDING row whose `lease_until` has passed goes back to PENDING (whoever owned
//! it), so an instance that crashed while holding rows leaves nothing stuck: the rows are claimed
//! and sent again (a duplicate if the crashed instance had already sent them). A live process
//! renews the leases of the rows it holds in memory ([`HeldRows`]) well before they expire
//! ([`renew_every`]), so a long in-memory retry does not hand its rows to another instance. It
//! renews nothing else: rows left SENDING under the same `owner` by an earlier life of the same
//! `relay.instance_id` (a restart after `kill -9`), by a claim whose COMMIT reply was lost, or by
//! an optimistic claim that failed part-way are not held by anyone, so they expire within one
//! lease and are claimed again. On shutdown an instance releases its owner's SENDING rows at
//! once instead of waiting for their leases.

use crate::outbox::{Status, TableName};
use mysql_async::prelude::*;
use mysql_async::{Conn, Pool};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The rows this process claimed and may still be sending, by table: what its lease keeper
/// renews, and which of its owner's SENDING rows are queued in its own shards (a key-order check
/// may pass over those, never over the others). Shared by every claimer of the process.
///
/// Added to when a claim returns its rows; pruned by the lease keeper of rows no longer SENDING
/// under this owner (marked SENT or FAILED, released, or taken over after an expired lease).
#[derive(Debug, Clone, Default)]
pub struct HeldRows(Arc<Mutex<BTreeMap<TableName, BTreeSet<u64>>>>);

impl HeldRows {
    /// Records `ids` of `table` as claimed by this process.
    pub fn add(&self, table: &TableName, ids: impl IntoIterator<Item = u64>) {
        let mut held = self.0.lock().expect("not poisoned");
        let set = held.entry(table.clone()).or_default();
        set.extend(ids);
    }

    /// Whether this process claimed row `id` of `table` and may still be sending it.
    pub fn contains(&self, table: &TableName, id: u64) -> bool {
        let held = self.0.lock().expect("not poisoned");
        held.get(table).is_some_and(|ids| ids.contains(&id))
    }

    /// The held ids of `table`, in id order.
    pub fn of(&self, table: &TableName) -> Vec<u64> {
        let held = self.0.lock().expect("not poisoned");
        held.get(table)
            .map(|ids| ids.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Forgets the rows of `table` among `looked_at` that are not in `still_held`.
    fn keep_only(&self, table: &TableName, looked_at: &[u64], still_held: &[u64]) {
        let still: BTreeSet<u64> = still_held.iter().copied().collect();
        let mut held = self.0.lock().expect("not poisoned");
        if let Some(ids) = held.get_mut(table) {
            for id in looked_at.iter().filter(|id| !still.contains(id)) {
                ids.remove(id);
            }
        }
    }
}

/// Most ids in one renewal statement.
const RENEW_CHUNK: usize = 1000;

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
        "UPDATE {} SET {}, owner = NULL, lease_until = NULL \
         WHERE {} AND lease_until < NOW(3)",
        table.sql(),
        Status::Pending.sql(),
        Status::Sending.sql()
    ))
    .await?;
    Ok(conn.affected_rows())
}

/// Extends the leases of the rows of `table` this process holds (`held`) that are still SENDING
/// under `owner`, and forgets the others; how many were extended. Rows of `owner` that `held`
/// does not list are left to expire.
pub async fn renew(
    conn: &mut Conn,
    table: &TableName,
    owner: &str,
    held: &HeldRows,
    lease: Duration,
) -> Result<u64, mysql_async::Error> {
    let micros = u64::try_from(lease.as_micros()).unwrap_or(u64::MAX);
    let mut renewed = 0;
    for ids in held.of(table).chunks(RENEW_CHUNK) {
        let list = crate::db::id_list(ids.iter().copied());
        let still: Vec<u64> = conn
            .exec(
                format!(
                    "SELECT id FROM {} WHERE id IN ({list}) AND {} AND owner = ?",
                    table.sql(),
                    Status::Sending.sql()
                ),
                (owner,),
            )
            .await?;
        held.keep_only(table, ids, &still);
        if still.is_empty() {
            continue;
        }
        conn.exec_drop(
            format!(
                "UPDATE {} SET lease_until = NOW(3) + INTERVAL ? MICROSECOND \
                 WHERE id IN ({}) AND {} AND owner = ?",
                table.sql(),
                crate::db::id_list(still),
                Status::Sending.sql()
            ),
            (micros, owner),
        )
        .await?;
        renewed += conn.affected_rows();
    }
    Ok(renewed)
}

/// Returns every row of `table` that `owner` still holds to PENDING (graceful shutdown); how many.
pub async fn release(
    conn: &mut Conn,
    table: &TableName,
    owner: &str,
) -> Result<u64, mysql_async::Error> {
    conn.exec_drop(
        format!(
            "UPDATE {} SET {}, owner = NULL, lease_until = NULL \
             WHERE {} AND owner = ?",
            table.sql(),
            Status::Pending.sql(),
            Status::Sending.sql()
        ),
        (owner,),
    )
    .await?;
    Ok(conn.affected_rows())
}

/// Every `every` until `stop`: renews the leases of the rows this process holds (`held`, under
/// `owner`) and returns expired ones (anyone's) to PENDING.
pub async fn keep(
    pool: Pool,
    tables: Vec<TableName>,
    owner: String,
    held: HeldRows,
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
            let renewed =
                crate::db::bounded(renew(&mut conn, table, &owner, &held, lease_length)).await;
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
