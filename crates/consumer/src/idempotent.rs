//! The transaction protocol: judge duplicates first, process and mark in the same transaction.
//!
//! For each delivery [`IdempotentProcessor::process`] runs, on one connection:
//!
//! ```text
//! START TRANSACTION
//! INSERT INTO event_dedup (group, key, 'PROCESSED')   -- duplicate key? → ROLLBACK, ACK (dedup hit)
//! SAVEPOINT handler
//! <handler's business writes>                        -- same transaction
//! Success → COMMIT → ACK
//! Retry   → ROLLBACK (business writes and mark) → RECONSUME_LATER
//! Reject  → ROLLBACK TO SAVEPOINT handler; mark REJECTED; INSERT quarantine; COMMIT → ACK
//! ```
//!
//! Guarantees:
//! - The mark and the business change commit together or not at all, so a failed attempt never
//!   leaves a mark behind (never "marked as processed" for an event whose business change was lost) and a
//!   committed mark always has its business change.
//! - The answer is ACK only after a COMMIT succeeded (or for a duplicate of a committed mark).
//!   Every error, a handler `Err`, a handler panic, a handler that runs past the timeout and a
//!   failed COMMIT all end as [`Disposition::Retry`]: never as success.
//! - Concurrent deliveries of one event (two consumers, a redelivery racing a slow attempt)
//!   serialise on the mark's primary key: the second waits for the first to commit (then it is
//!   a dedup hit) or roll back (then it processes).
//! - A rejected event keeps no business change, gets a REJECTED mark and a quarantine row in
//!   one transaction, and is ACKed; later deliveries of it are dedup hits.

use super::event::ConsumedEvent;
use super::metrics::{ConsumerMetrics, Counted};
use super::prefilter::RecentKeys;
use super::store::{self, DedupStatus, Mark};
use super::{Handler, Outcome};
use futures_util::FutureExt;
use mysql_async::prelude::*;
use mysql_async::{Pool, Transaction, TxOpts};
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

/// Default limit for one handler call. Below the RocketMQ client's 30 s limit for a listener
/// call, so the transaction is rolled back before the client gives up on the delivery.
pub const DEFAULT_HANDLER_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest consumer group name (`event_dedup.consumer_group` is `VARCHAR(128)`).
pub const MAX_GROUP_LEN: usize = 128;

/// What became of one delivery. [`Disposition::is_ack`] says whether the broker may forget it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// The handler ran and its transaction, with the mark, committed. ACK.
    Processed,
    /// The event was handled before: the handler did not run. ACK. `previous` is the stored
    /// mark's status, or `None` when the in-memory pre-filter answered.
    Duplicate { previous: Option<DedupStatus> },
    /// The event can never be processed: quarantined (and marked REJECTED if it has a key). ACK.
    Rejected { reason: String },
    /// Not acknowledged: the broker must deliver it again. RECONSUME_LATER. Nothing was kept,
    /// except after a COMMIT whose reply was lost: then it may have committed, and the
    /// redelivery is a [`Disposition::Duplicate`].
    Retry { reason: String },
}

impl Disposition {
    /// True when the delivery may be acknowledged.
    pub fn is_ack(&self) -> bool {
        !matches!(self, Disposition::Retry { .. })
    }
}

impl fmt::Display for Disposition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Disposition::Processed => f.write_str("processed"),
            Disposition::Duplicate {
                previous: Some(status),
            } => write!(f, "duplicate (already {status})"),
            Disposition::Duplicate { previous: None } => {
                f.write_str("duplicate (recently handled)")
            }
            Disposition::Rejected { reason } => write!(f, "rejected: {reason}"),
            Disposition::Retry { reason } => write!(f, "retry: {reason}"),
        }
    }
}

/// Called after every delivery with its outcome (logging, an example's output, tests).
pub type Observer = Arc<dyn Fn(&ConsumedEvent, &Disposition) + Send + Sync>;

/// Applies the protocol in the module docs for one consumer group and one [`Handler`].
pub struct IdempotentProcessor<H> {
    pool: Pool,
    group: String,
    handler: H,
    metrics: ConsumerMetrics,
    recent: Option<RecentKeys>,
    handler_timeout: Duration,
    observer: Option<Observer>,
}

/// Why a processor could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ProcessorError {
    #[error("consumer group must be 1 to {MAX_GROUP_LEN} characters, got {0:?}")]
    InvalidGroup(String),
}

impl<H: Handler> IdempotentProcessor<H> {
    /// A processor for `group` writing marks through `pool` (tables from migrations 0002 and
    /// 0005). No pre-filter, [`DEFAULT_HANDLER_TIMEOUT`], fresh metrics.
    pub fn new(pool: Pool, group: impl Into<String>, handler: H) -> Result<Self, ProcessorError> {
        let group = group.into();
        if group.is_empty() || group.chars().count() > MAX_GROUP_LEN {
            return Err(ProcessorError::InvalidGroup(group));
        }
        Ok(Self {
            pool,
            group,
            handler,
            metrics: ConsumerMetrics::new(),
            recent: None,
            handler_timeout: DEFAULT_HANDLER_TIMEOUT,
            observer: None,
        })
    }

    /// Counts into `metrics` (e.g. a clone registered in the process's registry).
    pub fn with_metrics(mut self, metrics: ConsumerMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Remembers the last `capacity` committed keys in memory to ACK their redeliveries without
    /// a database round trip (see [`super::prefilter`]).
    pub fn with_prefilter(mut self, capacity: usize) -> Self {
        self.recent = Some(RecentKeys::new(capacity));
        self
    }

    /// Limit for one handler call; past it the transaction is rolled back and the delivery is
    /// retried.
    pub fn with_handler_timeout(mut self, timeout: Duration) -> Self {
        self.handler_timeout = timeout;
        self
    }

    /// Calls `observer` after every delivery.
    pub fn with_observer(mut self, observer: Observer) -> Self {
        self.observer = Some(observer);
        self
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    pub fn metrics(&self) -> &ConsumerMetrics {
        &self.metrics
    }

    /// Handles one delivery; see the module docs. Never panics because of the handler.
    pub async fn process(&self, event: &ConsumedEvent) -> Disposition {
        let disposition = match event.dedup_key() {
            Ok(key) => self.process_keyed(event, &key).await,
            Err(reason) => self.quarantine_unkeyed(event, reason).await,
        };
        let counted = match &disposition {
            Disposition::Processed => Counted::Processed,
            Disposition::Duplicate { .. } => Counted::DedupHit,
            Disposition::Rejected { .. } => Counted::Rejected,
            Disposition::Retry { .. } => Counted::Retry,
        };
        self.metrics.record(&self.group, &event.topic, counted);
        match &disposition {
            Disposition::Retry { reason } => tracing::warn!(
                group = %self.group, topic = %event.topic, msg_id = %event.msg_id,
                reconsume_times = event.reconsume_times, "delivery not acknowledged, will be redelivered: {reason}"
            ),
            Disposition::Rejected { reason } => tracing::warn!(
                group = %self.group, topic = %event.topic, msg_id = %event.msg_id,
                "event quarantined: {reason}"
            ),
            _ => {}
        }
        if let Some(observer) = &self.observer {
            observer(event, &disposition);
        }
        disposition
    }

    async fn process_keyed(&self, event: &ConsumedEvent, key: &str) -> Disposition {
        if self.recent.as_ref().is_some_and(|r| r.contains(key)) {
            return Disposition::Duplicate { previous: None };
        }
        let mut tx = match self.pool.start_transaction(TxOpts::default()).await {
            Ok(tx) => tx,
            Err(e) => return retry("cannot start a transaction", e),
        };
        match store::insert_mark(&mut tx, &self.group, key, event).await {
            Ok(Mark::New) => {}
            Ok(Mark::Exists(previous)) => {
                let _ = tx.rollback().await;
                if previous.is_some() {
                    self.remember(key);
                }
                return Disposition::Duplicate { previous };
            }
            Err(e) => return retry("cannot write the dedup mark", e),
        }
        if let Err(e) = tx.query_drop("SAVEPOINT outbox_relay_handler").await {
            return retry("cannot set the handler savepoint", e);
        }
        match self.run_handler(event, &mut tx).await {
            Outcome::Success => match tx.commit().await {
                Ok(()) => {
                    self.remember(key);
                    Disposition::Processed
                }
                // If the connection died during COMMIT the outcome is unknown; the redelivery
                // finds out (a dedup hit if it did commit).
                Err(e) => retry(
                    "COMMIT failed, outcome unknown (if it committed, the redelivery is a dedup hit)",
                    e,
                ),
            },
            Outcome::Retry(reason) => {
                let _ = tx.rollback().await;
                Disposition::Retry { reason }
            }
            Outcome::Reject(reason) => self.reject_keyed(tx, event, key, reason).await,
        }
    }

    /// Runs the handler in `tx`, turning an `Err`, a panic or a timeout into `Outcome::Retry`.
    async fn run_handler(&self, event: &ConsumedEvent, tx: &mut Transaction<'static>) -> Outcome {
        let call = AssertUnwindSafe(self.handler.handle(event, tx)).catch_unwind();
        match tokio::time::timeout(self.handler_timeout, call).await {
            Ok(Ok(Ok(outcome))) => outcome,
            Ok(Ok(Err(e))) => Outcome::Retry(format!("handler error: {e:#}")),
            Ok(Err(panic)) => Outcome::Retry(format!("handler panicked: {}", panic_text(&*panic))),
            Err(_) => Outcome::Retry(format!(
                "handler did not finish within {:?}",
                self.handler_timeout
            )),
        }
    }

    async fn reject_keyed(
        &self,
        mut tx: Transaction<'static>,
        event: &ConsumedEvent,
        key: &str,
        reason: String,
    ) -> Disposition {
        let written = async {
            tx.query_drop("ROLLBACK TO SAVEPOINT outbox_relay_handler")
                .await?;
            store::mark_rejected(&mut tx, &self.group, key).await?;
            store::quarantine(&mut tx, &self.group, Some(key), event, &reason).await?;
            tx.commit().await
        }
        .await;
        match written {
            Ok(()) => {
                self.remember(key);
                Disposition::Rejected { reason }
            }
            Err(e) => retry("cannot quarantine the rejected event", e),
        }
    }

    /// A message without a dedup key: quarantined (no mark is possible) and ACKed.
    async fn quarantine_unkeyed(&self, event: &ConsumedEvent, reason: String) -> Disposition {
        let written = async {
            let mut conn = self.pool.get_conn().await?;
            store::quarantine(&mut conn, &self.group, None, event, &reason).await
        }
        .await;
        match written {
            Ok(()) => Disposition::Rejected { reason },
            Err(e) => retry("cannot quarantine the message without a dedup key", e),
        }
    }

    fn remember(&self, key: &str) {
        if let Some(recent) = &self.recent {
            recent.insert(key);
        }
    }
}

fn retry(what: &str, error: mysql_async::Error) -> Disposition {
    Disposition::Retry {
        reason: format!("{what}: {error}"),
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a non-text panic payload".to_string()
    }
}

impl<H> fmt::Debug for IdempotentProcessor<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentProcessor")
            .field("group", &self.group)
            .field("handler_timeout", &self.handler_timeout)
            .field("prefilter", &self.recent.as_ref().map(RecentKeys::len))
            .finish_non_exhaustive()
    }
}
