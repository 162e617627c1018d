//! `outbox-relay config check|show`.

use super::GlobalArgs;
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    action: ConfigAction,
}

#[derive(Debug, Subcommand)]
enum ConfigAction {
    /// Load the configuration and report the first problem, if any (the RocketMQ secret file
    /// is read too).
    Check,
    /// Print the effective configuration as TOML, with the MySQL password and the RocketMQ
    /// secret masked.
    Show,
}

pub fn run(global: &GlobalArgs, args: ConfigArgs) -> anyhow::Result<()> {
    let config = global.load_config()?;
    match args.action {
        ConfigAction::Check => {
            config.mysql_url()?;
            config.rocketmq.credentials()?;
            println!("configuration OK");
        }
        ConfigAction::Show => print!("{}", config.to_redacted_toml()),
    }
    Ok(())
}
