//! One relay instance in CDC mode, among any number sharing a `relay.name`: it stands by (sweeping)
//! until it wins the election, then streams (with the sweeper beside the stream) until it is
//! stopped or loses leadership, and then stands by again.
//!
//! Guarantees: at most one instance streams at a time as far as the server's lock goes (see
//! [`crate::leader`]); a new leader resumes from the furthest checkpoint it can see (its own, or
//! the mirror the previous leader kept in MySQL), so a takeover resends at most what the old
//! leader sent after its last mirrored checkpoint. If the checkpoint is no longer on the server
//! (purged binlogs), the leader logs an ERROR, counts it, restarts from the oldest position the
//! server has, and the sweeper publishes the PENDING rows of the gap.

use super::{run_cdc, run_sweeper_alone, PipelineBuilder, RunOptions, RunSummary};
use crate::binlog::reader::{check_server, oldest_position, ReaderError, ServerInfo};
use crate::binlog::ServerFlavor;
use crate::checkpoint::{CheckpointStore, MysqlMirror};
use crate::db::Deployment;
use crate::leader::{Election, Leadership};
use crate::send::Sink;
use crate::sweep::{SweepGate, SweepSettings};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// How many times in a row one leadership may restart from the oldest binlog before giving up.
const MAX_FALLBACKS: u32 = 3;

/// Runs this instance until `cancel` fires, or a permanent error (a failed start-up check, a
/// store that cannot be written).
pub async fn run_instance<S: Sink>(
    pipeline: &PipelineBuilder<'_, S>,
    store: Arc<dyn CheckpointStore>,
    options: RunOptions,
    cancel: CancellationToken,
) -> anyhow::Result<RunSummary> {
    // Every instance checks the server and its grants first, so a missing privilege is named
    // at start-up (not as a failed election or a refused binlog dump later).
    let (config, deployment) = (pipeline.config(), pipeline.deployment());
    let election = Election::new(
        deployment.opts.clone(),
        &config.relay.name,
        &config.instance_id(),
    );
    let mut total = RunSummary::default();
    let policy = crate::retry::RetryPolicy::reconnect();
    let mut failures = 0;
    let mut first_round = true;
    loop {
        // A connection lost during start-up or a run (a killed connection, a restarting server)
        // is retried with backoff; a misconfigured server or missing grant stops the instance.
        let round = async {
            let server = check_server(&deployment.opts, &deployment.tables).await?;
            let leadership = match election.try_lead().await.map_err(|e| {
                anyhow::anyhow!(
                    "cannot enter the leader election in MySQL (has `outbox-relay migrate` run?): {e}"
                )
            })? {
                Some(leadership) => leadership,
                None => {
                    match stand_by(pipeline, &election, &options, &cancel, &mut total).await? {
                        Some(leadership) => leadership,
                        None => return Ok(None),
                    }
                }
            };
            let led = lead(pipeline, server, &store, &options, &cancel, &leadership).await;
            leadership.resign(&election).await;
            led.map(Some)
        };
        let outcome = round.await;
        let started = std::mem::replace(&mut first_round, false);
        let started = !started;
        match outcome {
            Ok(None) => return Ok(total),
            Ok(Some(summary)) => {
                failures = 0;
                total.absorb(summary);
                if cancel.is_cancelled() {
                    return Ok(total);
                }
                tracing::warn!("no longer the leader: standing by");
            }
            Err(e) if is_permanent(&e, started) || cancel.is_cancelled() => return Err(e),
            Err(e) => {
                failures += 1;
                let delay = policy.delay(failures).unwrap_or(policy.max);
                tracing::warn!(error = %e, retry_in = ?delay, "relay round failed; retrying");
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(total),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Errors retrying cannot fix: the server's configuration, missing grants (at start-up, or met
/// by the marker while running), a refused or unsupported binlog, a broken checkpoint store; and,
/// before the instance ever ran, a server it cannot connect to (the user must see that at once).
/// A connection lost mid-way is retried.
fn is_permanent(error: &anyhow::Error, started: bool) -> bool {
    if error.downcast_ref::<crate::mark::MarkError>().is_some() {
        return true;
    }
    use crate::binlog::reader::StartupError;
    use crate::checkpoint::store::StoreError;
    if let Some(e) = error.downcast_ref::<StartupError>() {
        return match e {
            StartupError::Misconfigured(_) | StartupError::Privilege(_) => true,
            StartupError::Connect(_) => !started,
            StartupError::Database(_) => false,
        };
    }
    if let Some(e) = error.downcast_ref::<ReaderError>() {
        return matches!(e, ReaderError::NotAllowed(_) | ReaderError::Unsupported(_));
    }
    if let Some(e) = error.downcast_ref::<StoreError>() {
        return matches!(e, StoreError::Sled { .. } | StoreError::Corrupt(_));
    }
    false
}

/// Sweeps (if enabled) while waiting for leadership; `None` when cancelled first.
async fn stand_by<S: Sink>(
    pipeline: &PipelineBuilder<'_, S>,
    election: &Election,
    options: &RunOptions,
    cancel: &CancellationToken,
    total: &mut RunSummary,
) -> anyhow::Result<Option<Leadership>> {
    let config = pipeline.config();
    tracing::info!(instance = %config.instance_id(),
        "another instance leads: standing by (sweeping) until it stops");
    crate::metrics::health().set_role(crate::metrics::Role::Standby);
    let sweeping = cancel.child_token();
    let sweep = async {
        if config.sweeper.enabled {
            let settings = SweepSettings::beside_stream(config);
            let gate = SweepGate::BehindMirror {
                relay_name: config.relay.name.clone(),
            };
            run_sweeper_alone(pipeline, settings, gate, options.clone(), sweeping.clone())
                .await
                .map(Some)
        } else {
            sweeping.cancelled().await;
            Ok(None)
        }
    };
    tokio::pin!(sweep);
    let led = tokio::select! {
        led = election.lead(cancel) => led,
        swept = &mut sweep => {
            // The sweeper ends early only on an error (or when `cancel` fired).
            if let Some(summary) = swept? {
                total.absorb(summary);
            }
            election.lead(cancel).await
        }
    };
    sweeping.cancel();
    if let Some(summary) = sweep.await? {
        total.absorb(summary);
    }
    Ok(led)
}

/// Streams under `leadership` (from `server`, as checked when it began) until `cancel` fires or
/// the leadership is lost.
async fn lead<S: Sink>(
    pipeline: &PipelineBuilder<'_, S>,
    server: ServerInfo,
    store: &Arc<dyn CheckpointStore>,
    options: &RunOptions,
    cancel: &CancellationToken,
    leadership: &Leadership,
) -> anyhow::Result<RunSummary> {
    crate::metrics::health().set_role(crate::metrics::Role::Streaming);
    let streaming = cancel.child_token();
    let link = {
        let (lost, streaming) = (leadership.lost(), streaming.clone());
        tokio::spawn(async move {
            lost.cancelled().await;
            streaming.cancel();
        })
    };
    let options = RunOptions {
        leader_epoch: Some(leadership.epoch),
        ..options.clone()
    };
    let mut total = RunSummary::default();
    let mut fallbacks = 0;
    let (flavor, deployment) = (server.flavor, pipeline.deployment());
    let mut server = Some(server);
    let result = loop {
        // After a fall-back the server is asked again: its end of binlog has moved on.
        let server = match server.take() {
            Some(server) => server,
            None => match check_server(&deployment.opts, &deployment.tables).await {
                Ok(server) => server,
                Err(e) => break Err(e.into()),
            },
        };
        let run = run_cdc(
            pipeline,
            server,
            Arc::clone(store),
            options.clone(),
            streaming.clone(),
        )
        .await;
        match run {
            Err(e) if position_gone(&e) && !streaming.is_cancelled() => {
                fallbacks += 1;
                if fallbacks > MAX_FALLBACKS {
                    break Err(e);
                }
                tracing::error!(error = %e,
                    "the checkpoint is no longer on the server: restarting from the oldest binlog position; the sweeper publishes the PENDING rows of the gap");
                crate::metrics::binlog_position_lost();
                if let Err(e) = fall_back(pipeline, flavor, store, leadership.epoch).await {
                    break Err(e);
                }
            }
            Err(e) => break Err(e),
            Ok(summary) => {
                total.absorb(summary);
                break Ok(total);
            }
        }
    };
    link.abort();
    result
}

fn position_gone(error: &anyhow::Error) -> bool {
    matches!(
        error.downcast_ref::<ReaderError>(),
        Some(ReaderError::PositionGone { .. })
    )
}

/// Saves the oldest position the server has as the checkpoint (local and mirror).
async fn fall_back<S: Sink>(
    pipeline: &PipelineBuilder<'_, S>,
    flavor: ServerFlavor,
    store: &Arc<dyn CheckpointStore>,
    epoch: u64,
) -> anyhow::Result<()> {
    let Deployment { opts, .. } = pipeline.deployment();
    let oldest = oldest_position(opts, flavor).await?;
    tracing::warn!(position = %oldest, "new checkpoint: the oldest position on the server");
    let (s, p) = (Arc::clone(store), oldest.clone());
    tokio::task::spawn_blocking(move || s.save(&p)).await??;
    let mut conn = mysql_async::Conn::new(opts.clone()).await?;
    MysqlMirror::new(pipeline.config().relay.name.clone())
        .fenced(epoch)
        .save(&mut conn, &oldest, None)
        .await?;
    conn.disconnect().await?;
    Ok(())
}
