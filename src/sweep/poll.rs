//! Poll mode, and a standby's sweeping: the sweeper with no stream beside it. Claim → route →
//! the same ordered shard senders as the CDC relay → the marker (owner rule); leases renewed and
//! expired ones recovered beside it.

use super::gate::SweepGate;
use super::sweeper::{SweepSettings, Sweeper};
use crate::binlog::BinlogPosition;
use crate::config::Config;
use crate::mark::{run_marker, MarkerContext};
use crate::outbox::message::RowLimits;
use crate::relay::{qualified_tables, RunOptions, RunSummary, Shards};
use crate::retry::RetryPolicy;
use crate::route::Router;
use crate::send::Sink;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Runs the polling relay until `cancel` fires (then drains in-flight events, records their
/// outcomes and releases the rows it still holds) or a start-up error.
///
/// Every `poll.interval` it claims up to `poll.batch_size` rows per table (at once again when a
/// claim came back full, to drain a backlog), under a `sweeper.lease` lease owned by
/// `config.instance_id()`.
pub async fn run_poll<S: Sink>(
    config: &Config,
    sink: Arc<S>,
    options: RunOptions,
    cancel: CancellationToken,
) -> anyhow::Result<RunSummary> {
    tracing::info!(interval = ?config.poll.interval, "poll mode");
    crate::metrics::health().set_role(crate::metrics::Role::Polling);
    let settings = SweepSettings::poll(config);
    run_sweeper_alone(config, sink, settings, SweepGate::Always, options, cancel).await
}

/// Runs a sweeper with `settings` and its own shards and marker, until `cancel` fires: poll mode,
/// and a CDC standby's sweeping while another instance streams.
pub async fn run_sweeper_alone<S: Sink>(
    config: &Config,
    sink: Arc<S>,
    settings: SweepSettings,
    gate: SweepGate,
    options: RunOptions,
    cancel: CancellationToken,
) -> anyhow::Result<RunSummary> {
    let pool = crate::db::writer_pool(config).await?;
    let owner = config.instance_id();
    if settings.lease < config.rocketmq.send_timeout * 5 {
        tracing::warn!(lease = ?settings.lease, send_timeout = ?config.rocketmq.send_timeout,
            "sweeper.lease is under 5 × rocketmq.send_timeout: a stalled instance's rows may be taken over (and sent twice) early");
    }
    let sweeper = Sweeper::new(
        pool.clone(),
        qualified_tables(config)?,
        owner.clone(),
        settings,
        RowLimits {
            max_payload_bytes: config.outbox.max_payload_bytes,
        },
        options.claim_strategy,
    )
    .await?;

    let (completions_tx, completions_rx) = mpsc::channel(super::CHANNEL_CAPACITY);
    let router = Router::new(config.relay.shards);
    let (shards, shard_inputs) = Shards::start(
        &sink,
        router.shards(),
        super::CHANNEL_CAPACITY,
        RetryPolicy::from_config(&config.retry),
        &completions_tx,
    );
    // Cancelled by the marker when it stops for good (a permanent error): the run ends with it.
    let marker_failed = CancellationToken::new();
    let marker_task = tokio::spawn(run_marker(
        pool.clone(),
        completions_rx,
        MarkerContext {
            watermark: None,
            owner,
        },
        marker_failed.clone(),
    ));
    let mut running = sweeper.spawn(router, shard_inputs, completions_tx, gate, None);
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = marker_failed.cancelled() => {}
    }

    // Stopped claiming: let the shards finish what they hold, within the drain timeout.
    running.stop_claiming().await;
    shards
        .drain(
            options.drain_timeout,
            "their rows are released and sent again",
        )
        .await;
    let marked = marker_task.await?;
    // Every outcome is recorded; what this instance still holds was not sent (or not proven).
    running.finish().await;
    crate::db::close(pool).await;
    let marked = marked?;
    Ok(RunSummary {
        marked,
        checkpoint: BinlogPosition::default(),
        unidentifiable: 0,
    })
}
