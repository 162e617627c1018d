//! Election by a lease in the deployment's row of `outbox_relay_state`, for servers where a
//! named lock is not cluster-wide (Galera, multi-primary).
//!
//! The row says who leads (`leader`), under which epoch (`leader_epoch`), and when the leader
//! last renewed (`lease_until`, rewritten at every renewal). A candidate claims with one
//! compare-and-set UPDATE that bumps the epoch and matches the row exactly as it observed it:
//! two claimants of one observation conflict (on one server the second UPDATE waits for the
//! first and then matches nothing; on Galera certification fails one of them), so one wins.
//!
//! Guarantees (timed by each instance's own monotonic clock, never by comparing clocks):
//! - A candidate claims a led row only after it has seen the row unchanged for [`LEASE`], i.e.
//!   seen no renewal for that long, or when the row has no leader (a leader that resigned).
//! - A leader's leadership is valid for [`VALIDITY`] (under [`LEASE`]) after the start of its
//!   last successful renewal, and its fence stops sending at that moment. A renewal that a
//!   candidate saw started before the candidate saw it; so by the time a candidate claims, the
//!   old leader's validity has run out: leaders never overlap, beyond sends already in flight.
//! - Reads wait for the cluster (`wsrep_sync_wait = 1` on Galera), so a candidate sees every
//!   renewal committed anywhere before its read.

use mysql_async::prelude::*;
use mysql_async::Conn;
use std::time::{Duration, Instant};

/// How long a candidate must see a led row unchanged before it claims it: the takeover time
/// after a leader dies without resigning.
pub const LEASE: Duration = Duration::from_secs(8);
/// How long a lease leadership stays valid after the start of its last successful renewal.
pub const VALIDITY: Duration = Duration::from_secs(4);
/// How often a candidate looks at the row.
pub const OBSERVE_EVERY: Duration = Duration::from_secs(1);
// A leader's validity runs out before a candidate can have seen no renewal for a whole lease.
const _: () = assert!(VALIDITY.as_secs() + OBSERVE_EVERY.as_secs() < LEASE.as_secs());

/// The row as a candidate saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Seen {
    leader: Option<String>,
    epoch: u64,
    /// `lease_until` as text (compared, never interpreted).
    renewed: Option<String>,
}

/// A candidate's memory of the row: what it saw and since when it has not changed.
#[derive(Debug, Default)]
pub(super) struct Watcher {
    seen: Option<(Seen, Instant)>,
}

/// What a candidate does after a look at the row.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Claim the row as seen.
    Claim,
    /// Someone leads (or led less than [`LEASE`] ago): look again later.
    Wait,
}

impl Watcher {
    /// Records `now`'s observation of the row; whether it may be claimed.
    pub(super) fn observe(&mut self, row: Seen, now: Instant) -> Verdict {
        if row.leader.is_none() {
            self.seen = Some((row, now));
            return Verdict::Claim;
        }
        match &self.seen {
            Some((seen, since)) if *seen == row => {
                if now.saturating_duration_since(*since) >= LEASE {
                    Verdict::Claim
                } else {
                    Verdict::Wait
                }
            }
            _ => {
                self.seen = Some((row, now));
                Verdict::Wait
            }
        }
    }

    /// The observation a claim must match.
    pub(super) fn claimable(&self) -> Option<&Seen> {
        self.seen.as_ref().map(|(seen, _)| seen)
    }

    /// Forgets what was seen (after a failed claim or a lost connection).
    pub(super) fn forget(&mut self) {
        self.seen = None;
    }
}

/// The deployment's row, created (without a leader) if missing.
pub(super) async fn look(conn: &mut Conn, name: &str) -> Result<Seen, mysql_async::Error> {
    loop {
        let row: Option<(Option<String>, u64, Option<String>)> = conn
            .exec_first(
                "SELECT leader, leader_epoch, CAST(lease_until AS CHAR) \
                 FROM outbox_relay_state WHERE name = ?",
                (name,),
            )
            .await?;
        if let Some((leader, epoch, renewed)) = row {
            return Ok(Seen {
                leader,
                epoch,
                renewed,
            });
        }
        conn.exec_drop(
            "INSERT IGNORE INTO outbox_relay_state (name, leader_epoch) VALUES (?, 0)",
            (name,),
        )
        .await?;
    }
}

/// Claims the row as `seen` for `instance`: the new epoch, or `None` when the row changed since
/// (another candidate won, or the leader renewed). A write conflict (Galera certification, a
/// deadlock) is a lost claim too.
pub(super) async fn claim(
    conn: &mut Conn,
    name: &str,
    instance: &str,
    seen: &Seen,
) -> Result<Option<u64>, mysql_async::Error> {
    let claimed = conn
        .exec_drop(
            "UPDATE outbox_relay_state SET leader = ?, leader_epoch = leader_epoch + 1, \
             lease_until = NOW(3) + INTERVAL ? SECOND \
             WHERE name = ? AND leader_epoch = ? AND leader <=> ? \
             AND CAST(lease_until AS CHAR) <=> ?",
            (
                instance,
                LEASE.as_secs(),
                name,
                seen.epoch,
                &seen.leader,
                &seen.renewed,
            ),
        )
        .await;
    match claimed {
        Err(mysql_async::Error::Server(e)) if e.code == 1213 => Ok(None),
        Err(e) => Err(e),
        Ok(()) if conn.affected_rows() == 1 => Ok(Some(seen.epoch + 1)),
        Ok(()) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn led(epoch: u64, renewed: &str) -> Seen {
        Seen {
            leader: Some("a".into()),
            epoch,
            renewed: Some(renewed.into()),
        }
    }

    #[test]
    fn a_row_without_a_leader_is_claimed_at_once() {
        let mut watcher = Watcher::default();
        let row = Seen {
            leader: None,
            epoch: 3,
            renewed: None,
        };
        assert_eq!(watcher.observe(row.clone(), Instant::now()), Verdict::Claim);
        assert_eq!(watcher.claimable(), Some(&row));
    }

    #[test]
    fn a_led_row_is_claimed_only_after_a_lease_without_renewals() {
        let mut watcher = Watcher::default();
        let t0 = Instant::now();
        assert_eq!(watcher.observe(led(1, "10:00:01"), t0), Verdict::Wait);
        assert_eq!(
            watcher.observe(led(1, "10:00:01"), t0 + LEASE / 2),
            Verdict::Wait
        );
        // A renewal restarts the wait.
        assert_eq!(
            watcher.observe(led(1, "10:00:05"), t0 + LEASE - Duration::from_millis(1)),
            Verdict::Wait
        );
        assert_eq!(
            watcher.observe(led(1, "10:00:05"), t0 + LEASE + Duration::from_secs(1)),
            Verdict::Wait
        );
        let t1 = t0 + LEASE - Duration::from_millis(1);
        assert_eq!(
            watcher.observe(led(1, "10:00:05"), t1 + LEASE),
            Verdict::Claim
        );
        assert_eq!(watcher.claimable(), Some(&led(1, "10:00:05")));
        watcher.forget();
        assert_eq!(
            watcher.observe(led(1, "10:00:05"), t1 + LEASE * 2),
            Verdict::Wait
        );
    }
}
