//! The send stage as a whole: `relay.shards` ordered shard senders, started together, fed
//! through one [`SendInputs`], drained together on shutdown. CDC, poll mode, the sweeper beside
//! the stream and `replay` all send through it.

use super::{run_shard, Completion, ShardEvent, ShardOptions, Sink, Stalls};
use crate::leader::Fence;
use crate::retry::RetryPolicy;
use crate::route::Router;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Running shard senders.
pub struct Shards {
    tasks: Vec<JoinHandle<()>>,
    cancel: CancellationToken,
}

/// What feeds the send stage: the router that picks a key's shard, each shard's queue, and the
/// completions channel (the marker's input) for events that fail before any send (bad rows).
///
/// Guarantee: every event of one `biz_key` handed to [`SendInputs::send`] goes to the same shard,
/// which sends in the order handed over. The shards stop once every clone is dropped.
#[derive(Clone)]
pub struct SendInputs {
    router: Router,
    shards: Vec<mpsc::Sender<ShardEvent>>,
    completions: mpsc::Sender<Completion>,
    stalls: Arc<Stalls>,
}

/// The send stage is gone (its shards or the marker stopped): nothing more can be handed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the shard senders or the marker stopped")]
pub struct Stopped;

impl SendInputs {
    /// Queues `event` on its key's shard (waits while that shard is full).
    pub async fn send(&self, event: ShardEvent) -> Result<(), Stopped> {
        let shard = &self.shards[self.router.shard(event.key_hash)];
        shard.send(event).await.map_err(|_| Stopped)
    }

    /// Hands an outcome straight to the marker (a row that cannot become a message).
    pub async fn complete(&self, completion: Completion) -> Result<(), Stopped> {
        self.completions.send(completion).await.map_err(|_| Stopped)
    }

    /// Inputs over bare channels, for unit tests that read what the stages hand on.
    #[cfg(test)]
    pub(crate) fn from_channels(
        shards: Vec<mpsc::Sender<ShardEvent>>,
        completions: mpsc::Sender<Completion>,
    ) -> Self {
        SendInputs {
            router: Router::new(shards.len()),
            shards,
            completions,
            stalls: Arc::default(),
        }
    }

    /// The topics that do not accept events now (see [`Stalls`]).
    pub fn stalls(&self) -> &Arc<Stalls> {
        &self.stalls
    }

    /// How many shards there are.
    #[cfg(any(test, feature = "test-utils"))]
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }
}

impl Shards {
    /// Starts `count` shards sending through `sink` with `retry`, each queueing up to `capacity`
    /// events, sending only while `fence` holds, keeping their stalled topics in `stalls`,
    /// reporting outcomes to `completions`; returns them and their inputs.
    pub fn start<S: Sink>(
        sink: &Arc<S>,
        count: usize,
        capacity: usize,
        retry: RetryPolicy,
        fence: Fence,
        stalls: Arc<Stalls>,
        completions: mpsc::Sender<Completion>,
    ) -> (Self, SendInputs) {
        // A leadership that is over stops every shard between sends, as a drain timeout does.
        let cancel = fence.ended().child_token();
        let options = ShardOptions {
            retry,
            fence,
            stalls: Arc::clone(&stalls),
            ..ShardOptions::default()
        };
        let mut inputs = Vec::with_capacity(count);
        let mut tasks = Vec::with_capacity(count);
        for index in 0..count {
            let (tx, rx) = mpsc::channel(capacity);
            inputs.push(tx);
            let options = ShardOptions {
                index: index as u32,
                released: Arc::default(),
                ..options.clone()
            };
            tasks.push(tokio::spawn(run_shard(
                Arc::clone(sink),
                rx,
                completions.clone(),
                options,
                cancel.clone(),
            )));
        }
        let inputs = SendInputs {
            router: Router::new(count),
            shards: inputs,
            completions,
            stalls,
        };
        (Shards { tasks, cancel }, inputs)
    }

    /// Once every [`SendInputs`] is dropped: waits until every shard has sent what it holds, at
    /// most `timeout`; then stops the rest between sends (their events stay unacknowledged, and
    /// `unfinished` says what happens to them).
    pub async fn drain(self, timeout: Duration, unfinished: &str) {
        let Shards { tasks, cancel } = self;
        let drain = async {
            for task in tasks {
                let _ = task.await;
            }
        };
        if tokio::time::timeout(timeout, drain).await.is_err() {
            tracing::warn!(
                ?timeout,
                "in-flight events did not finish before the drain timeout; {unfinished}"
            );
            cancel.cancel();
        }
    }
}
