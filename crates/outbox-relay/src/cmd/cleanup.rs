//! `outbox-relay cleanup [--older-than 7d] [--batch-size 1000] [--pause 100ms] [--dry-run]`;
//! each option left out takes its `[cleanup]` setting (`retention`, `batch_size`, `pause`).

use super::GlobalArgs;
use clap::Args;
use rocketmq_outbox::db;
use rocketmq_outbox::operate::{select_tables, thousands, Cleanup};
use std::time::Duration;

#[derive(Debug, Args)]
pub struct CleanupArgs {
    /// Delete SENT rows created longer ago than this (FAILED, PENDING and SENDING rows are
    /// kept) [default: `cleanup.retention`, 7d].
    #[arg(long, value_parser = humantime::parse_duration)]
    older_than: Option<Duration>,
    /// Most rows per DELETE statement [default: `cleanup.batch_size`, 1000].
    #[arg(long)]
    batch_size: Option<usize>,
    /// Sleep between two DELETE statements [default: `cleanup.pause`, 100ms].
    #[arg(long, value_parser = humantime::parse_duration)]
    pause: Option<Duration>,
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
    let settings = &config.cleanup;
    let cleanup = Cleanup {
        retention: args.older_than.unwrap_or(settings.retention),
        batch_size: args.batch_size.unwrap_or(settings.batch_size),
        pause: args.pause.unwrap_or(settings.pause),
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
