//! `outbox-relay cleanup [--older-than 7d] [--batch-size 1000] [--pause 100ms] [--dry-run]`.

use super::GlobalArgs;
use clap::Args;
use rocketmq_outbox::db;
use rocketmq_outbox::operate::{select_tables, thousands, Cleanup};
use std::time::Duration;

#[derive(Debug, Args)]
pub struct CleanupArgs {
    /// Delete SENT rows created longer ago than this (FAILED, PENDING and SENDING rows are kept).
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    older_than: Duration,
    /// Most rows per DELETE statement.
    #[arg(long, default_value_t = 1000)]
    batch_size: usize,
    /// Sleep between two DELETE statements.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pause: Duration,
    /// Only count the rows that would be deleted.
    #[arg(long)]
    dry_run: bool,
    /// Only this outbox table (default: every table in `outbox.tables`).
    #[arg(long)]
    table: Vec<String>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub async fn run(global: &GlobalArgs, args: CleanupArgs) -> anyhow::Result<()> {
    let config = global.load_config()?;
    let tables = select_tables(&config.outbox_tables(), &args.table).map_err(anyhow::Error::msg)?;
    let cleanup = Cleanup {
        retention: args.older_than,
        batch_size: args.batch_size,
        pause: args.pause,
        dry_run: args.dry_run,
    };
    cleanup.validate()?;
    let pool = db::pool(&config)?;
    let summary = cleanup
        .run_once(&pool, &tables, |p| {
            eprintln!(
                "cleanup {}: batch {} deleted {} rows ({} so far)",
                p.table,
                p.batch,
                thousands(p.deleted),
                thousands(p.table_total)
            );
        })
        .await;
    pool.disconnect().await.ok();
    let summary = summary?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(());
    }
    let verb = if summary.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    for t in &summary.tables {
        println!(
            "{}: {verb} {} SENT rows created before {} ({} batches)",
            t.table,
            thousands(t.deleted),
            t.cutoff,
            t.batches
        );
    }
    println!(
        "total: {verb} {} rows in {} batches",
        thousands(summary.deleted()),
        summary.batches()
    );
    Ok(())
}
