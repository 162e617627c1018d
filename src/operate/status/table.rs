//! One outbox table's part of the status: counts by status, the oldest PENDING row, expired
//! leases, recent and frequent FAILED reasons, and the topics that wait.

use super::waiting::waiting_topics;
use super::{FailedReason, OldestPending, TableStatus, MAX_REASON_DISPLAY, TOP_REASONS};
use crate::outbox::{Status, TableName};
use mysql_async::prelude::*;
use mysql_async::Conn;
use std::time::Duration;

pub(super) async fn table_status(
    conn: &mut Conn,
    table: &TableName,
    failing_window: Duration,
    lag_seconds: f64,
) -> Result<TableStatus, mysql_async::Error> {
    let sql = table.sql();
    let counts: Vec<(i64, u64)> = conn
        .query(format!(
            "SELECT status, COUNT(*) FROM {sql} GROUP BY status"
        ))
        .await?;
    let count = |s: Status| {
        counts
            .iter()
            .find(|(code, _)| *code == i64::from(s.code()))
            .map_or(0, |c| c.1)
    };
    let oldest = oldest_pending(conn, table).await?;
    let expired_leases: Option<u64> = conn
        .query_first(format!(
            "SELECT COUNT(*) FROM {sql} WHERE {} AND lease_until < NOW(3)",
            Status::Sending.sql()
        ))
        .await?;
    let window = u64::try_from(failing_window.as_micros()).unwrap_or(u64::MAX);
    let failed_recently: Option<u64> = conn
        .exec_first(
            format!(
                "SELECT COUNT(*) FROM {sql} \
                 WHERE {} AND updated_at >= NOW(3) - INTERVAL ? MICROSECOND",
                Status::Failed.sql()
            ),
            (window,),
        )
        .await?;
    let reasons: Vec<(String, u64)> = conn
        .exec(
            format!(
                "SELECT LEFT(COALESCE(last_error, '(no reason recorded)'), 255) AS reason, \
                 COUNT(*) AS n FROM {sql} WHERE {} \
                 GROUP BY reason ORDER BY n DESC, reason LIMIT ?",
                Status::Failed.sql()
            ),
            (TOP_REASONS,),
        )
        .await?;
    let waiting = waiting_topics(conn, table, lag_seconds).await?;
    Ok(TableStatus {
        table: table.to_string(),
        pending: count(Status::Pending),
        sending: count(Status::Sending),
        sent: count(Status::Sent),
        failed: count(Status::Failed),
        oldest_pending_seconds: oldest.as_ref().map_or(0.0, |o| o.age_seconds),
        oldest_pending: oldest,
        expired_leases: expired_leases.unwrap_or_default(),
        failed_recently: failed_recently.unwrap_or_default(),
        failed_reasons: reasons
            .into_iter()
            .map(|(reason, count)| FailedReason {
                reason: truncate_reason(&reason),
                count,
            })
            .collect(),
        waiting,
    })
}

/// At most [`MAX_REASON_DISPLAY`] characters, one line, `…` when cut.
pub(super) fn truncate_reason(reason: &str) -> String {
    let one_line: String = reason.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= MAX_REASON_DISPLAY {
        return one_line;
    }
    let mut cut: String = one_line.chars().take(MAX_REASON_DISPLAY - 1).collect();
    cut.push('…');
    cut
}

/// The PENDING row that has waited longest: the lowest PENDING id (ids grow with time, and the
/// sweeper claims each topic in id order), the lowest of each topic's first entry in
/// `idx_pending (status, topic)` (one dive per topic) and one row, however many rows wait or were
/// SENT before it. Its age runs from its `created_at` (database clock).
pub(crate) async fn oldest_pending(
    conn: &mut Conn,
    table: &TableName,
) -> Result<Option<OldestPending>, mysql_async::Error> {
    let rows: Vec<(i64, String, String, String, i64)> = crate::sweep::waiting::on_pending_index(
        conn,
        table,
        |hinted| {
            format!(
                "SELECT id, event_id, topic, CAST(created_at AS CHAR), \
                 TIMESTAMPDIFF(MICROSECOND, created_at, NOW(3)) FROM {} WHERE id = ({})",
                table.sql(),
                crate::sweep::waiting::first_pending_id_sql(table, hinted)
            )
        },
        Vec::new(),
    )
    .await?;
    Ok(rows
        .into_iter()
        .next()
        .map(|(id, event_id, topic, created_at, micros)| OldestPending {
            id,
            event_id,
            topic,
            created_at,
            age_seconds: micros.max(0) as f64 / 1e6,
        }))
}
