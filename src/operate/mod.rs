//! Operating the outbox by hand: the library behind `outbox-relay cleanup`, `retry` / `resend` /
//! `mark-failed`, `reconcile`, `status`, `replay` and `partitions`. Each command is also usable from code (e.g. `run` can call
//! [`Cleanup::run_once`] periodically).
//!
//! Guarantees each command keeps:
//!
//! - [`cleanup`]: deletes only SENT rows created before a fixed cutoff (now minus
//!   the retention, taken once from the database clock). Never PENDING, SENDING or FAILED rows,
//!   whatever their age. Deletes by primary key in batches of at most `batch_size` rows, each
//!   batch its own short statement (`DELETE … WHERE id IN (…) AND <SENT>`), with a pause
//!   between batches: never one big DELETE holding locks and flooding replicas. A dry run only
//!   counts.
//! - [`compensate`]: every change is one row's `UPDATE`, guarded by the status the row was read
//!   with (`AND status = <from>`), and its `outbox_audit` row (operator, reason, before, after,
//!   result) is written in the same transaction: there is no change without its audit row and
//!   no audit row without its change. A row already in the target state, or in a state the
//!   action does not apply to, is left alone and gets no audit row, so repeating a command
//!   changes nothing the second time. A row the relay changes concurrently is not overwritten.
//! - [`reconcile`]: reads the outbox and the consumer's `event_dedup`; the only table it writes
//!   is its own work queue `outbox_reconcile_diff` (one row per consumer group, outbox table and
//!   event_id, so repeating a run never duplicates a row). It never changes business data or
//!   outbox rows.
//! - [`status`]: reads only; the verdict rules are in its module doc.
//! - [`replay`]: re-publishes the outbox INSERTs of a binlog range through the relay's shard
//!   senders, with their original `event_id`; it never changes outbox rows and writes one
//!   `outbox_audit` summary row per run.
//! - `table_metrics`: reads only; refreshes the outbox table gauges of `/metrics` on a timer
//!   in every running instance.
//! - [`Watchers`]: the table gauges, dead-letter gauges and periodic cleanup that run beside a
//!   relay in its process.
//! - [`partitions`]: daily partitions with a catch-all, so an INSERT never lacks a partition; a
//!   day is dropped only when it is wholly past the retention and holds no PENDING, SENDING or
//!   FAILED row, checked and dropped under a table lock, one `outbox_audit` row per drop.
//!
//! Times are the database's: windows and cutoffs are computed with `NOW(3)` on the server, so
//! the machine running the command may have any clock and time zone.

pub mod cleanup;
pub mod compensate;
pub mod dead_letters;
pub mod partitions;
pub mod reconcile;
pub mod replay;
pub mod selection;
pub mod status;
pub(crate) mod table_metrics;
mod watchers;

pub use watchers::Watchers;

pub use cleanup::{Cleanup, CleanupProgress, CleanupSummary};
pub use compensate::{Action, Compensation, CompensationReport, RowOutcome, RowReport};
pub use reconcile::{Reconcile, ReconcileReport};
pub use replay::{Replay, ReplaySummary};
pub use selection::{Selection, TimeBound};
pub use status::{StatusOptions, StatusReport, Verdict};

use crate::outbox::TableName;
use mysql_async::prelude::*;
use std::time::Duration;

/// The outbox tables a command works on: `only` (each must be one of `configured`, given as
/// `table` or `schema.table`), or all of `configured` when `only` is empty.
pub fn select_tables(configured: &[TableName], only: &[String]) -> Result<Vec<TableName>, String> {
    if only.is_empty() {
        return Ok(configured.to_vec());
    }
    let names: Vec<String> = configured.iter().map(ToString::to_string).collect();
    only.iter()
        .map(|wanted| {
            configured
                .iter()
                .find(|t| t.to_string() == *wanted)
                .cloned()
                .ok_or_else(|| {
                    format!(
                        "--table {wanted} is not in outbox.tables ({}): pass one of those",
                        names.join(", ")
                    )
                })
        })
        .collect()
}

/// `?, ?, …, ?` for an `IN (…)` list of `n` values.
pub(crate) fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// The database clock `ago` in the past, as `YYYY-MM-DD HH:MM:SS.fff` (a value every later
/// statement can compare DATETIME(3) columns with).
pub(crate) async fn db_time_ago(
    conn: &mut impl Queryable,
    ago: Duration,
) -> Result<String, mysql_async::Error> {
    let micros = u64::try_from(ago.as_micros()).unwrap_or(u64::MAX);
    let time: Option<String> = conn
        .exec_first(
            "SELECT CAST(CAST(NOW(3) - INTERVAL ? MICROSECOND AS DATETIME(3)) AS CHAR)",
            (micros,),
        )
        .await?;
    Ok(time.unwrap_or_default())
}

/// Formats `n` with thousands separators: `2,500`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_and_thousands() {
        assert_eq!(placeholders(3), "?, ?, ?");
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(2500), "2,500");
        assert_eq!(thousands(1234567), "1,234,567");
    }

    #[test]
    fn tables_are_all_configured_or_the_named_ones() {
        let configured = vec![
            TableName::parse("outbox_event").unwrap(),
            TableName::parse("app.outbox_b").unwrap(),
        ];
        assert_eq!(select_tables(&configured, &[]).unwrap(), configured);
        let only = select_tables(&configured, &["app.outbox_b".into()]).unwrap();
        assert_eq!(only, vec![configured[1].clone()]);
        let err = select_tables(&configured, &["nope".into()]).unwrap_err();
        assert!(err.contains("outbox_event, app.outbox_b"), "{err}");
    }
}
