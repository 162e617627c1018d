//! The running relay: [`RelayHandle`] puts the pipeline of [`crate::pipeline`] together with a
//! sink (the RocketMQ producer) and a checkpoint store (sled), and stops them in order (drain,
//! final checkpoint, sink closed). [`dry_run`] is `run --dry-run`. What else runs in an
//! `outbox-relay run` process (the tables' metrics, the periodic cleanup) is the process's:
//! [`crate::operate::Watchers`].

use crate::binlog::reader::{check_server, BinlogReader, ReaderOptions};
use crate::binlog::StreamClock;
use crate::checkpoint::CheckpointStore;
use crate::config::{Config, RelayMode};
use crate::db::Deployment;
use crate::pipeline::{run_instance, run_poll, PipelineBuilder, RunOptions, RunSummary};
use crate::send::Sink;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Decoded items waiting to be printed by the dry run.
const DRY_RUN_CAPACITY: usize = 2048;

/// `run --dry-run`: reads from the checkpoint (or the current end) and prints each decoded event
/// as a JSON line; sends, marks and saves nothing.
pub async fn dry_run(config: &Config, cancel: CancellationToken) -> anyhow::Result<()> {
    use crate::binlog::BinlogItem;
    use std::io::Write;
    let Deployment { opts, tables } = Deployment::resolve(config)?;
    let server = check_server(&opts, &tables).await?;
    let start = match crate::checkpoint::SledStore::open(&config.relay.checkpoint_dir)
        .ok()
        .and_then(|s| s.load().ok().flatten())
    {
        Some(position) => position,
        None => server.current.clone(),
    };
    eprintln!("dry run from {start}; Ctrl-C to stop");
    let reader = BinlogReader::new(ReaderOptions::from_config(
        config,
        opts,
        tables,
        server.flavor,
        StreamClock::default(),
    ));
    let (tx, mut rx) = mpsc::channel(DRY_RUN_CAPACITY);
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

/// Stops the relay before it starts when an outbox table lacks what the relay needs (the same
/// comparison `migrate --plan` prints), naming what is missing and the command that adds it;
/// warns of a missing index. A server that cannot be reached or read here is left to the
/// pipeline's own start-up checks, which classify and retry such errors.
async fn check_tables(deployment: &Deployment) -> anyhow::Result<()> {
    let checked = async {
        let mut conn = mysql_async::Conn::new(deployment.opts.clone()).await?;
        let result = crate::schema::check_for_run(&mut conn, &deployment.tables).await;
        let _ = conn.disconnect().await;
        anyhow::Ok(result?)
    };
    match checked.await {
        Ok(Ok(warnings)) => {
            for warning in warnings {
                tracing::warn!("{warning}");
            }
            Ok(())
        }
        Ok(Err(blocked)) => Err(anyhow::anyhow!(blocked)),
        Err(e) => {
            tracing::debug!(error = %e, "outbox tables not checked before the start");
            Ok(())
        }
    }
}

/// The sled checkpoint store in `relay.checkpoint_dir` (created if need be), in CDC mode; none
/// in poll mode.
fn open_checkpoint_store(config: &Config) -> anyhow::Result<Option<Arc<dyn CheckpointStore>>> {
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
    Ok(store)
}

/// Starts the RocketMQ producer, keeping its queue lists in the relay's database.
async fn start_sink(config: &Config) -> anyhow::Result<Arc<crate::send::RocketMqSink>> {
    // The queue lists live in the relay's database too: an instance that starts while a
    // broker group is down keeps that group's keys on their queues.
    let queue_table = crate::send::QueueTable::new(crate::db::pool(config)?, &config.relay.name);
    let sink = Arc::new(
        crate::send::RocketMqSink::start(&config.rocketmq)
            .await?
            .with_queue_store(Arc::new(queue_table)),
    );
    Ok(sink)
}

/// A relay running on the current Tokio runtime: what `outbox-relay run`, `outbox-dev up`, the
/// tests and the benchmark start. It is the pipeline of `config.relay.mode` (CDC or poll) over a
/// sink and, in CDC mode, a checkpoint store; it runs until cancelled (or a permanent error),
/// then drains, writes its final checkpoint and closes the sink.
pub struct RelayHandle {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<RunSummary>>,
}

impl RelayHandle {
    /// Starts the relay with the RocketMQ producer of `config.rocketmq` and, in CDC mode, the
    /// sled store in `relay.checkpoint_dir`; `cancel` stops it (drain, final checkpoint in CDC
    /// mode, release of still-claimed rows in poll mode).
    pub async fn spawn(
        config: &Config,
        options: RunOptions,
        cancel: CancellationToken,
    ) -> anyhow::Result<Self> {
        let store = open_checkpoint_store(config)?;
        let deployment = Deployment::resolve(config)?;
        check_tables(&deployment).await?;
        let sink = start_sink(config).await?;
        Ok(Self::start(config, deployment, sink, store, options, cancel))
    }

    /// Starts the relay over `sink` and, in CDC mode, `store` (poll mode keeps no checkpoint:
    /// `None`); `cancel` stops it. The sink is closed ([`Sink::close`]) once the relay ends.
    pub fn spawn_with<S: Sink>(
        config: &Config,
        sink: Arc<S>,
        store: Option<Arc<dyn CheckpointStore>>,
        options: RunOptions,
        cancel: CancellationToken,
    ) -> anyhow::Result<Self> {
        let deployment = Deployment::resolve(config)?;
        Ok(Self::start(config, deployment, sink, store, options, cancel))
    }

    fn start<S: Sink>(
        config: &Config,
        deployment: Deployment,
        sink: Arc<S>,
        store: Option<Arc<dyn CheckpointStore>>,
        options: RunOptions,
        cancel: CancellationToken,
    ) -> Self {
        let config = config.clone();
        // A checkpointer that gives up (saves failing for a minute) stops the relay through
        // this token; the caller's `cancel` stops it too.
        let token = cancel.child_token();
        let mut options = options;
        options.checkpoint.stop_relay = Some(token.clone());
        let task = tokio::spawn(async move {
            let pipeline = PipelineBuilder::new(&config, &deployment, Arc::clone(&sink));
            let result = match store {
                Some(store) => run_instance(&pipeline, store, options, token).await,
                None => run_poll(&pipeline, options, token).await,
            }
            .map_err(anyhow::Error::from);
            drop(pipeline);
            crate::metrics::health().set_role(crate::metrics::Role::Stopping);
            sink.close().await;
            result
        });
        RelayHandle { cancel, task }
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
