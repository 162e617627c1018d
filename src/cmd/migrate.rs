//! `outbox-relay migrate [--status]`.

use super::GlobalArgs;
use clap::Args;
use mysql_async::Conn;
use rocketmq_outbox::{db, schema};

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Only list the migrations and whether each is applied.
    #[arg(long)]
    status: bool,
}

pub async fn run(global: &GlobalArgs, args: MigrateArgs) -> anyhow::Result<()> {
    let config = global.load_config()?;
    let opts = db::opts(&config)?;
    let database = opts.db_name().unwrap_or_default().to_string();
    let mut conn = Conn::new(opts).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot connect to MySQL at {}: {e}",
            rocketmq_outbox::config::redact_url_password(config.mysql_url().unwrap_or_default())
        )
    })?;
    if args.status {
        for (version, name, applied) in schema::status(&mut conn).await? {
            let state = if applied { "applied" } else { "pending" };
            println!("{version:>4}  {name:<24} {state}");
        }
    } else {
        let report = schema::migrate(&mut conn, &config.outbox_tables()).await?;
        for (version, name) in &report.applied {
            println!("applied {version:04} {name}");
        }
        for table in &report.created_tables {
            println!("created outbox table {table} (like outbox_event)");
        }
        println!(
            "database `{database}` is up to date ({} applied now, {} already applied)",
            report.applied.len(),
            report.already_applied
        );
    }
    conn.disconnect().await?;
    Ok(())
}
