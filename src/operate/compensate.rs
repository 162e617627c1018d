//! Compensation with audit: `retry` (FAILED → PENDING), `resend` (SENT → PENDING) and
//! `mark-failed` (PENDING → FAILED), each by id, by event_id or by a filter, each with an
//! operator and a reason.
//!
//! Per selected row, in one transaction: read the row `FOR UPDATE` (the *before* state); if it
//! is in the action's source status, `UPDATE … WHERE id = ? AND status = <source>`, read it
//! again (the *after* state) and insert one `outbox_audit` row; commit. A row already in the
//! target status, or in any other status, is left alone and gets no audit row: repeating a
//! command changes nothing. The guard on the old status means a row the relay moved meanwhile
//! (e.g. marked SENT) is never overwritten.
//!
//! What each action writes:
//! - `retry`: `status = PENDING, retry_count = 0, next_retry_at = NOW(3)`, `owner`,
//!   `lease_until` and `last_error` cleared (the old error stays in the audit row's before
//!   state; a PENDING row carrying a stale error would mislead whoever looks at it next).
//! - `resend`: the same, and `msg_id`, `sent_at` cleared (a row that is not SENT has no proof
//!   of sending; the old `msg_id` stays in the audit row).
//! - `mark-failed`: `status = FAILED`, `last_error = "marked failed by <operator>: <reason>"`,
//!   `owner`, `lease_until` cleared.
//!
//! PENDING rows are picked up again by the sweeper (CDC mode) or the poller (poll mode); a
//! retried or resent event may reach consumers after newer events of its `biz_key`.

use super::selection::{Bounds, Selection};
use crate::outbox::{Status, TableName};
use mysql_async::prelude::*;
use mysql_async::{Conn, Pool, Row, TxOpts, Value};
use serde::Serialize;
use serde_json::json;

/// Longest `outbox_audit.operator` (VARCHAR(128)).
const MAX_OPERATOR_CHARS: usize = 128;
/// Longest `outbox_audit.reason` (VARCHAR(1024)).
const MAX_REASON_CHARS: usize = 1024;
/// Longest `outbox_event.last_error` (VARCHAR(1024)).
const MAX_ERROR_CHARS: usize = 1024;
/// Most rows one command may change.
pub const MAX_LIMIT: usize = 100_000;

/// A compensation action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// FAILED → PENDING.
    Retry,
    /// SENT → PENDING.
    Resend,
    /// PENDING → FAILED.
    MarkFailed,
}

impl Action {
    /// The status a row must have to be changed.
    pub fn from_status(self) -> Status {
        match self {
            Action::Retry => Status::Failed,
            Action::Resend => Status::Sent,
            Action::MarkFailed => Status::Pending,
        }
    }

    /// The status a changed row gets.
    pub fn to_status(self) -> Status {
        match self {
            Action::Retry | Action::Resend => Status::Pending,
            Action::MarkFailed => Status::Failed,
        }
    }

    /// The name written to `outbox_audit.action` (and the subcommand's name).
    pub fn name(self) -> &'static str {
        match self {
            Action::Retry => "retry",
            Action::Resend => "resend",
            Action::MarkFailed => "mark-failed",
        }
    }

    /// The `SET` clause of the UPDATE (bind: `last_error` for mark-failed).
    fn set_clause(self) -> String {
        let rest = match self {
            Action::Retry => {
                "retry_count = 0, next_retry_at = NOW(3), owner = NULL, lease_until = NULL, \
                 last_error = NULL"
            }
            Action::Resend => {
                "retry_count = 0, next_retry_at = NOW(3), owner = NULL, lease_until = NULL, \
                 last_error = NULL, msg_id = DEFAULT, sent_at = DEFAULT"
            }
            Action::MarkFailed => "owner = NULL, lease_until = NULL, last_error = ?",
        };
        format!("{}, {rest}", self.to_status().sql())
    }
}

/// Why a compensation could not run.
#[derive(Debug, thiserror::Error)]
pub enum CompensateError {
    #[error(
        "--operator is required: name the person running this (it is written to outbox_audit)"
    )]
    MissingOperator,
    #[error("--reason is required: say why (it is written to outbox_audit), e.g. --reason \"INC-42: topic created\"")]
    MissingReason,
    #[error("--operator is longer than {MAX_OPERATOR_CHARS} characters")]
    OperatorTooLong,
    #[error("--reason is longer than {MAX_REASON_CHARS} characters")]
    ReasonTooLong,
    #[error(
        "no selector given: pass --id, --event-id or a filter such as --topic, --error-like, \
         --created-before or --created-after"
    )]
    NoSelector,
    #[error("--limit must be between 1 and {MAX_LIMIT} (got {0})")]
    Limit(usize),
    #[error("--id is ambiguous with several outbox tables ({0}): pass --table to say which one")]
    IdsNeedTable(String),
    #[error("database error: {0}")]
    Database(#[from] mysql_async::Error),
}

/// What happened to one selected row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RowOutcome {
    /// Updated, with its audit row.
    Changed,
    /// Already in the target status: nothing done.
    AlreadyInTarget,
    /// In a status the action does not apply to: nothing done.
    Skipped,
    /// Deleted or changed between selection and update: nothing done.
    Vanished,
}

/// One selected row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RowReport {
    pub table: String,
    pub id: i64,
    pub event_id: String,
    pub topic: String,
    pub before: Option<Status>,
    pub after: Option<Status>,
    pub outcome: RowOutcome,
}

/// What a command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CompensationReport {
    pub action: Action,
    pub rows: Vec<RowReport>,
    /// More rows matched than `--limit`: run again for the next ones.
    pub limit_reached: bool,
    /// Requested ids (as text) and event_ids that matched no row.
    pub not_found: Vec<String>,
}

impl CompensationReport {
    pub fn count(&self, outcome: RowOutcome) -> usize {
        self.rows.iter().filter(|r| r.outcome == outcome).count()
    }

    /// `retry: 2 changed, 1 already in target state, 0 skipped`.
    pub fn summary_line(&self) -> String {
        let mut line = format!(
            "{}: {} changed, {} already in target state ({}), {} skipped (not {})",
            self.action.name(),
            self.count(RowOutcome::Changed),
            self.count(RowOutcome::AlreadyInTarget),
            self.action.to_status(),
            self.count(RowOutcome::Skipped),
            self.action.from_status(),
        );
        let vanished = self.count(RowOutcome::Vanished);
        if vanished > 0 {
            line.push_str(&format!(", {vanished} changed concurrently"));
        }
        if !self.not_found.is_empty() {
            line.push_str(&format!(", {} not found", self.not_found.len()));
        }
        if self.limit_reached {
            line.push_str("; --limit reached, run again for more");
        }
        line
    }
}

/// One command: an action, who and why, and which rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compensation {
    pub action: Action,
    pub operator: String,
    pub reason: String,
    pub selection: Selection,
}

impl Compensation {
    /// Checks operator, reason and selection.
    pub fn validate(&self, tables: &[TableName]) -> Result<(), CompensateError> {
        check_operator_and_reason(&self.operator, &self.reason)?;
        let selection = &self.selection;
        if !selection.by_key() && !selection.has_filter() {
            return Err(CompensateError::NoSelector);
        }
        if selection.limit == 0 || selection.limit > MAX_LIMIT {
            return Err(CompensateError::Limit(selection.limit));
        }
        if !selection.ids.is_empty() && tables.len() > 1 {
            let names: Vec<String> = tables.iter().map(ToString::to_string).collect();
            return Err(CompensateError::IdsNeedTable(names.join(", ")));
        }
        Ok(())
    }

    /// Applies the action to the selected rows of `tables`, one transaction per row.
    pub async fn run(
        &self,
        pool: &Pool,
        tables: &[TableName],
    ) -> Result<CompensationReport, CompensateError> {
        self.validate(tables)?;
        let mut conn = pool.get_conn().await?;
        let bounds = self.selection.bounds(&mut conn).await?;
        let mut report = CompensationReport {
            action: self.action,
            rows: Vec::new(),
            limit_reached: false,
            not_found: Vec::new(),
        };
        let mut found_ids = Vec::new();
        let mut found_event_ids = Vec::new();
        for table in tables {
            let remaining = self.selection.limit - report.rows.len();
            if remaining == 0 {
                report.limit_reached = true;
                break;
            }
            let mut ids = self.select(&mut conn, table, &bounds, remaining).await?;
            if ids.len() > remaining {
                ids.truncate(remaining);
                report.limit_reached = true;
            }
            for id in ids {
                let row = self.apply(&mut conn, table, id).await?;
                found_ids.push(row.id);
                found_event_ids.push(row.event_id.clone());
                report.rows.push(row);
            }
        }
        if !report.limit_reached {
            let missing_ids = self
                .selection
                .ids
                .iter()
                .filter(|id| !found_ids.contains(id));
            report
                .not_found
                .extend(missing_ids.map(|id| format!("id {id}")));
            let missing_events = self
                .selection
                .event_ids
                .iter()
                .filter(|e| !found_event_ids.contains(e));
            report
                .not_found
                .extend(missing_events.map(|e| format!("event_id {e}")));
        }
        Ok(report)
    }

    /// Ids of the selected rows of one table, in id order, at most `limit + 1`.
    async fn select(
        &self,
        conn: &mut Conn,
        table: &TableName,
        bounds: &Bounds,
        limit: usize,
    ) -> Result<Vec<i64>, mysql_async::Error> {
        let (condition, mut params) = self.selection.condition(self.action.from_status(), bounds);
        params.push((limit + 1).into());
        conn.exec(
            format!(
                "SELECT id FROM {} WHERE {condition} ORDER BY id LIMIT ?",
                table.sql()
            ),
            params,
        )
        .await
    }

    /// Applies the action to one row in its own transaction (see the module doc).
    async fn apply(
        &self,
        conn: &mut Conn,
        table: &TableName,
        id: i64,
    ) -> Result<RowReport, mysql_async::Error> {
        let (from, to) = (self.action.from_status(), self.action.to_status());
        let mut tx = conn.start_transaction(TxOpts::default()).await?;
        let state_sql = format!("{STATE_SELECT} FROM {} WHERE id = ?", table.sql());
        let row: Option<Row> = tx
            .exec_first(format!("{state_sql} FOR UPDATE"), (id,))
            .await?;
        let Some(row) = row else {
            tx.rollback().await?;
            return Ok(vanished(table, id));
        };
        let before = RowState::from_row(row);
        let mut report = RowReport {
            table: table.to_string(),
            id,
            event_id: before.event_id.clone(),
            topic: before.topic.clone(),
            before: before.status,
            after: before.status,
            outcome: RowOutcome::Skipped,
        };
        if before.status != Some(from) {
            if before.status == Some(to) {
                report.outcome = RowOutcome::AlreadyInTarget;
            }
            tx.rollback().await?;
            return Ok(report);
        }
        let mut params: Vec<Value> = Vec::new();
        if self.action == Action::MarkFailed {
            let error = format!(
                "marked failed by {}: {}",
                self.operator.trim(),
                self.reason.trim()
            );
            params.push(truncate(&error, MAX_ERROR_CHARS).into());
        }
        params.push(id.into());
        params.push(from.code().into());
        tx.exec_drop(
            format!(
                "UPDATE {} SET {} WHERE id = ? AND status = ?",
                table.sql(),
                self.action.set_clause()
            ),
            params,
        )
        .await?;
        if tx.affected_rows() != 1 {
            tx.rollback().await?;
            report.outcome = RowOutcome::Vanished;
            return Ok(report);
        }
        let row: Option<Row> = tx.exec_first(state_sql, (id,)).await?;
        let after = row.map(RowState::from_row);
        let audit = AuditRow {
            operator: &self.operator,
            reason: &self.reason,
            action: self.action.name(),
            table,
            event_id: Some(&before.event_id),
            before: Some(before.json.clone()),
            after: after.as_ref().map(|a| a.json.clone()),
            result: format!("changed: {from} -> {to}"),
        };
        audit.insert(&mut tx).await?;
        tx.commit().await?;
        report.after = after.and_then(|a| a.status);
        report.outcome = RowOutcome::Changed;
        Ok(report)
    }
}

/// Checks the `--operator` and `--reason` every audited command requires.
pub(crate) fn check_operator_and_reason(
    operator: &str,
    reason: &str,
) -> Result<(), CompensateError> {
    let (operator, reason) = (operator.trim(), reason.trim());
    if operator.is_empty() {
        return Err(CompensateError::MissingOperator);
    }
    if reason.is_empty() {
        return Err(CompensateError::MissingReason);
    }
    if operator.chars().count() > MAX_OPERATOR_CHARS {
        return Err(CompensateError::OperatorTooLong);
    }
    if reason.chars().count() > MAX_REASON_CHARS {
        return Err(CompensateError::ReasonTooLong);
    }
    Ok(())
}

/// One `outbox_audit` row (migration 0003), written by whoever changed the outbox by hand or
/// by maintenance, in the caller's transaction or session.
pub(crate) struct AuditRow<'a> {
    pub operator: &'a str,
    pub reason: &'a str,
    /// `outbox_audit.action`, e.g. `retry` or `partition-drop`.
    pub action: &'a str,
    pub table: &'a TableName,
    pub event_id: Option<&'a str>,
    pub before: Option<serde_json::Value>,
    pub after: Option<serde_json::Value>,
    pub result: String,
}

impl AuditRow<'_> {
    /// Inserts the row (operator and reason trimmed, `result` cut to its column's 255).
    pub(crate) async fn insert(&self, conn: &mut impl Queryable) -> Result<(), mysql_async::Error> {
        conn.exec_drop(
            "INSERT INTO outbox_audit \
             (operator, reason, action, outbox_table, event_id, before_state, after_state, result) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self.operator.trim(),
                self.reason.trim(),
                self.action,
                self.table.to_string(),
                self.event_id,
                self.before.as_ref().map(ToString::to_string),
                self.after.as_ref().map(ToString::to_string),
                truncate(&self.result, 255),
            ),
        )
        .await
    }
}

fn vanished(table: &TableName, id: i64) -> RowReport {
    RowReport {
        table: table.to_string(),
        id,
        event_id: String::new(),
        topic: String::new(),
        before: None,
        after: None,
        outcome: RowOutcome::Vanished,
    }
}

fn truncate(text: &str, max_chars: usize) -> String {
    text.chars().take(max_chars).collect()
}

/// The columns kept in `outbox_audit.before_state` / `after_state` (not the payload: the
/// audit is about the delivery state, and the payload does not change).
const STATE_SELECT: &str = "SELECT id, event_id, biz_key, topic, status, retry_count, \
     CAST(next_retry_at AS CHAR), CAST(lease_until AS CHAR), owner, msg_id, \
     CAST(sent_at AS CHAR), last_error, CAST(created_at AS CHAR)";

/// A row's delivery state, as read by [`STATE_SELECT`].
struct RowState {
    event_id: String,
    topic: String,
    status: Option<Status>,
    json: serde_json::Value,
}

impl RowState {
    fn from_row(mut row: Row) -> Self {
        let id: Option<i64> = row.take(0);
        let status_code: i64 = row.take(4).unwrap_or(-1);
        let retry_count: Option<i64> = row.take(5);
        let mut text = |i: usize| -> Option<String> { row.take::<Option<String>, _>(i).flatten() };
        let event_id = text(1).unwrap_or_default();
        let biz_key = text(2);
        let topic = text(3).unwrap_or_default();
        let status = Status::from_code(status_code);
        let json = json!({
            "id": id,
            "event_id": event_id,
            "biz_key": biz_key,
            "topic": topic,
            "status": status.map(Status::name),
            "status_code": status_code,
            "retry_count": retry_count,
            "next_retry_at": text(6),
            "lease_until": text(7),
            "owner": text(8),
            "msg_id": text(9),
            "sent_at": text(10),
            "last_error": text(11),
            "created_at": text(12),
        });
        RowState {
            event_id,
            topic,
            status,
            json,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(operator: &str, reason: &str, selection: Selection) -> Compensation {
        Compensation {
            action: Action::Retry,
            operator: operator.into(),
            reason: reason.into(),
            selection,
        }
    }

    fn by_id() -> Selection {
        Selection {
            ids: vec![1],
            ..Selection::default()
        }
    }

    #[test]
    fn actions_move_between_the_documented_statuses() {
        assert_eq!(Action::Retry.from_status(), Status::Failed);
        assert_eq!(Action::Retry.to_status(), Status::Pending);
        assert_eq!(Action::Resend.from_status(), Status::Sent);
        assert_eq!(Action::Resend.to_status(), Status::Pending);
        assert_eq!(Action::MarkFailed.from_status(), Status::Pending);
        assert_eq!(Action::MarkFailed.to_status(), Status::Failed);
        assert!(Action::Retry.set_clause().contains("last_error = NULL"));
        assert!(Action::Resend.set_clause().contains("msg_id = DEFAULT"));
    }

    #[test]
    fn operator_reason_and_a_selector_are_required() {
        let tables = [TableName::parse("outbox_event").unwrap()];
        let err = command("", "why", by_id()).validate(&tables).unwrap_err();
        assert!(err.to_string().contains("--operator is required"), "{err}");
        let err = command("ann", "  ", by_id()).validate(&tables).unwrap_err();
        assert!(err.to_string().contains("--reason is required"), "{err}");
        let err = command("ann", "why", Selection::default())
            .validate(&tables)
            .unwrap_err();
        assert!(err.to_string().contains("no selector given"), "{err}");
        let topic = Selection {
            topic: Some("t".into()),
            ..Selection::default()
        };
        assert!(command("ann", "why", topic).validate(&tables).is_ok());
        let zero = Selection {
            limit: 0,
            ..by_id()
        };
        assert!(command("ann", "why", zero).validate(&tables).is_err());
        let two = [
            TableName::parse("outbox_event").unwrap(),
            TableName::parse("outbox_b").unwrap(),
        ];
        let err = command("ann", "why", by_id()).validate(&two).unwrap_err();
        assert!(err.to_string().contains("--table"), "{err}");
    }

    #[test]
    fn the_summary_names_each_outcome() {
        let row = |outcome| RowReport {
            table: "outbox_event".into(),
            id: 1,
            event_id: "e".into(),
            topic: "t".into(),
            before: Some(Status::Pending),
            after: Some(Status::Pending),
            outcome,
        };
        let report = CompensationReport {
            action: Action::Retry,
            rows: vec![row(RowOutcome::AlreadyInTarget), row(RowOutcome::Skipped)],
            limit_reached: false,
            not_found: vec![],
        };
        assert_eq!(
            report.summary_line(),
            "retry: 0 changed, 1 already in target state (PENDING), 1 skipped (not FAILED)"
        );
    }
}
