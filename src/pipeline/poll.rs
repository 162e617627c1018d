//! Poll mode, and a standby's sweeping: the sweeper with no stream beside it. Claim → route →
//! the same ordered shard senders as the CDC relay → the marker (owner rule); leases renewed and
//! expired ones recovered beside it.

use super::builder::PipelineBuilder;
use super::{RunOptions, RunSummary};
use crate::binlog::BinlogPosition;
use crate::error::PipelineError;
use crate::send::Sink;
use crate::sweep::{SweepGate, SweepSettings};
use tokio_util::sync::CancellationToken;

/// Claimed rows waiting per shard to be sent (their leases are renewed while they wait).
const SHARD_CAPACITY: usize = 1024;

/// Runs the polling relay until `cancel` fires (then drains in-flight events, records their
/// outcomes and releases the rows it still holds) or a start-up error.
///
/// Every `poll.interval` it claims up to `poll.batch_size` rows per table (at once again when a
/// claim came back full, to drain a backlog), under a `sweeper.lease` lease owned by
/// `config.instance_id()`.
pub async fn run_poll<S: Sink>(
    pipeline: &PipelineBuilder<'_, S>,
    options: RunOptions,
    cancel: CancellationToken,
) -> Result<RunSummary, PipelineError> {
    let config = pipeline.config();
    tracing::info!(interval = ?config.poll.interval, "poll mode");
    crate::metrics::health().set_role(crate::metrics::Role::Polling);
    let settings = SweepSettings::poll(config);
    run_sweeper_alone(pipeline, settings, SweepGate::Always, options, cancel).await
}

/// Runs a sweeper with `settings` and its own shards and marker, until `cancel` fires: poll mode,
/// and a CDC standby's sweeping while another instance streams.
pub async fn run_sweeper_alone<S: Sink>(
    pipeline: &PipelineBuilder<'_, S>,
    settings: SweepSettings,
    gate: SweepGate,
    options: RunOptions,
    cancel: CancellationToken,
) -> Result<RunSummary, PipelineError> {
    let (config, deployment) = (pipeline.config(), pipeline.deployment());
    let opts = crate::db::writer_opts_from(deployment.opts.clone(), config).await;
    let pool = mysql_async::Pool::new(opts);
    let sweeper = pipeline
        .sweeper(pool.clone(), settings, options.claim_strategy)
        .await?;
    // Cancelled by the marker when it stops for good (a permanent error): the run ends with it.
    let marker_failed = CancellationToken::new();
    let (send_stage, inputs) = pipeline.shard_capacity(SHARD_CAPACITY).marked_send_stage(
        pool.clone(),
        config.instance_id(),
        marker_failed.clone(),
    );
    let mut running = sweeper.spawn(inputs, gate, None);
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = marker_failed.cancelled() => {}
    }

    // Stopped claiming: let the shards finish what they hold, within the drain timeout.
    running.stop_claiming().await;
    let marked = send_stage
        .finish(
            options.drain_timeout,
            "their rows are released and sent again",
        )
        .await?;
    // Every outcome is recorded; what this instance still holds was not sent (or not proven).
    running.finish().await;
    crate::db::close(pool).await;
    let marked = marked?;
    Ok(RunSummary {
        marked,
        checkpoint: BinlogPosition::default(),
        unidentifiable: 0,
        key_order_checks: Default::default(),
    })
}
