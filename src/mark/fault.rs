//! What the marker does with a failed write: retry it, or stop the relay and say what to fix.
//!
//! Guarantee: only an error of [`crate::db::permanent_fault`] (the one classification of
//! permanent server errors) stops the relay; everything else is retried. The stop message names
//! the table, the server's own words, and the fix (the `GRANT` statement for the relay's
//! account, `outbox-relay migrate`, or the column definitions to restore).

use crate::db::PermanentFault;
use crate::outbox::TableName;
use mysql_async::prelude::*;
use mysql_async::Pool;
use std::fmt;

/// A marking write that failed, and the table it was writing (none before a connection).
#[derive(Debug)]
pub(super) struct WriteFailure {
    table: Option<String>,
    error: mysql_async::Error,
}

impl WriteFailure {
    /// No connection could be had from the pool.
    pub(super) fn connect(error: mysql_async::Error) -> Self {
        WriteFailure { table: None, error }
    }

    /// An UPDATE of `table` failed.
    pub(super) fn on(table: &TableName, error: mysql_async::Error) -> Self {
        WriteFailure {
            table: Some(table.sql()),
            error,
        }
    }

    /// The batch did not finish within the marker's bound.
    pub(super) fn timed_out() -> Self {
        Self::connect(mysql_async::Error::Other("marking timed out".into()))
    }

    /// The error to stop the relay with, if retrying cannot fix this failure. Asks the server
    /// for the relay's account (for the `GRANT` to run) when a privilege is missing.
    pub(super) async fn permanent(&self, pool: &Pool) -> Option<MarkError> {
        let fault = crate::db::permanent_fault(&self.error)?;
        let table = self
            .table
            .clone()
            .unwrap_or_else(|| "the outbox table".into());
        let fix = match fault {
            PermanentFault::Privilege => format!(
                "Grant the relay's account what it needs: GRANT SELECT, UPDATE ON {table} TO {}",
                account(pool).await
            ),
            PermanentFault::Schema => "The outbox table lacks a column the relay writes \
                 (status, msg_id, sent_at, owner, lease_until, last_error, retry_count): run \
                 `outbox-relay migrate`, or fix outbox.tables"
                .to_string(),
            PermanentFault::Data => "A value the relay writes does not fit its column (msg_id, \
                 last_error, retry_count or owner no longer as `outbox-relay migrate` creates \
                 them): restore the column definitions"
                .to_string(),
        };
        let message = match &self.error {
            mysql_async::Error::Server(e) => format!("{} (error {})", e.message, e.code),
            other => other.to_string(),
        };
        Some(MarkError {
            fault,
            table,
            message,
            fix,
        })
    }
}

impl fmt::Display for WriteFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.table {
            Some(table) => write!(f, "{table}: {}", self.error),
            None => write!(f, "{}", self.error),
        }
    }
}

/// `'user'@'host'` of the pool's account, as `GRANT` wants it; a description if the server will
/// not say.
async fn account(pool: &Pool) -> String {
    let asked: Result<Option<String>, _> = crate::db::bounded(async {
        let mut conn = pool.get_conn().await?;
        conn.query_first("SELECT CURRENT_USER()").await
    })
    .await;
    match asked.ok().flatten() {
        Some(current) => match current.rsplit_once('@') {
            Some((user, host)) => format!("'{user}'@'{host}'"),
            None => format!("'{current}'"),
        },
        None => "the relay's account (mysql.url)".into(),
    }
}

/// The marker met an error retrying cannot fix; the relay stops with it. The batch it was
/// writing was not acknowledged: the checkpoint stays before those events, so after the fix a
/// restart sends and records them again (duplicates possible, nothing lost).
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot record outcomes in {table}: {message}. {fix}, then start the relay again. The relay \
     stopped: its checkpoint stays before the unrecorded events, so the restart sends and records \
     them (duplicates possible, nothing lost)"
)]
pub struct MarkError {
    /// What kind of error it was.
    pub fault: PermanentFault,
    table: String,
    message: String,
    fix: String,
}

#[cfg(test)]
impl MarkError {
    /// A marking error of `fault` (for tests of what the relay does with it).
    pub(crate) fn for_test(fault: PermanentFault) -> Self {
        MarkError {
            fault,
            table: "db.outbox_event".into(),
            message: "denied".into(),
            fix: "grant it".into(),
        }
    }
}
