//! `outbox-dev`: development tooling, kept out of the production binary (`outbox-relay`).
//!
//! - `outbox-dev up`: a local MariaDB + RocketMQ, the schema, the relay and sample events
//!   (what `scripts/quickstart.sh` runs);
//! - `outbox-dev servers`: the servers a test phase shares (what `scripts/test.sh` runs);
//! - `outbox-dev demo`: enqueue sample events with the producer API, as business code would.

mod demo;
mod up;

use clap::{Args, Parser, Subcommand};
use rocketmq_outbox::config::Config;
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::process::ExitCode;

/// Local servers and sample events for trying and testing outbox-relay.
#[derive(Debug, Parser)]
#[command(name = "outbox-dev", version, about)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

/// Where `demo` finds the database: the relay's config file, environment and flag.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// The relay's TOML config file.
    #[arg(long, short = 'c', global = true, env = "OUTBOX_RELAY_CONFIG")]
    config: Option<PathBuf>,
    /// Overrides `mysql.url`.
    #[arg(long, global = true)]
    mysql_url: Option<String>,
}

impl GlobalArgs {
    /// File ← environment ← `--mysql-url`, as `outbox-relay` loads it.
    pub fn load_config(&self) -> anyhow::Result<Config> {
        let mut overrides = Map::new();
        if let Some(url) = &self.mysql_url {
            overrides.insert("mysql".into(), json!({ "url": url }));
        }
        Ok(Config::load(
            self.config.as_deref(),
            Value::Object(overrides),
        )?)
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start MariaDB, RocketMQ and the relay, migrate, pay sample orders and show their events
    /// arriving in RocketMQ; run until Ctrl-C.
    Up(up::UpArgs),
    /// Start the servers a whole test run shares (the SQL server `$OUTBOX_TEST_DB` names,
    /// MariaDB by default or MySQL, and a RocketMQ cluster of `$OUTBOX_BROKER`, without topic
    /// auto-creation), write their addresses to an env file, and run until SIGTERM or Ctrl-C.
    /// `scripts/test.sh` uses it.
    Servers(up::ServersArgs),
    /// Enqueue sample events with the producer API, as business code would.
    Demo(demo::DemoArgs),
}

/// `RUST_LOG` overrides this. The RocketMQ client is chatty at `info`; and the pull consumer that
/// shows the events arriving (`outbox_devenv::TopicReader`) long-polls every queue in the
/// background, where the broker holds a pull longer than the client waits: each such pull logs a
/// transport WARN and a pull ERROR although nothing is wrong. Those two are off here (the relay
/// running inside `up` reports its own send failures under `rocketmq_outbox`).
const DEFAULT_LOG_FILTER: &str =
    "info,rocketmq_client_rust=warn,rocketmq_transport=warn,rocketmq_runtime=warn,rocketmq_remoting=warn,\
     rocketmq_client_rust::factory::route_update=error,\
     rocketmq_client_rust::consumer::consumer_impl::default_lite_pull_consumer_impl=off,\
     rocketmq_transport::clients::rocketmq_tokio_client::request=error";

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER)),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Up(args) => up::up_cmd(args).await,
        Command::Servers(args) => up::servers_cmd(args).await,
        Command::Demo(args) => demo::run(&cli.global, args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
