//! CDC: the binlog stream and everything beside it, for one leadership (or one run without an
//! election). The reader decodes committed outbox INSERTs; the dispatcher gives each its
//! acknowledgement and routes it (behind the key-order guard when a sweeper runs); the shards
//! send; the marker records each outcome and acknowledges it; the checkpointer persists how far
//! everything is acknowledged. See [`super`] for the guarantees.

use super::builder::PipelineBuilder;
use super::dispatch;
use super::key_order::KeyOrder;
use super::{Marked, RunOptions, RunSummary, SendStage};
use crate::binlog::reader::{BinlogReader, ReaderError, ReaderOptions, ServerInfo};
use crate::binlog::{BinlogItem, BinlogPosition, StreamClock};
use crate::checkpoint::{
    run_checkpointer, Acknowledgements, CheckpointError, CheckpointStore, MysqlMirror,
};
use crate::error::{DbError, PipelineError};
use crate::mark::MarkStats;
use crate::send::Sink;
use crate::sweep::{HeldForOrder, RunningSweeper, SweepGate, SweepSettings, Sweeper};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Decoded binlog items waiting for the dispatcher (backpressure on the reader bounds memory;
/// the dispatcher takes up to 1,000 at a time).
const ITEMS_CAPACITY: usize = 2048;
/// Requests from the key-order guard to the sweeper not yet taken up (when full, the guard asks
/// again at its next recheck).
const NUDGE_CAPACITY: usize = 64;

/// Runs the CDC relay against `server` (checked by the caller: its flavour and current end of
/// binlog) until `cancel` fires (then drains and writes the final checkpoint) or a permanent
/// error.
pub async fn run_cdc<S: Sink>(
    pipeline: &PipelineBuilder<'_, S>,
    server: ServerInfo,
    store: Arc<dyn CheckpointStore>,
    options: RunOptions,
    cancel: CancellationToken,
) -> Result<RunSummary, PipelineError> {
    let (opened, start) = open_stores(pipeline, &server, &*store, &options).await?;
    let reading = spawn_reader(pipeline, &server, &opened.pool, start, &cancel);
    let (stages, outputs, acks) = spawn_stages(pipeline, opened, &reading, &store, &options);
    let dispatched = dispatch::run(reading.items, outputs, acks, reading.catch_up).await;
    let (marked, checkpoint) = drain_and_join(reading.task, stages, options.drain_timeout).await?;
    Ok(RunSummary {
        marked,
        checkpoint,
        unidentifiable: dispatched.unidentifiable,
        key_order_checks: dispatched.key_order,
    })
}

/// What a run stands on: the marker's pool, the checkpoint mirror, the stream's
/// acknowledgements, and the sweeper (when enabled) not yet running.
struct Opened {
    pool: mysql_async::Pool,
    mirror: MysqlMirror,
    acks: Acknowledgements,
    sweeper: Option<Sweeper>,
}

/// Opens the marker's pool and the sweeper's, and finds where the stream starts
/// ([`start_position`]), returned beside them.
async fn open_stores<S: Sink>(
    pipeline: &PipelineBuilder<'_, S>,
    server: &ServerInfo,
    store: &dyn CheckpointStore,
    options: &RunOptions,
) -> Result<(Opened, BinlogPosition), PipelineError> {
    let (config, deployment) = (pipeline.config(), pipeline.deployment());
    // The marker's and the sweeper's pools: separate (the sweeper closes its own before the
    // final checkpoint is mirrored), from one question to the server.
    let writer_opts = crate::db::writer_opts_from(deployment.opts.clone(), config).await;
    let pool = mysql_async::Pool::new(writer_opts.clone());
    // Under a leadership, the builder's fence stops the senders, the marker and the mirror.
    let mirror = pipeline.mirror();
    let start = start_position(store, &mirror, &pool, &server.current).await?;
    let acks = Acknowledgements::new(start.clone());
    let sweeper = match config.sweeper.enabled {
        true => Some(
            pipeline
                .sweeper(
                    mysql_async::Pool::new(writer_opts),
                    SweepSettings::beside_stream(config),
                    options.claim_strategy,
                )
                .await?,
        ),
        false => None,
    };
    let opened = Opened {
        pool,
        mirror,
        acks,
        sweeper,
    };
    Ok((opened, start))
}

/// The binlog reader, running, and what the dispatcher takes from it.
struct Reading {
    task: JoinHandle<Result<(), ReaderError>>,
    items: mpsc::Receiver<BinlogItem>,
    /// Stops the reader, and so the whole run.
    cancel: CancellationToken,
    catch_up: Option<dispatch::CatchUp>,
    clock: StreamClock,
}

/// Spawns the reader from `start`, stopped by (a child of) `cancel`. The stream clock is armed
/// at once when there is nothing to catch up.
fn spawn_reader<S: Sink>(
    pipeline: &PipelineBuilder<'_, S>,
    server: &ServerInfo,
    pool: &mysql_async::Pool,
    start: BinlogPosition,
    cancel: &CancellationToken,
) -> Reading {
    let (config, deployment) = (pipeline.config(), pipeline.deployment());
    let clock = StreamClock::default();
    let reader = BinlogReader::new(ReaderOptions::from_config(
        config,
        deployment.opts.clone(),
        deployment.tables.clone(),
        server.flavor,
        clock.clone(),
    ));
    let (items_tx, items_rx) = mpsc::channel(ITEMS_CAPACITY);
    let reader_cancel = cancel.child_token();
    let catch_up = dispatch::CatchUp::new(
        pool.clone(),
        &start,
        &server.current,
        config.sweeper.enabled,
        clock.clone(),
    )
    .map(|catch_up| catch_up.reading_tails(pipeline.broker_tails()));
    if catch_up.is_none() {
        clock.arm(); // nothing written before the start is left to read
    }
    let reader_task = tokio::spawn(reader.run(start, items_tx, reader_cancel.clone()));
    Reading {
        task: reader_task,
        items: items_rx,
        cancel: reader_cancel,
        catch_up,
        clock,
    }
}

/// The stages after the dispatcher, running: the shards with the marker, the sweeper and the
/// checkpointer; and the marker's pool, closed once they are done.
struct Stages {
    pool: mysql_async::Pool,
    send_stage: SendStage<Marked>,
    sweeper: Option<RunningSweeper>,
    checkpoint_stop: CancellationToken,
    checkpoint_task: JoinHandle<Result<BinlogPosition, CheckpointError>>,
}

/// Starts the send stage (with its marker), the sweeper feeding the same shards, and the
/// checkpointer; returns them with where the dispatcher hands events on and the stream's
/// acknowledgements.
fn spawn_stages<S: Sink>(
    pipeline: &PipelineBuilder<'_, S>,
    opened: Opened,
    reading: &Reading,
    store: &Arc<dyn CheckpointStore>,
    options: &RunOptions,
) -> (Stages, dispatch::Outputs, Acknowledgements) {
    let Opened {
        pool,
        mirror,
        acks,
        sweeper,
    } = opened;
    let config = pipeline.config();
    let clock = &reading.clock;
    // With a sweeper to send them later, a stalled topic's new events are parked (left PENDING)
    // instead of held in memory.
    let parking = pipeline.parking(config.relay.park_after);
    let stage = if sweeper.is_some() {
        &parking
    } else {
        pipeline
    };
    let (send_stage, inputs) = stage.marked_send_stage(
        pool.clone(),
        config.instance_id(),
        // A permanent marking error stops the reader, and so the whole run.
        reading.cancel.clone(),
    );
    // The sweeper feeds the same shards: a key's swept rows queue behind its streamed ones, and
    // the stream's key-order guard asks it for the older rows a key waits for.
    let (nudge_tx, nudge_rx) = mpsc::channel(NUDGE_CAPACITY);
    let held = HeldForOrder::default();
    let key_order = sweeper.is_some().then(|| {
        KeyOrder::new(pool.clone(), nudge_tx, held.clone(), config.sweeper.min_age)
    });
    let sweeper = sweeper.map(|sweeper| {
        sweeper.spawn(
            inputs.clone(),
            SweepGate::beside_stream(acks.clone(), clock.clone(), held),
            Some(nudge_rx),
        )
    });
    let checkpoint_stop = CancellationToken::new();
    let checkpoint_task = tokio::spawn(run_checkpointer(
        acks.clone(),
        Arc::clone(store),
        mirror,
        pool.clone(),
        options.checkpoint.clone(),
        clock.clone(),
        checkpoint_stop.clone(),
    ));

    let park_prepared_after = key_order
        .is_some()
        .then_some(config.relay.park_prepared_after);
    let outputs = dispatch::Outputs {
        inputs,
        key_order,
        park_prepared_after,
    };
    let stages = Stages {
        pool,
        send_stage,
        sweeper,
        checkpoint_stop,
        checkpoint_task,
    };
    (stages, outputs, acks)
}

/// Once the dispatcher is done (the reader stopped, cancelled or failed): lets the shards drain
/// within `drain_timeout`, stops the sweeper, writes the final checkpoint and closes the pool.
/// The marker's and the reader's errors are returned only after all of that.
async fn drain_and_join(
    reader_task: JoinHandle<Result<(), ReaderError>>,
    stages: Stages,
    drain_timeout: Duration,
) -> Result<(MarkStats, BinlogPosition), PipelineError> {
    let Stages {
        pool,
        send_stage,
        mut sweeper,
        checkpoint_stop,
        checkpoint_task,
    } = stages;
    // The reader stopped (cancelled or failed). Let the shards drain, within the timeout.
    let reader_result = reader_task
        .await
        .map_err(PipelineError::task("binlog reader"))?;
    if let Some(sweeper) = &mut sweeper {
        sweeper.stop_claiming().await;
    }
    let marked = send_stage
        .finish(drain_timeout, "they will be sent again after restart")
        .await?;
    if let Some(sweeper) = sweeper {
        sweeper.finish().await;
    }
    checkpoint_stop.cancel();
    let checkpoint = checkpoint_task
        .await
        .map_err(PipelineError::task("checkpointer"))??;
    crate::db::close(pool).await;
    let marked = marked?;
    reader_result?;
    Ok((marked, checkpoint))
}

/// Where to start: the furthest of the local (sled) checkpoint and the MySQL mirror (each is safe
/// on its own; after a failover the mirror is usually ahead of a former leader's local one), else
/// the server's current end.
async fn start_position(
    store: &dyn CheckpointStore,
    mirror: &MysqlMirror,
    pool: &mysql_async::Pool,
    current: &BinlogPosition,
) -> Result<BinlogPosition, PipelineError> {
    let local = store.load()?;
    let mut conn = pool.get_conn().await.map_err(DbError::when(
        "cannot connect to MySQL to read the checkpoint mirror",
    ))?;
    let shared = mirror.load(&mut conn).await?;
    drop(conn);
    match (local, shared) {
        (Some(local), Some(shared)) if !local.covers(&shared) => {
            tracing::info!(position = %shared, local = %local,
                "resuming from the checkpoint mirror in MySQL (ahead of the local checkpoint)");
            Ok(shared)
        }
        (Some(local), _) => {
            tracing::info!(position = %local, "resuming from the local checkpoint");
            Ok(local)
        }
        (None, Some(shared)) => {
            tracing::info!(position = %shared,
                "no local checkpoint; resuming from the checkpoint mirror in MySQL");
            Ok(shared)
        }
        (None, None) => {
            tracing::warn!(position = %current,
                "no checkpoint anywhere: starting at the current end of the binlog; older PENDING rows are left to the sweeper");
            Ok(current.clone())
        }
    }
}
