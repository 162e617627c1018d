//! `outbox-dev`: development tooling, kept out of the production binary (`outbox-relay`).
//!
//! - `outbox-dev up`: a local MariaDB + RocketMQ, the schema, the relay and sample events
//!   (what `scripts/quickstart.sh` runs);
//! - `outbox-dev servers`: the servers a test phase shares (what `scripts/test.sh` runs);
//! - `outbox-dev demo`: enqueue sample events with the producer API, as business code would;
//! - `outbox-dev consume`: an example idempotent consumer of those events.

mod consume;
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

/// Where `demo` and `consume` find the servers: the relay's config file, environment and flags.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// The relay's TOML config file.
    #[arg(long, short = 'c', global = true, env = "OUTBOX_RELAY_CONFIG")]
    config: Option<PathBuf>,
    /// Overrides `mysql.url`.
    #[arg(long, global = true)]
    mysql_url: Option<String>,
    /// Overrides `rocketmq.namesrv_addr`.
    #[arg(long, global = true)]
    namesrv_addr: Option<String>,
}

impl GlobalArgs {
    /// File ← environment ← `--mysql-url`, as `outbox-relay` loads it.
    pub fn load_config(&self) -> anyhow::Result<Config> {
        let mut overrides = Map::new();
        if let Some(url) = &self.mysql_url {
            overrides.insert("mysql".into(), json!({ "url": url }));
        }
        if let Some(addr) = &self.namesrv_addr {
            overrides.insert("rocketmq".into(), json!({ "namesrv_addr": addr }));
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
    /// Example idempotent consumer: settles the demo's OrderPaid events, prints each outcome.
    Consume(consume::ConsumeArgs),
}

/// The relay's default log filter, and more. The migrations at `warn`: `up` prints how
/// many it applied (the statements are for `outbox-relay migrate`). And the pull consumer that
/// shows the events arriving (`outbox_devenv::TopicReader`) long-polls every queue in the
/// background, where the broker holds a pull longer than the client waits, so each such pull
/// logs a transport WARN and a pull ERROR although nothing is wrong: those two are off here (the
/// relay running inside `up` reports its own send failures under `rocketmq_outbox`). The
/// example consumer (`consume`) subscribes to its group's retry topic (`%RETRY%<group>`), which
/// the broker creates at the first redelivery: until then each route look-up of it logs two
/// WARN lines ("RouteInfoFromNameServer is not exist") that read as errors; those targets log
/// from ERROR up here.
fn log_filter() -> String {
    format!(
        "{},rocketmq_outbox_producer::schema=warn,\
         rocketmq_client_rust::consumer::consumer_impl::default_lite_pull_consumer_impl=off,\
         rocketmq_transport::clients::rocketmq_tokio_client::request=error,\
         rocketmq_client_rust::implementation::mq_client_api_impl::route=error,\
         rocketmq_client_rust::factory::mq_client_instance=error",
        rocketmq_outbox::logging::DEFAULT_FILTER
    )
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    rocketmq_outbox::logging::init(&log_filter());
    let result = match cli.command {
        Command::Up(args) => up::up_cmd(args).await,
        Command::Servers(args) => up::servers_cmd(args).await,
        Command::Demo(args) => demo::run(&cli.global, args).await,
        Command::Consume(args) => consume::run(&cli.global, args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
