//! Waiting out a shard's retry delays, and the wake-up that cuts them short.

use super::{failed, SendOutcome};
use crate::retry::RetryPolicy;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Wakes the senders waiting out a retry delay for a topic when a send to that topic got
/// `SEND_OK`: its broker is back, so a shard (or a lane) need not sit out the rest of a long
/// backoff (and hold its keys) after an outage that another shard has already seen end. A
/// success on another topic wakes nobody here: it says nothing about this topic, and would
/// make a stalled topic's lanes try again at the pace of a healthy topic's sends. A wake-up
/// only moves an attempt earlier; it is not a retry (see `Backoff`).
///
/// Shared by the shards given clones of one [`ShardOptions`](super::ShardOptions), i.e. the
/// shards of one relay; shards of other relays in the same process (tests) are not woken.
#[derive(Debug, Default)]
pub struct WakeUp {
    /// The senders waiting out a retry delay, by topic: how many, and what wakes them.
    waiting: Mutex<HashMap<String, (usize, Arc<Notify>)>>,
    /// How many wait in all: a `SEND_OK` while nobody waits (the common case) takes no lock.
    waiting_total: AtomicUsize,
}

impl WakeUp {
    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<String, (usize, Arc<Notify>)>> {
        self.waiting.lock().expect("not poisoned")
    }

    /// A send to `topic` (to `queue`, where keys keep their queue) got `SEND_OK`: wakes the
    /// senders waiting out a retry delay for the topic, and those for that queue. Senders waiting
    /// for another queue are not woken: their queue's broker group may be the one that is down.
    pub(super) fn broker_answered_at(&self, topic: &str, queue: Option<usize>) {
        if self.waiting_total.load(Ordering::SeqCst) == 0 {
            return;
        }
        let waiting = self.waiting();
        let keys =
            std::iter::once(topic.to_string()).chain(queue.map(|q| wait_key(topic, Some(q))));
        for key in keys {
            if let Some((_, notify)) = waiting.get(&key) {
                notify.notify_waiters();
            }
        }
    }

    /// Waits until `deadline` or a wake-up for `topic`, whichever comes first (true: woken);
    /// `Err` if `cancel` fires.
    async fn wait_until(
        &self,
        topic: &str,
        deadline: Instant,
        cancel: &CancellationToken,
    ) -> Result<bool, ()> {
        let notify = {
            let mut waiting = self.waiting();
            let entry =
                (waiting.entry(topic.to_string())).or_insert_with(|| (0, Arc::new(Notify::new())));
            entry.0 += 1;
            Arc::clone(&entry.1)
        };
        self.waiting_total.fetch_add(1, Ordering::SeqCst);
        let waited = tokio::select! {
            _ = cancel.cancelled() => Err(()),
            _ = tokio::time::sleep_until(deadline) => Ok(false),
            _ = notify.notified() => Ok(true),
        };
        self.waiting_total.fetch_sub(1, Ordering::SeqCst);
        let mut waiting = self.waiting();
        if let Some(entry) = waiting.get_mut(topic) {
            entry.0 -= 1;
            if entry.0 == 0 {
                waiting.remove(topic);
            }
        }
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
    /// Failed attempts since the batch's topic parked (they use no retry: see
    /// [`Backoff::park`]).
    parked_failures: u32,
    /// Whether the batch's topic has parked.
    parked: bool,
    /// When the retry delay being waited out ends; `None` before the first retry.
    deadline: Option<Instant>,
}

/// The longest wait between attempts of a parked topic's retried batch: how soon after the
/// topic takes events again (and the route shows it) its events go out.
pub(super) const PARKED_RETRY_EVERY: Duration = Duration::from_secs(10);

/// What a failed attempt leads to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Retry number `retry`, after `delay`.
    Retry { retry: u32, delay: Duration },
    /// The attempt came early (after a wake-up): no retry is used, the rest of the current delay
    /// (`left`) is waited out.
    Resume { left: Duration },
    /// The batch's topic has parked (see [`Backoff::park`]): no retry is used, the next attempt
    /// comes after `delay`.
    Parked { delay: Duration },
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
            parked_failures: 0,
            parked: false,
            deadline: None,
        }
    }

    /// The batch's topic has parked (stalled for `relay.park_after`): the stall is the
    /// topic's, not its events', so from now on a failed attempt uses no retry and the batch is
    /// never FAILED for it. It waits as its topic's other events do (those are PENDING rows):
    /// the delays grow as the policy's do, at most [`PARKED_RETRY_EVERY`]. A failure the broker
    /// blames on an event (`SendError::Rejected`) still fails that event at once.
    pub(super) fn park(&mut self) {
        self.parked = true;
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
        if self.parked {
            self.parked_failures = self.parked_failures.saturating_add(1);
            let delay = (self.policy)
                .delay_without_end(self.retries + self.parked_failures)
                .min(PARKED_RETRY_EVERY);
            self.deadline = Some(now + delay);
            return Next::Parked { delay };
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

    /// A send to `topic` (to `queue`, where keys keep their queue) got `SEND_OK`: wakes the
    /// senders waiting out a retry delay for it (see [`WakeUp`]).
    pub(super) fn broker_answered(&self, topic: &str, queue: Option<usize>) {
        self.wake.broker_answered_at(topic, queue);
    }

    /// Waits until the current retry delay ends or a wake-up comes for `topic` (for `queue`
    /// only, if given: a failed send to that queue); `Err` if `cancel` fires.
    pub(super) async fn wait(
        &self,
        topic: &str,
        queue: Option<usize>,
        cancel: &CancellationToken,
    ) -> Result<(), ()> {
        let deadline = self.deadline.unwrap_or_else(Instant::now);
        self.wake
            .wait_until(&wait_key(topic, queue), deadline, cancel)
            .await
            .map(drop)
    }

    /// As [`Backoff::wait`], but returns at `until` too, if that comes first: true when the next
    /// attempt is due (the delay is over, or a wake-up came), false when it returned at `until`.
    pub(super) async fn wait_or_until(
        &self,
        topic: &str,
        queue: Option<usize>,
        until: Instant,
        cancel: &CancellationToken,
    ) -> Result<bool, ()> {
        let deadline = self.deadline.unwrap_or_else(Instant::now);
        if until >= deadline {
            self.wait(topic, queue, cancel).await?;
            return Ok(true);
        }
        let woken = (self.wake)
            .wait_until(&wait_key(topic, queue), until, cancel)
            .await?;
        Ok(woken || Instant::now() >= deadline)
    }
}

/// What the senders waiting for `topic` (for its `queue` only, if given) are woken by.
fn wait_key(topic: &str, queue: Option<usize>) -> String {
    match queue {
        // `#` is not allowed in a RocketMQ topic name.
        Some(queue) => format!("{topic}#{queue}"),
        None => topic.to_string(),
    }
}
