//! How sending a batch can end before every event has an outcome, and what a sender does then.

use super::retry::Backoff;
use super::{SendOutcome, ShardEvent};
use crate::leader::Fence;
use tokio_util::sync::CancellationToken;

/// Why a route look-up returned no queues.
pub(super) enum Halt {
    /// It failed for a reason worth retrying: the sender stalls, and its lane waits.
    Stall,
    /// Retrying cannot help, or the retries are used up: the events' outcome.
    Failed(SendOutcome),
}

/// Why sending a batch ended before every event of it had an outcome.
pub(super) enum Interrupt {
    /// The shard is stopping (cancelled, or its fence no longer holds).
    Stopped,
    /// An attempt failed for a reason worth retrying: the events left, and the retries they
    /// used, for the topic's lane (which waits out the delay).
    Stalled(Stalled),
}

impl From<()> for Interrupt {
    fn from((): ()) -> Self {
        Interrupt::Stopped
    }
}

/// The events of one topic whose attempt failed, in order, with the retries they used so far.
pub(super) struct Stalled {
    pub(super) batch: Vec<ShardEvent>,
    pub(super) backoff: Backoff,
    /// The queue they were all bound for, if one: a send to it failed. `None`: the topic's
    /// route could not be looked up, or they are bound for several queues.
    pub(super) queue: Option<usize>,
    /// The send failed as a broker that does not answer fails (a timeout, a refused
    /// connection): every queue of its broker group is likely stalled, whatever the topic.
    pub(super) broker_wide: bool,
}

impl Stalled {
    /// Events whose topic's route could not be looked up.
    pub(super) fn new(batch: Vec<ShardEvent>, backoff: Backoff) -> Self {
        Stalled {
            batch,
            backoff,
            queue: None,
            broker_wide: false,
        }
    }

    /// Events whose send to `queue` failed (as a broker that does not answer fails, if
    /// `broker_wide`).
    pub(super) fn at(
        batch: Vec<ShardEvent>,
        queue: usize,
        backoff: Backoff,
        broker_wide: bool,
    ) -> Self {
        Stalled {
            batch,
            backoff,
            queue: Some(queue),
            broker_wide,
        }
    }

    pub(super) fn topic(&self) -> &str {
        &self.batch[0].row.message.topic
    }
}

/// What stops a sender between sends: its cancellation (shutdown, a drain timeout, a
/// leadership that is over) and, checked right before each send, its fence.
#[derive(Clone, Copy)]
pub(super) struct Stop<'a> {
    pub(super) cancel: &'a CancellationToken,
    pub(super) fence: &'a Fence,
}
