//! `outbox-relay reconcile --consumer-group G [--consumer-url URL] [--since 24h] [--grace 5m]`.

use super::GlobalArgs;
use clap::Args;
use rocketmq_outbox::db;
use rocketmq_outbox::operate::reconcile::DIFF_TABLE;
use rocketmq_outbox::operate::{select_tables, thousands, Reconcile, ReconcileReport};
use rocketmq_outbox::outbox::TableName;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    /// The consumer group whose event_dedup rows count as "seen downstream". Required.
    #[arg(long)]
    consumer_group: Option<String>,
    /// The consumer's database (default: mysql.url, the outbox's own database).
    #[arg(long, value_name = "mysql://…")]
    consumer_url: Option<String>,
    /// The consumer's dedup table.
    #[arg(long, default_value = "event_dedup")]
    consumer_table: String,
    /// Compare SENT rows created this long ago or later.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    since: Duration,
    /// Events sent less than this long ago are not expected downstream yet.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// Only this topic (repeatable; default: every topic).
    #[arg(long)]
    topic: Vec<String>,
    /// Only this outbox table (default: every table in `outbox.tables`).
    #[arg(long)]
    table: Vec<String>,
    /// Event ids per page and per lookup on the consumer side.
    #[arg(long, default_value_t = 1000)]
    chunk_size: usize,
    /// Report only; do not write outbox_reconcile_diff.
    #[arg(long)]
    dry_run: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub async fn run(global: &GlobalArgs, args: ReconcileArgs) -> anyhow::Result<()> {
    let Some(consumer_group) = args.consumer_group else {
        anyhow::bail!(
            "--consumer-group is required: event_dedup is keyed by (consumer_group, event_id); \
             pass the group of the consumer to compare with"
        );
    };
    let config = global.load_config()?;
    let tables = select_tables(&config.outbox_tables(), &args.table).map_err(anyhow::Error::msg)?;
    let consumer_table = TableName::parse(&args.consumer_table)
        .map_err(|e| anyhow::anyhow!("--consumer-table: {e}"))?;
    let reconcile = Reconcile {
        since: args.since,
        grace: args.grace,
        consumer_group,
        topics: args.topic,
        consumer_table,
        chunk_size: args.chunk_size,
        record: !args.dry_run,
    };
    let producer = db::pool(&config)?;
    let consumer = match &args.consumer_url {
        None => producer.clone(),
        Some(url) => {
            let mut consumer_config = config.clone();
            consumer_config.mysql.url = Some(url.clone());
            db::pool(&consumer_config).map_err(|e| anyhow::anyhow!("--consumer-url: {e}"))?
        }
    };
    let report = reconcile.run(&producer, &consumer, &tables).await;
    producer.disconnect().await.ok();
    if args.consumer_url.is_some() {
        consumer.disconnect().await.ok();
    }
    super::print_report(&report?, args.json, print_table)
}

fn print_table(report: &ReconcileReport) {
    println!(
        "consumer group `{}`: SENT rows created since {}, sent before {}",
        report.consumer_group, report.window_start, report.grace_cutoff
    );
    if !report.rows.is_empty() {
        println!(
            "{:<20} {:<19} {:<24} {:>9} {:>9} {:>9}",
            "table", "hour", "topic", "sent", "seen", "missing"
        );
    }
    for row in &report.rows {
        println!(
            "{:<20} {:<19} {:<24} {:>9} {:>9} {:>9}",
            row.table,
            row.hour,
            row.topic,
            thousands(row.sent),
            thousands(row.seen),
            thousands(row.missing)
        );
    }
    println!(
        "total: {} sent, {} seen downstream, {} missing ({} new), {} resolved since the last run, \
         {} still within the grace period",
        thousands(report.sent()),
        thousands(report.seen()),
        thousands(report.missing()),
        thousands(report.newly_missing),
        thousands(report.resolved),
        thousands(report.in_grace)
    );
    if report.recorded {
        if report.missing() > 0 {
            println!(
                "missing events are open rows in {DIFF_TABLE} (resolved_at IS NULL); run {}",
                report.run_id
            );
        }
    } else {
        println!("dry run: {DIFF_TABLE} not written");
    }
}
