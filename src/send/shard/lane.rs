//! A shard's lanes: one per topic that does not accept events now.
//!
//! When an attempt for a topic fails for a reason worth retrying, the shard hands the events
//! to a lane of that topic (a task of its own) and goes on with its other topics. Every later
//! event of the topic the shard takes goes to the back of the lane, so the lane sends the
//! topic's events in the shard's order, retrying each batch under the retry policy as a shard
//! always did. Once the lane has given every event it holds an outcome it closes, and the shard
//! sends the topic's events itself again, but only after the lane's task has ended: a key's
//! events are never sent by two tasks at once.
//!
//! Guarantee: a topic that does not accept events holds back its own events only, in order.
//! A lane holds at most [`LANE_CAPACITY`] events: well before that, the stream parks the
//! topic's new events (see [`Stalls`]); where nothing parks, at most [`LANE_LIMIT`], and the
//! shard waits while it is full.

use super::{next_batch, resume, send_batch, Backoff, OnFailure, ShardOptions, Stalled, Stop};
use super::{Completion, ShardEvent, Sink};
use crate::send::stall::LANE_LIMIT;
use crate::send::Stalls;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Most events one lane holds where the stream parks a stalled topic's events: a bound for
/// the time it takes the stream to start parking, never reached in practice.
pub const LANE_CAPACITY: usize = 16 * LANE_LIMIT;

/// The lanes of one shard, by topic.
pub(super) struct Lanes<'a, S> {
    sink: &'a Arc<S>,
    completions: &'a mpsc::Sender<Completion>,
    options: &'a ShardOptions,
    cancel: &'a CancellationToken,
    lanes: HashMap<String, Lane>,
}

struct Lane {
    input: mpsc::Sender<ShardEvent>,
    task: JoinHandle<()>,
    held: Arc<Held>,
}

/// How many events a lane holds (queued or being sent), as [`Stalls`] reports them.
struct Held {
    count: AtomicUsize,
    stalls: Arc<Stalls>,
    topic: String,
    shard: u32,
}

impl Held {
    fn add(&self, n: usize) {
        let held = self.count.fetch_add(n, Ordering::SeqCst) + n;
        self.stalls.holding(&self.topic, self.shard, held);
    }

    fn done(&self, n: usize) {
        let held = self.count.fetch_sub(n, Ordering::SeqCst) - n;
        self.stalls.holding(&self.topic, self.shard, held);
    }
}

impl<'a, S: Sink> Lanes<'a, S> {
    pub(super) fn new(
        sink: &'a Arc<S>,
        completions: &'a mpsc::Sender<Completion>,
        options: &'a ShardOptions,
        cancel: &'a CancellationToken,
    ) -> Self {
        Lanes {
            sink,
            completions,
            options,
            cancel,
            lanes: HashMap::new(),
        }
    }

    /// Puts `event` at the back of its topic's lane, if the topic has one (`Ok(None)`); else
    /// gives it back, to be sent by the shard. A lane that has closed (its topic accepts events
    /// again) is waited for first. Waits while the lane is full. `Err` once the shard stops.
    pub(super) async fn queue(&mut self, event: ShardEvent) -> Result<Option<ShardEvent>, ()> {
        // The common case, no stalled topic at all, costs no look-up.
        if self.lanes.is_empty() || !self.lanes.contains_key(&event.row.message.topic) {
            return Ok(Some(event));
        }
        let topic = event.row.message.topic.clone();
        let lane = &self.lanes[&topic];
        let event = tokio::select! {
            _ = self.cancel.cancelled() => return Err(()),
            sent = lane.input.send(event) => match sent {
                Ok(()) => {
                    lane.held.add(1);
                    return Ok(None);
                }
                Err(mpsc::error::SendError(event)) => event,
            },
        };
        let lane = self.lanes.remove(&topic).expect("present");
        let _ = lane.task.await;
        if self.cancel.is_cancelled() {
            return Err(());
        }
        Ok(Some(event))
    }

    /// Opens a lane for the topic of `stalled`, starting with its events.
    pub(super) fn open(&mut self, stalled: Stalled) {
        let topic = stalled.topic().to_string();
        let stalls = &self.options.stalls;
        let capacity = if stalls.parks() {
            LANE_CAPACITY
        } else {
            LANE_LIMIT
        };
        let (input, events) = mpsc::channel(capacity);
        let held = Arc::new(Held {
            count: AtomicUsize::new(0),
            stalls: Arc::clone(stalls),
            topic: topic.clone(),
            shard: self.options.index,
        });
        held.add(stalled.batch.len());
        let task = tokio::spawn(run_lane(
            Arc::clone(self.sink),
            stalled,
            events,
            self.completions.clone(),
            self.options.clone(),
            self.cancel.clone(),
            Arc::clone(&held),
        ));
        self.lanes.insert(topic, Lane { input, task, held });
    }

    /// Once the shard's input is drained: waits until every lane has sent what it holds.
    pub(super) async fn finish(self) {
        for (_, lane) in self.lanes {
            drop(lane.input);
            let _ = lane.task.await;
        }
    }
}

/// Tells the stalls when a lane ends, however it ends.
struct Closing<'a> {
    stalls: &'a Stalls,
    topic: String,
    shard: u32,
}

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        self.stalls.closed(&self.topic, self.shard);
    }
}

/// A lane: sends `stalled`, then the events queued behind it, each batch retried until it has
/// its outcome; closes its input once it finds it empty and ends when it has sent what was left.
async fn run_lane<S: Sink>(
    sink: Arc<S>,
    stalled: Stalled,
    mut input: mpsc::Receiver<ShardEvent>,
    completions: mpsc::Sender<Completion>,
    options: ShardOptions,
    cancel: CancellationToken,
    held: Arc<Held>,
) {
    // Tells the stalls the lane is closed when this function returns, however it returns.
    let _closing = Closing {
        stalls: &options.stalls,
        topic: stalled.topic().to_string(),
        shard: options.index,
    };
    let stop = Stop {
        cancel: &cancel,
        fence: &options.fence,
        on_failure: OnFailure::Wait,
    };
    let size = stalled.batch.len();
    if resume(&*sink, stalled, &completions, stop).await.is_err() {
        return;
    }
    held.done(size);
    let mut next_first: Option<ShardEvent> = None;
    loop {
        let first = match next_first.take().or_else(|| input.try_recv().ok()) {
            Some(event) => event,
            None => {
                input.close();
                match input.recv().await {
                    Some(event) => event,
                    None => return,
                }
            }
        };
        let next = next_batch(
            &*sink,
            first,
            &mut input,
            &mut next_first,
            &completions,
            &options,
            stop,
        );
        let sent = match next.await {
            Ok(Some((batch, queue))) => {
                let size = batch.len();
                let backoff = Backoff::new(&options.retry, &options.wake);
                send_batch(&*sink, batch, queue, backoff, &completions, stop)
                    .await
                    .map(|()| size)
            }
            Ok(None) => Ok(1),
            Err(interrupt) => Err(interrupt),
        };
        match sent {
            Ok(size) => held.done(size),
            Err(_) => return,
        }
    }
}
