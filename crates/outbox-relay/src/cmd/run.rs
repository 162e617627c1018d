//! `outbox-relay run [--dry-run]`.

use super::GlobalArgs;
use clap::Args;
use rocketmq_outbox::config::{Config, RelayMode};
use rocketmq_outbox::operate::Watchers;
use rocketmq_outbox::{RelayHandle, RunOptions, RunSummary};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Decode and print events as JSON lines; send nothing, mark nothing, save no checkpoint.
    #[arg(long)]
    dry_run: bool,
    /// After SIGTERM/SIGINT, how long in-flight events may take to finish.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
}

pub async fn run(global: &GlobalArgs, args: RunArgs) -> anyhow::Result<()> {
    let config = global.load_config()?;
    if args.dry_run && config.relay.mode == RelayMode::Poll {
        anyhow::bail!("--dry-run reads the binlog: it needs relay.mode = \"cdc\"");
    }
    let cancel = CancellationToken::new();
    tokio::spawn(cancel_on_signal(cancel.clone()));
    if args.dry_run {
        return rocketmq_outbox::dry_run(&config, cancel).await;
    }
    config.namesrv_addr()?;
    if !config.metrics.listen.is_empty() {
        let listener = rocketmq_outbox::bind_metrics(&config.metrics.listen).await?;
        let server = rocketmq_outbox::serve_metrics(listener, cancel.clone());
        tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(error = %e, "the metrics endpoint stopped");
            }
        });
    }
    let options = RunOptions {
        drain_timeout: args.drain_timeout,
        ..RunOptions::default()
    };
    let summary = run_relay(&config, options, cancel).await?;
    match config.relay.mode {
        RelayMode::Cdc => {
            eprintln!(
                "stopped: {} sent, {} failed, checkpoint {}",
                summary.marked.sent, summary.marked.failed, summary.checkpoint
            );
            let asked = summary.key_order_checks;
            if asked != Default::default() {
                eprintln!(
                    "key-order check, batches that asked nothing / about skipped ids / by key: {} / {} / {}",
                    asked.none, asked.gap, asked.keys
                );
            }
        }
        RelayMode::Poll => eprintln!(
            "stopped: {} sent, {} failed",
            summary.marked.sent, summary.marked.failed
        ),
    }
    Ok(())
}

/// The running relay of this process, assembled here and nowhere else: the relay (its pipeline
/// over the RocketMQ producer and, in CDC mode, the sled checkpoint) and beside it the watchers
/// (the tables' metrics, dead letters, periodic cleanup), which stop once it has ended.
async fn run_relay(
    config: &Config,
    options: RunOptions,
    cancel: CancellationToken,
) -> anyhow::Result<RunSummary> {
    let relay = RelayHandle::spawn(config, options, cancel.clone()).await?;
    let watchers = Watchers::spawn(config, &cancel)?;
    let summary = relay.join().await;
    watchers.stop();
    summary
}

/// Cancels on the first SIGTERM or SIGINT; a second one exits at once.
async fn cancel_on_signal(cancel: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::info!("stop requested: draining in-flight events, then writing the final checkpoint");
    cancel.cancel();
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::warn!("second stop request: exiting without draining");
    std::process::exit(130);
}
