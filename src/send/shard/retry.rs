//! Waiting out a shard's retry delays, and the wake-up that cuts them short.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Wakes the shards waiting out a retry delay when one of them got `SEND_OK`: the broker is
/// back, so a shard need not sit out the rest of a long backoff (and hold its keys) after an
/// outage that other shards have already seen end.
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

    /// Waits out `delay` or until a wake-up, whichever comes first; `Err` if `cancel` fires.
    pub(super) async fn wait(&self, delay: Duration, cancel: &CancellationToken) -> Result<(), ()> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let waited = tokio::select! {
            _ = cancel.cancelled() => Err(()),
            _ = tokio::time::sleep(delay) => Ok(()),
            _ = self.notify.notified() => Ok(()),
        };
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        waited
    }
}
