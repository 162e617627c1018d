//! What an outbox table must have for the relay, and what an existing one has: the one home of
//! the table's required shape, which `migrate` adopts existing tables to
//! ([`super::adopt`]) and `run` checks at start-up.
//!
//! The shape is the one the migrations in `migrations/` leave (a test compares a freshly migrated
//! table with it), written as requirements rather than as DDL: an existing table written by
//! another relay (the reference article's polling relay, say) fits when its columns are of a
//! compatible kind, whatever their exact types, lengths or positions.

use crate::outbox::TableName;
use mysql_async::prelude::*;
use mysql_async::Conn;

/// The family of SQL types a column may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    /// Any integer type.
    Integer,
    /// CHAR, VARCHAR or a TEXT type of at least `min_chars` characters (what the relay writes
    /// into it must fit; 0 for columns the relay only reads).
    Text { min_chars: u64 },
    /// JSON, or any text type (MariaDB's JSON is LONGTEXT).
    Document,
    /// DATETIME or TIMESTAMP.
    Time,
}

/// Who fills a column, which decides whether `migrate` may add it to an existing table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filled {
    /// Business code writes it in every row: a table without it holds no outbox events the
    /// relay could publish, and `migrate` cannot invent its values for existing rows.
    ByProducer,
    /// The relay writes it, or it has a default (or may be NULL): `migrate` adds it.
    ByRelay,
    /// The server fills it (`ON UPDATE`) and only operator commands read it (`status`): `migrate`
    /// adds it, and the relay runs without it.
    ByServer,
}

/// How the relay clears a column, which decides what an existing column must allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cleared {
    /// Never: any column of the right kind serves.
    Never,
    /// To NULL: the column must be nullable.
    ToNull,
    /// To its default (`SET col = DEFAULT`): the column must be nullable or have a default.
    ToDefault,
}

impl Cleared {
    /// Whether `existing` accepts the clearing, and if not, why not.
    pub fn refuses(self, existing: &ExistingColumn) -> Option<&'static str> {
        match self {
            Cleared::ToNull if !existing.nullable => Some("the relay sets it to NULL"),
            Cleared::ToDefault if !existing.nullable && !existing.has_default => {
                Some("`resend` sets it back to its default, and it has none")
            }
            _ => None,
        }
    }
}

/// A column the relay reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequiredColumn {
    pub name: &'static str,
    pub kind: ColumnKind,
    /// What the relay or its operator commands write into it when they clear it: the marker
    /// clears `owner`, `lease_until` and `last_error` to NULL; `resend` sets `msg_id` and
    /// `sent_at` back to their column defaults.
    pub cleared: Cleared,
    pub filled: Filled,
    /// The column's definition after its name, as a table `migrate` made or adopted has it.
    pub definition: &'static str,
}

const fn column(
    name: &'static str,
    kind: ColumnKind,
    cleared: Cleared,
    filled: Filled,
    definition: &'static str,
) -> RequiredColumn {
    RequiredColumn {
        name,
        kind,
        cleared,
        filled,
        definition,
    }
}

/// Every column of an outbox table, in the order the migrations leave them.
///
/// `migrate` leaves every outbox table with these definitions: migration 0001 made `msg_id`
/// and `sent_at` nullable, and adoption converts them ([`TableShape::sent_in_place`]).
pub const COLUMNS: &[RequiredColumn] = {
    use Cleared::*;
    use ColumnKind::*;
    use Filled::*;
    &[
        column(
            "id",
            Integer,
            Never,
            ByProducer,
            "BIGINT NOT NULL AUTO_INCREMENT",
        ),
        column(
            "event_id",
            Text { min_chars: 0 },
            Never,
            ByProducer,
            "VARCHAR(64) NOT NULL",
        ),
        column(
            "biz_key",
            Text { min_chars: 0 },
            Never,
            ByProducer,
            "VARCHAR(64) NOT NULL",
        ),
        column(
            "topic",
            Text { min_chars: 0 },
            Never,
            ByProducer,
            "VARCHAR(127) NOT NULL",
        ),
        column(
            "tags",
            Text { min_chars: 0 },
            Never,
            ByRelay,
            "VARCHAR(128) NULL",
        ),
        column("headers", Document, Never, ByRelay, "JSON NULL"),
        column("payload", Document, Never, ByProducer, "JSON NOT NULL"),
        column(
            "status",
            Integer,
            Never,
            ByRelay,
            "TINYINT NOT NULL DEFAULT 0",
        ),
        column(
            "retry_count",
            Integer,
            Never,
            ByRelay,
            "INT NOT NULL DEFAULT 0",
        ),
        column(
            "next_retry_at",
            Time,
            Never,
            ByRelay,
            "DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)",
        ),
        column("lease_until", Time, ToNull, ByRelay, "DATETIME(3) NULL"),
        column(
            "owner",
            Text { min_chars: 128 },
            ToNull,
            ByRelay,
            "VARCHAR(128) NULL",
        ),
        // Stored at full size from the INSERT on, so the SENT mark updates rows in place (see
        // `TableShape::sent_in_place`): a CHAR (InnoDB keeps at least N bytes of a utf8mb4
        // CHAR(N)) and a NOT NULL time; `''` and the epoch until the event is SENT.
        column(
            "msg_id",
            Text { min_chars: 64 },
            ToDefault,
            ByRelay,
            "CHAR(64) NOT NULL DEFAULT ''",
        ),
        column(
            "sent_at",
            Time,
            ToDefault,
            ByRelay,
            "DATETIME(3) NOT NULL DEFAULT '1970-01-01 00:00:00'",
        ),
        // The marker keeps the first 1,000 characters of a reason.
        column(
            "last_error",
            Text { min_chars: 1000 },
            ToNull,
            ByRelay,
            "VARCHAR(1024) NULL",
        ),
        column(
            "created_at",
            Time,
            Never,
            ByRelay,
            "DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)",
        ),
        column(
            "updated_at",
            Time,
            Never,
            ByServer,
            "DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)",
        ),
        // A scheduled event's delivery time (migration 0014); NULL: at once.
        column(
            "deliver_at",
            Time,
            Never,
            ByRelay,
            "TIMESTAMP(3) NULL DEFAULT NULL",
        ),
    ]
};

/// How the relay finds an index it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Any index whose leading columns are these serves (the optimizer picks it).
    ByColumns,
    /// Queries name it in `FORCE INDEX`: an index of this name must exist and lead with the
    /// first of these columns.
    ByName,
}

/// A secondary index the relay's queries need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequiredIndex {
    pub name: &'static str,
    pub columns: &'static [&'static str],
    /// Whether `migrate` creates it unique. Any index leading with `columns` serves, unique or
    /// not: a partitioned table's `idx_event_id` cannot be unique (a unique index must hold the
    /// partitioning column), and the relay only looks rows up by it.
    pub unique: bool,
    pub lookup: Lookup,
    /// What it serves, for the plan's comments.
    pub serves: &'static str,
    /// What an index of this name with other columns (used as it is) costs, for the plan's
    /// note (indexes found [`Lookup::ByName`]).
    pub otherwise: &'static str,
}

/// Every secondary index an outbox table needs (the primary key is `(id)`).
pub const INDEXES: &[RequiredIndex] = &[
    RequiredIndex {
        name: "uk_event_id",
        columns: &["event_id"],
        unique: true,
        lookup: Lookup::ByColumns,
        serves: "one row per event_id (operators' look-ups, replays)",
        otherwise: "",
    },
    RequiredIndex {
        name: "idx_pending",
        columns: &["status", "topic"],
        unique: false,
        lookup: Lookup::ByName,
        serves: "claims of each topic's PENDING rows in id order, lease recovery, counts by \
                 status, the oldest PENDING row",
        otherwise: "its claims then read more rows: the PENDING rows of other topics, or all of them to sort by id",
    },
    RequiredIndex {
        name: "idx_created",
        columns: &["created_at"],
        unique: false,
        lookup: Lookup::ByColumns,
        serves: "cleanup and reconcile (SENT rows by creation time), partition conversion",
        otherwise: "",
    },
    RequiredIndex {
        name: "idx_waiting_key",
        columns: &["topic", "biz_key"],
        unique: false,
        lookup: Lookup::ByName,
        serves: "the key-order guard and claims: the older rows of a key that still wait",
        otherwise: "each SENT mark moves an entry in it if it holds `status`, and the key-order question may read more rows",
    },
];

/// An index the relay created in an earlier version and no query uses now. Migrations drop it
/// from `outbox_event`; another outbox table made `LIKE outbox_event` before that keeps it, and
/// adoption (which never drops) says so with the statement to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetiredIndex {
    pub name: &'static str,
    pub columns: &'static [&'static str],
    /// What keeping it costs.
    pub costs: &'static str,
}

/// The relay's retired indexes (a table holds one only under this name and with these columns).
pub const RETIRED_INDEXES: &[RetiredIndex] = &[
    RetiredIndex {
        name: "idx_status_created",
        columns: &["status", "created_at"],
        costs: "every claim and SENT mark moves an entry in it (migration 0015)",
    },
    RetiredIndex {
        name: "idx_claim",
        columns: &["status", "next_retry_at", "id"],
        costs: "every claim and SENT mark moves an entry in it (migration 0009)",
    },
    RetiredIndex {
        name: "idx_lease",
        columns: &["status", "lease_until"],
        costs: "every claim, lease renewal and SENT mark moves an entry in it (migration 0010)",
    },
    RetiredIndex {
        name: "idx_key_order",
        columns: &["biz_key", "id"],
        costs: "every INSERT adds an entry to it (migration 0013)",
    },
];

/// A column as the server describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingColumn {
    pub name: String,
    /// `DATA_TYPE`, lower case (`varchar`, `json`, `longtext`, `bigint`, …).
    pub data_type: String,
    /// `COLUMN_TYPE` as the server prints it (`varchar(64)`, `tinyint(4)`).
    pub column_type: String,
    /// `CHARACTER_MAXIMUM_LENGTH` of a text column.
    pub max_chars: Option<u64>,
    pub nullable: bool,
    /// Whether it has a default other than NULL.
    pub has_default: bool,
    /// Whether the server numbers it (`AUTO_INCREMENT`).
    pub auto_increment: bool,
}

/// An index as the server describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingIndex {
    pub name: String,
    pub columns: Vec<String>,
    pub unique: bool,
}

/// An existing table's columns and indexes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableShape {
    pub columns: Vec<ExistingColumn>,
    pub indexes: Vec<ExistingIndex>,
    /// The server's estimate of the table's rows (`information_schema.TABLES.TABLE_ROWS`).
    pub estimated_rows: u64,
}

impl TableShape {
    /// Reads `table`'s shape; `None` when it does not exist.
    pub async fn read(
        conn: &mut Conn,
        table: &TableName,
    ) -> Result<Option<Self>, mysql_async::Error> {
        let where_table = "table_schema = COALESCE(?, DATABASE()) AND table_name = ?";
        let params = (table.schema.as_deref(), table.table.as_str());
        let rows: Option<Option<u64>> = conn
            .exec_first(
                format!("SELECT table_rows FROM information_schema.tables WHERE {where_table}"),
                params,
            )
            .await?;
        let Some(estimated_rows) = rows else {
            return Ok(None);
        };
        type Row = (String, String, String, Option<u64>, String, bool, bool);
        let columns: Vec<Row> = conn
            .exec(
                format!(
                    "SELECT column_name AS c, LOWER(data_type) AS t, LOWER(column_type) AS ct, \
                     character_maximum_length AS l, is_nullable AS n, \
                     column_default IS NOT NULL AND column_default <> 'NULL' AS d, \
                     LOWER(extra) LIKE '%auto_increment%' AS a \
                     FROM information_schema.columns WHERE {where_table} ORDER BY ordinal_position"
                ),
                params,
            )
            .await?;
        let parts: Vec<(String, String, i64)> = conn
            .exec(
                format!(
                    "SELECT index_name AS i, column_name AS c, non_unique AS u \
                     FROM information_schema.statistics WHERE {where_table} \
                     ORDER BY index_name, seq_in_index"
                ),
                params,
            )
            .await?;
        let mut indexes: Vec<ExistingIndex> = Vec::new();
        for (name, column, non_unique) in parts {
            match indexes.last_mut() {
                Some(last) if last.name == name => last.columns.push(column),
                _ => indexes.push(ExistingIndex {
                    name,
                    columns: vec![column],
                    unique: non_unique == 0,
                }),
            }
        }
        Ok(Some(TableShape {
            columns: columns
                .into_iter()
                .map(
                    |(name, data_type, column_type, max_chars, nullable, has_default, auto)| {
                        ExistingColumn {
                            name,
                            data_type,
                            column_type,
                            max_chars,
                            nullable: nullable.eq_ignore_ascii_case("YES"),
                            has_default,
                            auto_increment: auto,
                        }
                    },
                )
                .collect(),
            indexes,
            estimated_rows: estimated_rows.unwrap_or(0),
        }))
    }

    /// The column named `name` (column names are case-insensitive in MySQL).
    pub fn column(&self, name: &str) -> Option<&ExistingColumn> {
        self.columns
            .iter()
            .find(|c| c.name.eq_ignore_ascii_case(name))
    }

    /// Whether the SENT mark can update this table's rows in place: `msg_id` a NOT NULL CHAR
    /// and `sent_at` NOT NULL, so filling them in changes no stored length. Where they are NULL
    /// until the mark (or `msg_id` a VARCHAR), every mark lengthens its row and InnoDB rewrites
    /// the whole record, payload included, instead of overwriting a few bytes: on MariaDB 10.11,
    /// 29 instead of 18 µs of the server's CPU and ~6,000 instead of ~380 bytes of redo per row.
    /// A table without the columns yet gets them in this form from adoption.
    pub fn sent_in_place(&self) -> bool {
        let msg_id = self
            .column("msg_id")
            .is_none_or(|c| c.data_type == "char" && !c.nullable);
        let sent_at = self.column("sent_at").is_none_or(|c| !c.nullable);
        msg_id && sent_at
    }

    /// The index named `name`.
    pub fn index(&self, name: &str) -> Option<&ExistingIndex> {
        self.indexes
            .iter()
            .find(|i| i.name.eq_ignore_ascii_case(name))
    }

    /// An index that leads with `columns`, unique or not.
    pub fn index_leading_with(&self, columns: &[&str]) -> Option<&ExistingIndex> {
        self.indexes.iter().find(|i| {
            i.columns.len() >= columns.len()
                && i.columns
                    .iter()
                    .zip(columns)
                    .all(|(a, b)| a.eq_ignore_ascii_case(b))
        })
    }
}

impl ColumnKind {
    /// Whether a column of `existing`'s type is of this kind.
    pub fn admits(self, existing: &ExistingColumn) -> bool {
        let t = existing.data_type.as_str();
        let text = matches!(
            t,
            "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext"
        );
        match self {
            ColumnKind::Integer => {
                matches!(
                    t,
                    "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint"
                )
            }
            ColumnKind::Text { min_chars } => {
                text && existing.max_chars.is_none_or(|n| n >= min_chars)
            }
            ColumnKind::Document => text || t == "json",
            ColumnKind::Time => matches!(t, "datetime" | "timestamp"),
        }
    }

    /// The kind in words, for refusals.
    pub fn describe(self) -> String {
        match self {
            ColumnKind::Integer => "an integer type".into(),
            ColumnKind::Text { min_chars: 0 } => "a text type (CHAR, VARCHAR, TEXT)".into(),
            ColumnKind::Text { min_chars } => {
                format!("a text type of at least {min_chars} characters")
            }
            ColumnKind::Document => "JSON or a text type".into(),
            ColumnKind::Time => "DATETIME or TIMESTAMP".into(),
        }
    }
}
