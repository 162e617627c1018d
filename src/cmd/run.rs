//! `outbox-relay run [--dry-run]`.

use super::GlobalArgs;
use clap::Args;
use rocketmq_outbox::config::RelayMode;
use rocketmq_outbox::pipeline::RunOptions;
use rocketmq_outbox::relay::{self, RelayHandle};
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
        return relay::dry_run(&config, cancel).await;
    }
    config.namesrv_addr()?;
    if !config.metrics.listen.is_empty() {
        let listener = rocketmq_outbox::metrics::server::bind(&config.metrics.listen).await?;
        let server = rocketmq_outbox::metrics::server::serve(listener, cancel.clone());
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
    let summary = RelayHandle::spawn(&config, options, cancel)
        .await?
        .join()
        .await?;
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
