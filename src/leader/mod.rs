//! Leadership: among the instances that share a `relay.name` and a database, exactly one tails
//! the binlog; the others stand by (and sweep). No ZooKeeper: the leader holds a MySQL named lock
//! (`GET_LOCK`) on a connection of its own, and bumps `leader_epoch` in `outbox_relay_state`.
//!
//! Guarantees:
//! - **At most one leader at a time, as the server sees it.** The lock is held by one connection;
//!   the server frees it when that connection ends, and only then can a standby (waiting in
//!   `GET_LOCK`) take it. A killed leader process (kill -9) closes its socket, so a standby takes
//!   over within about a second (bounded by [`WAIT_STEP`] plus the server noticing the closed
//!   connection). A host that vanished without closing its connections is bounded by
//!   [`IDLE_LIMIT`]: the lock connection's `wait_timeout`, which a live leader never reaches
//!   because it checks its lock every [`CHECK_EVERY`].
//! - **A leader that loses its lock stops.** It checks its lock every [`CHECK_EVERY`]; if the
//!   connection broke it tries to take the lock again at once, and keeps leading only if nobody
//!   led in between (the epoch is unchanged); otherwise [`Leadership::lost`] fires and the relay
//!   stops streaming. Until it notices, two instances may stream: that costs duplicates, never a
//!   loss (both send only committed rows, and each checkpoint is safe on its own).
//! - **Fencing.** Each leadership has a new epoch; the checkpoint mirror is written only by the
//!   current epoch ([`crate::checkpoint::MysqlMirror::fenced`]), so a deposed leader cannot move
//!   the shared checkpoint.

use crate::retry::RetryPolicy;
use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};
use sha2::{Digest, Sha256};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long one `GET_LOCK` waits on the server before the standby checks for cancellation.
pub const WAIT_STEP: Duration = Duration::from_secs(1);
/// How often a leader checks that it still holds its lock.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);
/// The lock connection's `wait_timeout`: the server ends it (freeing the lock) after this long
/// without a query, i.e. when the leader's host is gone without closing it.
pub const IDLE_LIMIT: Duration = Duration::from_secs(10);
/// How many times in a row a leader may fail to confirm its lock before it steps down.
const CONFIRM_ATTEMPTS: u32 = 3;

/// The election of one relay deployment (`relay.name` in one database).
#[derive(Debug, Clone)]
pub struct Election {
    opts: Opts,
    name: String,
    instance: String,
    lock: String,
}

impl Election {
    /// The election for `name` in the database of `opts`, entered as `instance`.
    pub fn new(opts: Opts, name: &str, instance: &str) -> Self {
        let database = opts.db_name().unwrap_or_default().to_string();
        Election {
            lock: lock_name(&database, name),
            opts,
            name: name.to_string(),
            instance: instance.to_string(),
        }
    }

    /// A connection for the lock, ended by the server after [`IDLE_LIMIT`] of silence.
    async fn connect(&self) -> Result<Conn, mysql_async::Error> {
        let mut conn = Conn::new(self.opts.clone()).await?;
        conn.query_drop(format!(
            "SET SESSION wait_timeout = {}",
            IDLE_LIMIT.as_secs()
        ))
        .await?;
        Ok(conn)
    }

    /// The MySQL lock name (server-wide, so it includes the database).
    pub fn lock_name(&self) -> &str {
        &self.lock
    }

    /// Becomes the leader if nobody is: `None` at once when another instance leads.
    pub async fn try_lead(&self) -> Result<Option<Leadership>, mysql_async::Error> {
        let mut conn = self.connect().await?;
        if take_lock(&mut conn, &self.lock, Duration::ZERO).await? {
            return self.begin(conn).await.map(Some);
        }
        conn.disconnect().await?;
        Ok(None)
    }

    /// Waits until this instance leads (`None` if `cancel` fired first). Connection errors are
    /// retried with backoff.
    pub async fn lead(&self, cancel: &CancellationToken) -> Option<Leadership> {
        let policy = RetryPolicy::reconnect();
        let mut failures = 0;
        loop {
            let attempt = async {
                let mut conn = self.connect().await?;
                loop {
                    let took = crate::db::bounded(take_lock(&mut conn, &self.lock, WAIT_STEP));
                    if took.await? {
                        return self.begin(conn).await;
                    }
                }
            };
            let error = tokio::select! {
                _ = cancel.cancelled() => return None,
                led = attempt => match led {
                    Ok(leadership) => return Some(leadership),
                    Err(e) => e,
                },
            };
            failures += 1;
            let delay = policy.delay(failures).unwrap_or(policy.max);
            tracing::warn!(error = %error, retry_in = ?delay, "standby cannot wait for leadership; retrying");
            tokio::select! {
                _ = cancel.cancelled() => return None,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Holding the lock on `conn`: records a new epoch and starts watching the lock.
    async fn begin(&self, mut conn: Conn) -> Result<Leadership, mysql_async::Error> {
        conn.exec_drop(
            "INSERT INTO outbox_relay_state (name, leader, leader_epoch) VALUES (?, ?, 1) \
             ON DUPLICATE KEY UPDATE leader = VALUES(leader), leader_epoch = leader_epoch + 1",
            (&self.name, &self.instance),
        )
        .await?;
        let epoch: u64 = conn
            .exec_first(
                "SELECT leader_epoch FROM outbox_relay_state WHERE name = ?",
                (&self.name,),
            )
            .await?
            .unwrap_or(0);
        tracing::info!(instance = %self.instance, epoch, lock = %self.lock, "this instance leads: it tails the binlog");
        crate::metrics::relay().leader.set(1);
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let watch = tokio::spawn(watch(self.clone(), conn, epoch, lost.clone(), stop.clone()));
        Ok(Leadership {
            epoch,
            lost,
            stop,
            watch,
        })
    }

    /// On a new connection: takes the lock again if free and nobody led since `epoch`.
    async fn regain(&self, epoch: u64) -> Result<Option<Conn>, mysql_async::Error> {
        let mut conn = self.connect().await?;
        if !take_lock(&mut conn, &self.lock, Duration::ZERO).await? {
            return Ok(None);
        }
        let current: Option<u64> = conn
            .exec_first(
                "SELECT leader_epoch FROM outbox_relay_state WHERE name = ?",
                (&self.name,),
            )
            .await?;
        if current == Some(epoch) {
            return Ok(Some(conn));
        }
        conn.exec_drop("SELECT RELEASE_LOCK(?)", (&self.lock,))
            .await?;
        Ok(None)
    }
}

/// This instance's leadership. Dropping it without [`Leadership::resign`] ends the watch; the
/// lock is freed when its connection closes.
pub struct Leadership {
    /// This leadership's epoch (fences the checkpoint mirror).
    pub epoch: u64,
    lost: CancellationToken,
    stop: CancellationToken,
    watch: JoinHandle<Option<Conn>>,
}

impl Leadership {
    /// Fires when this instance no longer holds the lock (stop streaming).
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Steps down: frees the lock (a standby takes over at once) and clears `leader` if it is
    /// still this epoch's.
    pub async fn resign(self, election: &Election) {
        crate::metrics::relay().leader.set(0);
        self.stop.cancel();
        let Ok(Some(mut conn)) = self.watch.await else {
            return;
        };
        let cleared = conn
            .exec_drop(
                "UPDATE outbox_relay_state SET leader = NULL WHERE name = ? AND leader_epoch = ?",
                (&election.name, self.epoch),
            )
            .await;
        let released = conn
            .exec_drop("SELECT RELEASE_LOCK(?)", (&election.lock,))
            .await;
        if let Err(e) = cleared.and(released) {
            tracing::warn!(error = %e, "cannot resign cleanly; the lock is freed when the connection closes");
        }
        let _ = conn.disconnect().await;
        tracing::info!(epoch = self.epoch, "stepped down as leader");
    }
}

/// Checks the lock every [`CHECK_EVERY`] until `stop` (returns the lock's connection) or until
/// it is lost (fires `lost`, returns `None`).
async fn watch(
    election: Election,
    mut conn: Conn,
    epoch: u64,
    lost: CancellationToken,
    stop: CancellationToken,
) -> Option<Conn> {
    let mut failures = 0;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Some(conn),
            _ = tokio::time::sleep(CHECK_EVERY) => {}
        }
        let held: Result<Option<Option<u64>>, _> = crate::db::bounded(conn.exec_first(
            "SELECT IS_USED_LOCK(?) = CONNECTION_ID()",
            (&election.lock,),
        ))
        .await;
        match held {
            Ok(Some(Some(1))) => {
                failures = 0;
                continue;
            }
            Ok(_) => {
                tracing::error!(
                    epoch,
                    "the leader lock is held by another connection: stepping down"
                );
                lost.cancel();
                return None;
            }
            Err(e) => tracing::warn!(error = %e, "cannot confirm the leader lock; taking it again"),
        }
        match crate::db::bounded(election.regain(epoch)).await {
            Ok(Some(new_conn)) => {
                tracing::info!(
                    epoch,
                    "leader lock taken again on a new connection; still leading"
                );
                conn = new_conn;
                failures = 0;
            }
            Ok(None) => {
                tracing::error!(
                    epoch,
                    "another instance took over leadership: stepping down"
                );
                lost.cancel();
                return None;
            }
            Err(e) => {
                failures += 1;
                if failures >= CONFIRM_ATTEMPTS {
                    tracing::error!(error = %e, epoch,
                        "cannot confirm the leader lock: stepping down (another instance may lead)");
                    lost.cancel();
                    return None;
                }
            }
        }
    }
}

/// `GET_LOCK(lock, wait)`: true when this connection now holds it.
async fn take_lock(
    conn: &mut Conn,
    lock: &str,
    wait: Duration,
) -> Result<bool, mysql_async::Error> {
    let got: Option<Option<i64>> = conn
        .exec_first("SELECT GET_LOCK(?, ?)", (lock, wait.as_secs_f64()))
        .await?;
    Ok(got.flatten() == Some(1))
}

/// A lock name of at most 64 characters (MySQL's limit) unique to `database` and `name`.
fn lock_name(database: &str, name: &str) -> String {
    let digest = Sha256::digest(format!("{database}\0{name}").as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("outbox-relay-leader-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_fit_mysql_and_separate_deployments() {
        let a = lock_name("shop", "default");
        assert!(a.len() <= 64, "{a}");
        assert_ne!(a, lock_name("shop", "other"));
        assert_ne!(a, lock_name("billing", "default"));
        assert_eq!(a, lock_name("shop", "default"));
    }
}
