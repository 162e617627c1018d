//! Guards for out-of-order and repeated updates, used inside a [`super::Handler`].
//!
//! De-duplication stops the *same* event from applying twice; it does not order *different*
//! events. Per-`biz_key` order holds on the broker, but a retried older event can still arrive
//! after a newer one. Two guards handle that, both on the handler's transaction:
//!
//! - [`VersionGuard`]: apply an event only if its version is newer than the row's.
//! - [`StateGuard`] over a [`StateMachine`]: move a row's state only along allowed transitions;
//!   a repeated or illegal transition is ignored (and counted), not an error.
//!
//! Both lock the row (`SELECT ... FOR UPDATE`) before deciding, so two concurrent events for one
//! row decide one after the other. Ignoring means the handler returns `Outcome::Success`
//! without writing: the event is then marked processed and ACKed, as it should be.

use super::metrics::ConsumerMetrics;
use mysql_async::prelude::*;
use mysql_async::{Transaction, Value};
use rocketmq_outbox_producer::outbox::TableName;
use std::collections::HashSet;

/// A guard was configured with a table or column name that is not a plain identifier.
#[derive(Debug, thiserror::Error)]
#[error("invalid {what} {name:?}: {reason}")]
pub struct GuardConfigError {
    what: &'static str,
    name: String,
    reason: String,
}

/// A column name: letters, digits and `_`, quoted with backticks in SQL.
#[derive(Debug, Clone)]
struct Column(String);

impl Column {
    fn parse(name: &str) -> Result<Self, GuardConfigError> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if ok {
            Ok(Column(name.to_string()))
        } else {
            Err(GuardConfigError {
                what: "column",
                name: name.to_string(),
                reason: "use 1 to 64 of [A-Za-z0-9_]".into(),
            })
        }
    }

    fn sql(&self) -> String {
        format!("`{}`", self.0)
    }
}

/// The row a guard reads and locks: `table.key_column = key`.
#[derive(Debug, Clone)]
struct GuardedRow {
    table: TableName,
    key: Column,
    value: Column,
}

impl GuardedRow {
    fn new(table: &str, key: &str, value: &str) -> Result<Self, GuardConfigError> {
        let table = TableName::parse(table).map_err(|reason| GuardConfigError {
            what: "table",
            name: table.to_string(),
            reason,
        })?;
        Ok(Self {
            table,
            key: Column::parse(key)?,
            value: Column::parse(value)?,
        })
    }

    /// The guarded column of the row, locked until the transaction ends; `None`: no such row.
    async fn lock<T: FromValue + Send + 'static>(
        &self,
        tx: &mut Transaction<'static>,
        key: Value,
    ) -> Result<Option<T>, mysql_async::Error> {
        let sql = format!(
            "SELECT {} FROM {} WHERE {} = ? FOR UPDATE",
            self.value.sql(),
            self.table.sql(),
            self.key.sql()
        );
        tx.exec_first(sql, (key,)).await
    }
}

/// The result of [`VersionGuard::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionCheck {
    /// The event is newer than the stored version: apply it (and store its version).
    Newer { stored: i64 },
    /// The stored version is the same or newer: ignore the event (counted as `stale`).
    Stale { stored: i64 },
    /// No row with that key yet: the caller decides (usually: insert it).
    Missing,
}

impl VersionCheck {
    /// True for `Newer` and `Missing`.
    pub fn should_apply(self) -> bool {
        !matches!(self, VersionCheck::Stale { .. })
    }
}

/// Applies an event only if its version is newer than the row's `version_column`.
#[derive(Debug, Clone)]
pub struct VersionGuard {
    row: GuardedRow,
    metrics: Option<ConsumerMetrics>,
}

impl VersionGuard {
    /// Guards `table` rows found by `key_column`, versioned by the integer `version_column`.
    pub fn new(
        table: &str,
        key_column: &str,
        version_column: &str,
    ) -> Result<Self, GuardConfigError> {
        Ok(Self {
            row: GuardedRow::new(table, key_column, version_column)?,
            metrics: None,
        })
    }

    /// Counts ignored events as `consume_guard_ignored_total{guard="version",reason="stale"}`.
    pub fn with_metrics(mut self, metrics: ConsumerMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Locks the row of `key` and compares its version with the event's `version`. The caller
    /// writes the row (including the new version) only if [`VersionCheck::should_apply`].
    pub async fn check(
        &self,
        tx: &mut Transaction<'static>,
        key: impl Into<Value>,
        version: i64,
    ) -> Result<VersionCheck, mysql_async::Error> {
        let stored: Option<Option<i64>> = self.row.lock(tx, key.into()).await?;
        let check = match stored {
            None => VersionCheck::Missing,
            Some(stored) => {
                let stored = stored.unwrap_or(i64::MIN); // a NULL version is older than any
                if version > stored {
                    VersionCheck::Newer { stored }
                } else {
                    VersionCheck::Stale { stored }
                }
            }
        };
        if let (VersionCheck::Stale { .. }, Some(metrics)) = (check, &self.metrics) {
            metrics.record_guard_ignored("version", "stale");
        }
        Ok(check)
    }
}

/// The result of a state transition check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// Allowed: the state was (or may be) moved.
    Apply,
    /// Already in the target state: ignored (counted as `repeated`).
    Repeated,
    /// Not an allowed transition from the current state: ignored (counted as `illegal`).
    Illegal { from: String, to: String },
    /// No row with that key: nothing moved (counted as `missing`).
    Missing,
}

/// The allowed `(from, to)` state transitions of one kind of row.
#[derive(Debug, Clone, Default)]
pub struct StateMachine {
    allowed: HashSet<(String, String)>,
}

impl StateMachine {
    /// A machine allowing exactly `transitions`, e.g. `[("CREATED", "PAID"), ("PAID", "SHIPPED")]`.
    pub fn new<A: Into<String>, B: Into<String>>(
        transitions: impl IntoIterator<Item = (A, B)>,
    ) -> Self {
        Self {
            allowed: transitions
                .into_iter()
                .map(|(from, to)| (from.into(), to.into()))
                .collect(),
        }
    }

    /// Whether moving `from` → `to` is allowed, repeated (`from == to`) or illegal.
    pub fn check(&self, from: &str, to: &str) -> Transition {
        if from == to {
            Transition::Repeated
        } else if self.allowed.contains(&(from.to_string(), to.to_string())) {
            Transition::Apply
        } else {
            Transition::Illegal {
                from: from.to_string(),
                to: to.to_string(),
            }
        }
    }
}

/// Moves a row's state column along a [`StateMachine`], ignoring repeated and illegal moves.
#[derive(Debug, Clone)]
pub struct StateGuard {
    machine: StateMachine,
    row: GuardedRow,
    metrics: Option<ConsumerMetrics>,
}

impl StateGuard {
    /// Guards the `state_column` of `table` rows found by `key_column`.
    pub fn new(
        machine: StateMachine,
        table: &str,
        key_column: &str,
        state_column: &str,
    ) -> Result<Self, GuardConfigError> {
        Ok(Self {
            machine,
            row: GuardedRow::new(table, key_column, state_column)?,
            metrics: None,
        })
    }

    /// Counts ignored moves as `consume_guard_ignored_total{guard="state",reason=...}`.
    pub fn with_metrics(mut self, metrics: ConsumerMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Locks the row of `key`; if moving its state to `to` is allowed, updates it in `tx`.
    /// Returns what happened; only `Transition::Apply` wrote anything.
    pub async fn apply(
        &self,
        tx: &mut Transaction<'static>,
        key: impl Into<Value>,
        to: &str,
    ) -> Result<Transition, mysql_async::Error> {
        let key = key.into();
        let current: Option<String> = self.row.lock(tx, key.clone()).await?;
        let transition = match current {
            None => Transition::Missing,
            Some(from) => self.machine.check(&from, to),
        };
        let ignored = match &transition {
            Transition::Apply => {
                let sql = format!(
                    "UPDATE {} SET {} = ? WHERE {} = ?",
                    self.row.table.sql(),
                    self.row.value.sql(),
                    self.row.key.sql()
                );
                tx.exec_drop(sql, (to, key)).await?;
                None
            }
            Transition::Repeated => Some("repeated"),
            Transition::Illegal { .. } => Some("illegal"),
            Transition::Missing => Some("missing"),
        };
        if let (Some(reason), Some(metrics)) = (ignored, &self.metrics) {
            metrics.record_guard_ignored("state", reason);
        }
        Ok(transition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_machine_allows_only_listed_moves() {
        let machine = StateMachine::new([("CREATED", "PAID"), ("PAID", "SHIPPED")]);
        assert_eq!(machine.check("CREATED", "PAID"), Transition::Apply);
        assert_eq!(machine.check("PAID", "PAID"), Transition::Repeated);
        assert_eq!(
            machine.check("SHIPPED", "PAID"),
            Transition::Illegal {
                from: "SHIPPED".into(),
                to: "PAID".into()
            }
        );
        assert!(matches!(
            machine.check("CREATED", "SHIPPED"),
            Transition::Illegal { .. }
        ));
    }

    #[test]
    fn guard_names_must_be_identifiers() {
        assert!(VersionGuard::new("orders", "id", "version").is_ok());
        assert!(VersionGuard::new("app.orders", "id", "version").is_ok());
        let err = VersionGuard::new("orders", "id; DROP TABLE x", "version").unwrap_err();
        assert!(err.to_string().contains("column"), "{err}");
        assert!(StateGuard::new(StateMachine::default(), "bad table", "id", "s").is_err());
    }

    #[test]
    fn only_stale_versions_are_skipped() {
        assert!(VersionCheck::Newer { stored: 1 }.should_apply());
        assert!(VersionCheck::Missing.should_apply());
        assert!(!VersionCheck::Stale { stored: 3 }.should_apply());
    }
}
