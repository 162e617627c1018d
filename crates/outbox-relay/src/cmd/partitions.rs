//! `outbox-relay partitions convert | maintain | status`: daily partitions of the outbox tables.

use super::GlobalArgs;
use clap::{Args, Subcommand};
use rocketmq_outbox::db;
use rocketmq_outbox::operate::partitions::{self, Convert, ConvertOutcome, Maintain};
use rocketmq_outbox::operate::{select_tables, thousands};
use std::time::Duration;

#[derive(Debug, Args)]
pub struct PartitionsArgs {
    #[command(subcommand)]
    command: PartitionsCommand,
}

#[derive(Debug, Subcommand)]
enum PartitionsCommand {
    /// Partition each outbox table by day of created_at, with a catch-all `p_future`
    /// (a table copy; audited; does nothing to a table already partitioned).
    Convert(ChangeArgs),
    /// Create the coming days' partitions; drop the days past the retention that hold no
    /// PENDING, SENDING or FAILED row (one audit row per drop).
    Maintain(MaintainArgs),
    /// List the partitions: bounds, rows, unfinished rows, days ahead.
    Status(CommonArgs),
}

#[derive(Debug, Args)]
struct CommonArgs {
    /// Only this outbox table (default: every table in `outbox.tables`).
    #[arg(long)]
    table: Vec<String>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ChangeArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Who runs this (written to outbox_audit). Required unless --dry-run.
    #[arg(long)]
    operator: Option<String>,
    /// Why (written to outbox_audit). Required unless --dry-run.
    #[arg(long)]
    reason: Option<String>,
    /// Day partitions to have after today (default: `cleanup.partitions_ahead`, 7).
    #[arg(long)]
    ahead: Option<u32>,
    /// Longest wait for the table's metadata lock before giving up.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    lock_wait: Duration,
    /// Say what would be done; change nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, Args)]
struct MaintainArgs {
    #[command(flatten)]
    change: ChangeArgs,
    /// Drop only days wholly older than this (default: `cleanup.retention`, 7d).
    #[arg(long, value_parser = humantime::parse_duration)]
    retention: Option<Duration>,
}

pub async fn run(global: &GlobalArgs, args: PartitionsArgs) -> anyhow::Result<()> {
    let config = global.load_config()?;
    let common = match &args.command {
        PartitionsCommand::Convert(c) => &c.common,
        PartitionsCommand::Maintain(m) => &m.change.common,
        PartitionsCommand::Status(c) => c,
    };
    let tables =
        select_tables(&config.outbox_tables(), &common.table).map_err(anyhow::Error::msg)?;
    let json = common.json;
    let cleanup = &config.cleanup;
    let pool = db::pool(&config)?;
    let result = match args.command {
        PartitionsCommand::Convert(c) => {
            let convert = Convert {
                ahead: c.ahead.unwrap_or(cleanup.partitions_ahead),
                operator: c.operator.unwrap_or_default(),
                reason: c.reason.unwrap_or_default(),
                dry_run: c.dry_run,
                lock_wait: c.lock_wait,
            };
            convert
                .run(&pool, &tables, |line| eprintln!("{line}"))
                .await
                .map(|done| print_convert(&done, json))
        }
        PartitionsCommand::Maintain(m) => {
            let c = m.change;
            let maintain = Maintain {
                ahead: c.ahead.unwrap_or(cleanup.partitions_ahead),
                retention: m.retention.unwrap_or(cleanup.retention),
                operator: c.operator.unwrap_or_default(),
                reason: c.reason.unwrap_or_default(),
                dry_run: c.dry_run,
                lock_wait: c.lock_wait,
            };
            maintain
                .run(&pool, &tables)
                .await
                .map(|done| print_maintain(&done, json, c.dry_run))
        }
        PartitionsCommand::Status(_) => partitions::status(&pool, &tables)
            .await
            .map(|done| print_status(&done, json)),
    };
    pool.disconnect().await.ok();
    result??;
    Ok(())
}

fn print_convert(done: &[partitions::TableConvert], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(done)?);
        return Ok(());
    }
    for t in done {
        let days = format!(
            "{} partitions ({} .. {}, and p_future)",
            t.partitions,
            t.first_day.as_deref().unwrap_or("-"),
            t.last_day.as_deref().unwrap_or("-")
        );
        match t.outcome {
            ConvertOutcome::AlreadyPartitioned => {
                println!("{}: already partitioned, {days}: nothing done", t.table)
            }
            ConvertOutcome::WouldConvert => println!(
                "{}: would convert {} rows into {days}; key changes: {}",
                t.table,
                thousands(t.rows),
                t.key_changes.join("; ")
            ),
            ConvertOutcome::Converted => println!(
                "{}: converted {} rows into {days} in {} ms; key changes: {}",
                t.table,
                thousands(t.rows),
                t.took_ms,
                t.key_changes.join("; ")
            ),
        }
    }
    Ok(())
}

fn print_maintain(
    done: &[partitions::TableMaintain],
    json: bool,
    dry_run: bool,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(done)?);
        return Ok(());
    }
    let (create, drop) = if dry_run {
        ("would create", "would drop")
    } else {
        ("created", "dropped")
    };
    for t in done {
        if !t.partitioned {
            println!(
                "{}: not partitioned, nothing done (run `outbox-relay partitions convert`)",
                t.table
            );
            continue;
        }
        if let Some(why) = &t.skipped {
            println!("{}: {why}", t.table);
            continue;
        }
        let dropped: Vec<String> = t
            .dropped
            .iter()
            .map(|d| format!("{} (~{} rows)", d.partition, thousands(d.rows_estimate)))
            .collect();
        println!(
            "{}: {create} [{}]; {drop} [{}]; {} days ahead; cutoff {}",
            t.table,
            t.created.join(", "),
            dropped.join(", "),
            t.days_ahead,
            t.cutoff
        );
        for kept in &t.kept {
            println!(
                "{}: kept {}: {} PENDING/SENDING/FAILED rows (retry or mark-failed them)",
                t.table, kept.partition, kept.unfinished
            );
        }
    }
    Ok(())
}

fn print_status(done: &[partitions::TableStatus], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(done)?);
        return Ok(());
    }
    for t in done {
        if !t.partitioned {
            println!("{}: not partitioned", t.table);
            continue;
        }
        println!(
            "{}: {} partitions, {} days ahead of {} (database date)",
            t.table,
            t.partitions.len(),
            t.days_ahead,
            t.today
        );
        println!(
            "  {:<12} {:<12} {:>14} {:>11}",
            "partition", "below", "rows (est.)", "unfinished"
        );
        for p in &t.partitions {
            println!(
                "  {:<12} {:<12} {:>14} {:>11}",
                p.name,
                p.below,
                thousands(p.rows_estimate),
                thousands(p.unfinished)
            );
        }
    }
    Ok(())
}
