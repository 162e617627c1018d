//! One attempt at sending a shard's batch ([`super::send_batch`]): the send itself, and what
//! the broker stored reported SENT at once.

use super::retry::Backoff;
use super::{report, Completion, SendOutcome, ShardEvent};
use super::{OutboundMessage, SendError, SendFailure, Sink};
use crate::event::now_us;
use crate::leader::Fence;
use tokio::sync::mpsc;

/// One attempt: stamps `batch` sent now and sends it to `queue`. What the broker stored (the
/// first events of `batch`, in order, by msg_id), and why it did not store the rest, if it did
/// not.
pub(super) async fn attempt<S: Sink>(
    sink: &S,
    topic: &str,
    queue: usize,
    batch: &mut [ShardEvent],
    fence: &Fence,
) -> (Vec<String>, Option<SendError>) {
    let sent = now_us();
    for event in batch.iter_mut() {
        event.row.stamps.sent = sent;
    }
    let messages: Vec<&OutboundMessage> = batch.iter().map(|e| &e.row.message).collect();
    match sink.send(topic, queue, &messages, fence).await {
        Ok(ids) => (ids, None),
        Err(SendFailure { stored, error }) => (stored, Some(error)),
    }
}

/// The broker answered, storing the first events of `batch` (`stored`): wakes the senders
/// waiting for `topic` (and `own_queue`), and reports those events SENT; returns the rest.
pub(super) async fn report_stored(
    completions: &mpsc::Sender<Completion>,
    topic: &str,
    own_queue: Option<usize>,
    backoff: &Backoff,
    mut batch: Vec<ShardEvent>,
    stored: Vec<String>,
) -> Result<Vec<ShardEvent>, ()> {
    let ack = now_us();
    // The broker stored these; nothing is marked SENT nor acknowledged yet.
    crate::failpoint::hit(crate::failpoint::AFTER_SEND_OK);
    crate::metrics::health().set_broker(true);
    crate::metrics::health().set_refused(topic, None);
    backoff.broker_answered(topic, own_queue);
    // What was stored is reported now, whatever happened to the rest: a retry carries on after
    // it and never sends it again.
    let rest = batch.split_off(stored.len().min(batch.len()));
    for (mut event, msg_id) in batch.into_iter().zip(stored) {
        event.row.stamps.ack = ack;
        report(completions, event, SendOutcome::Sent { msg_id }).await?;
    }
    Ok(rest)
}
