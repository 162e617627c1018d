//! Election by MySQL's named lock (`GET_LOCK`), held on a connection of the leader's own.
//!
//! Guarantee, on one server: the lock is held by one connection; the server frees it when that
//! connection ends, and only then can a standby (waiting in `GET_LOCK`) take it. A killed leader
//! process closes its socket, so a standby takes over within about a second ([`WAIT_STEP`] plus
//! the server noticing). A host that vanished without closing its connections is bounded by
//! [`IDLE_LIMIT`], the lock connection's `wait_timeout`, which a live leader never reaches: its
//! watch checks the lock every [`super::CHECK_EVERY`]. The lock is local to one server: on
//! Galera or any multi-primary setup each node grants it separately, which is why
//! [`super::Election::for_server`] refuses it there.

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};
use sha2::{Digest, Sha256};
use std::time::Duration;

/// How long one `GET_LOCK` waits on the server before the standby checks for cancellation.
pub const WAIT_STEP: Duration = Duration::from_secs(1);
/// The lock connection's `wait_timeout`: the server ends it (freeing the lock) after this long
/// without a query, i.e. when the leader's host is gone without closing it.
pub const IDLE_LIMIT: Duration = Duration::from_secs(10);
/// How often a standby waiting for the lock opens a new connection for it: a standby that
/// kept one connection would wait on the server it first reached after the address moved to a
/// promoted replica (the old primary still up), and never lead on the new one.
pub const RECONNECT_EVERY: Duration = Duration::from_secs(5);
/// How long a lock leadership stays valid after the start of its last successful check: under
/// [`IDLE_LIMIT`], so a leader cut off from its server stops before the server frees its lock.
pub const VALIDITY: Duration = Duration::from_secs(8);

/// A connection for the lock, ended by the server after [`IDLE_LIMIT`] of silence.
pub(super) async fn connect(opts: &Opts) -> Result<Conn, mysql_async::Error> {
    let mut conn = Conn::new(opts.clone()).await?;
    conn.query_drop(format!(
        "SET SESSION wait_timeout = {}",
        IDLE_LIMIT.as_secs()
    ))
    .await?;
    Ok(conn)
}

/// `GET_LOCK(lock, wait)`: true when this connection now holds it.
pub(super) async fn take(
    conn: &mut Conn,
    lock: &str,
    wait: Duration,
) -> Result<bool, mysql_async::Error> {
    let got: Option<Option<i64>> = conn
        .exec_first("SELECT GET_LOCK(?, ?)", (lock, wait.as_secs_f64()))
        .await?;
    Ok(got.flatten() == Some(1))
}

/// Whether `conn` still holds `lock`.
pub(super) async fn held(conn: &mut Conn, lock: &str) -> Result<bool, mysql_async::Error> {
    let held: Option<Option<u64>> =
        crate::db::bounded(conn.exec_first("SELECT IS_USED_LOCK(?) = CONNECTION_ID()", (lock,)))
            .await?;
    Ok(held.flatten() == Some(1))
}

/// Frees `lock` on `conn`.
pub(super) async fn release(conn: &mut Conn, lock: &str) -> Result<(), mysql_async::Error> {
    conn.exec_drop("SELECT RELEASE_LOCK(?)", (lock,)).await
}

/// A lock name of at most 64 characters (MySQL's limit) unique to `database` and `name`.
pub fn lock_name(database: &str, name: &str) -> String {
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
