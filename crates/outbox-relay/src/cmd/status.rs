//! `outbox-relay status [--json] [--lag-threshold 30s] [--behind-threshold 10000]
//! [--failing-window 1h]`.

use super::GlobalArgs;
use clap::Args;
use rocketmq_outbox::operate::status::{
    BinlogLag, RelayState, StatusOptions, StatusReport, TableStatus,
};
use rocketmq_outbox::operate::thousands;
use std::time::Duration;

/// Exit code when the status could not be read at all.
const EXIT_UNKNOWN: i32 = 2;

#[derive(Debug, Args)]
#[command(after_help = "\
Verdict (most severe first):
  stuck    a SENDING row's lease expired, or the oldest PENDING row is older than
           --lag-threshold while the checkpoint has not moved for --stuck-after,
           or (CDC mode) no instance streams: no leader, or the leader's lease ran
           out over 30 s ago
  failing  rows were marked FAILED within --failing-window
  lagging  the oldest PENDING row is older than --lag-threshold, or the mirrored
           checkpoint is more than --behind-threshold transactions behind the server
  healthy  none of the above

Exit code: 0 healthy; 1 lagging, stuck or failing; 2 the status could not be read.
The database password is never printed.")]
pub struct StatusArgs {
    /// The oldest PENDING row older than this makes the verdict `lagging`.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    lag_threshold: Duration,
    /// The mirrored checkpoint more than this many transactions behind the server's end of
    /// binlog makes the verdict `lagging` (the mirror is written every 2 s: the default is 2 s
    /// of 5,000 transactions/s; raise it for busier servers).
    #[arg(long, default_value_t = rocketmq_outbox::operate::status::DEFAULT_BEHIND_THRESHOLD)]
    behind_threshold: u64,
    /// A checkpoint unchanged this long while rows wait makes the verdict `stuck`.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    stuck_after: Duration,
    /// Rows marked FAILED within this window make the verdict `failing`.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    failing_window: Duration,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub async fn run(global: &GlobalArgs, args: StatusArgs) -> anyhow::Result<()> {
    let config = global.load_config()?;
    let options = StatusOptions {
        lag_threshold: args.lag_threshold,
        stuck_after: args.stuck_after,
        failing_window: args.failing_window,
        behind_threshold: args.behind_threshold,
    };
    let report = match StatusReport::gather(&config, &options).await {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: cannot read the status: {e:#}");
            std::process::exit(EXIT_UNKNOWN);
        }
    };
    super::print_report(&report, args.json, print_report)?;
    let code = report.exit_code();
    if code != 0 {
        use std::io::Write;
        std::io::stdout().flush().ok();
        std::process::exit(code.into());
    }
    Ok(())
}

fn print_report(r: &StatusReport) {
    println!(
        "outbox-relay status: relay `{}` ({} mode), database time {}",
        r.relay.name,
        serde_json::to_value(r.mode)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        r.database_time
    );
    println!();
    print_tables(r);
    println!();
    print_checkpoint(&r.relay);
    print_leader(&r.relay);
    print_binlog(r);
    print_prepared_xa(r);
    print_dead_letters(r);
    println!();
    println!("{}", r.verdict_line());
}

/// One line per table's row counts, then each table's details.
fn print_tables(r: &StatusReport) {
    println!(
        "{:<24} {:>9} {:>9} {:>11} {:>9} {:>14} {:>8} {:>12}",
        "table", "PENDING", "SENDING", "SENT", "FAILED", "oldest PENDING", "expired", "FAILED new"
    );
    for t in &r.tables {
        println!(
            "{:<24} {:>9} {:>9} {:>11} {:>9} {:>14} {:>8} {:>12}",
            t.table,
            thousands(t.pending),
            thousands(t.sending),
            thousands(t.sent),
            thousands(t.failed),
            format!("{:.1} s", t.oldest_pending_seconds),
            thousands(t.expired_leases),
            thousands(t.failed_recently),
        );
    }
    println!(
        "(expired: SENDING rows whose lease has passed; FAILED new: marked FAILED in the last {})",
        humantime::format_duration(r.thresholds.failing_window)
    );
    for t in &r.tables {
        print_table_details(t);
    }
}

fn print_checkpoint(relay: &RelayState) {
    match (&relay.checkpoint, &relay.checkpoint_at) {
        (Some(position), at) => println!(
            "checkpoint  {position}, saved {} ({})",
            at.as_deref().unwrap_or("?"),
            relay
                .checkpoint_age_seconds
                .map_or("age unknown".into(), |a| format!("{a:.1} s ago"))
        ),
        (None, _) => println!("checkpoint  none mirrored in outbox_relay_state"),
    }
}

/// The leader and how it was elected (lock, or a lease renewed or run out), or why there is none.
fn print_leader(relay: &RelayState) {
    match &relay.leader {
        Some(leader) => match relay.lease_left_seconds {
            None => println!(
                "leader      {leader} (epoch {}, elected by lock{})",
                relay.leader_epoch,
                match relay.lock_held {
                    Some(false) => ": the lock is free, nobody holds it",
                    _ => "",
                }
            ),
            Some(left) if left >= 0.0 => println!(
                "leader      {leader} (epoch {}, elected by lease: renewed, runs out in {left:.1} s unless renewed)",
                relay.leader_epoch
            ),
            Some(left) => println!(
                "leader      {leader} (epoch {}, elected by lease: ran out {:.1} s ago, not renewed)",
                relay.leader_epoch,
                -left
            ),
        },
        None if relay.found => println!(
            "leader      none (last epoch {}): no instance streams",
            relay.leader_epoch
        ),
        None => println!(
            "leader      none: no relay named `{}` has run here",
            relay.name
        ),
    }
}

/// The server's binlog position and how far the checkpoint is behind it; nothing when neither
/// the position nor an error was read.
fn print_binlog(r: &StatusReport) {
    match (&r.binlog, &r.binlog_error) {
        (Some(lag), _) => {
            let behind = match (r.relay.position.is_some(), binlog_behind(lag)) {
                (false, _) => "no checkpoint to compare".to_string(),
                (true, None) => "distance unknown (different binlog files)".to_string(),
                (true, Some(behind)) => format!("checkpoint behind by {behind}"),
            };
            println!("binlog      server at {}; {behind}", lag.server_position);
        }
        (None, Some(error)) => println!("binlog      position unavailable: {error}"),
        (None, None) => {}
    }
}

/// `N transactions (domain D: n, …), N bytes`, whichever parts are known; `None` when neither is.
fn binlog_behind(lag: &BinlogLag) -> Option<String> {
    let mut behind = Vec::new();
    if let Some(n) = lag.transactions_behind {
        let domains: Vec<String> = lag
            .domains
            .iter()
            .map(|d| format!("domain {}: {}", d.domain, d.behind))
            .collect();
        let detail = match domains.len() {
            0 => String::new(),
            _ => format!(" ({})", domains.join(", ")),
        };
        behind.push(format!("{} transactions{detail}", thousands(n)));
    }
    if let Some(bytes) = lag.bytes_behind {
        behind.push(format!("{} bytes", thousands(bytes)));
    }
    (!behind.is_empty()).then(|| behind.join(", "))
}

fn print_prepared_xa(r: &StatusReport) {
    match (&r.prepared_xa[..], &r.prepared_xa_error) {
        (_, Some(error)) => println!("XA          prepared transactions unknown: {error}"),
        ([], None) => println!("XA          no prepared transaction (XA RECOVER)"),
        (xids, None) => println!(
            "XA          {} prepared, not ended (each holds its events, and the relay's \
             checkpoint until parked): {}",
            xids.len(),
            xids.join(" ")
        ),
    }
}

fn print_dead_letters(r: &StatusReport) {
    if let Some(error) = &r.dead_letters_error {
        println!("DLQ         dead-letter queues unknown: {error}");
    }
    for q in &r.dead_letters {
        println!(
            "DLQ         group {}: {} stored, {} ever ({}){}",
            q.group,
            thousands(q.stored),
            thousands(q.received),
            q.topic,
            if q.stored > 0 {
                ": events this group gave up on (runbook: dead letters)"
            } else {
                ""
            }
        );
    }
}

fn print_table_details(t: &TableStatus) {
    if let Some(o) = &t.oldest_pending {
        println!(
            "{}: oldest PENDING id {} event {} topic {} created {}",
            t.table, o.id, o.event_id, o.topic, o.created_at
        );
    }
    if !t.waiting.is_empty() {
        println!(
            "{}: topics with PENDING rows, longest waiting first:",
            t.table
        );
        for w in &t.waiting {
            let keys = match w.oldest_keys.is_empty() {
                true => String::new(),
                false => format!("  oldest keys: {}", w.oldest_keys.join(", ")),
            };
            println!(
                "  {:<32} {:>9} PENDING, oldest {:.1} s{keys}",
                w.topic,
                thousands(w.pending),
                w.oldest_seconds
            );
        }
    }
    if !t.failed_reasons.is_empty() {
        println!(
            "{}: FAILED rows by reason (top {}):",
            t.table,
            t.failed_reasons.len()
        );
        for reason in &t.failed_reasons {
            println!("  {:>9}  {}", thousands(reason.count), reason.reason);
        }
    }
}
