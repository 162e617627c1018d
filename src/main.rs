//! `outbox-relay`: the command-line entry point. Each subcommand lives in `src/cmd/`.

mod cmd;

use clap::Parser;
use std::process::ExitCode;

/// See Cargo.toml: per-event allocations across threads are cheaper with mimalloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `RUST_LOG` overrides this; the RocketMQ client is chatty at `info`.
const DEFAULT_LOG_FILTER: &str =
    "info,rocketmq_client_rust=warn,rocketmq_transport=warn,rocketmq_runtime=warn,rocketmq_remoting=warn,\
     rocketmq_client_rust::factory::route_update=error,\
     rocketmq_client_rust::consumer::consumer_impl::default_lite_pull_consumer_impl=off";

#[tokio::main]
async fn main() -> ExitCode {
    let cli = cmd::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER)),
        )
        .with_writer(std::io::stderr)
        .init();
    match cmd::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
