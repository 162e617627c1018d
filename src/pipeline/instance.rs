//! One relay instance in CDC mode, among any number sharing a `relay.name`: it stands by (sweeping)
//! until it wins the election, then streams (with the sweeper beside the stream) until it is
//! stopped or loses leadership, and then stands by again.
//!
//! Guarantees: at most one instance streams at a time as far as the server's lock goes (see
//! [`crate::leader`]); a new leader resumes from the furthest checkpoint it can see (its own, or
//! the mirror the previous leader kept in MySQL) and, reading again up to the server's end of
//! binlog as it is when it takes over, skips the events already recorded SENT or FAILED: a
//! takeover resends what the old leader had sent but not yet recorded, not everything after its
//! last mirrored checkpoint. If the checkpoint is no longer on the server
//! (purged binlogs), the leader logs an ERROR, counts it, restarts from the oldest position the
//! server has, and the sweeper publishes the PENDING rows of the gap.

use super::{run_cdc, run_sweeper_alone, PipelineBuilder, RunOptions, RunSummary};
use crate::binlog::reader::{
    check_server, oldest_position, server_position, ReaderError, ServerInfo,
};
use crate::binlog::ServerFlavor;
use crate::checkpoint::CheckpointStore;
use crate::db::Deployment;
use crate::error::{DbError, PipelineError};
use crate::leader::{Election, Leadership};
use crate::send::Sink;
use crate::sweep::{SweepGate, SweepSettings};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// How many times in a row one leadership may restart from the oldest binlog before giving up.
const MAX_FALLBACKS: u32 = 3;

/// Runs this instance until `cancel` fires, or a round fails with an error whose
/// [`crate::error::ErrorClass`] stops it ([`PipelineError::class`]: a failed start-up check, a store that
/// cannot be written, an outcome that cannot be recorded; a server that cannot be reached before
/// the first round). Every other failed round is retried with backoff, for ever.
pub async fn run_instance<S: Sink>(
    pipeline: &PipelineBuilder<'_, S>,
    store: Arc<dyn CheckpointStore>,
    options: RunOptions,
    cancel: CancellationToken,
) -> Result<RunSummary, PipelineError> {
    // Every instance checks the server and its grants first, so a missing privilege is named
    // at start-up (not as a failed election or a refused binlog dump later).
    let (config, deployment) = (pipeline.config(), pipeline.deployment());
    let mut total = RunSummary::default();
    let policy = crate::retry::RetryPolicy::reconnect();
    let mut failures = 0;
    let mut first_round = true;
    loop {
        // A connection lost during start-up or a run (a killed connection, a restarting server)
        // is retried with backoff; a misconfigured server or missing grant stops the instance.
        let round = async {
            let server = check_server(&deployment.opts, &deployment.tables).await?;
            let election = Election::for_server(
                deployment.opts.clone(),
                &config.relay.name,
                &config.instance_id(),
                config.relay.election,
                server.galera,
            )?;
            let leadership = match election.try_lead().await.map_err(PipelineError::Election)? {
                Some(leadership) => leadership,
                None => match stand_by(pipeline, &election, &options, &cancel, &mut total).await? {
                    Some(leadership) => leadership,
                    None => return Ok(None),
                },
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
            Err(e) if stops(&e, started) || cancel.is_cancelled() => return Err(e),
            Err(e) => {
                failures += 1;
                let delay = policy.delay(failures).unwrap_or(policy.max);
                if e.class().reported() {
                    // Retried like a lost connection, but never unseen: an ERROR, a count and an
                    // alert (OutboxUnclassifiedErrors) say that the relay did not foresee it.
                    crate::metrics::relay().unclassified_errors.inc();
                    tracing::error!(error = %e.report(), retry_in = ?delay, failures,
                        "relay round failed with an error the relay does not classify (a task \
                         that panicked: not a lost connection, not a known configuration error): \
                         retrying; if it repeats, report it with this message");
                } else {
                    tracing::warn!(error = %e.report(), retry_in = ?delay, "relay round failed; retrying");
                }
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(total),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Whether a failed round stops the instance (`started`: it ran a round before): its error's
/// [`PipelineError::class`].
fn stops(error: &PipelineError, started: bool) -> bool {
    error.class().stops(started)
}

/// Sweeps (if enabled) while waiting for leadership; `None` when cancelled first.
async fn stand_by<S: Sink>(
    pipeline: &PipelineBuilder<'_, S>,
    election: &Election,
    options: &RunOptions,
    cancel: &CancellationToken,
    total: &mut RunSummary,
) -> Result<Option<Leadership>, PipelineError> {
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
) -> Result<RunSummary, PipelineError> {
    crate::metrics::health().set_role(crate::metrics::Role::Streaming);
    let streaming = cancel.child_token();
    let link = {
        let (lost, streaming) = (leadership.lost(), streaming.clone());
        tokio::spawn(async move {
            lost.cancelled().await;
            streaming.cancel();
        })
    };
    // The leadership's fence stops the senders, the marker and the mirror once it is over.
    let pipeline = &pipeline.fenced(leadership.fence());
    let mut total = RunSummary::default();
    let mut fallbacks = 0;
    let (flavor, deployment) = (server.flavor, pipeline.deployment());
    let mut server = Some(server);
    let result = loop {
        // After a fall-back the server is asked again: its end of binlog has moved on.
        let server = match server.take() {
            // The end of binlog is asked again even the first time: a standby read it when it
            // began to wait for this leadership, maybe long ago, and catching up (skipping the
            // events the old leader already recorded) runs up to the end as it is now. With a
            // stale end a new leader resent everything since the mirrored checkpoint.
            Some(server) => match server_position(&deployment.opts).await {
                Ok(now) => ServerInfo {
                    current: now.current,
                    ..server
                },
                Err(e) => break Err(e.into()),
            },
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
            Err(e @ PipelineError::Reader(ReaderError::PositionGone { .. }))
                if !streaming.is_cancelled() =>
            {
                fallbacks += 1;
                if fallbacks > MAX_FALLBACKS {
                    break Err(e);
                }
                tracing::error!(error = %e.report(),
                    "the checkpoint is no longer on the server: restarting from the oldest binlog position; the sweeper publishes the PENDING rows of the gap");
                crate::metrics::binlog_position_lost();
                if let Err(e) = fall_back(pipeline, flavor, store).await {
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

/// Saves the oldest position the server has as the checkpoint (local and mirror).
async fn fall_back<S: Sink>(
    pipeline: &PipelineBuilder<'_, S>,
    flavor: ServerFlavor,
    store: &Arc<dyn CheckpointStore>,
) -> Result<(), PipelineError> {
    let Deployment { opts, .. } = pipeline.deployment();
    let oldest = oldest_position(opts, flavor).await?;
    tracing::warn!(position = %oldest, "new checkpoint: the oldest position on the server");
    let (s, p) = (Arc::clone(store), oldest.clone());
    tokio::task::spawn_blocking(move || s.save(&p))
        .await
        .map_err(PipelineError::task("checkpoint save"))??;
    let mirroring = "cannot mirror the fall-back checkpoint into MySQL";
    let mut conn = mysql_async::Conn::new(opts.clone())
        .await
        .map_err(DbError::when(mirroring))?;
    pipeline.mirror().save(&mut conn, &oldest, None).await?;
    conn.disconnect().await.map_err(DbError::when(mirroring))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binlog::reader::StartupError;
    use crate::checkpoint::store::StoreError;

    fn lost() -> mysql_async::Error {
        mysql_async::Error::Driver(mysql_async::DriverError::PoolDisconnected)
    }

    fn unreachable() -> PipelineError {
        StartupError::Connect(lost()).into()
    }

    #[test]
    fn a_round_stops_the_instance_by_the_class_its_error_states() {
        let misconfigured: PipelineError =
            StartupError::Misconfigured("binlog_format".into()).into();
        assert!(stops(&misconfigured, true));
        // A server that cannot be reached stops an instance that never ran, not one that did.
        assert!(stops(&unreachable(), false));
        assert!(!stops(&unreachable(), true));
        let refused = PipelineError::from(ReaderError::NotAllowed("denied".into()));
        assert!(stops(&refused, true));
        let gone = ReaderError::PositionGone {
            position: "0-1-5".into(),
            message: "purged".into(),
        };
        assert!(!stops(&gone.into(), true));
        assert!(!stops(&StoreError::Fenced(3).into(), true));
        assert!(stops(&StoreError::Corrupt("bad".into()).into(), true));
        // A connection lost mid-way (the election's, the pipeline's own statements) is retried,
        // before the first round too.
        assert!(!stops(&PipelineError::Election(lost()), false));
        let own = DbError::new("cannot read outbox table t", lost());
        assert!(!stops(&own.into(), false));
    }

    #[tokio::test]
    async fn only_an_unforeseen_error_is_reported_as_unclassified() {
        // Retried like a lost connection, but logged at ERROR and counted: a panicked task.
        let panicked = tokio::spawn(async { panic!("a bug") }).await.unwrap_err();
        let panicked = PipelineError::task("binlog reader")(panicked);
        assert!(!stops(&panicked, false) && !stops(&panicked, true));
        assert!(panicked.class().reported());
        assert!(panicked
            .report()
            .to_string()
            .contains("the binlog reader task failed"));
        // A lost connection is expected: a WARN, not a report.
        let lost = PipelineError::Election(lost());
        assert!(!lost.class().reported(), "a lost connection");
        assert!(
            lost.report()
                .to_string()
                .starts_with("cannot enter the leader election"),
            "{}",
            lost.report()
        );
        assert!(!unreachable().class().reported(), "classified");
    }
}
