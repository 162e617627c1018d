//! Leadership: among the instances that share a `relay.name` and a database, one tails the
//! binlog; the others stand by (and sweep). No ZooKeeper: the election runs in MySQL itself, by
//! one of two methods (`relay.election`, see [`ElectionMethod`]):
//! - **lock** ([`lock`]): MySQL's named lock (`GET_LOCK`) on a connection of the leader's own;
//!   takeover within about a second of a leader's death. Local to one server.
//! - **lease** ([`lease`]): a lease in the deployment's row of `outbox_relay_state`, claimed by a
//!   write that conflicts for two claimants; takeover after [`lease::LEASE`]. Cluster-wide
//!   wherever every instance writes the same row: Galera, where it is chosen automatically.
//!
//! Guarantees, whatever the method:
//! - **Every leadership has a new epoch** (`leader_epoch`, bumped when it begins).
//! - **The epoch fences the stream, not only the checkpoint.** The leader renews every
//!   [`CHECK_EVERY`] on a new connection each time (so after a failover that moved the server's
//!   address, the renewal reaches the new primary): by lease an UPDATE that matches only its own
//!   epoch, by lock a read of the epoch. A renewal that finds a newer epoch, a checkpoint-mirror write refused for this
//!   epoch, or a lost lock ends the leadership's [`Fence`]; and a leadership is only valid for a
//!   fixed time after its last successful renewal ([`lock::VALIDITY`], [`lease::VALIDITY`]). The
//!   senders and the marker check the fence before each batch: a superseded leader stops
//!   sending and marking within [`CHECK_EVERY`] plus one renewal of the newer epoch being
//!   committed (lock), or before a candidate may claim at all (lease); sends already in flight
//!   (at most `rocketmq.send_timeout`) are the only overlap. Overlap costs duplicates, never a
//!   loss: both leaders send only committed rows, and each checkpoint is safe on its own.
//! - **A leader that cannot renew stops** when its validity runs out, and stands by again.

mod clock;
mod fence;
pub mod lease;
pub mod lock;

pub use crate::config::ElectionMethod;
pub use fence::Fence;

use crate::binlog::reader::StartupError;
use crate::metrics::LeadershipEnd;
use crate::retry::RetryPolicy;
pub use clock::BootInstant;
use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How often a leader renews its leadership (and, with the lock, checks its lock).
pub const CHECK_EVERY: Duration = Duration::from_secs(1);
pub use lock::WAIT_STEP;
#[cfg(any(test, feature = "test-utils"))]
pub use lock::IDLE_LIMIT;

/// How the election is held, with what it needs.
#[derive(Debug, Clone)]
enum Method {
    Lock { lock: String },
    Lease,
}

/// The election of one relay deployment (`relay.name` in one database).
#[derive(Debug, Clone)]
pub struct Election {
    opts: Opts,
    name: String,
    instance: String,
    method: Method,
}

impl Election {
    /// The election for `name` in the database of `opts`, entered as `instance`, by the lock.
    pub fn new(opts: Opts, name: &str, instance: &str) -> Self {
        let database = opts.db_name().unwrap_or_default().to_string();
        Election {
            method: Method::Lock {
                lock: lock::lock_name(&database, name),
            },
            opts,
            name: name.to_string(),
            instance: instance.to_string(),
        }
    }

    /// The same election, held by lease.
    pub fn by_lease(self) -> Self {
        Election {
            method: Method::Lease,
            ..self
        }
    }

    /// The election `configured` for a server that is (`galera`) or is not a Galera node:
    /// `auto` picks the lease on Galera and the lock elsewhere; the lock on Galera is refused.
    pub fn for_server(
        opts: Opts,
        name: &str,
        instance: &str,
        configured: ElectionMethod,
        galera: bool,
    ) -> Result<Self, StartupError> {
        let election = Election::new(opts, name, instance);
        match (configured, galera) {
            (ElectionMethod::Lock, true) => Err(StartupError::Misconfigured(
                "relay.election = \"lock\" on a Galera node: GET_LOCK is local to each node, so \
                 instances on different nodes would all lead; set relay.election = \"auto\" or \
                 \"lease\" (see docs/concepts/several-instances.md)"
                    .into(),
            )),
            (ElectionMethod::Lease, _) | (ElectionMethod::Auto, true) => Ok(election.by_lease()),
            (ElectionMethod::Lock | ElectionMethod::Auto, false) => Ok(election),
        }
    }

    /// `"lock"` or `"lease"`.
    pub fn method(&self) -> &'static str {
        match self.method {
            Method::Lock { .. } => "lock",
            Method::Lease => "lease",
        }
    }

    /// The MySQL lock name (server-wide, so it includes the database), if elected by lock.
    pub fn lock_name(&self) -> Option<&str> {
        match &self.method {
            Method::Lock { lock } => Some(lock),
            Method::Lease => None,
        }
    }

    /// Becomes the leader if nobody is: `None` at once when another instance leads (by lease:
    /// when the row has a leader, even one whose lease is running out).
    pub async fn try_lead(&self) -> Result<Option<Leadership>, mysql_async::Error> {
        let started = BootInstant::now();
        match &self.method {
            Method::Lock { lock } => {
                let mut conn = lock::connect(&self.opts).await?;
                if lock::take(&mut conn, lock, Duration::ZERO).await? {
                    return self.begin_locked(conn, started).await.map(Some);
                }
                conn.disconnect().await?;
                Ok(None)
            }
            Method::Lease => {
                let mut conn = consistent_connection(&self.opts).await?;
                let mut watcher = lease::Watcher::default();
                let led = self.look_and_claim(&mut conn, &mut watcher, started).await;
                let _ = conn.disconnect().await;
                led
            }
        }
    }

    /// Waits until this instance leads (`None` if `cancel` fired first). Connection errors are
    /// retried with backoff.
    pub async fn lead(&self, cancel: &CancellationToken) -> Option<Leadership> {
        let policy = RetryPolicy::reconnect();
        let mut failures = 0;
        let mut watcher = lease::Watcher::default();
        loop {
            let attempt = self.wait_to_lead(&mut watcher);
            let error = tokio::select! {
                _ = cancel.cancelled() => return None,
                led = attempt => match led {
                    Ok(leadership) => return Some(leadership),
                    Err(e) => e,
                },
            };
            watcher.forget();
            failures += 1;
            let delay = policy.delay(failures).unwrap_or(policy.max);
            tracing::warn!(error = %error, retry_in = ?delay, "standby cannot wait for leadership; retrying");
            tokio::select! {
                _ = cancel.cancelled() => return None,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// One connection's wait for leadership (returns on leading or on a connection error).
    async fn wait_to_lead(
        &self,
        watcher: &mut lease::Watcher,
    ) -> Result<Leadership, mysql_async::Error> {
        match &self.method {
            Method::Lock { lock } => {
                let mut conn = lock::connect(&self.opts).await?;
                let mut connected = BootInstant::now();
                loop {
                    // A new connection now and then: the address may have moved to another
                    // server (a promoted replica) while the old one lives on, and the lock to
                    // wait for is the one on the server the address names now.
                    if connected.elapsed() >= lock::RECONNECT_EVERY {
                        let fresh = lock::connect(&self.opts).await?;
                        let _ = std::mem::replace(&mut conn, fresh).disconnect().await;
                        connected = BootInstant::now();
                    }
                    let started = BootInstant::now();
                    let took = crate::db::bounded(lock::take(&mut conn, lock, WAIT_STEP));
                    if took.await? {
                        return self.begin_locked(conn, started).await;
                    }
                }
            }
            Method::Lease => {
                let mut conn = consistent_connection(&self.opts).await?;
                loop {
                    let started = BootInstant::now();
                    if let Some(leadership) =
                        self.look_and_claim(&mut conn, watcher, started).await?
                    {
                        let _ = conn.disconnect().await;
                        return Ok(leadership);
                    }
                    tokio::time::sleep(lease::OBSERVE_EVERY).await;
                }
            }
        }
    }

    /// One look at the lease row, and a claim if it may be claimed.
    async fn look_and_claim(
        &self,
        conn: &mut Conn,
        watcher: &mut lease::Watcher,
        started: BootInstant,
    ) -> Result<Option<Leadership>, mysql_async::Error> {
        let row = crate::db::bounded(lease::look(conn, &self.name)).await?;
        if watcher.observe(row, Instant::now()) == lease::Verdict::Wait {
            return Ok(None);
        }
        let seen = watcher
            .claimable()
            .expect("a claimable row was seen")
            .clone();
        let claimed = crate::db::bounded(lease::claim(conn, &self.name, &self.instance, &seen));
        match claimed.await? {
            Some(epoch) => Ok(Some(self.begin(epoch, None, started, lease::VALIDITY))),
            None => {
                watcher.forget();
                Ok(None)
            }
        }
    }

    /// Holding the lock on `conn`: records a new epoch and begins.
    async fn begin_locked(
        &self,
        mut conn: Conn,
        started: BootInstant,
    ) -> Result<Leadership, mysql_async::Error> {
        conn.exec_drop(
            "INSERT INTO outbox_relay_state (name, leader, leader_epoch, lease_until) \
             VALUES (?, ?, 1, NULL) \
             ON DUPLICATE KEY UPDATE leader = VALUES(leader), leader_epoch = leader_epoch + 1, \
             lease_until = NULL",
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
        Ok(self.begin(epoch, Some(conn), started, lock::VALIDITY))
    }

    /// Leads under `epoch` (holding the lock on `lock_conn`, if elected by lock), valid for
    /// `validity` after `started`: starts the watch.
    fn begin(
        &self,
        epoch: u64,
        lock_conn: Option<Conn>,
        started: BootInstant,
        validity: Duration,
    ) -> Leadership {
        tracing::info!(instance = %self.instance, epoch, election = self.method(),
            "this instance leads: it tails the binlog");
        crate::metrics::relay().leader.set(1);
        let fence = Fence::new(epoch, started, validity);
        let stop = CancellationToken::new();
        let watch = tokio::spawn(watch(
            self.clone(),
            lock_conn,
            fence.clone(),
            validity,
            stop.clone(),
        ));
        Leadership { fence, stop, watch }
    }

    /// On a new connection: takes the lock again if free and nobody led since `epoch`.
    async fn regain(&self, lock: &str, epoch: u64) -> Result<Option<Conn>, mysql_async::Error> {
        let mut conn = lock::connect(&self.opts).await?;
        if !lock::take(&mut conn, lock, Duration::ZERO).await? {
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
        lock::release(&mut conn, lock).await?;
        Ok(None)
    }

    /// Renews `epoch` on a new connection: `Ok(None)` when renewed, `Ok(Some(newer))` when
    /// another leadership began since. By lease, the renewal rewrites `lease_until` (what
    /// candidates watch); by lock, the lock itself is the claim, so the renewal only reads the
    /// epoch (an idle deployment writes nothing to the binlog for it).
    async fn renew(&self, epoch: u64) -> Result<Option<u64>, mysql_async::Error> {
        let mut conn = match self.method {
            Method::Lease => consistent_connection(&self.opts).await?,
            // The lock is refused on Galera: every other server reads consistently anyway.
            Method::Lock { .. } => Conn::new(self.opts.clone()).await?,
        };
        if let Method::Lease = self.method {
            conn.exec_drop(
                "UPDATE outbox_relay_state SET lease_until = NOW(3) + INTERVAL ? SECOND \
                 WHERE name = ? AND leader_epoch = ?",
                (lease::LEASE.as_secs(), &self.name, epoch),
            )
            .await?;
        }
        let renewed = matches!(self.method, Method::Lease) && conn.affected_rows() == 1;
        let superseded = if renewed {
            None
        } else {
            let current: Option<u64> = conn
                .exec_first(
                    "SELECT leader_epoch FROM outbox_relay_state WHERE name = ?",
                    (&self.name,),
                )
                .await?;
            // The same epoch: still this leadership's (by lease: renewed twice within a
            // millisecond, so the UPDATE changed nothing).
            current.filter(|&current| current != epoch)
        };
        let _ = conn.disconnect().await;
        Ok(superseded)
    }
}

/// A new connection whose reads see every write committed in the cluster before them
/// (`wsrep_sync_wait = 1` on Galera; other servers are consistent anyway).
async fn consistent_connection(opts: &Opts) -> Result<Conn, mysql_async::Error> {
    let mut conn = Conn::new(opts.clone()).await?;
    match conn.query_drop("SET SESSION wsrep_sync_wait = 1").await {
        // MySQL has no such variable.
        Err(mysql_async::Error::Server(e)) if e.code == 1193 => {}
        other => other?,
    }
    Ok(conn)
}

/// This instance's leadership. Dropping it without [`Leadership::resign`] ends the watch: a lock
/// is freed as its connection closes, a lease runs out.
pub struct Leadership {
    fence: Fence,
    stop: CancellationToken,
    watch: JoinHandle<Option<Conn>>,
}

impl Leadership {
    /// This leadership's epoch.
    pub fn epoch(&self) -> u64 {
        self.fence.epoch().expect("a leadership has an epoch")
    }

    /// What the senders, the marker and the checkpoint mirror check before each batch.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Fires when this leadership is over (stop streaming).
    pub fn lost(&self) -> CancellationToken {
        self.fence.ended()
    }

    /// Steps down: clears `leader` if it is still this epoch's (a lease standby claims at once),
    /// and frees the lock (a lock standby takes over at once).
    pub async fn resign(mut self, election: &Election) {
        crate::metrics::relay().leader.set(0);
        self.stop.cancel();
        let lock_conn = (&mut self.watch).await.ok().flatten();
        let cleared = async {
            let mut conn = match lock_conn {
                Some(conn) => conn,
                None => consistent_connection(&election.opts).await?,
            };
            conn.exec_drop(
                "UPDATE outbox_relay_state SET leader = NULL, lease_until = NULL \
                 WHERE name = ? AND leader_epoch = ?",
                (&election.name, self.epoch()),
            )
            .await?;
            if let Some(lock) = election.lock_name() {
                lock::release(&mut conn, lock).await?;
            }
            conn.disconnect().await
        };
        if let Err(e) = crate::db::bounded(cleared).await {
            tracing::warn!(error = %e, "cannot resign cleanly; a lock is freed when its connection closes, a lease runs out");
        }
        tracing::info!(epoch = self.epoch(), "stepped down as leader");
    }
}

impl Drop for Leadership {
    /// Ends the watch without resigning (a lock is freed as its connection closes; a lease runs
    /// out): what a leader's death looks like to the others.
    fn drop(&mut self) {
        self.watch.abort();
    }
}

/// Renews `fence`'s leadership every [`CHECK_EVERY`] (and, holding `lock_conn`, checks the
/// lock) until `stop` (returns the lock's connection) or until the leadership is over (ends the
/// fence, returns `None`).
async fn watch(
    election: Election,
    mut lock_conn: Option<Conn>,
    fence: Fence,
    validity: Duration,
    stop: CancellationToken,
) -> Option<Conn> {
    let (epoch, ended) = (
        fence.epoch().expect("a leadership has an epoch"),
        fence.ended(),
    );
    loop {
        tokio::select! {
            _ = stop.cancelled() => return lock_conn,
            _ = ended.cancelled() => return None,
            _ = tokio::time::sleep(CHECK_EVERY) => {}
        }
        if let (Some(conn), Method::Lock { lock }) = (&mut lock_conn, &election.method) {
            match check_lock(&election, conn, lock, epoch).await {
                LockCheck::Held => {}
                LockCheck::Moved(conn) => lock_conn = Some(conn),
                LockCheck::Lost(why) => {
                    fence.end(LeadershipEnd::LOCK_LOST, why);
                    return None;
                }
                LockCheck::Unknown => {}
            }
        }
        // Bounded by the time the leadership has left: a renewal that answers later is too late.
        let left = fence.remaining()?;
        let started = BootInstant::now();
        match tokio::time::timeout(left, election.renew(epoch)).await {
            Ok(Ok(None)) => fence.renewed(started, validity),
            Ok(Ok(Some(newer))) => {
                fence.end(
                    LeadershipEnd::SUPERSEDED,
                    format_args!(
                    "another instance leads under epoch {newer} (found by this leader's renewal)"
                ),
                );
                return None;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, epoch, left = ?fence.remaining(),
                    "cannot renew leadership; retrying (this instance stops leading if it cannot before its validity runs out)");
            }
            Err(_) => {}
        }
        if !fence.holds() {
            return None;
        }
    }
}

/// What a check of the leader's lock found.
enum LockCheck {
    Held,
    /// The lock's connection broke, and the lock was taken again on this one (nobody led since).
    Moved(Conn),
    /// Another instance holds it (or led since): the reason.
    Lost(&'static str),
    /// Neither confirmed nor denied (the server cannot be reached): the renewal's validity decides.
    Unknown,
}

async fn check_lock(election: &Election, conn: &mut Conn, lock: &str, epoch: u64) -> LockCheck {
    match lock::held(conn, lock).await {
        Ok(true) => return LockCheck::Held,
        Ok(false) => return LockCheck::Lost("the leader lock is held by another connection"),
        Err(e) => tracing::warn!(error = %e, "cannot confirm the leader lock; taking it again"),
    }
    match crate::db::bounded(election.regain(lock, epoch)).await {
        Ok(Some(conn)) => {
            tracing::info!(
                epoch,
                "leader lock taken again on a new connection; still leading"
            );
            LockCheck::Moved(conn)
        }
        Ok(None) => LockCheck::Lost("another instance took over the leader lock"),
        Err(e) => {
            tracing::warn!(error = %e, epoch, "cannot take the leader lock again; retrying");
            LockCheck::Unknown
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_picks_the_lease_on_galera_and_the_lock_elsewhere_and_the_lock_is_refused_on_galera() {
        let opts = Opts::from_url("mysql://root@127.0.0.1:3306/shop").unwrap();
        let pick = |method, galera| {
            Election::for_server(opts.clone(), "default", "a", method, galera)
                .map(|e| e.method())
                .map_err(|e| e.to_string())
        };
        assert_eq!(pick(ElectionMethod::Auto, false), Ok("lock"));
        assert_eq!(pick(ElectionMethod::Auto, true), Ok("lease"));
        assert_eq!(pick(ElectionMethod::Lease, false), Ok("lease"));
        assert_eq!(pick(ElectionMethod::Lock, false), Ok("lock"));
        let refused = pick(ElectionMethod::Lock, true).unwrap_err();
        assert!(
            refused.contains("relay.election") && refused.contains("Galera"),
            "{refused}"
        );
    }
}
