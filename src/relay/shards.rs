//! The ordered shard senders both relays run (CDC and poll mode): started together, drained
//! together on shutdown.

use crate::retry::RetryPolicy;
use crate::send::{run_shard, Completion, ShardEvent, ShardOptions, Sink};
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

impl Shards {
    /// Starts `count` shards sending through `sink` with `retry`, reporting outcomes to `completions`;
    /// returns them and their inputs (each of `capacity` events).
    pub fn start<S: Sink>(
        sink: &Arc<S>,
        count: usize,
        capacity: usize,
        retry: RetryPolicy,
        completions: &mpsc::Sender<Completion>,
    ) -> (Self, Vec<mpsc::Sender<ShardEvent>>) {
        let options = ShardOptions {
            retry,
            ..ShardOptions::default()
        };
        let cancel = CancellationToken::new();
        let mut inputs = Vec::with_capacity(count);
        let mut tasks = Vec::with_capacity(count);
        for index in 0..count {
            let (tx, rx) = mpsc::channel(capacity);
            inputs.push(tx);
            let options = ShardOptions {
                index: index as u32,
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
        (Shards { tasks, cancel }, inputs)
    }

    /// Once the inputs are dropped: waits until every shard has sent what it holds, at most
    /// `timeout`; then stops the rest between sends (their events stay unacknowledged, and
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
