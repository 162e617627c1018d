//! Adopting an existing outbox table: what `migrate` adds to a table it did not create (the
//! reference article's `outbox_event`, a table another relay fills), what it refuses to do by
//! itself, and the check `run` makes before it starts.
//!
//! Guarantees: adoption only adds (columns, then indexes); it never drops, renames, retypes or
//! rewrites anything. Columns are added `ALGORITHM=INSTANT` (metadata only, at any table size;
//! where the server cannot, `INPLACE, LOCK=NONE`), indexes `ALGORITHM=INPLACE, LOCK=NONE`, so
//! writers and a polling relay keep working while it runs. A table larger than the operator's
//! rule ([`OnlineRule`]) is not changed at all: the statements are printed for a DBA instead.
//! What it does to a table is one step, recorded with its statements in
//! `outbox_schema_changes`.

use super::shape::TableShape;
use super::shape::{ExistingColumn, ExistingIndex, Filled, Lookup, RequiredColumn, RequiredIndex};
use super::shape::{COLUMNS, INDEXES, RETIRED_INDEXES};
use crate::outbox::TableName;
use std::fmt::Write as _;

/// The operator's rule for changes that copy or rebuild data (index builds; column adds where the
/// server has no instant ADD COLUMN).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnlineRule {
    /// Largest table (the server's row estimate) `migrate` changes that way by itself; `None`: any.
    pub max_rows: Option<u64>,
}

/// The default row limit: an outbox keeps only a short window of events (SENT rows are cleaned
/// up after days), so a larger one is worth a DBA's look before an index build.
pub const DEFAULT_MAX_ROWS: u64 = 1_000_000;

impl Default for OnlineRule {
    fn default() -> Self {
        OnlineRule {
            max_rows: Some(DEFAULT_MAX_ROWS),
        }
    }
}

/// Something `migrate` will not do by itself, with what to run instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub kind: RefusalKind,
    pub reason: String,
    /// The statement(s) that would resolve it, for an operator to run (after the step the reason
    /// names, if any).
    pub statement: String,
}

/// What a [`Refusal`] is about, which decides what it holds back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// A column missing that migrate cannot add, or of an incompatible type: the relay cannot
    /// run on the table, and migrate changes nothing on it.
    Column,
    /// The table is over the operator's row limit for an index build: migrate changes nothing
    /// on it (the relay cannot run while columns are missing).
    TooLarge,
    /// An index name taken by another index: the relay runs, slower; migrate adds the rest.
    Index,
    /// Rows the relay's producer writes could never be claimed (see `unclaimable`): migrate
    /// changes nothing on the table; the relay runs (the stream reads such rows) and warns that
    /// rows only a sweeper can send would wait for ever.
    Unclaimable,
}

/// What adopting one existing table takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TablePlan {
    pub table: TableName,
    pub estimated_rows: u64,
    pub add_columns: Vec<RequiredColumn>,
    pub add_indexes: Vec<RequiredIndex>,
    pub refusals: Vec<Refusal>,
    /// Differences the relay works with, and why, for the plan's comments.
    pub notes: Vec<String>,
    /// What becomes of `msg_id` and `sent_at` (stored at full size or not).
    pub sent_columns: SentColumns,
}

/// `msg_id` and `sent_at` in a table's plan: the SENT mark updates a row in place only when
/// they are stored at full size from the INSERT on ([`TableShape::sent_in_place`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SentColumns {
    /// Already so (or added so): nothing to do.
    InPlace,
    /// Converted by this adoption: a table copy, which blocks writes to it while it runs.
    Convert,
    /// Left as they are: the table is over the row limit for a copy by migrate. The relay runs
    /// on it, each SENT mark costing the database more.
    Left,
}

/// `ALGORITHM` clauses: the first one tried for column adds, the fallback, and index adds'.
pub const INSTANT: &str = "ALGORITHM=INSTANT";
pub const ONLINE: &str = "ALGORITHM=INPLACE, LOCK=NONE";

impl TablePlan {
    /// Compares `shape` (of existing `table`) with what the relay needs.
    pub fn compare(table: &TableName, shape: &TableShape, rule: OnlineRule) -> Self {
        let mut plan = TablePlan {
            table: table.clone(),
            estimated_rows: shape.estimated_rows,
            add_columns: Vec::new(),
            add_indexes: Vec::new(),
            refusals: Vec::new(),
            notes: Vec::new(),
            sent_columns: if shape.sent_in_place() {
                SentColumns::InPlace
            } else {
                SentColumns::Convert
            },
        };
        for required in COLUMNS {
            plan.compare_column(required, shape);
        }
        // A partitioned table's key is (id, created_at): it must lead with id.
        let primary = shape.index("PRIMARY");
        if !primary.is_some_and(|pk| pk.columns[0].eq_ignore_ascii_case("id")) {
            let drop = if primary.is_some() {
                "DROP PRIMARY KEY, "
            } else {
                ""
            };
            plan.refuse(
                RefusalKind::Column,
                "the primary key must start with `id`: the relay orders each key's events by it"
                    .into(),
                format!("ALTER TABLE {} {drop}ADD PRIMARY KEY (`id`)", table.sql()),
            );
        }
        for required in INDEXES {
            plan.compare_index(required, shape);
        }
        // Migrations drop them from `outbox_event` itself.
        for retired in RETIRED_INDEXES
            .iter()
            .filter(|_| !table.is_default_outbox())
        {
            if shape
                .index(retired.name)
                .is_some_and(|existing| same_columns(existing, retired.columns))
            {
                plan.notes.push(format!(
                    "{} ({}) is an index of an earlier relay version that no query uses now; \
                     {}. To drop it: ALTER TABLE {} DROP INDEX {}",
                    retired.name,
                    column_list(retired.columns),
                    retired.costs,
                    table.sql(),
                    retired.name
                ));
            }
        }
        plan.apply_rule(rule);
        plan
    }

    fn refuse(&mut self, kind: RefusalKind, reason: String, statement: String) {
        self.refusals.push(Refusal {
            kind,
            reason,
            statement,
        });
    }

    fn compare_column(&mut self, required: &RequiredColumn, shape: &TableShape) {
        let (name, table) = (required.name, self.table.sql());
        let modify = format!(
            "ALTER TABLE {table} MODIFY COLUMN `{name}` {}",
            required.definition
        );
        let Some(existing) = shape.column(name) else {
            match required.filled {
                Filled::ByRelay | Filled::ByServer => self.add_columns.push(*required),
                Filled::ByProducer => self.refuse(
                    RefusalKind::Column,
                    format!(
                        "column `{name}` is missing: business code writes it in every event, so \
                         migrate cannot fill it for the rows already there"
                    ),
                    format!(
                        "ALTER TABLE {table} ADD COLUMN `{name}` {}",
                        required.definition
                    ),
                ),
            }
            return;
        };
        if let Some((reason, fix)) = unclaimable(name, existing, &table) {
            self.refuse(RefusalKind::Unclaimable, reason, fix);
        } else if !required.kind.admits(existing) {
            let mut reason = format!(
                "column `{name}` is {}; the relay needs {}",
                existing.column_type,
                required.kind.describe()
            );
            if name == "status" {
                reason.push_str(
                    " (codes 0 PENDING, 1 SENDING, 2 SENT, 3 FAILED: convert the values first)",
                );
            }
            self.refuse(RefusalKind::Column, reason, modify);
        } else if let Some(why) = required.cleared.refuses(existing) {
            self.refuse(
                RefusalKind::Column,
                format!("column `{name}` is NOT NULL; {why}"),
                modify,
            );
        }
    }

    fn compare_index(&mut self, required: &RequiredIndex, shape: &TableShape) {
        let table = self.table.sql();
        let wanted = column_list(required.columns);
        let same_name = shape.index(required.name);
        let serves = match required.lookup {
            // Any index leading with the columns (of this name or another).
            Lookup::ByColumns => shape.index_leading_with(required.columns).is_some(),
            // The index of this name, if it leads with the first column.
            Lookup::ByName => same_name.is_some_and(|existing| {
                existing.columns[0].eq_ignore_ascii_case(required.columns[0])
            }),
        };
        match same_name {
            Some(existing)
                if serves
                    && required.lookup == Lookup::ByName
                    && !same_columns(existing, required.columns) =>
            {
                self.notes.push(format!(
                    "{} is ({}) here, the relay's is ({wanted}): the relay uses it as it is \
                     ({}). To match it: ALTER TABLE {table} DROP INDEX {}, ADD INDEX {} \
                     ({wanted}), {ONLINE}",
                    required.name,
                    column_list_of(existing),
                    required.otherwise,
                    required.name,
                    required.name
                ));
            }
            _ if serves => {}
            Some(existing) => self.refuse(
                RefusalKind::Index,
                format!(
                    "an index named {} exists on ({}); the relay needs that name for \
                     ({wanted}), for {}",
                    required.name,
                    column_list_of(existing),
                    required.serves
                ),
                format!(
                    "ALTER TABLE {table} RENAME INDEX {} TO {}_old",
                    required.name, required.name
                ),
            ),
            None => self.add_indexes.push(*required),
        }
    }

    /// A table over the operator's row limit gets nothing by itself when an index must be built;
    /// one over a tenth of it keeps its `msg_id` and `sent_at` (their conversion copies the
    /// table, blocking writes to it meanwhile, where an index build lets them go on).
    fn apply_rule(&mut self, rule: OnlineRule) {
        let Some(max) = rule.max_rows else { return };
        let copy_max = max / 10;
        if self.sent_columns == SentColumns::Convert && self.estimated_rows > copy_max {
            self.sent_columns = SentColumns::Left;
            self.notes.push(format!(
                "msg_id and sent_at are stored only once an event is SENT, so each SENT mark \
                 lengthens its row and the server rewrites the whole record rather than a few \
                 bytes of it (on MariaDB 10.11: 29 instead of 18 µs of its CPU, ~6,000 instead \
                 of ~380 bytes of redo per row). Storing them at full size copies the table, \
                 which blocks writes to it while it runs, and {} has about {} rows, over the \
                 limit of {copy_max} for a copy by migrate (a tenth of --max-rows): the relay \
                 works as it is. To convert it (in a quiet hour, or with your online schema \
                 change tool): {}",
                self.table,
                self.estimated_rows,
                // One line: the plan prints notes as comments.
                self.sent_conversion()
                    .join("; ")
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
        }
        if self.add_indexes.is_empty() || self.estimated_rows <= max {
            return;
        }
        let statements = self.statements().join(";\n");
        self.refuse(
            RefusalKind::TooLarge,
            format!(
                "{} has about {} rows, over the limit of {max} for an index build by migrate \
                 (--max-rows): run these statements yourself (or with your online schema change \
                 tool), then `outbox-relay migrate` again",
                self.table, self.estimated_rows
            ),
            statements,
        );
    }

    /// Whether the table needs nothing and nothing is refused.
    pub fn is_empty(&self) -> bool {
        self.add_columns.is_empty()
            && self.add_indexes.is_empty()
            && self.refusals.is_empty()
            && self.sent_columns != SentColumns::Convert
    }

    /// Whether `migrate` leaves the table as it is (a refusal it cannot work around).
    pub fn is_refused(&self) -> bool {
        self.refusals.iter().any(|r| r.kind != RefusalKind::Index)
    }

    /// The statements adoption runs: one ALTER adding the columns (instant), one adding the
    /// indexes (online); a clause a line.
    pub fn statements(&self) -> Vec<String> {
        let mut out = Vec::new();
        let table = self.table.sql();
        if !self.add_columns.is_empty() {
            let adds: Vec<String> = self
                .add_columns
                .iter()
                .map(|c| format!("ADD COLUMN `{}` {}", c.name, c.definition))
                .collect();
            out.push(format!(
                "ALTER TABLE {table}\n  {},\n  {INSTANT}",
                adds.join(",\n  ")
            ));
        }
        if self.sent_columns == SentColumns::Convert {
            out.extend(self.sent_conversion());
        }
        if !self.add_indexes.is_empty() {
            let adds: Vec<String> = self
                .add_indexes
                .iter()
                .map(|i| {
                    let unique = if i.unique { "UNIQUE " } else { "" };
                    format!(
                        "ADD {unique}INDEX `{}` ({})",
                        i.name,
                        column_list(i.columns)
                    )
                })
                .collect();
            out.push(format!(
                "ALTER TABLE {table}\n  {},\n  {ONLINE}",
                adds.join(",\n  ")
            ));
        }
        out
    }

    /// The statements that store `msg_id` and `sent_at` at full size: their defaults first (rows
    /// inserted meanwhile get them), then every NULL set to its default, then the columns made
    /// NOT NULL (`msg_id` a CHAR), which copies the table.
    fn sent_conversion(&self) -> Vec<String> {
        let table = self.table.sql();
        let [msg_id, sent_at] = ["msg_id", "sent_at"].map(|name| {
            COLUMNS
                .iter()
                .find(|c| c.name == name)
                .expect("msg_id and sent_at are required columns")
        });
        let default_of = |c: &RequiredColumn| {
            c.definition
                .split_once(" DEFAULT ")
                .map_or("NULL", |(_, default)| default)
        };
        vec![
            format!(
                "ALTER TABLE {table} ALTER COLUMN `msg_id` SET DEFAULT {}, \
                 ALTER COLUMN `sent_at` SET DEFAULT {}",
                default_of(msg_id),
                default_of(sent_at)
            ),
            format!(
                "UPDATE {table} SET `msg_id` = COALESCE(`msg_id`, DEFAULT(`msg_id`)), \
                 `sent_at` = COALESCE(`sent_at`, DEFAULT(`sent_at`)) \
                 WHERE `msg_id` IS NULL OR `sent_at` IS NULL"
            ),
            format!(
                "ALTER TABLE {table}\n  MODIFY COLUMN `msg_id` {},\n  MODIFY COLUMN `sent_at` {}",
                msg_id.definition, sent_at.definition
            ),
        ]
    }

    /// Why `run` cannot start on this table (missing or incompatible columns), if it cannot.
    pub fn blocks_run(&self) -> Option<String> {
        let blocking: Vec<&Refusal> = self
            .refusals
            .iter()
            .filter(|r| r.kind == RefusalKind::Column)
            .collect();
        let missing: Vec<&str> = self
            .add_columns
            .iter()
            .filter(|c| c.filled != Filled::ByServer)
            .map(|c| c.name)
            .collect();
        if missing.is_empty() && blocking.is_empty() {
            return None;
        }
        let mut reasons = Vec::new();
        if !missing.is_empty() {
            reasons.push(format!("it lacks the column(s) {}", missing.join(", ")));
        }
        reasons.extend(blocking.iter().map(|r| r.reason.clone()));
        let mut text = format!(
            "outbox table {} is not ready for the relay: {}",
            self.table,
            reasons.join("; ")
        );
        let _ = write!(
            text,
            ". Run `outbox-relay migrate` (it adds what is missing online and drops nothing; \
             `outbox-relay migrate --plan` prints the statements first)"
        );
        Some(text)
    }

    /// What the relay runs without on this table, and what that costs (a missing index: more
    /// rows read; a column only operator commands read), if anything.
    pub fn slows_run(&self) -> Option<String> {
        let mut reasons: Vec<String> = self
            .add_indexes
            .iter()
            .map(|i| format!("index {} ({}) is missing", i.name, column_list(i.columns)))
            .collect();
        reasons.extend(
            self.add_columns
                .iter()
                .filter(|c| c.filled == Filled::ByServer)
                .map(|c| format!("column {} is missing (operator commands read it)", c.name)),
        );
        reasons.extend(
            self.refusals
                .iter()
                .filter(|r| matches!(r.kind, RefusalKind::Index | RefusalKind::Unclaimable))
                .map(|r| r.reason.clone()),
        );
        if self.sent_columns != SentColumns::InPlace {
            reasons.push(
                "msg_id and sent_at are stored only once an event is SENT, so each SENT mark \
                 rewrites its whole row instead of a few bytes of it (`outbox-relay migrate \
                 --plan` says how to store them at full size)"
                    .into(),
            );
        }
        (!reasons.is_empty()).then(|| {
            format!(
                "outbox table {}: {}; the relay works without it (run `outbox-relay migrate` to \
                 add it)",
                self.table,
                reasons.join("; ")
            )
        })
    }

    /// The plan as SQL with comments, for `migrate --plan`.
    pub fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "-- Adopt the existing table {} (about {} rows): add what the relay needs, drop nothing.",
            self.table, self.estimated_rows
        );
        for note in &self.notes {
            let _ = writeln!(out, "-- note: {note}");
        }
        for refusal in &self.refusals {
            let what = if refusal.kind != RefusalKind::Index {
                "migrate will not do this by itself"
            } else {
                "left as it is; to resolve it run"
            };
            let _ = writeln!(out, "-- REFUSED: {}", refusal.reason);
            let _ = writeln!(out, "-- ({what}:)");
            for line in refusal.statement.lines() {
                let _ = writeln!(out, "--   {line}");
            }
        }
        if self.is_refused() {
            let _ = writeln!(
                out,
                "-- nothing is changed on {} until the above is resolved",
                self.table
            );
            return;
        }
        if self.add_columns.is_empty() && self.add_indexes.is_empty() {
            let _ = writeln!(
                out,
                "-- {} has every column and index the relay needs",
                self.table
            );
        }
        for statement in self.statements() {
            let _ = writeln!(out, "{statement};");
        }
    }
}

/// Why rows of a table with column `name` shaped as `existing` could be written that the relay
/// never claims, and the statements that fix it: the producer's INSERT leaves `id`,
/// `next_retry_at` and `created_at` to the server, and a claim compares the times (a NULL
/// matches nothing).
fn unclaimable(name: &str, existing: &ExistingColumn, table: &str) -> Option<(String, String)> {
    match name {
        "id" if !existing.auto_increment => Some((
            "column `id` has no AUTO_INCREMENT: the relay's producer leaves it out of its INSERT, \
             and the relay orders each key's events by it"
                .into(),
            format!("ALTER TABLE {table} MODIFY COLUMN `id` BIGINT NOT NULL AUTO_INCREMENT"),
        )),
        "next_retry_at" | "created_at" if existing.nullable || !existing.has_default => {
            let what = match (existing.nullable, existing.has_default) {
                (true, true) => "nullable",
                (true, false) => "nullable without a default",
                _ => "without a default",
            };
            let fill = match name {
                "next_retry_at" => "COALESCE(created_at, NOW(3))",
                _ => "NOW(3)",
            };
            Some((
                format!(
                    "column `{name}` is {what}: the relay's producer leaves it out of its INSERT, \
                     and a row whose `{name}` is NULL is never claimed (a claim compares it with \
                     the time)"
                ),
                format!(
                    "UPDATE {table} SET `{name}` = {fill} WHERE `{name}` IS NULL; ALTER TABLE \
                     {table} MODIFY COLUMN `{name}` DATETIME(3) NOT NULL DEFAULT \
                     CURRENT_TIMESTAMP(3)"
                ),
            ))
        }
        _ => None,
    }
}

fn same_columns(existing: &ExistingIndex, columns: &[&str]) -> bool {
    existing.columns.len() == columns.len()
        && existing
            .columns
            .iter()
            .zip(columns)
            .all(|(a, b)| a.eq_ignore_ascii_case(b))
}

fn column_list(columns: &[&str]) -> String {
    columns
        .iter()
        .map(|c| format!("`{c}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn column_list_of(index: &ExistingIndex) -> String {
    let names: Vec<&str> = index.columns.iter().map(String::as_str).collect();
    column_list(&names)
}

#[cfg(test)]
#[path = "adopt_tests.rs"]
mod tests;
