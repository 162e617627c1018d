//! The CDC relay: binlog reader → router → ordered shard senders → marker → watermark →
//! checkpoint. `outbox-relay run` calls [`run_cdc`], or [`run_poll`] (the polling relay of
//! [`crate::sweep`]) when `relay.mode = "poll"`.
//!
//! Guarantees (the product's contract): every committed outbox INSERT after the start position
//! is published with `SEND_OK` and marked SENT, or marked FAILED with a reason; events of one
//! `biz_key` are sent in commit order, and never before an older row of the key that the stream
//! did not read (see `key_order`); the persisted checkpoint never passes an event that is not
//! recorded as SENT or FAILED, so a crash at any moment loses nothing (it may resend).

mod checkpointer;
mod dispatch;
mod instance;
mod key_order;
#[cfg(test)]
mod pipeline_tests;
mod shards;

pub use crate::sweep::run_poll;
pub use checkpointer::CheckpointSettings;
pub use instance::run_instance;
pub use shards::Shards;

use crate::binlog::reader::{check_server, BinlogReader, ReaderOptions};
use crate::binlog::{BinlogPosition, StreamClock};
use crate::checkpoint::{CheckpointStore, MysqlMirror, Watermark};
use crate::config::{Config, RelayMode};
use crate::mark::{run_marker, MarkStats, MarkerContext};
use crate::outbox::message::RowLimits;
use crate::outbox::TableName;
use crate::retry::RetryPolicy;
use crate::route::Router;
use crate::send::Sink;
use crate::sweep::{SweepSettings, Sweeper};
use key_order::KeyOrder;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Capacity of the channels from the reader and to the marker (backpressure bounds memory;
/// the dispatcher and the marker take up to 1,000 at a time).
const CHANNEL_CAPACITY: usize = 2048;
/// Events waiting per shard: a few sends' worth keeps each shard busy, while more only holds
/// payloads in memory (a drain once kept 8 × 4,096 in flight, and the relay's CPU went to
/// faulting in fresh pages for them).
const SHARD_CAPACITY: usize = 256;
/// Requests from the key-order guard to the sweeper not yet taken up (when full, the guard asks
/// again at its next recheck).
const NUDGE_CAPACITY: usize = 64;

/// What a finished run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunSummary {
    pub marked: MarkStats,
    /// The last persisted checkpoint.
    pub checkpoint: BinlogPosition,
    /// Rows that could not even be identified (no primary key): logged, not marked.
    pub unidentifiable: u64,
}

impl RunSummary {
    /// Adds a later run's counts; its checkpoint (if any) becomes the last one.
    pub fn absorb(&mut self, later: RunSummary) {
        self.marked.sent += later.marked.sent;
        self.marked.failed += later.marked.failed;
        self.unidentifiable += later.unidentifiable;
        if !later.checkpoint.is_unknown() {
            self.checkpoint = later.checkpoint;
        }
    }
}

/// Options beyond the config file.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// After cancellation, how long in-flight events may take to finish.
    pub drain_timeout: Duration,
    pub checkpoint: CheckpointSettings,
    /// Poll mode and the sweeper: how rows are claimed; `None` detects it from the server's
    /// version.
    pub claim_strategy: Option<crate::sweep::ClaimStrategy>,
    /// CDC: the leadership epoch this run streams under (fences the checkpoint mirror); set by
    /// the instance supervisor, `None` when no election is held.
    pub leader_epoch: Option<u64>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            drain_timeout: Duration::from_secs(10),
            checkpoint: CheckpointSettings::default(),
            claim_strategy: None,
            leader_epoch: None,
        }
    }
}

/// The configured outbox tables, qualified with the URL's database.
pub fn qualified_tables(config: &Config) -> anyhow::Result<Vec<TableName>> {
    let opts = crate::db::opts(config)?;
    let database = opts.db_name().unwrap_or_default().to_string();
    Ok(config
        .outbox_tables()
        .into_iter()
        .map(|t| t.in_schema(&database))
        .collect())
}

pub(crate) fn reader_options(
    config: &Config,
    opts: mysql_async::Opts,
    tables: Vec<TableName>,
    flavor: crate::binlog::ServerFlavor,
    clock: StreamClock,
) -> ReaderOptions {
    ReaderOptions {
        opts,
        server_id: config.mysql.server_id,
        heartbeat: config.mysql.heartbeat,
        tables,
        limits: limits(config),
        flavor,
        clock,
    }
}

fn limits(config: &Config) -> RowLimits {
    RowLimits {
        max_payload_bytes: config.outbox.max_payload_bytes,
    }
}

/// Where to start: the furthest of the local (sled) checkpoint and the MySQL mirror (each is safe
/// on its own; after a failover the mirror is usually ahead of a former leader's local one), else
/// the server's current end.
async fn start_position(
    store: &dyn CheckpointStore,
    mirror: &MysqlMirror,
    pool: &mysql_async::Pool,
    current: &BinlogPosition,
) -> anyhow::Result<BinlogPosition> {
    let local = store.load()?;
    let mut conn = pool.get_conn().await?;
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

/// Runs the CDC relay until `cancel` fires (then drains and writes the final checkpoint) or a
/// permanent error.
pub async fn run_cdc<S: Sink>(
    config: &Config,
    sink: Arc<S>,
    store: Arc<dyn CheckpointStore>,
    options: RunOptions,
    cancel: CancellationToken,
) -> anyhow::Result<RunSummary> {
    let opts = crate::db::opts(config)?;
    let tables = qualified_tables(config)?;
    let server = check_server(&opts, &tables).await?;
    tracing::info!(version = %server.version, flavor = ?server.flavor, "server checks passed");
    // The marker's and the sweeper's pools: separate (the sweeper closes its own before the
    // final checkpoint is mirrored), from one question to the server.
    let writer_opts = crate::db::writer_opts(config).await?;
    let pool = mysql_async::Pool::new(writer_opts.clone());
    let mut mirror = MysqlMirror::new(config.relay.name.clone());
    if let Some(epoch) = options.leader_epoch {
        mirror = mirror.fenced(epoch);
    }
    let start = start_position(&*store, &mirror, &pool, &server.current).await?;
    let watermark = Arc::new(Mutex::new(Watermark::new(start.clone())));
    let sweeper = match config.sweeper.enabled {
        true => Some(
            Sweeper::new(
                mysql_async::Pool::new(writer_opts),
                tables.clone(),
                config.instance_id(),
                SweepSettings::beside_stream(config),
                limits(config),
                options.claim_strategy,
            )
            .await?,
        ),
        false => None,
    };

    let clock = StreamClock::default();
    let reader = BinlogReader::new(reader_options(
        config,
        opts,
        tables,
        server.flavor,
        clock.clone(),
    ));
    let (items_tx, items_rx) = mpsc::channel(CHANNEL_CAPACITY);
    let reader_cancel = cancel.child_token();
    let catch_up = dispatch::CatchUp::new(
        pool.clone(),
        &start,
        &server.current,
        config.sweeper.enabled,
        clock.clone(),
    );
    if catch_up.is_none() {
        clock.arm(); // nothing written before the start is left to read
    }
    let reader_task = tokio::spawn(reader.run(start, items_tx, reader_cancel.clone()));

    let (completions_tx, completions_rx) = mpsc::channel(CHANNEL_CAPACITY);
    let (shards, shard_inputs) = Shards::start(
        &sink,
        config.relay.shards,
        SHARD_CAPACITY,
        RetryPolicy::from_config(&config.retry),
        &completions_tx,
    );
    let marker_task = tokio::spawn(run_marker(
        pool.clone(),
        completions_rx,
        MarkerContext {
            watermark: Some(Arc::clone(&watermark)),
            owner: config.instance_id(),
        },
        // A permanent marking error stops the reader, and so the whole run.
        reader_cancel.clone(),
    ));
    // The sweeper feeds the same shards: a key's swept rows queue behind its streamed ones, and
    // the stream's key-order guard asks it for the older rows a key waits for.
    let (nudge_tx, nudge_rx) = mpsc::channel(NUDGE_CAPACITY);
    let key_order = sweeper
        .is_some()
        .then(|| KeyOrder::new(pool.clone(), nudge_tx, config.sweeper.min_age));
    let mut sweeper = sweeper.map(|sweeper| {
        sweeper.spawn(
            Router::new(config.relay.shards),
            shard_inputs.clone(),
            completions_tx.clone(),
            crate::sweep::SweepGate::beside_stream(Arc::clone(&watermark), clock.clone()),
            Some(nudge_rx),
        )
    });
    let checkpoint_stop = CancellationToken::new();
    let checkpoint_task = tokio::spawn(checkpointer::run(
        Arc::clone(&watermark),
        Arc::clone(&store),
        mirror,
        pool.clone(),
        options.checkpoint.clone(),
        clock.clone(),
        checkpoint_stop.clone(),
    ));

    let outputs = dispatch::Outputs {
        router: Router::new(config.relay.shards),
        shards: shard_inputs,
        completions: completions_tx,
        key_order,
    };
    let dispatched = dispatch::run(items_rx, outputs, Arc::clone(&watermark), catch_up).await;

    // The reader stopped (cancelled or failed). Let the shards drain, within the timeout.
    let reader_result = reader_task.await?;
    if let Some(sweeper) = &mut sweeper {
        sweeper.stop_claiming().await;
    }
    shards
        .drain(
            options.drain_timeout,
            "they will be sent again after restart",
        )
        .await;
    let marked = marker_task.await?;
    if let Some(sweeper) = sweeper {
        sweeper.finish().await;
    }
    checkpoint_stop.cancel();
    let checkpoint = checkpoint_task.await??;
    crate::db::close(pool).await;
    let marked = marked?;
    reader_result?;
    Ok(RunSummary {
        marked,
        checkpoint,
        unidentifiable: dispatched.unidentifiable,
    })
}

/// `run --dry-run`: reads from the checkpoint (or the current end) and prints each decoded event
/// as a JSON line; sends, marks and saves nothing.
pub async fn dry_run(config: &Config, cancel: CancellationToken) -> anyhow::Result<()> {
    use crate::binlog::BinlogItem;
    use std::io::Write;
    let opts = crate::db::opts(config)?;
    let tables = qualified_tables(config)?;
    let server = check_server(&opts, &tables).await?;
    let start = match crate::checkpoint::SledStore::open(&config.relay.checkpoint_dir)
        .ok()
        .and_then(|s| s.load().ok().flatten())
    {
        Some(position) => position,
        None => server.current.clone(),
    };
    eprintln!("dry run from {start}; Ctrl-C to stop");
    let reader = BinlogReader::new(reader_options(
        config,
        opts,
        tables,
        server.flavor,
        StreamClock::default(),
    ));
    let (tx, mut rx) = mpsc::channel(CHANNEL_CAPACITY);
    let task = tokio::spawn(reader.run(start, tx, cancel.clone()));
    while let Some(item) = rx.recv().await {
        let line = match item {
            BinlogItem::Row(crate::binlog::DecodedRow::Event(row)) => {
                let e = row.message;
                serde_json::json!({
                    "table": row.table.to_string(), "id": row.id, "event_id": e.event_id,
                    "biz_key": e.biz_key, "topic": e.topic, "tags": e.tags, "headers": e.headers,
                    "payload": e.payload,
                })
            }
            BinlogItem::Row(crate::binlog::DecodedRow::Problem(p)) => serde_json::json!({
                "table": p.table.to_string(), "id": p.id, "event_id": p.event_id, "would_fail": p.reason,
            }),
            BinlogItem::TxEnd(end) => {
                serde_json::json!({ "commit": end.file, "end_pos": end.end_pos })
            }
            _ => continue,
        };
        // A closed stdout (`run --dry-run | head`) ends the dry run quietly.
        if writeln!(std::io::stdout(), "{line}").is_err() {
            cancel.cancel();
            break;
        }
    }
    drop(rx);
    task.await??;
    Ok(())
}

/// A relay running on the current Tokio runtime with the RocketMQ sink and the sled store in
/// `relay.checkpoint_dir`: what `outbox-relay run`, `dev up`, the tests and the benchmark start.
pub struct RelayHandle {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<RunSummary>>,
}

impl RelayHandle {
    /// Starts the producer and the relay of `config.relay.mode`; `cancel` stops it (drain, final
    /// checkpoint in CDC mode, release of still-claimed rows in poll mode).
    pub async fn spawn(
        config: &Config,
        options: RunOptions,
        cancel: CancellationToken,
    ) -> anyhow::Result<Self> {
        let store: Option<Arc<dyn CheckpointStore>> = match config.relay.mode {
            RelayMode::Poll => None,
            RelayMode::Cdc => {
                std::fs::create_dir_all(&config.relay.checkpoint_dir).map_err(|e| {
                    anyhow::anyhow!(
                        "cannot create relay.checkpoint_dir {}: {e}",
                        config.relay.checkpoint_dir.display()
                    )
                })?;
                Some(Arc::new(crate::checkpoint::SledStore::open(
                    &config.relay.checkpoint_dir,
                )?))
            }
        };
        let sink = Arc::new(crate::send::RocketMqSink::start(&config.rocketmq).await?);
        let (config, token) = (config.clone(), cancel.clone());
        let deployment = match config.relay.mode {
            RelayMode::Cdc => Some((crate::db::opts(&config)?, config.relay.name.clone())),
            RelayMode::Poll => None,
        };
        let tables_watch = tokio::spawn(crate::metrics::tables::watch(
            crate::db::read_committed_pool(&config)?,
            qualified_tables(&config)?,
            deployment,
            config.metrics.refresh,
            cancel.child_token(),
        ));
        if config.cleanup.enabled {
            tokio::spawn(crate::operate::cleanup::run_periodically(
                config.cleanup.clone(),
                crate::db::pool(&config)?,
                qualified_tables(&config)?,
                format!("outbox-relay run ({})", config.relay.name),
                cancel.child_token(),
            ));
        }
        let task = tokio::spawn(async move {
            let result = match store {
                Some(store) => {
                    run_instance(&config, Arc::clone(&sink), store, options, token).await
                }
                None => run_poll(&config, Arc::clone(&sink), options, token).await,
            };
            crate::metrics::health().set_role(crate::metrics::Role::Stopping);
            tables_watch.abort();
            if let Ok(sink) = Arc::try_unwrap(sink) {
                sink.shutdown().await;
            }
            result
        });
        Ok(RelayHandle { cancel, task })
    }

    /// Waits until the relay ends (cancelled, or a permanent error).
    pub async fn join(self) -> anyhow::Result<RunSummary> {
        self.task.await?
    }

    /// Requests a graceful stop and waits for the summary.
    pub async fn stop(self) -> anyhow::Result<RunSummary> {
        self.cancel.cancel();
        self.join().await
    }
}
