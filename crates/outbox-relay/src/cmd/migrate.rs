//! `outbox-relay migrate [--status | --plan] [--max-rows N]`.

use super::GlobalArgs;
use clap::Args;
use mysql_async::Conn;
use rocketmq_outbox::{db, schema};

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Only list the migrations and whether each is applied, and the outbox tables adopted.
    #[arg(long, conflicts_with = "plan")]
    status: bool,
    /// Print the SQL migrate would run (the adoption of existing outbox tables, then the
    /// migrations not yet applied) and change nothing: for a DBA who applies schema changes.
    #[arg(long)]
    plan: bool,
    /// Largest existing outbox table (the server's row estimate) migrate builds an index on by
    /// itself; over it, migrate changes nothing and prints the statements to run. 0: no limit.
    #[arg(long, env = "OUTBOX_MIGRATE_MAX_ROWS", default_value_t = schema::adopt::DEFAULT_MAX_ROWS)]
    max_rows: u64,
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
    let rule = schema::adopt::OnlineRule {
        max_rows: (args.max_rows > 0).then_some(args.max_rows),
    };
    if args.plan {
        print!(
            "-- outbox-relay migrate --plan: database `{database}`\n\n{}",
            schema::plan(&mut conn, &config.outbox_tables(), rule).await?
        );
    } else if args.status {
        for (version, name, applied) in schema::status(&mut conn).await? {
            let state = if applied { "applied" } else { "pending" };
            println!("{version:>4}  {name:<24} {state}");
        }
        for (table, at, statements) in schema::adoptions(&mut conn).await? {
            println!("adopted {table} at {at}:");
            for line in statements.lines() {
                println!("      {line}");
            }
        }
    } else {
        let report = schema::migrate_with(&mut conn, &config.outbox_tables(), rule).await?;
        print_changes("adopted", &report.adopted);
        for (version, name) in &report.applied {
            println!("applied {version:04} {name}");
        }
        print_changes("finished", &report.finished);
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

/// Prints each changed outbox table with the statements run on it.
fn print_changes(what: &str, changes: &[(String, Vec<String>)]) {
    for (table, statements) in changes {
        println!("{what} outbox table {table} (recorded in outbox_schema_changes):");
        for statement in statements {
            println!("  {statement}");
        }
    }
}
