//! A shard's lanes: one per topic, or per queue of a topic, that does not accept events now.
//!
//! When an attempt for a topic fails for a reason worth retrying, the shard hands the events
//! to a lane (a task of its own) and goes on with the rest. Where keys keep their queue whatever
//! the route says ([`Sink::stable_queues`]), a failed send to a queue opens a lane of that queue
//! only; a failed route look-up (or a sink whose keys may move between queues) opens a lane of
//! the whole topic, which first lets the topic's queue lanes finish. Every later event the lane
//! covers goes to its back, so the lane sends them in the shard's order, retrying each batch
//! under the retry policy as a shard always did. Once the lane has given every event it holds an
//! outcome it closes, and the shard sends those events itself again, but only after the lane's
//! task has ended: a key's events are never sent by two tasks at once.
//!
//! Guarantee: a topic (or queue) that does not accept events holds back its own events only, in
//! order, and the checkpoint only until it parks: from then on a lane releases the streamed
//! events it holds (their rows stay PENDING for the sweeper) but the batch it retries, which
//! tells when the topic accepts events again (see [`LaneInput::release`]).
//! A lane holds at most [`LANE_CAPACITY`] events: well before that, the stream parks the
//! topic's new events (see [`Stalls`]); where nothing parks, at most [`LANE_LIMIT`], and the
//! shard waits while it is full.

use super::{next_batch, queue_index, resume_now, send_batch, Backoff, ShardOptions};
use super::{Completion, EventSource, Interrupt, ShardEvent, Sink, Stalled, Stop};
use crate::event::Origin;
use crate::send::released::{self, ReleasedKeys};
use crate::route::index_for;
use crate::send::stall::{LaneId, QueueIndex, LANE_LIMIT};
use crate::send::Stalls;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Most events one lane holds where the stream parks a stalled topic's events: a bound for
/// the time it takes the stream to start parking, never reached in practice.
pub const LANE_CAPACITY: usize = 16 * LANE_LIMIT;

/// The lanes of one shard.
pub(super) struct Lanes<'a, S> {
    sink: &'a Arc<S>,
    completions: &'a mpsc::Sender<Completion>,
    options: &'a ShardOptions,
    cancel: &'a CancellationToken,
    /// Per topic, its lanes by queue index (`None`: the lane of all its events, then its only
    /// one).
    lanes: HashMap<String, HashMap<Option<usize>, Lane>>,
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
    lane: LaneId,
    /// The broker group the lane found not answering, if that is why it opened; taken once the
    /// lane has sent what it was opened with (the group answers again) or ends.
    group: std::sync::Mutex<Option<String>>,
}

impl Held {
    fn add(&self, n: usize) {
        let held = self.count.fetch_add(n, Ordering::SeqCst) + n;
        self.stalls.holding(&self.topic, self.lane, held);
    }

    fn done(&self, n: usize) {
        let held = self.count.fetch_sub(n, Ordering::SeqCst) - n;
        self.stalls.holding(&self.topic, self.lane, held);
    }

    /// The group the lane found not answering answers again (or the lane ends).
    fn group_answers(&self) {
        if let Some(group) = self.group.lock().expect("not poisoned").take() {
            self.stalls.group_lane_closed(&group);
        }
    }
}

/// Where [`Lanes::queue`] puts an event.
enum Destination {
    /// Back to the shard, to send itself.
    Shard,
    /// The back of its topic's lane of this queue (`None`: the lane of the whole topic).
    Lane(Option<usize>),
    /// A new lane of this queue, of which another lane met the failures.
    NewQueueLane(QueueIndex),
    /// A new lane of the whole topic, behind the lanes it has.
    NewTopicLane,
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

    /// Puts `event` at the back of its lane, if its topic or queue has one (`Ok(None)`); else
    /// gives it back, to be sent by the shard. A lane that has closed (its topic or queue accepts
    /// events again) is waited for first. Waits while the lane is full. `Err` once the shard
    /// stops.
    pub(super) async fn queue(&mut self, event: ShardEvent) -> Result<Option<ShardEvent>, ()> {
        let Some(event) = super::input::admit(event, self.options) else {
            return Ok(None);
        };
        let stalls = &self.options.stalls;
        // The common case, nothing stalled anywhere, costs no look-up.
        if self.lanes.is_empty() && !stalls.any() {
            return Ok(Some(event));
        }
        // Handed on just before its topic (or queue) began to park: parked here instead.
        let mut event = event;
        let message = &event.row.message;
        if event.origin.holds_checkpoint() && stalls.releases(&message.topic, &message.biz_key) {
            released::release(&mut event, &stalls.released, &self.options.released);
            return Ok(None);
        }
        let queue = match self.destination(&event).await {
            Destination::Shard => return Ok(Some(event)),
            Destination::Lane(queue) => queue,
            Destination::NewQueueLane(q) => {
                let backoff = Backoff::new(&self.options.retry, &self.options.wake);
                self.open(Stalled::at(vec![event], q.index, backoff, false))
                    .await;
                return Ok(None);
            }
            Destination::NewTopicLane => {
                let backoff = Backoff::new(&self.options.retry, &self.options.wake);
                self.open(Stalled::new(vec![event], backoff)).await;
                return Ok(None);
            }
        };
        self.join_lane(event, queue).await
    }

    /// Where `event` goes: the shard, a lane its topic has, or a new lane. A lane holding its
    /// key's older events takes it, whatever its key's queue is now.
    async fn destination(&self, event: &ShardEvent) -> Destination {
        let stalls = &self.options.stalls;
        let of_topic = self.lanes.get(&event.row.message.topic);
        if of_topic.is_some_and(|lanes| lanes.contains_key(&None)) {
            return Destination::Lane(None);
        }
        // Whether another lane may hold this event's queue: its topic stalled somewhere, or a
        // broker group not answering. Else (another topic refused, say) no queue look-up.
        let elsewhere =
            stalls.any() && self.sink.stable_queues() && stalls.may_hold(&event.row.message.topic);
        if of_topic.is_none() && !elsewhere {
            return Destination::Shard;
        }
        // A lane holding the key's older events, bound for the queue the key had when the
        // lane opened: the key's queue may have changed since (an operator's `updateTopic
        // -w`, a group made read-only), and its new events must not overtake those.
        let behind = of_topic.and_then(|lanes| {
            lanes.iter().find_map(|(index, lane)| {
                let q = lane.held.lane.queue?;
                (index_for(event.key_hash, q.count) == q.index).then_some(*index)
            })
        });
        let known = match behind {
            Some(_) => None,
            None => queue_index(&**self.sink, event).await,
        };
        match (behind, known) {
            (Some(lane), _) => Destination::Lane(lane),
            (None, Some(q)) if of_topic.is_some_and(|lanes| lanes.contains_key(&Some(q.index))) => {
                Destination::Lane(Some(q.index))
            }
            // Another lane found this queue, or its broker group, stalled: its events go to a
            // lane of this shard at once, so the lane, not the shard, waits out the failures
            // (a frozen broker's timeouts) the other lane met.
            (None, Some(q)) if elsewhere && self.stalled_elsewhere(&event.row.message.topic, q) => {
                Destination::NewQueueLane(q)
            }
            (None, Some(_)) => Destination::Shard,
            (None, None) if of_topic.is_none() => Destination::Shard,
            // Its queue is unknown now (no route), so it may be one with a lane: the whole
            // topic waits, behind the lanes it has.
            (None, None) => Destination::NewTopicLane,
        }
    }

    /// Puts `event` at the back of its topic's lane of `queue` (`None`: of the whole topic),
    /// waiting while the lane is full; if that lane has closed, see [`Self::behind_closed`].
    async fn join_lane(
        &mut self,
        event: ShardEvent,
        queue: Option<usize>,
    ) -> Result<Option<ShardEvent>, ()> {
        let topic = event.row.message.topic.clone();
        let lane = &self.lanes[&topic][&queue];
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
        self.behind_closed(topic, queue, event).await
    }

    /// `event` found its lane closed: the lane is dropped, and `event` waits behind the lane's
    /// last events in a new lane, or once the lane's task has ended goes back to the shard. A
    /// key's events are never sent by two tasks at once.
    async fn behind_closed(
        &mut self,
        topic: String,
        queue: Option<usize>,
        event: ShardEvent,
    ) -> Result<Option<ShardEvent>, ()> {
        let of_topic = self.lanes.get_mut(&topic).expect("present");
        let lane = of_topic.remove(&queue).expect("present");
        if of_topic.is_empty() {
            self.lanes.remove(&topic);
        }
        if !lane.task.is_finished() {
            // The lane has closed but still sends its last events (and may be retrying them):
            // this one waits behind them in a new lane, rather than the shard waiting.
            let backoff = Backoff::new(&self.options.retry, &self.options.wake);
            let stalled = Stalled {
                batch: vec![event],
                backoff,
                queue,
                broker_wide: false,
            };
            self.spawn(lane.held.lane.queue, stalled, vec![lane.task]);
            return Ok(None);
        }
        let _ = lane.task.await;
        if self.cancel.is_cancelled() {
            return Err(());
        }
        Ok(Some(event))
    }

    /// Opens a lane for `stalled`, starting with its events: of its queue, if it has one and
    /// keys keep their queue, else of its whole topic (which takes over from the topic's queue
    /// lanes: they finish what they hold, then it starts).
    pub(super) async fn open(&mut self, stalled: Stalled) {
        let topic = stalled.topic().to_string();
        let queue = match stalled.queue {
            Some(index) if self.sink.stable_queues() => match self.sink.queue_count(&topic).await {
                Ok(count) if index < count => Some(QueueIndex { index, count }),
                _ => None,
            },
            _ => None,
        };
        let of_topic = self.lanes.entry(topic).or_default();
        let before: Vec<JoinHandle<()>> = match queue {
            None => of_topic.drain().map(|(_, lane)| lane.task).collect(),
            Some(q) => of_topic
                .remove(&Some(q.index))
                .map(|lane| lane.task)
                .into_iter()
                .collect(),
        };
        self.spawn(queue, stalled, before);
    }

    /// Whether a lane (of any shard) holds `queue` of `topic`, or the queue's broker group does
    /// not answer.
    fn stalled_elsewhere(&self, topic: &str, queue: QueueIndex) -> bool {
        let stalls = &self.options.stalls;
        stalls.queue_stalled(topic, queue)
            || (self.sink.queue_group(topic, queue.index))
                .is_some_and(|g| stalls.is_group_stalled(&g))
    }

    /// Starts the lane of `stalled`'s topic and `queue` (`None`: all of the topic's events),
    /// once the lanes `before` it have ended.
    fn spawn(&mut self, queue: Option<QueueIndex>, stalled: Stalled, before: Vec<JoinHandle<()>>) {
        let topic = stalled.topic().to_string();
        let group = match (queue, stalled.broker_wide) {
            (Some(q), true) => self.sink.queue_group(&topic, q.index),
            _ => None,
        };
        let lane = LaneId::new(self.options.index, queue);
        let stalls = &self.options.stalls;
        let capacity = if stalls.parks() {
            LANE_CAPACITY
        } else {
            LANE_LIMIT
        };
        let (input, events) = mpsc::channel(capacity);
        if let Some(group) = &group {
            stalls.group_stalled(group);
        }
        let held = Arc::new(Held {
            count: AtomicUsize::new(0),
            stalls: Arc::clone(stalls),
            topic: topic.clone(),
            lane,
            group: std::sync::Mutex::new(group),
        });
        held.add(stalled.batch.len());
        let task = tokio::spawn(run_lane(
            Arc::clone(self.sink),
            (before, stalled),
            events,
            self.completions.clone(),
            self.options.clone(),
            self.cancel.clone(),
            Arc::clone(&held),
        ));
        let lane = Lane { input, task, held };
        let of_topic = self.lanes.entry(topic).or_default();
        of_topic.insert(queue.map(|q| q.index), lane);
    }

    /// Once the shard's input is drained: waits until every lane has sent what it holds.
    pub(super) async fn finish(self) {
        for lane in self.lanes.into_values().flat_map(HashMap::into_values) {
            drop(lane.input);
            let _ = lane.task.await;
        }
    }
}

/// Tells the stalls when a lane ends, however it ends.
struct Closing<'a> {
    held: &'a Held,
}

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        self.held.stalls.closed(&self.held.topic, self.held.lane);
        self.held.group_answers();
    }
}

/// A lane: once the lanes it takes over from (`before`) have ended, sends `stalled`, then the
/// events queued behind it, each batch retried until it has its outcome; closes its input once
/// it finds it empty and ends when it has sent what was left. Once its topic parks
/// ([`Stalls::release_due`]) it releases the streamed events it holds (see [`LaneInput::release`]).
async fn run_lane<S: Sink>(
    sink: Arc<S>,
    (before, stalled): (Vec<JoinHandle<()>>, Stalled),
    input: mpsc::Receiver<ShardEvent>,
    completions: mpsc::Sender<Completion>,
    options: ShardOptions,
    cancel: CancellationToken,
    held: Arc<Held>,
) {
    // Tells the stalls the lane is closed when this function returns, however it returns.
    let _closing = Closing { held: &held };
    for lane in before {
        let _ = lane.await;
    }
    let mut lane = LaneRun {
        sink: &*sink,
        input: LaneInput {
            kept: VecDeque::new(),
            rx: input,
        },
        completions: &completions,
        options: &options,
        held: &held,
        stop: Stop {
            cancel: &cancel,
            fence: &options.fence,
        },
    };
    let size = stalled.batch.len();
    if lane.settle(stalled, size).await.is_err() {
        return;
    }
    held.group_answers();
    let mut next_first: Option<ShardEvent> = None;
    loop {
        let first = match next_first.take().or_else(|| lane.input.try_next()) {
            Some(event) => event,
            None => {
                lane.input.rx.close();
                match lane.input.rx.recv().await {
                    Some(event) => event,
                    None => return,
                }
            }
        };
        let (sink, completions, options, stop) =
            (lane.sink, lane.completions, lane.options, lane.stop);
        let next = next_batch(
            sink,
            first,
            &mut lane.input,
            &mut next_first,
            completions,
            options,
        );
        let (size, sent) = match next.await {
            Ok(Some((batch, queue))) => {
                let size = batch.len();
                let backoff = Backoff::new(&options.retry, &options.wake);
                let sent = send_batch(sink, batch, queue, backoff, completions, stop).await;
                (size, sent)
            }
            Ok(None) => (1, Ok(())),
            Err(interrupt) => (1, Err(interrupt)),
        };
        let settled = match sent {
            Ok(()) => {
                held.done(size);
                Ok(())
            }
            Err(Interrupt::Stalled(stalled)) => lane.settle(stalled, size).await,
            Err(Interrupt::Stopped) => Err(()),
        };
        if settled.is_err() {
            return;
        }
    }
}

/// A lane at work: what it sends through and reports to, and what it holds.
struct LaneRun<'a, S> {
    sink: &'a S,
    input: LaneInput,
    completions: &'a mpsc::Sender<Completion>,
    options: &'a ShardOptions,
    held: &'a Held,
    /// A failed attempt stalls: the lane waits itself ([`LaneRun::settle`]), releasing what it
    /// holds meanwhile once its topic parks.
    stop: Stop<'a>,
}

impl<S: Sink> LaneRun<'_, S> {
    /// Retries `stalled` (what is left of a batch of `size` events whose attempt failed, with the
    /// retries it used) until every event of it has an outcome: waits out each retry delay,
    /// releasing what the lane holds once its topic parks. `Err` once the lane stops.
    async fn settle(&mut self, mut stalled: Stalled, mut size: usize) -> Result<(), ()> {
        let topic = stalled.topic().to_string();
        loop {
            self.held.done(size - stalled.batch.len());
            size = stalled.batch.len();
            let queue = stalled.queue.filter(|_| self.sink.stable_queues());
            loop {
                let due = self.options.stalls.release_due(&topic, self.held.lane.queue);
                let now = Instant::now();
                if due.is_some_and(|due| due <= now) {
                    self.input.release(&mut stalled, self.held, &self.options.released);
                    stalled.backoff.park();
                }
                let cancel = self.stop.cancel;
                let attempt = match due.filter(|&due| due > now) {
                    Some(until) => {
                        (stalled.backoff)
                            .wait_or_until(&topic, queue, until.into(), cancel)
                            .await?
                    }
                    None => {
                        stalled.backoff.wait(&topic, queue, cancel).await?;
                        true
                    }
                };
                if attempt {
                    break;
                }
            }
            match resume_now(self.sink, stalled, self.completions, self.stop).await {
                Ok(()) => {
                    self.held.done(size);
                    return Ok(());
                }
                Err(Interrupt::Stalled(again)) => stalled = again,
                Err(Interrupt::Stopped) => return Err(()),
            }
        }
    }
}

/// What a lane has yet to send: the events it kept through a release, then its queue.
struct LaneInput {
    kept: VecDeque<ShardEvent>,
    rx: mpsc::Receiver<ShardEvent>,
}

impl LaneInput {
    fn try_next(&mut self) -> Option<ShardEvent> {
        self.kept.pop_front().or_else(|| self.rx.try_recv().ok())
    }

    /// The lane's topic parks: gives back the acknowledgement of every streamed event the lane
    /// holds ([`crate::event::Origin::release`]), so the checkpoint passes them, and lets go of
    /// those it need not keep; their rows are PENDING, for the sweeper once the topic accepts
    /// events again. Kept in memory: `retrying` (the batch the lane retries, its probe of the
    /// topic), claimed events (their leases are renewed while they are held), and any streamed
    /// event followed by a kept one of its key (it must go first). Safe to repeat.
    /// The events it lets go of are recorded in `keys` (and the stage's release log), so later
    /// events of their keys follow them (see [`crate::send::released`]).
    fn release(&mut self, retrying: &mut Stalled, held: &Held, keys: &ReleasedKeys) {
        // Given back but kept: counted here, as parked; those let go are counted as released.
        let mut given_back = 0;
        for event in &mut retrying.batch {
            given_back += usize::from(event.origin.release());
        }
        let mut queued: Vec<ShardEvent> = self.kept.drain(..).collect();
        while let Ok(event) = self.rx.try_recv() {
            queued.push(event);
        }
        let mut keys_kept: HashSet<String> = HashSet::new();
        let mut dropped = 0;
        let mut let_go = 0;
        for mut event in queued.into_iter().rev() {
            let key = &event.row.message.biz_key;
            if event.origin == Origin::Claimed || keys_kept.contains(key) {
                given_back += usize::from(event.origin.release());
                keys_kept.insert(key.clone());
                self.kept.push_front(event);
            } else {
                let_go += usize::from(released::release(&mut event, &held.stalls.released, keys));
                dropped += 1;
            }
        }
        held.done(dropped);
        let released = given_back + let_go;
        if released > 0 {
            for _ in 0..given_back {
                crate::send::stall::count_parked(&held.topic);
            }
            tracing::info!(topic = %held.topic, released, dropped, kept = self.kept.len() + retrying.batch.len(),
                "released the streamed events of a stalled topic held in memory: they stay PENDING \
                 for the sweeper, and the checkpoint goes on past them; the batch being retried \
                 is kept to learn when the topic accepts events again");
        }
    }
}

impl EventSource for LaneInput {
    fn try_next(&mut self) -> Option<ShardEvent> {
        LaneInput::try_next(self)
    }
}
