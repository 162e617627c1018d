//! A shard's input: the events the dispatcher and the sweeper hand it. Those that join a batch
//! behind its first are admitted here; the first, as the shard queues it. A streamed event that
//! follows a release of its key the key-order guard had not learnt of when it let the event go
//! (see [`crate::send::released`]) is released too.

use super::{EventSource, ShardEvent, ShardOptions};
use crate::send::released;
use tokio::sync::mpsc;

/// See the module docs.
pub(super) struct ShardInput<'a> {
    rx: mpsc::Receiver<ShardEvent>,
    options: &'a ShardOptions,
}

impl<'a> ShardInput<'a> {
    pub(super) fn new(rx: mpsc::Receiver<ShardEvent>, options: &'a ShardOptions) -> Self {
        ShardInput { rx, options }
    }

    /// Events waiting.
    pub(super) fn len(&self) -> usize {
        self.rx.len()
    }

    /// The next event, as it came (the shard admits it as it queues it, [`super::Lanes::queue`]);
    /// `None` once the input is closed and drained.
    pub(super) async fn recv(&mut self) -> Option<ShardEvent> {
        self.rx.recv().await
    }
}

/// `event`, unless it follows a release of its key the key-order guard had not learnt of when it
/// let the event go: then it is released too (its row stays PENDING for the sweeper, which sends
/// it after the released one). Asked as the shard queues an event (sent, or put in a lane) and as
/// it takes one into a batch.
pub(super) fn admit(mut event: ShardEvent, options: &ShardOptions) -> Option<ShardEvent> {
    let message = &event.row.message;
    let follows = event.origin.holds_checkpoint()
        && (options.released).follows_release(&message.topic, &message.biz_key, event.released_seen);
    if !follows {
        return Some(event);
    }
    tracing::debug!(topic = %message.topic, id = event.row.id,
        "an event of a key whose older event was released: released too, for the sweeper");
    released::release(&mut event, &options.stalls.released, &options.released);
    None
}

impl EventSource for ShardInput<'_> {
    fn try_next(&mut self) -> Option<ShardEvent> {
        while let Ok(event) = self.rx.try_recv() {
            if let Some(event) = admit(event, self.options) {
                return Some(event);
            }
        }
        None
    }
}
