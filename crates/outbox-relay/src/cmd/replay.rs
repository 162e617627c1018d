//! `outbox-relay replay --from-gtid X [--to-gtid Y] --operator WHO --reason WHY`, or
//! `--from-time` / `--from-checkpoint N`, `--to-time`, `--dry-run`, `--list-checkpoints`.

use super::GlobalArgs;
use clap::{ArgGroup, Args};
use rocketmq_outbox::config::Config;
use rocketmq_outbox::operate::replay::{
    checkpoint_at_or_before, format_millis, open_history_store, parse_gtid_position, parse_time,
    unix_seconds, Progress, ReplayEvent, TxEnd, TxGtid,
};
use rocketmq_outbox::operate::{thousands, Replay, ReplaySummary};
use rocketmq_outbox::{BinlogPosition, RocketMqSink};
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often the progress line on stderr is refreshed.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("start").args(["from_gtid", "from_time", "from_checkpoint"])))]
#[command(after_help = "\
The range is (from, to]: the --from transaction itself is not replayed (pass the GTID position
printed after the last good transaction, e.g. @@gtid_binlog_pos), --to-gtid is replayed.
Outbox rows are not changed; one outbox_audit row records the run.
Examples:
  outbox-relay -c relay.toml replay --from-gtid 0-1-1200 --to-gtid 0-1-1450 \\
      --operator alice --reason \"INC-4714: consumer lost a window\"
  outbox-relay -c relay.toml replay --from-time '2025-06-01 02:00:00' --to-time '2025-06-01 02:30:00' --dry-run
  outbox-relay -c relay.toml replay --list-checkpoints")]
pub struct ReplayArgs {
    /// Start after this GTID position (MariaDB `0-1-100[,1-2-7]`, MySQL `uuid:1-100`).
    #[arg(long, value_name = "GTID")]
    from_gtid: Option<String>,
    /// Start at the newest saved checkpoint at or before this time (UTC: `2025-06-01 13:00:00`
    /// or `2025-06-01T13:00:00Z`; or a duration ago such as `2h`).
    #[arg(long, value_name = "TIME")]
    from_time: Option<String>,
    /// Start at checkpoint N of `--list-checkpoints`.
    #[arg(long, value_name = "N")]
    from_checkpoint: Option<u64>,
    /// Replay up to and including this GTID position (default: the server's end of binlog when
    /// the replay starts).
    #[arg(long, value_name = "GTID")]
    to_gtid: Option<String>,
    /// Stop at the first transaction committed after this time (binlog timestamps, whole
    /// seconds).
    #[arg(long, value_name = "TIME")]
    to_time: Option<String>,
    /// Who runs this (written to outbox_audit). Required unless --dry-run.
    #[arg(long)]
    operator: Option<String>,
    /// Why (written to outbox_audit). Required unless --dry-run.
    #[arg(long)]
    reason: Option<String>,
    /// List the events of the range on stdout; send and write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print the checkpoint history (from relay.checkpoint_dir) and exit.
    #[arg(long)]
    list_checkpoints: bool,
    /// Replica server id of the replay's binlog reader (default: the relay's mysql.server_id + 1;
    /// must differ from every replica's).
    #[arg(long)]
    server_id: Option<u32>,
    /// Machine-readable output: JSON lines for listed events, the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub async fn run(global: &GlobalArgs, args: ReplayArgs) -> anyhow::Result<()> {
    let config = global.load_config()?;
    if args.list_checkpoints {
        return list_checkpoints(&config, args.json);
    }
    let replay = Replay {
        from: start(&config, &args)?,
        to: args
            .to_gtid
            .as_deref()
            .map(parse_gtid_position)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--to-gtid: {e}"))?,
        to_time: args
            .to_time
            .as_deref()
            .map(parse_time)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--to-time: {e}"))?
            .map(unix_seconds),
        operator: args.operator.clone().unwrap_or_default(),
        reason: args.reason.clone().unwrap_or_default(),
        server_id: args
            .server_id
            .unwrap_or(config.mysql.server_id.wrapping_add(1)),
    };
    replay.validate(&config, args.dry_run)?;
    let cancel = CancellationToken::new();
    {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\ninterrupted: finishing the events already handed to the senders");
                cancel.cancel();
            }
        });
    }
    let mut display = Display::new(args.json);
    let observer = |event: ReplayEvent<'_>| display.show(event, args.dry_run);
    let summary = if args.dry_run {
        replay.dry_run(&config, observer, cancel).await?
    } else {
        config.namesrv_addr()?;
        let sink = Arc::new(RocketMqSink::start(&config.rocketmq).await?);
        let summary = replay
            .run(&config, Arc::clone(&sink), observer, cancel)
            .await;
        if let Ok(sink) = Arc::try_unwrap(sink) {
            sink.shutdown().await;
        }
        summary?
    };
    display.end();
    print_summary(&summary, args.json)?;
    if summary.failed > 0 {
        anyhow::bail!(
            "{} event(s) were not acknowledged with SEND_OK",
            summary.failed
        );
    }
    Ok(())
}

/// The start position from --from-gtid, --from-time or --from-checkpoint.
fn start(config: &Config, args: &ReplayArgs) -> anyhow::Result<BinlogPosition> {
    if let Some(gtid) = &args.from_gtid {
        return parse_gtid_position(gtid).map_err(|e| anyhow::anyhow!("--from-gtid: {e}"));
    }
    let store = match (&args.from_time, args.from_checkpoint) {
        (None, None) => anyhow::bail!(
            "say where to start: --from-gtid, --from-time or --from-checkpoint \
             (see --list-checkpoints)"
        ),
        _ => open_history_store(&config.relay.checkpoint_dir)?,
    };
    let entry = match (&args.from_time, args.from_checkpoint) {
        (Some(time), _) => {
            let time = parse_time(time).map_err(|e| anyhow::anyhow!("--from-time: {e}"))?;
            checkpoint_at_or_before(store.history(), time)?
        }
        (None, Some(n)) => store.history().get(n)?.ok_or_else(|| {
            anyhow::anyhow!("no checkpoint #{n} in the history: see --list-checkpoints")
        })?,
        (None, None) => unreachable!("checked above"),
    };
    eprintln!(
        "starting after checkpoint #{} saved at {}: {}",
        entry.number,
        format_millis(entry.at_millis),
        entry.position
    );
    Ok(entry.position)
}

fn list_checkpoints(config: &Config, json: bool) -> anyhow::Result<()> {
    let store = open_history_store(&config.relay.checkpoint_dir)?;
    let entries = store.history().list()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
        return Ok(());
    }
    if entries.is_empty() {
        println!(
            "no checkpoints in the history of {} (the relay records at most one per minute while it runs)",
            config.relay.checkpoint_dir.display()
        );
        return Ok(());
    }
    println!("{:>6}  {:<24}  position", "N", "saved at (UTC)");
    for e in &entries {
        println!(
            "{:>6}  {:<24}  {}",
            e.number,
            format_millis(e.at_millis),
            e.position
        );
    }
    Ok(())
}

/// Listed events on stdout; the progress line on stderr (rewritten in place on a terminal).
struct Display {
    json: bool,
    terminal: bool,
    last: Option<Instant>,
    line: Option<String>,
}

impl Display {
    fn new(json: bool) -> Self {
        Display {
            json,
            terminal: std::io::stderr().is_terminal(),
            last: None,
            line: None,
        }
    }

    fn show(&mut self, event: ReplayEvent<'_>, dry_run: bool) {
        match event {
            ReplayEvent::Event { row, commit } if dry_run => {
                let m = &row.message;
                let line = match self.json {
                    true => serde_json::json!({
                        "table": row.table.to_string(), "id": row.id, "event_id": m.event_id,
                        "biz_key": m.biz_key, "topic": m.topic, "commit": commit_name(commit),
                    })
                    .to_string(),
                    false => format!(
                        "event {} key {} topic {} ({} id {}, commit {})",
                        m.event_id,
                        m.biz_key,
                        m.topic,
                        row.table,
                        row.id,
                        commit_name(commit)
                    ),
                };
                println!("{line}");
            }
            ReplayEvent::Event { .. } => {}
            ReplayEvent::Progress(progress) => self.progress(progress),
        }
    }

    fn progress(&mut self, p: &Progress) {
        let line = format!(
            "replay: {} events ({} sent, {} failed) in {} transactions, at {}",
            thousands(p.events),
            thousands(p.sent),
            thousands(p.failed),
            thousands(p.transactions),
            p.position
        );
        self.line = Some(line);
        if self.last.is_some_and(|t| t.elapsed() < PROGRESS_EVERY) {
            return;
        }
        self.last = Some(Instant::now());
        self.flush_line();
    }

    fn flush_line(&mut self) {
        let Some(line) = self.line.take() else {
            return;
        };
        let mut err = std::io::stderr();
        let _ = match self.terminal {
            true => write!(err, "\r\x1b[2K{line}"),
            false => writeln!(err, "{line}"),
        };
    }

    /// The last progress line, then a newline on a terminal.
    fn end(&mut self) {
        self.flush_line();
        if self.terminal && self.last.is_some() {
            eprintln!();
        }
    }
}

fn commit_name(end: &TxEnd) -> String {
    match &end.gtid {
        Some(TxGtid::MariaDb(g)) => g.to_string(),
        Some(TxGtid::MySql(source, gno)) => format!("{}:{gno}", source.uuid),
        None => format!("{}:{}", end.file, end.end_pos),
    }
}

fn print_summary(summary: &ReplaySummary, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(summary)?);
        return Ok(());
    }
    for f in &summary.failures {
        println!("FAILED event {}: {}", f.event_id, f.reason);
    }
    if summary.outside_range > 0 {
        println!(
            "{} transactions of other GTID domains or sources were outside the range",
            summary.outside_range
        );
    }
    println!("{}", summary.line());
    Ok(())
}
