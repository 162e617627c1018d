//! Sending: per-shard ordered senders that publish events through a [`Sink`] and report each
//! event's final outcome.
//!
//! Guarantees: only a `SEND_OK` from the broker makes an event `Sent`; every other answer or
//! error is retried (if retryable, with backoff, holding back the later events of the same topic
//! in the shard so a key's order is kept, and nothing else: see [`stall`]) or ends `Failed`
//! with the reason. A refusal of the relay's account
//! (credentials, permission) or of its events' type for a topic is retried without end: it never
//! makes an event `Failed`. An event
//! is reported exactly once.

mod completion;
pub mod rocketmq;
pub(crate) mod released;
pub mod shard;
mod shards;
pub mod stall;
pub mod tail;

pub use rocketmq::{QueueStore, QueueTable, RocketMqSink};
pub use completion::{Completion, SendOutcome};
pub use shard::{run_shard, ShardEvent, ShardOptions};
pub use shards::{SendInputs, Shards, Stopped};
pub use stall::{StalledSet, Stalls};
pub use tail::{StoredTail, TailBound};

pub use crate::outbox::OutboundMessage;

use crate::leader::Fence;

use futures_util::future::BoxFuture;
use std::future::Future;
use std::sync::Arc;

/// Why a send did not end in `SEND_OK`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// Worth retrying: timeouts (the message may be stored; consumers de-duplicate), flush/slave
    /// statuses, broker or name server unavailable.
    #[error("retryable: {0}")]
    Retryable(String),
    /// Retrying cannot help: no such topic, message too large, malformed message.
    #[error("rejected: {0}")]
    Rejected(String),
    /// The broker refused the relay's account: unknown access key, wrong secret, or no `Pub`
    /// permission on the topic (a configuration error, not the event's). Retried at the retry
    /// policy's pace without using up retries, so the event waits until it is fixed.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The cluster cannot take the relay's events for this topic as it is set up (a RocketMQ 5
    /// topic type the relay cannot send, see `rocketmq::message_type`): a configuration error
    /// like [`SendError::Unauthorized`], handled the same way. The reason says what to change.
    #[error("misconfigured: {0}")]
    Misconfigured(String),
}

impl SendError {
    /// The reason without the class prefix.
    pub fn reason(&self) -> &str {
        match self {
            SendError::Retryable(r)
            | SendError::Rejected(r)
            | SendError::Unauthorized(r)
            | SendError::Misconfigured(r) => r,
        }
    }
}

/// The error of a send that a leadership's end stopped between requests.
pub(crate) fn fenced() -> SendError {
    SendError::Retryable("the leadership is over: no further request was sent".into())
}

/// A send that did not store every message: the ids of those the broker did store (a prefix of
/// the messages, in order: a send may take several requests), and why the rest were not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendFailure {
    pub stored: Vec<String>,
    pub error: SendError,
}

/// A failure before anything was stored.
impl From<SendError> for SendFailure {
    fn from(error: SendError) -> Self {
        SendFailure {
            stored: Vec::new(),
            error,
        }
    }
}

/// Where events are published. The seam between the pipeline and the broker client.
///
/// Guarantee of an implementation: `send` returns `Ok` only when the broker acknowledged every
/// message of the batch with `SEND_OK`, with one message id per message, in order; an `Err`
/// names the messages the broker did store before the failure ([`SendFailure::stored`]), so a
/// retry sends only the rest.
pub trait Sink: Send + Sync + 'static {
    /// How many write queues `topic` has (implementations cache the route).
    fn queue_count(&self, topic: &str) -> impl Future<Output = Result<usize, SendError>> + Send;

    /// Whether a key keeps its queue index while a broker group is lost (the queue list does not
    /// shrink), so a send that fails holds back that queue's events only; else a failure holds
    /// back the topic's (in one shard), since its keys may move to other queues.
    fn stable_queues(&self) -> bool {
        false
    }

    /// The broker group serving queue `queue` of `topic`, if its route is known (cached): a
    /// group that does not answer stalls all its queues, whatever their topic.
    fn queue_group(&self, _topic: &str, _queue: usize) -> Option<String> {
        None
    }

    /// Publishes `messages` (all of `topic`) to the queue at `queue_index`, in order. `fence`
    /// is checked before each request to the broker: once it no longer holds (a leadership that
    /// is over), no further request goes out and the send fails with what was stored.
    fn send(
        &self,
        topic: &str,
        queue_index: usize,
        messages: &[&OutboundMessage],
        fence: &Fence,
    ) -> impl Future<Output = Result<Vec<String>, SendFailure>> + Send;

    /// The relay's messages stored in `topic` within `bound` ([`tail`]): read when a relay starts
    /// streaming, so it skips the events a previous run stored but had not recorded SENT.
    /// `Ok(None)`: this sink cannot read what it stored (the default); such events are sent
    /// again. Boxed: it runs once per topic at start-up, and a client's deeply nested futures
    /// proven `Send` behind the box need no higher recursion limit in the crates that build a
    /// pipeline over the sink.
    fn stored_tail<'a>(
        &'a self,
        _topic: &'a str,
        _bound: TailBound,
    ) -> BoxFuture<'a, Result<Option<StoredTail>, SendError>> {
        Box::pin(async { Ok(None) })
    }

    /// Releases the sink's connections; the relay calls it once, after its last send, with the
    /// last reference it holds. The default does nothing.
    fn close(self: Arc<Self>) -> impl Future<Output = ()> + Send
    where
        Self: Sized,
    {
        async {}
    }
}
