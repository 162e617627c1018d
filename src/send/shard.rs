//! One ordered sender: takes events of its shard in binlog order, batches consecutive events
//! bound for the same queue, sends, retries, and reports each event's outcome in order.
//!
//! A retry goes to the queue each key has under the topic's route at the time, in the shard's
//! order (`send_batch`); how retry delays are waited out, and how a wake-up may cut them short
//! without counting as a retry, is in `retry::Backoff`.
//!
//! A send or route look-up the broker refuses for the relay's account
//! ([`SendError::Unauthorized`]) is a configuration error, never the event's: it is retried at
//! the retry policy's pace but uses no retry, so its events stay unacknowledged (PENDING or
//! claimed, in order) until the credentials or permissions are fixed. Like any topic that does not
//! take events, the shard hands that topic's events to a lane of their own and goes on with the
//! other topics' (`Halt::Stall`; see `send::stall`), so only the refused topic waits; each
//! refusal logs at ERROR what to fix, and `/readyz` fails until a send to that topic is accepted.

use super::released::ReleasedKeys;
use super::stall::QueueIndex;
pub use super::completion::{Completion, SendOutcome};
use super::{OutboundMessage, SendError, SendFailure, Sink, Stalls};
use crate::event::{now_us, Ack, Origin, OutboxRow};
use crate::leader::Fence;
use crate::logging::Throttle;
use crate::retry::{Jitter, RetryPolicy};
use crate::route::{index_for, java_string_hash};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod attempt;
mod input;
mod interrupt;
mod lane;
mod retry;
use attempt::{attempt, report_stored};
use interrupt::{Halt, Interrupt, Stalled, Stop};
use input::ShardInput;
use lane::Lanes;
pub use retry::WakeUp;
use retry::{Backoff, Next, Refusal};

/// An event routed to a shard.
#[derive(Debug)]
pub struct ShardEvent {
    /// Where it came from; moved untouched into its [`Completion`].
    pub origin: Origin,
    pub row: OutboxRow,
    /// `java_string_hash(row.biz_key)`, computed once by the router.
    pub key_hash: i32,
    /// The send stage's releases the key-order guard knew of when it let this streamed event go
    /// (a [`crate::send::released::ReleaseLog`] generation): a shard releases it too if its key
    /// was released after that (see [`crate::send::released`]).
    pub(crate) released_seen: u64,
}

impl ShardEvent {
    /// An event read from the binlog, carrying the acknowledgement its checkpoint waits for.
    pub fn streamed(ack: Ack, row: OutboxRow) -> Self {
        Self::from(Origin::Stream(ack), row)
    }

    /// An event claimed from the table (poll mode, sweeper): nothing to acknowledge.
    pub fn claimed(row: OutboxRow) -> Self {
        Self::from(Origin::Claimed, row)
    }

    fn from(origin: Origin, mut row: OutboxRow) -> Self {
        row.stamps.dispatched = now_us();
        let key_hash = java_string_hash(&row.message.biz_key);
        ShardEvent {
            origin,
            row,
            key_hash,
            released_seen: 0,
        }
    }
}

/// Tuning of a shard.
#[derive(Debug, Clone)]
pub struct ShardOptions {
    pub retry: RetryPolicy,
    /// Most messages in one batch send.
    pub max_batch: usize,
    /// Most payload bytes in one batch send.
    pub max_batch_bytes: usize,
    /// This shard's number (the `shard` label of its queue-depth metric).
    pub index: u32,
    /// The wake-up shared by the shards given clones of these options.
    pub wake: Arc<WakeUp>,
    /// Checked before every send: once it no longer holds (a leadership that is over), the
    /// shard stops, leaving its events unacknowledged.
    pub fence: Fence,
    /// The stalled topics of the send stage, shared by its shards.
    pub stalls: Arc<Stalls>,
    /// This shard's keys whose events it released (its own: one per shard).
    pub(crate) released: Arc<ReleasedKeys>,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions {
            // The `[retry]` defaults without jitter, for tests that time the waits exactly;
            // the send stage always gives its own policy (`Shards::start`).
            retry: RetryPolicy {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(300),
                max_retries: Some(8),
                jitter: Jitter::None,
            },
            max_batch: 64,
            max_batch_bytes: 1024 * 1024,
            index: 0,
            wake: Arc::default(),
            fence: Fence::open(),
            stalls: Arc::default(),
            released: Arc::default(),
        }
    }
}

/// Runs one shard until its input closes (and is drained, its lanes too) or `cancel` fires.
/// Outcomes go to `completions`, each key's in order. A cancelled shard stops between sends;
/// unreported events stay unacknowledged, so the checkpoint does not pass them.
///
/// A topic whose send (or route look-up) fails for a reason worth retrying does not hold the
/// shard: the failed batch and every later event of that topic go to the topic's lane
/// (`shard::lane`), which retries them in order while the shard goes on with the other topics.
/// Events of a topic are sent by the shard again only once its lane is done, so each key's
/// order is kept.
pub async fn run_shard<S: Sink>(
    sink: Arc<S>,
    input: mpsc::Receiver<ShardEvent>,
    completions: mpsc::Sender<Completion>,
    options: ShardOptions,
    cancel: CancellationToken,
) {
    let depth = crate::metrics::relay()
        .shard_queue_depth
        .get_or_create(&crate::metrics::ShardLabel {
            shard: options.index,
        })
        .clone();
    let mut lanes = Lanes::new(&sink, &completions, &options, &cancel);
    let mut input = ShardInput::new(input, &options);
    let mut held: Option<ShardEvent> = None;
    let stop = Stop {
        cancel: &cancel,
        fence: &options.fence,
    };
    loop {
        depth.set(input.len() as i64);
        let first = match held.take() {
            Some(event) => event,
            None => tokio::select! {
                _ = cancel.cancelled() => return,
                e = input.recv() => match e { Some(e) => e, None => break },
            },
        };
        // A topic with a lane: its events queue there, behind the ones it holds.
        let first = match lanes.queue(first).await {
            Ok(Some(event)) => event,
            Ok(None) => continue,
            Err(()) => return,
        };
        let next = next_batch(&*sink, first, &mut input, &mut held, &completions, &options);
        match next.await {
            Ok(Some((batch, queue))) => {
                let backoff = Backoff::new(&options.retry, &options.wake);
                match send_batch(&*sink, batch, queue, backoff, &completions, stop).await {
                    Ok(()) => {}
                    Err(Interrupt::Stalled(stalled)) => lanes.open(stalled).await,
                    Err(Interrupt::Stopped) => return,
                }
            }
            Ok(None) => {}
            Err(Interrupt::Stalled(stalled)) => lanes.open(stalled).await,
            Err(Interrupt::Stopped) => return,
        }
    }
    // The input is closed and drained: the lanes finish what they hold.
    lanes.finish().await;
}

/// Where a sender takes the events that may join a batch: the ones already waiting.
trait EventSource {
    /// The next event waiting, if one is there now.
    fn try_next(&mut self) -> Option<ShardEvent>;
}


/// The batch that starts with `first`: its queue, and the events waiting in `input` that go to
/// the same topic and queue (the first that does not is put in `held`, so the order is kept).
/// `Ok(None)` once `first` has its outcome already (FAILED: its route cannot be found).
async fn next_batch<S: Sink>(
    sink: &S,
    first: ShardEvent,
    input: &mut impl EventSource,
    held: &mut Option<ShardEvent>,
    completions: &mpsc::Sender<Completion>,
    options: &ShardOptions,
) -> Result<Option<(Vec<ShardEvent>, usize)>, Interrupt> {
    // The first event's route look-up has retries of its own; the batch's start afresh.
    let mut look_up = Backoff::new(&options.retry, &options.wake);
    let first = vec![first];
    let queue = match route(sink, &first, &mut look_up).await {
        Ok(queues) => queues[0],
        Err(Halt::Stall) => return Err(Interrupt::Stalled(Stalled::new(first, look_up))),
        Err(Halt::Failed(outcome)) => {
            let [first] = <[ShardEvent; 1]>::try_from(first).expect("one event");
            report(completions, first, outcome).await?;
            return Ok(None);
        }
    };
    let mut batch = first;
    let mut bytes = batch[0].row.message.payload.len();
    while batch.len() < options.max_batch && bytes < options.max_batch_bytes {
        let Some(next) = input.try_next() else { break };
        let fits = bytes + next.row.message.payload.len() <= options.max_batch_bytes;
        if fits
            && next.row.message.topic == batch[0].row.message.topic
            && queue_of(sink, &next).await == Some(queue)
        {
            bytes += next.row.message.payload.len();
            batch.push(next);
        } else {
            *held = Some(next);
            break;
        }
    }
    Ok(Some((batch, queue)))
}

/// The queue of `event` if its topic's route is known.
async fn queue_of<S: Sink>(sink: &S, event: &ShardEvent) -> Option<usize> {
    queue_index(sink, event).await.map(|q| q.index)
}

/// The queue of `event` among its topic's queues, if its topic's route is known.
async fn queue_index<S: Sink>(sink: &S, event: &ShardEvent) -> Option<QueueIndex> {
    let count = sink.queue_count(&event.row.message.topic).await.ok()?;
    (count > 0).then(|| QueueIndex {
        index: index_for(event.key_hash, count),
        count,
    })
}

/// The queue of each of `events` (all of one topic) under the topic's current route. A look-up
/// that fails for a reason worth retrying counts a failed attempt under `backoff` (a refusal of
/// the relay's configuration uses none) and stalls ([`Halt::Stall`]): the lane waits out the
/// delay (a wake-up is not a retry: see [`Backoff`]).
async fn route<S: Sink>(
    sink: &S,
    events: &[ShardEvent],
    backoff: &mut Backoff,
) -> Result<Vec<usize>, Halt> {
    let topic = &events[0].row.message.topic;
    let reason = match sink.queue_count(topic).await {
        Ok(n) if n > 0 => return Ok(events.iter().map(|e| index_for(e.key_hash, n)).collect()),
        Ok(_) => {
            let reason = format!("topic {topic} has no writable queue");
            return Err(Halt::Failed(failed(reason, backoff.attempts())));
        }
        Err(SendError::Rejected(reason)) => {
            return Err(Halt::Failed(failed(reason, backoff.attempts())))
        }
        Err(error @ (SendError::Unauthorized(_) | SendError::Misconfigured(_))) => {
            refused(topic, &error, backoff);
            return Err(Halt::Stall);
        }
        // No route (its broker gone, the name server unreachable) is a failed attempt like
        // a refused connection: counted, and the relay unready until a send succeeds.
        Err(error @ SendError::Retryable(_)) => {
            count_error(&error);
            error.reason().to_string()
        }
    };
    match backoff.failed() {
        Next::Retry { retry, delay } => {
            tracing::warn!(%topic, %reason, retry, ?delay, "route look-up failed; retrying");
        }
        Next::Resume { left } => {
            tracing::debug!(%topic, %reason, ?left, "route look-up after a wake-up failed; waiting out the rest of the retry delay");
        }
        Next::Parked { delay } => {
            tracing::debug!(%topic, %reason, ?delay, "route look-up for a parked topic failed; trying again");
        }
        Next::GiveUp => return Err(Halt::Failed(backoff.gave_up(&reason))),
    }
    Err(Halt::Stall)
}

/// Cuts `batch` into runs of consecutive events bound for one queue (`queues[i]` is the queue of
/// `batch[i]`), in the batch's order.
fn runs(batch: Vec<ShardEvent>, queues: Vec<usize>) -> Vec<(usize, Vec<ShardEvent>)> {
    let mut runs: Vec<(usize, Vec<ShardEvent>)> = Vec::new();
    for (event, queue) in batch.into_iter().zip(queues) {
        match runs.last_mut() {
            Some((run_queue, run)) if *run_queue == queue => run.push(event),
            _ => runs.push((queue, vec![event])),
        }
    }
    runs
}

/// Counts a failed send attempt by class.
fn count_error(error: &SendError) {
    use crate::metrics::ErrorClass;
    let class = match error {
        SendError::Retryable(_) => {
            crate::metrics::health().set_broker(false);
            ErrorClass::RETRYABLE
        }
        SendError::Rejected(_) => ErrorClass::REJECTED,
        SendError::Unauthorized(_) => ErrorClass::UNAUTHORIZED,
        SendError::Misconfigured(_) => ErrorClass::MISCONFIGURED,
    };
    crate::metrics::relay()
        .send_errors
        .get_or_create(&ErrorClass { class })
        .inc();
}

/// How often a refused topic's ERROR line is written (the first at once), whatever the number of
/// lanes and attempts it stands for.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// An attempt for `topic` the cluster refused for the relay's configuration (its account, or
/// the type of its events): marks the relay unready until a send to `topic` is accepted, says at
/// ERROR what to fix (once per [`REFUSAL_LOG_EVERY`] per topic), and sets the wait before the
/// next attempt, which uses no retry (see [`Backoff::refused`]). Call `backoff.wait` next.
fn refused(topic: &str, error: &SendError, backoff: &mut Backoff) {
    static LINES: std::sync::LazyLock<Throttle> =
        std::sync::LazyLock::new(|| Throttle::new(REFUSAL_LOG_EVERY));
    let reason = error.reason();
    crate::metrics::health().set_refused(topic, Some(reason));
    match backoff.refused() {
        Refusal::Wait { count, delay } => {
            // Every lane of the topic is refused at each attempt: one line per topic and period.
            let Some(refusals) = LINES.admit(topic) else {
                return;
            };
            match error {
                SendError::Misconfigured(_) => tracing::error!(%topic, refusal = count, ?delay,
                    refusals_since_last_line = refusals,
                    "RocketMQ refuses the events of topic {topic}: {reason}; they are sent again \
                     after {delay:?}"),
                _ => tracing::error!(%topic, %reason, refusal = count, ?delay,
                    refusals_since_last_line = refusals,
                    "RocketMQ refused the relay's credentials for topic {topic}: check rocketmq.access_key / \
                     secret_key (or secret_key_file) and the account's Pub permission on the topic; the \
                     events wait, never FAILED for this, and are sent again after {delay:?}"),
            }
        }
        Refusal::Resume { left } => tracing::debug!(%topic, %reason, ?left,
            "refused again after a wake-up; waiting out the rest of the delay"),
    }
}

fn failed(reason: String, attempts: u32) -> SendOutcome {
    SendOutcome::Failed { reason, attempts }
}

async fn report(
    completions: &mpsc::Sender<Completion>,
    event: ShardEvent,
    outcome: SendOutcome,
) -> Result<(), ()> {
    if let SendOutcome::Failed { reason, attempts } = &outcome {
        tracing::error!(event_id = %event.row.message.event_id, table = %event.row.table, id = event.row.id,
            %reason, attempts, "event FAILED");
    }
    completions
        .send(Completion {
            origin: event.origin,
            table: event.row.table,
            id: event.row.id,
            event_id: event.row.message.event_id,
            outcome,
            stamps: event.row.stamps,
        })
        .await
        .map_err(|_| ())
}

/// Sends `batch` (events of one topic, in the shard's order) to `queue`: every event gets its
/// outcome, or, when an attempt fails for a reason worth retrying, the events left stall
/// ([`Interrupt::Stalled`], with the retries they used) for a lane to wait out the delay and
/// call [`resume_now`].
///
/// What the broker stored before a failure is reported SENT at once and never sent again. A
/// batch the broker rejects as a whole is split and sent one by one, so one poison message does
/// not fail its neighbours. Sub-batches keep the batch's retries (`backoff`): splitting gives no
/// event a fresh set.
async fn send_batch<S: Sink>(
    sink: &S,
    mut batch: Vec<ShardEvent>,
    queue: usize,
    mut backoff: Backoff,
    completions: &mpsc::Sender<Completion>,
    stop: Stop<'_>,
) -> Result<(), Interrupt> {
    let topic = batch[0].row.message.topic.clone();
    // Where keys keep their queue, a failed send holds that queue only, and waits for it.
    let own_queue = sink.stable_queues().then_some(queue);
    if !stop.fence.holds() {
        return Err(Interrupt::Stopped);
    }
    let size = batch.len();
    let (stored, error) = attempt(sink, &topic, queue, &mut batch, stop.fence).await;
    if !stored.is_empty() {
        batch = report_stored(completions, &topic, own_queue, &backoff, batch, stored).await?;
    }
    let Some(error) = error else {
        return Ok(());
    };
    if batch.is_empty() {
        // Every message stored after all (a sink that failed past its last message).
        return Ok(());
    }
    if !stop.fence.holds() {
        // The leadership ended during the send: the rest stays unreported.
        return Err(Interrupt::Stopped);
    }
    count_error(&error);
    let broker_wide = matches!(error, SendError::Retryable(_));
    match error {
        SendError::Rejected(reason) if batch.len() > 1 => {
            tracing::warn!(%topic, %reason, size = batch.len(), "batch rejected; sending its events one by one");
            let singles = batch.into_iter().map(|event| (queue, vec![event]));
            return send_in_turn(sink, singles, &backoff, completions, stop).await;
        }
        SendError::Rejected(reason) => {
            let event = batch.into_iter().next().expect("one event");
            return Ok(report(completions, event, failed(reason, backoff.attempts())).await?);
        }
        error @ (SendError::Unauthorized(_) | SendError::Misconfigured(_)) => {
            refused(&topic, &error, &mut backoff)
        }
        SendError::Retryable(reason) => match backoff.failed() {
            Next::Retry { retry, delay } => {
                crate::metrics::relay().retries.inc();
                tracing::warn!(%topic, queue, %reason, retry, ?delay, size, left = batch.len(),
                    "send not acknowledged; retrying");
            }
            Next::Resume { left } => {
                tracing::debug!(%topic, queue, %reason, ?left, size, unsent = batch.len(),
                    "send after a wake-up not acknowledged; waiting out the rest of the retry delay");
            }
            Next::Parked { delay } => {
                tracing::debug!(%topic, queue, %reason, ?delay, size,
                    "send of a parked topic's events not acknowledged; trying again");
                crate::send::stall::still_parked(&topic, &reason, delay);
            }
            Next::GiveUp => {
                return Ok(report_all(completions, batch, backoff.gave_up(&reason)).await?)
            }
        },
    }
    let stalled = Stalled::at(batch, queue, backoff, broker_wide);
    Err(Interrupt::Stalled(stalled))
}

/// Sends `stalled` (the events of a topic whose attempt failed, with the retries they used)
/// again now, its retry delay being over, until every event has an outcome or an attempt fails
/// again (stalled again).
async fn resume_now<S: Sink>(
    sink: &S,
    stalled: Stalled,
    completions: &mpsc::Sender<Completion>,
    stop: Stop<'_>,
) -> Result<(), Interrupt> {
    let Stalled {
        batch, mut backoff, ..
    } = stalled;
    if let Some((queue, batch)) = requeue(sink, batch, &mut backoff, completions, stop).await? {
        send_batch(sink, batch, queue, backoff, completions, stop).await?;
    }
    Ok(())
}

/// Before a retry: the queues of `batch` under its topic's current route (a broker may have
/// died, leaving fewer queues). If they still share one, that queue and the batch, to send
/// again; if the new route splits them, they are sent here as consecutive sub-batches, one per
/// run of events bound for one queue, each only once the one before has its outcome, so the
/// order is kept; `None` then, or when the route cannot be found (the events FAILED).
async fn requeue<S: Sink>(
    sink: &S,
    batch: Vec<ShardEvent>,
    backoff: &mut Backoff,
    completions: &mpsc::Sender<Completion>,
    stop: Stop<'_>,
) -> Result<Option<(usize, Vec<ShardEvent>)>, Interrupt> {
    let queues = match route(sink, &batch, backoff).await {
        Ok(queues) => queues,
        Err(Halt::Stall) => return Err(Interrupt::Stalled(Stalled::new(batch, backoff.clone()))),
        Err(Halt::Failed(outcome)) => {
            report_all(completions, batch, outcome).await?;
            return Ok(None);
        }
    };
    let mut runs = runs(batch, queues);
    if runs.len() > 1 {
        let topic = &runs[0].1[0].row.message.topic;
        tracing::warn!(%topic, runs = runs.len(), "the route changed; sending the batch as consecutive sub-batches");
        send_in_turn(sink, runs, backoff, completions, stop).await?;
        return Ok(None);
    }
    Ok(runs.pop())
}

/// Sends the sub-batches `(queue, events)` of one batch in turn, each with the batch's retries.
/// If one stalls, the ones after it stall with it, behind it.
async fn send_in_turn<S: Sink>(
    sink: &S,
    sub_batches: impl IntoIterator<Item = (usize, Vec<ShardEvent>)>,
    backoff: &Backoff,
    completions: &mpsc::Sender<Completion>,
    stop: Stop<'_>,
) -> Result<(), Interrupt> {
    let mut sub_batches = sub_batches.into_iter();
    while let Some((queue, events)) = sub_batches.next() {
        let sent = Box::pin(send_batch(
            sink,
            events,
            queue,
            backoff.clone(),
            completions,
            stop,
        ));
        match sent.await {
            Ok(()) => {}
            Err(Interrupt::Stalled(mut stalled)) => {
                for (queue, events) in sub_batches {
                    if stalled.queue != Some(queue) {
                        stalled.queue = None;
                    }
                    stalled.batch.extend(events);
                }
                return Err(Interrupt::Stalled(stalled));
            }
            Err(stopped) => return Err(stopped),
        }
    }
    Ok(())
}

/// Reports `outcome` for every event of `batch`, in order.
async fn report_all(
    completions: &mpsc::Sender<Completion>,
    batch: Vec<ShardEvent>,
    outcome: SendOutcome,
) -> Result<(), ()> {
    for event in batch {
        report(completions, event, outcome.clone()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
