//! Waiting out a shard's retry delays, and the wake-up that cuts them short.

use super::{failed, SendOutcome};
use crate::retry::RetryPolicy;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Wakes the shards waiting out a retry delay when one of them got `SEND_OK`: the broker is
/// back, so a shard need not sit out the rest of a long backoff (and hold its keys) after an
/// outage that other shards have already seen end. A wake-up only moves an attempt earlier; it
/// is not a retry (see `Backoff`).
///
/// Shared by the shards given clones of one [`ShardOptions`](super::ShardOptions), i.e. the
/// shards of one relay; shards of other relays in the same process (tests) are not woken.
#[derive(Debug, Default)]
pub struct WakeUp {
    notify: Notify,
    /// Shards waiting out a retry delay (so a successful send only notifies when someone waits).
    waiting: AtomicUsize,
}

impl WakeUp {
    /// A send got `SEND_OK`: wakes the shards waiting out a retry delay, if any.
    pub(super) fn broker_answered(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }

    /// Waits until `deadline` or a wake-up, whichever comes first; `Err` if `cancel` fires.
    async fn wait_until(&self, deadline: Instant, cancel: &CancellationToken) -> Result<(), ()> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let waited = tokio::select! {
            _ = cancel.cancelled() => Err(()),
            _ = tokio::time::sleep_until(deadline) => Ok(()),
            _ = self.notify.notified() => Ok(()),
        };
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        waited
    }
}

/// The retries of one batch (or route look-up) under the retry policy.
///
/// Guarantee: a wake-up lets the next attempt start at once, but an attempt that fails before
/// the deadline of the retry delay it cut short uses no retry: the shard goes back to waiting
/// until that same deadline, and only an attempt failing at or after it counts as the next
/// retry. So an event goes FAILED no sooner than the sum of the policy's delays after its first
/// attempt, however many wake-ups come.
#[derive(Debug, Clone)]
pub(super) struct Backoff {
    policy: RetryPolicy,
    wake: Arc<WakeUp>,
    /// Retries counted so far.
    retries: u32,
    /// Attempts refused for the relay's account so far (they use no retry).
    refusals: u32,
    /// When the retry delay being waited out ends; `None` before the first retry.
    deadline: Option<Instant>,
}

/// What a failed attempt leads to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Retry number `retry`, after `delay`.
    Retry { retry: u32, delay: Duration },
    /// The attempt came early (after a wake-up): no retry is used, the rest of the current delay
    /// (`left`) is waited out.
    Resume { left: Duration },
    /// The retries are used up.
    GiveUp,
}

/// What an attempt the broker refused for the relay's account leads to (no retry is used).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refusal {
    /// The `count`-th refusal in a row: the next attempt comes after `delay`.
    Wait { count: u32, delay: Duration },
    /// The attempt came early (after a wake-up): the rest of the current delay (`left`) is
    /// waited out.
    Resume { left: Duration },
}

impl Backoff {
    pub(super) fn new(policy: &RetryPolicy, wake: &Arc<WakeUp>) -> Self {
        Backoff {
            policy: policy.clone(),
            wake: Arc::clone(wake),
            retries: 0,
            refusals: 0,
            deadline: None,
        }
    }

    /// The attempts counted: the first and each retry (not the early ones after a wake-up).
    pub(super) fn attempts(&self) -> u32 {
        self.retries + 1
    }

    /// The outcome once [`Next::GiveUp`] was answered, after a last failure for `reason`.
    pub(super) fn gave_up(&self, reason: &str) -> SendOutcome {
        let reason = format!("gave up after {} retries: {reason}", self.retries);
        failed(reason, self.attempts())
    }

    /// Counts a failed attempt: a new retry delay, the rest of the current one if the attempt came
    /// before its deadline, or giving up. Call [`Backoff::wait`] next unless it gives up.
    pub(super) fn failed(&mut self) -> Next {
        let now = Instant::now();
        if let Some(left) = self.left(now) {
            return Next::Resume { left };
        }
        match self.policy.delay(self.retries + 1) {
            Some(delay) => {
                self.retries += 1;
                self.deadline = Some(now + delay);
                Next::Retry {
                    retry: self.retries,
                    delay,
                }
            }
            None => Next::GiveUp,
        }
    }

    /// Counts an attempt the broker refused for the relay's account (credentials, permission).
    /// It uses no retry, so the events never go FAILED for it, but it is waited out like one:
    /// the delays grow as the policy's do, then stay at its last
    /// ([`RetryPolicy::delay_without_end`]). An early attempt (after a wake-up) waits out the
    /// rest of the current delay, as in [`Backoff::failed`]. Call [`Backoff::wait`] next.
    pub(super) fn refused(&mut self) -> Refusal {
        let now = Instant::now();
        if let Some(left) = self.left(now) {
            return Refusal::Resume { left };
        }
        self.refusals = self.refusals.saturating_add(1);
        let delay = self.policy.delay_without_end(self.refusals);
        self.deadline = Some(now + delay);
        Refusal::Wait {
            count: self.refusals,
            delay,
        }
    }

    /// What is left of the delay being waited out at `now`, if `now` is before its deadline.
    fn left(&self, now: Instant) -> Option<Duration> {
        let deadline = self.deadline.filter(|&deadline| now < deadline)?;
        Some(deadline - now)
    }

    /// A send got `SEND_OK`: wakes the shards waiting out a retry delay (see [`WakeUp`]).
    pub(super) fn broker_answered(&self) {
        self.wake.broker_answered();
    }

    /// Waits until the current retry delay ends or a wake-up comes; `Err` if `cancel` fires.
    pub(super) async fn wait(&self, cancel: &CancellationToken) -> Result<(), ()> {
        let deadline = self.deadline.unwrap_or_else(Instant::now);
        self.wake.wait_until(deadline, cancel).await
    }
}
