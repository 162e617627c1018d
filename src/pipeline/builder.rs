//! The one place the pipeline's parts are put together. CDC ([`super::run_cdc`]), poll mode and
//! a standby's sweeping ([`super::run_sweeper_alone`]) and `replay` take their send stage from
//! here, and the relays their sweeper; they differ only in what feeds the shards (the binlog
//! dispatcher, the claim loop, a replayed range) and in who records the outcomes (the marker, or
//! replay's tally).
//!
//! Guarantee: a [`SendStage`] reports every event handed to its [`SendInputs`] to its recorder
//! exactly once, unless [`SendStage::finish`]'s timeout stops a shard first (then the event stays
//! unacknowledged, and so is never counted as done).

use crate::config::Config;
use crate::db::Deployment;
use crate::error::{DbError, PipelineError};
use crate::leader::Fence;
use crate::mark::{run_marker, MarkError, MarkStats, MarkerContext};
use crate::retry::RetryPolicy;
use crate::send::{Completion, SendInputs, Shards, Sink, Stalls};
use crate::sweep::{ClaimStrategy, SweepSettings, Sweeper};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Capacity of the completions channel (the marker takes up to 1,000 at a time).
const COMPLETIONS_CAPACITY: usize = 2048;
/// Events waiting per shard: a few sends' worth keeps each shard busy, while more only holds
/// payloads in memory (a drain once kept 8 × 4,096 in flight, and the relay's CPU went to
/// faulting in fresh pages for them).
const SHARD_CAPACITY: usize = 256;

/// Builds the parts of one run against one deployment, publishing through one sink.
pub struct PipelineBuilder<'a, S> {
    config: &'a Config,
    deployment: &'a Deployment,
    sink: Arc<S>,
    shard_capacity: usize,
    fence: Fence,
    /// `Some`: a stalled topic's new streamed events are parked after this long (a sweeper runs
    /// beside the stream to send them later); `None`: they are never parked.
    park_after: Option<Duration>,
}

/// Shard senders and the task recording their outcomes (its result is `R`).
pub struct SendStage<R> {
    shards: Shards,
    recorder: JoinHandle<R>,
}

/// The marker's result: what it recorded, or the error that stopped it.
pub type Marked = Result<MarkStats, MarkError>;

impl<'a, S: Sink> PipelineBuilder<'a, S> {
    pub fn new(config: &'a Config, deployment: &'a Deployment, sink: Arc<S>) -> Self {
        PipelineBuilder {
            config,
            deployment,
            sink,
            shard_capacity: SHARD_CAPACITY,
            fence: Fence::open(),
            park_after: None,
        }
    }

    /// The same builder, whose send stage lets the stream park a stalled topic's new events
    /// after `after` (see [`crate::send::Stalls`]): only where a sweeper runs beside the stream.
    pub fn parking(&self, after: Duration) -> Self {
        PipelineBuilder {
            park_after: Some(after),
            ..self.shard_capacity(self.shard_capacity)
        }
    }

    /// The same builder, with `capacity` events waiting per shard (default 256).
    pub fn shard_capacity(&self, capacity: usize) -> Self {
        PipelineBuilder {
            config: self.config,
            deployment: self.deployment,
            sink: Arc::clone(&self.sink),
            shard_capacity: capacity,
            fence: self.fence.clone(),
            park_after: self.park_after,
        }
    }

    /// Reads back what the sink stored, for a run catching up (see `dispatch::CatchUp`), at
    /// most `relay.takeover_read_limit` messages per queue.
    pub(super) fn broker_tails(&self) -> super::dispatch::BrokerTails {
        let sink = Arc::clone(&self.sink);
        super::dispatch::BrokerTails {
            read: Arc::new(move |topic: String, bound| {
                let sink = Arc::clone(&sink);
                Box::pin(async move { sink.stored_tail(&topic, bound).await })
            }),
            per_queue: self.config.relay.takeover_read_limit,
        }
    }

    /// The checkpoint mirror of this deployment, fenced by the builder's fence.
    pub fn mirror(&self) -> crate::checkpoint::MysqlMirror {
        crate::checkpoint::MysqlMirror::new(self.config.relay.name.clone())
            .fenced(self.fence.clone())
    }

    /// The same builder, whose send stages and checkpoint mirror stop sending, marking and
    /// mirroring once `fence` no longer holds (a leadership that is over; see
    /// [`crate::leader`]).
    pub fn fenced(&self, fence: Fence) -> Self {
        PipelineBuilder {
            fence,
            ..self.shard_capacity(self.shard_capacity)
        }
    }

    pub fn config(&self) -> &'a Config {
        self.config
    }

    pub fn deployment(&self) -> &'a Deployment {
        self.deployment
    }

    /// Starts `relay.shards` shard senders with `[retry]`, whose outcomes go to `record` (it runs
    /// as a task until every input is dropped and every shard is done).
    pub fn send_stage<R, F>(
        &self,
        record: impl FnOnce(mpsc::Receiver<Completion>) -> F,
    ) -> (SendStage<R>, SendInputs)
    where
        F: Future<Output = R> + Send + 'static,
        R: Send + 'static,
    {
        let (completions_tx, completions_rx) = mpsc::channel(COMPLETIONS_CAPACITY);
        let (shards, inputs) = Shards::start(
            &self.sink,
            self.config.relay.shards,
            self.shard_capacity,
            RetryPolicy::from_config(&self.config.retry),
            self.fence.clone(),
            Arc::new(match self.park_after {
                Some(after) => Stalls::new(after),
                None => Stalls::without_parking(),
            }),
            completions_tx,
        );
        let recorder = tokio::spawn(record(completions_rx));
        (SendStage { shards, recorder }, inputs)
    }

    /// A send stage whose outcomes the marker records on the rows (through `pool`) as `owner`; a
    /// permanent marking error cancels `stop`.
    pub fn marked_send_stage(
        &self,
        pool: mysql_async::Pool,
        owner: String,
        stop: CancellationToken,
    ) -> (SendStage<Marked>, SendInputs) {
        let context = MarkerContext {
            owner,
            fence: self.fence.clone(),
            relay_name: Some(self.config.relay.name.clone()),
            linger: self.config.relay.mark_linger,
        };
        self.send_stage(move |completions| run_marker(pool, completions, context, stop))
    }

    /// A sweeper of the deployment's tables with `settings`, claiming through `pool` as this
    /// instance (`claim_strategy`: `None` detects it from the server's version).
    pub async fn sweeper(
        &self,
        pool: mysql_async::Pool,
        settings: SweepSettings,
        claim_strategy: Option<ClaimStrategy>,
    ) -> Result<Sweeper, DbError> {
        if settings.lease < self.config.rocketmq.send_timeout * 5 {
            tracing::warn!(lease = ?settings.lease, send_timeout = ?self.config.rocketmq.send_timeout,
                "sweeper.lease is under 5 × rocketmq.send_timeout: a stalled instance's rows may be taken over (and sent twice) early");
        }
        Sweeper::new(
            pool,
            self.deployment.tables.clone(),
            self.config.instance_id(),
            settings,
            self.config.outbox.row_limits(),
            claim_strategy,
        )
        .await
    }
}

impl<R> SendStage<R> {
    /// Once every [`SendInputs`] is dropped: lets the shards send what they hold (at most
    /// `timeout`; `unfinished` says what becomes of the rest), then waits for the recorder.
    /// `Err` only if the recorder panicked.
    pub async fn finish(self, timeout: Duration, unfinished: &str) -> Result<R, PipelineError> {
        self.shards.drain(timeout, unfinished).await;
        self.recorder
            .await
            .map_err(PipelineError::task("outcome recorder"))
    }
}
