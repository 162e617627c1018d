//! # rocketmq-outbox-consumer
//!
//! The consumer library: process each event once although RocketMQ delivers at least once.
//!
//! The relay may send an event more than once (a resend after an ambiguous timeout, a lost SENT
//! mark, a manual replay) and the broker redelivers whatever was not ACKed. So every consumer
//! de-duplicates, by the rule "judge duplicates first, process and mark in the same
//! transaction":
//!
//! - [`Handler`] is the seam: your business writes for one event, inside a `mysql_async`
//!   transaction that the library opens, commits or rolls back. It returns an [`Outcome`].
//! - [`IdempotentProcessor`] runs the protocol (see [`idempotent`]): dedup mark + handler in one
//!   transaction, ACK only after COMMIT, duplicates ACKed without running the handler, failures
//!   rolled back (mark included) and redelivered, bad events quarantined.
//! - [`IdempotentPushConsumer`] connects a processor to a `rocketmq-client-rust` push consumer
//!   (concurrent or orderly) and maps each [`Disposition`] to the client's status.
//! - [`guards`] help with out-of-order updates (version and state-machine guards);
//!   [`prefilter`] is an optional in-memory fast path; [`ConsumerMetrics`] counts everything.
//!
//! ```no_run
//! use mysql_async::prelude::*;
//! use rocketmq_outbox_consumer::{ConsumedEvent, Handler, IdempotentProcessor, Outcome};
//!
//! struct CreditPoints;
//!
//! impl Handler for CreditPoints {
//!     async fn handle(
//!         &self,
//!         event: &ConsumedEvent,
//!         tx: &mut mysql_async::Transaction<'static>,
//!     ) -> anyhow::Result<Outcome> {
//!         let Ok(paid) = event.json::<serde_json::Value>() else {
//!             return Ok(Outcome::Reject("payload is not JSON".into()));
//!         };
//!         let Some(user) = paid["user_id"].as_u64() else {
//!             return Ok(Outcome::Reject("no user_id".into()));
//!         };
//!         tx.exec_drop("UPDATE points SET n = n + 10 WHERE user_id = ?", (user,)).await?; // Err → Retry
//!         Ok(Outcome::Success)
//!     }
//! }
//! # async fn run(pool: mysql_async::Pool, event: ConsumedEvent) -> anyhow::Result<()> {
//! let processor = IdempotentProcessor::new(pool, "points-service", CreditPoints)?;
//! let disposition = processor.process(&event).await; // ACK if disposition.is_ack()
//! # let _ = disposition; Ok(()) }
//! ```

pub mod config;
pub mod event;
pub mod guards;
pub mod idempotent;
pub mod metrics;
pub mod prefilter;
pub mod rocketmq;
pub mod rocketmq_client;
mod store;

pub use crate::rocketmq_client::ClientSecurity;
pub use event::ConsumedEvent;
pub use guards::{StateGuard, StateMachine, Transition, VersionCheck, VersionGuard};
pub use idempotent::{Disposition, IdempotentProcessor, Observer, ProcessorError};
pub use metrics::{ConsumeCounts, ConsumerMetrics};
pub use rocketmq::{IdempotentPushConsumer, ListenerMode, PushConsumerOptions};
pub use store::DedupStatus;

use mysql_async::Transaction;
use std::future::Future;

/// What a [`Handler`] decided about one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The business writes are done: commit them with the dedup mark, then ACK.
    Success,
    /// A transient failure (a lock timeout, a downstream service down): roll everything back,
    /// dedup mark included, and have the broker deliver the event again.
    Retry(String),
    /// The event can never be processed (malformed, unknown type, violates an invariant): roll
    /// the business writes back, quarantine the message with this reason, mark it REJECTED and
    /// ACK it, so it is not redelivered forever.
    Reject(String),
}

/// Your business logic for one event. The seam between the library and your code.
///
/// Contract:
/// - Do every business write through `tx`. The library commits it together with the dedup mark
///   only if you return `Ok(Outcome::Success)`; anything else rolls it back.
/// - You cannot commit or roll back `tx` yourself (`commit` and `rollback` need the transaction
///   by value; you get `&mut`), and you have no way to ACK: the library ACKs after its COMMIT.
///   Do not run `COMMIT`, `ROLLBACK`, `START TRANSACTION` or DDL as SQL text either: they would
///   end the transaction early, which the API cannot stop.
/// - Returning `Err` (e.g. with `?` on a database error), panicking, or running past the
///   processor's timeout all count as [`Outcome::Retry`], never as success.
/// - The handler may run more than once for one event (a retried attempt), but only one attempt
///   ever commits; keep side effects outside the database idempotent or avoid them.
pub trait Handler: Send + Sync + 'static {
    fn handle(
        &self,
        event: &ConsumedEvent,
        tx: &mut Transaction<'static>,
    ) -> impl Future<Output = anyhow::Result<Outcome>> + Send;
}

/// A shared handler (e.g. one the caller also inspects) is a handler too.
impl<H: Handler> Handler for std::sync::Arc<H> {
    fn handle(
        &self,
        event: &ConsumedEvent,
        tx: &mut Transaction<'static>,
    ) -> impl Future<Output = anyhow::Result<Outcome>> + Send {
        H::handle(self, event, tx)
    }
}
