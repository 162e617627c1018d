//! Subcommands and the flags every subcommand shares.

mod cleanup;
mod compensate;
mod config_cmd;
mod migrate;
mod partitions;
mod reconcile;
mod replay;
mod run;
mod status;

// docs/reference/cli.md checked against this parser.
#[cfg(test)]
mod reference_tests;

use clap::{Args, Parser, Subcommand};
use rocketmq_outbox::config::{Config, RelayMode};
use rocketmq_outbox::operate::Action;
use serde_json::{json, Map, Value};
use std::path::PathBuf;

/// Prints a command's result: pretty JSON with `--json`, else as text by `as_text`.
pub(crate) fn print_report<T: serde::Serialize + ?Sized>(
    report: &T,
    json: bool,
    as_text: impl FnOnce(&T),
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        as_text(report);
    }
    Ok(())
}

/// `outbox-relay --version`: the crate version and the git commit of the build, from
/// `OUTBOX_RELAY_GIT_COMMIT` at build time (the Dockerfile passes it: the image's build context
/// has no `.git`) or else from `git describe` of the source tree (`-modified` when it had
/// uncommitted changes).
fn version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| {
        let commit = option_env!("OUTBOX_RELAY_GIT_COMMIT").unwrap_or(git_version::git_version!(
            args = ["--always", "--abbrev=12", "--dirty=-modified"],
            fallback = "unknown"
        ));
        format!("{} (commit {commit})", env!("CARGO_PKG_VERSION"))
    })
}

/// Reliable event delivery: MySQL/MariaDB outbox → RocketMQ, at least once, ordered per key.
#[derive(Debug, Parser)]
#[command(name = "outbox-relay", version = version(), about)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Settings that override the config file and the environment.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// TOML config file.
    #[arg(long, short = 'c', global = true, env = "OUTBOX_RELAY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Overrides `mysql.url`.
    #[arg(long, global = true)]
    pub mysql_url: Option<String>,
    /// Overrides `rocketmq.namesrv_addr`.
    #[arg(long, global = true)]
    pub namesrv_addr: Option<String>,
    /// Overrides `relay.mode`.
    #[arg(long, global = true, value_enum)]
    pub mode: Option<ModeArg>,
    /// Overrides `relay.shards`.
    #[arg(long, global = true)]
    pub shards: Option<usize>,
    /// Overrides `relay.checkpoint_dir`.
    #[arg(long, global = true)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Overrides `metrics.listen` (`""` disables the endpoint).
    #[arg(long, global = true)]
    pub metrics_listen: Option<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ModeArg {
    Cdc,
    Poll,
}

impl GlobalArgs {
    /// The flags that were given, as a partial config tree.
    fn overrides(&self) -> Value {
        let mut tree = Map::new();
        let mut set = |section: &str, key: &str, value: Value| {
            tree.entry(section)
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .expect("sections are objects")
                .insert(key.to_string(), value);
        };
        if let Some(url) = &self.mysql_url {
            set("mysql", "url", json!(url));
        }
        if let Some(addr) = &self.namesrv_addr {
            set("rocketmq", "namesrv_addr", json!(addr));
        }
        if let Some(mode) = self.mode {
            let mode = match mode {
                ModeArg::Cdc => RelayMode::Cdc,
                ModeArg::Poll => RelayMode::Poll,
            };
            set("relay", "mode", json!(mode));
        }
        if let Some(shards) = self.shards {
            set("relay", "shards", json!(shards));
        }
        if let Some(dir) = &self.checkpoint_dir {
            set("relay", "checkpoint_dir", json!(dir));
        }
        if let Some(listen) = &self.metrics_listen {
            set("metrics", "listen", json!(listen));
        }
        Value::Object(tree)
    }

    /// File ← environment ← these flags.
    pub fn load_config(&self) -> anyhow::Result<Config> {
        Ok(Config::load(self.config.as_deref(), self.overrides())?)
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the relay: tail the binlog and publish outbox events to RocketMQ (SIGTERM drains).
    Run(run::RunArgs),
    /// Create or upgrade the outbox tables (idempotent).
    Migrate(migrate::MigrateArgs),
    /// Check or print the effective configuration (passwords masked).
    Config(config_cmd::ConfigArgs),
    /// Delete SENT rows older than a retention, by primary key in small batches.
    Cleanup(cleanup::CleanupArgs),
    /// FAILED -> PENDING (audited): send the selected rows again.
    Retry(compensate::CompensateArgs),
    /// SENT -> PENDING (audited): publish the selected events once more.
    Resend(compensate::CompensateArgs),
    /// PENDING -> FAILED (audited): stop sending the selected rows.
    MarkFailed(compensate::CompensateArgs),
    /// Compare SENT events with a consumer group's event_dedup; record the missing ones.
    Reconcile(reconcile::ReconcileArgs),
    /// Outbox and relay health: counts, oldest PENDING, FAILED reasons, checkpoint, leader,
    /// binlog lag and a verdict (exit code 0 healthy, 1 lagging/stuck/failing).
    Status(status::StatusArgs),
    /// Publish the outbox INSERTs of a binlog range again (original event_ids; rows unchanged;
    /// audited). `--list-checkpoints` shows the saved checkpoint history.
    Replay(replay::ReplayArgs),
    /// Daily partitions of the outbox tables: `convert` once, `maintain` daily (or
    /// `[cleanup] partitions = true`), `status` to look.
    Partitions(partitions::PartitionsArgs),
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => run::run(&cli.global, args).await,
        Command::Migrate(args) => migrate::run(&cli.global, args).await,
        Command::Config(args) => config_cmd::run(&cli.global, args),
        Command::Cleanup(args) => cleanup::run(&cli.global, args).await,
        Command::Retry(args) => compensate::run(&cli.global, Action::Retry, args).await,
        Command::Resend(args) => compensate::run(&cli.global, Action::Resend, args).await,
        Command::MarkFailed(args) => compensate::run(&cli.global, Action::MarkFailed, args).await,
        Command::Reconcile(args) => reconcile::run(&cli.global, args).await,
        Command::Status(args) => status::run(&cli.global, args).await,
        Command::Replay(args) => replay::run(&cli.global, args).await,
        Command::Partitions(args) => partitions::run(&cli.global, args).await,
    }
}
