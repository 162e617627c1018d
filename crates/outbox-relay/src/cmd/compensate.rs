//! `outbox-relay retry | resend | mark-failed --operator WHO --reason WHY <selector>`.

use super::GlobalArgs;
use clap::Args;
use rocketmq_outbox::db;
use rocketmq_outbox::operate::{
    select_tables, Action, Compensation, CompensationReport, Selection, TimeBound,
};

#[derive(Debug, Args)]
pub struct CompensateArgs {
    /// Who runs this (written to outbox_audit). Required.
    #[arg(long)]
    operator: Option<String>,
    /// Why (written to outbox_audit, e.g. a ticket). Required.
    #[arg(long)]
    reason: Option<String>,
    /// Outbox row id (repeatable). Needs --table when several outbox tables are configured.
    #[arg(long = "id", value_name = "ID")]
    ids: Vec<i64>,
    /// Event id (repeatable).
    #[arg(long = "event-id", value_name = "EVENT_ID")]
    event_ids: Vec<String>,
    /// Only rows of this topic.
    #[arg(long)]
    topic: Option<String>,
    /// Only rows whose last_error matches this SQL LIKE pattern, e.g. '%no route%'.
    #[arg(long, alias = "status-reason-like", value_name = "PATTERN")]
    error_like: Option<String>,
    /// Only rows created before this: a duration ago (2h) or a database time (2024-05-01 13:00).
    #[arg(long, value_name = "TIME")]
    created_before: Option<TimeBound>,
    /// Only rows created at or after this: a duration ago (2h) or a database time.
    #[arg(long, value_name = "TIME")]
    created_after: Option<TimeBound>,
    /// Most rows handled by one run (run again for more).
    #[arg(long, default_value_t = 1000)]
    limit: usize,
    /// Only this outbox table (default: every table in `outbox.tables`).
    #[arg(long)]
    table: Vec<String>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub async fn run(global: &GlobalArgs, action: Action, args: CompensateArgs) -> anyhow::Result<()> {
    let config = global.load_config()?;
    let tables = select_tables(&config.outbox_tables(), &args.table).map_err(anyhow::Error::msg)?;
    let command = Compensation {
        action,
        operator: args.operator.unwrap_or_default(),
        reason: args.reason.unwrap_or_default(),
        selection: Selection {
            ids: args.ids,
            event_ids: args.event_ids,
            topic: args.topic,
            error_like: args.error_like,
            created_before: args.created_before,
            created_after: args.created_after,
            limit: args.limit,
        },
    };
    // Before connecting: a missing --operator is reported without a database.
    command.validate(&tables)?;
    let pool = db::pool(&config)?;
    let report = command.run(&pool, &tables).await;
    pool.disconnect().await.ok();
    super::print_report(&report?, args.json, print_table)
}

fn print_table(report: &CompensationReport) {
    if !report.rows.is_empty() {
        println!(
            "{:<20} {:>10}  {:<38} {:<24} {:<8} {:<8} outcome",
            "table", "id", "event_id", "topic", "before", "after"
        );
    }
    let status = |s: Option<rocketmq_outbox::outbox::Status>| s.map_or("-", |s| s.name());
    for row in &report.rows {
        let outcome = serde_json::to_value(row.outcome)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        println!(
            "{:<20} {:>10}  {:<38} {:<24} {:<8} {:<8} {}",
            row.table,
            row.id,
            row.event_id,
            row.topic,
            status(row.before),
            status(row.after),
            outcome.replace('_', " ")
        );
    }
    for missing in &report.not_found {
        println!("not found: {missing}");
    }
    println!("{}", report.summary_line());
}
