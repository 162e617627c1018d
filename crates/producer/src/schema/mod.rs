//! Schema migrations: the SQL files in `migrations/`, applied in order by `outbox-relay migrate`,
//! after existing outbox tables are adopted ([`adopt`]).
//!
//! Guarantees: each migration is applied at most once per database (recorded in
//! `outbox_schema_history` with a SHA-256 of its text); a migration whose file changed after it
//! was applied is an error, not a silent drift; concurrent `migrate` runs serialise on a
//! MySQL named lock. Files use `CREATE TABLE IF NOT EXISTS`, and an index that already exists (or
//! is already gone) is accepted, so a half-applied migration (DDL is not transactional in MySQL)
//! can be run again.
//!
//! An outbox table that exists before its migrations run (the reference article's table, a
//! configured table another relay fills) is adopted first: what it lacks is added, and the
//! migrations that create or index `outbox_event` then find it complete. Tables the migrations
//! create are adopted after them (adoption is where a table gets the current column forms). A table `migrate`
//! cannot adopt by itself stops it before it changes anything else, with the statements to run.

pub mod adopt;
mod plan;
pub mod shape;

pub use plan::{check_for_run, plan};

use crate::outbox::{TableName, DEFAULT_TABLE};
use adopt::{OnlineRule, TablePlan};
use mysql_async::prelude::*;
use mysql_async::Conn;
use sha2::{Digest, Sha256};
use shape::TableShape;

/// One SQL file of `migrations/`.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: u32,
    pub name: &'static str,
    pub sql: &'static str,
}

macro_rules! migration {
    ($version:literal, $name:literal) => {
        Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("../../migrations/", $name, ".sql")),
        }
    };
}

/// Every migration this build knows, in order.
pub const MIGRATIONS: &[Migration] = &[
    migration!(1, "0001_outbox_event"),
    migration!(2, "0002_event_dedup"),
    migration!(3, "0003_outbox_audit"),
    migration!(4, "0004_relay_state"),
    migration!(5, "0005_consumer_quarantine"),
    migration!(6, "0006_outbox_key_order"),
    migration!(7, "0007_reconcile_diff"),
    migration!(8, "0008_outbox_pending_order"),
    migration!(9, "0009_outbox_drop_claim_index"),
    migration!(10, "0010_outbox_drop_lease_index"),
    migration!(11, "0011_relay_state_stream_at"),
    migration!(12, "0012_topic_queues"),
    migration!(13, "0013_outbox_waiting_key"),
    migration!(14, "0014_outbox_deliver_at"),
    migration!(15, "0015_outbox_created_index"),
    migration!(16, "0016_outbox_pending_topic"),
    migration!(17, "0017_outbox_waiting_key_without_status"),
];

const HISTORY_TABLE: &str = "outbox_schema_history";
/// One row per adoption step: the table and the statements run on it.
const CHANGES_TABLE: &str = "outbox_schema_changes";
const LOCK_NAME: &str = "outbox_relay.migrate";

/// Why migrating failed.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("database error while migrating: {0}")]
    Database(#[from] mysql_async::Error),
    #[error(
        "migration {version} ({name}) was applied with different SQL (checksum {applied} in \
         {HISTORY_TABLE}, {expected} in this build); do not edit applied migrations, add a new one"
    )]
    ChecksumMismatch {
        version: u32,
        name: String,
        applied: String,
        expected: String,
    },
    #[error(
        "the database has migration {version} ({name}) that this outbox-relay does not know; \
         it is older than the schema: upgrade outbox-relay"
    )]
    UnknownVersion { version: u32, name: String },
    #[error("another `outbox-relay migrate` holds the migration lock; try again when it ends")]
    Locked,
    #[error(
        "migrate will not change outbox table {table} by itself (nothing was changed):\n{details}"
    )]
    Refused { table: String, details: String },
    #[error("adopting outbox table {table} failed on `{statement}`: {source}")]
    Adopt {
        table: String,
        statement: String,
        source: mysql_async::Error,
    },
    #[error("migration {version} ({name}) failed on `{statement}`: {source}")]
    Statement {
        version: u32,
        name: &'static str,
        statement: String,
        source: mysql_async::Error,
    },
}

/// What [`migrate`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Migrations applied by this run, `(version, name)`.
    pub applied: Vec<(u32, &'static str)>,
    /// Migrations that were already there.
    pub already_applied: usize,
    /// Extra outbox tables created like `outbox_event`.
    pub created_tables: Vec<String>,
    /// Existing outbox tables adopted: the table and the statements run on it.
    pub adopted: Vec<(String, Vec<String>)>,
    /// Tables the migrations made, brought to the current column forms after them.
    pub finished: Vec<(String, Vec<String>)>,
}

/// SHA-256 of a migration's text, hex.
pub fn checksum(sql: &str) -> String {
    Sha256::digest(sql.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The statements of a migration file: `--` comment lines dropped, split at `;` ending a line.
pub fn statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in sql.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("--") || trimmed.is_empty() {
            continue;
        }
        current.push_str(line);
        current.push('\n');
        if trimmed.ends_with(';') {
            let statement = current.trim().trim_end_matches(';').trim().to_string();
            if !statement.is_empty() {
                out.push(statement);
            }
            current.clear();
        }
    }
    let rest = current.trim();
    if !rest.is_empty() {
        out.push(rest.to_string());
    }
    out
}

/// [`migrate_with`] under the default [`OnlineRule`].
pub async fn migrate(
    conn: &mut Conn,
    outbox_tables: &[TableName],
) -> Result<MigrationReport, MigrateError> {
    migrate_with(conn, outbox_tables, OnlineRule::default()).await
}

/// Adopts every existing outbox table (`outbox_event` and `outbox_tables`) under `rule`, applies
/// every migration not yet applied to the connection's current database, then creates each
/// configured outbox table that does not exist yet `LIKE outbox_event`.
pub async fn migrate_with(
    conn: &mut Conn,
    outbox_tables: &[TableName],
    rule: OnlineRule,
) -> Result<MigrationReport, MigrateError> {
    let locked: Option<i64> = conn
        .exec_first("SELECT GET_LOCK(?, 60)", (LOCK_NAME,))
        .await?;
    if locked != Some(1) {
        return Err(MigrateError::Locked);
    }
    let result = migrate_locked(conn, outbox_tables, rule).await;
    let _: Option<i64> = conn
        .exec_first("SELECT RELEASE_LOCK(?)", (LOCK_NAME,))
        .await?;
    result
}

/// [`migrate_with`] under the migration lock.
async fn migrate_locked(
    conn: &mut Conn,
    outbox_tables: &[TableName],
    rule: OnlineRule,
) -> Result<MigrationReport, MigrateError> {
    create_bookkeeping_tables(conn).await?;
    let applied = applied_versions(conn).await?;
    let mut report = MigrationReport {
        already_applied: applied.len(),
        ..MigrationReport::default()
    };
    report.adopted = adopt_all(conn, outbox_tables, rule).await?;
    for migration in MIGRATIONS {
        if applied.contains(&migration.version) {
            continue;
        }
        apply(conn, migration).await?;
        report.applied.push((migration.version, migration.name));
    }
    // Once more for the tables the migrations made (migration 0001 leaves `msg_id` and `sent_at`
    // nullable, which adoption stores at full size: `TableShape::sent_in_place`), before the
    // configured tables are created like `outbox_event`.
    report.finished = adopt_all(conn, outbox_tables, rule).await?;
    report.created_tables = create_configured_tables(conn, outbox_tables).await?;
    Ok(report)
}

/// The history of applied migrations and the log of adoption steps, if they are not there yet.
async fn create_bookkeeping_tables(conn: &mut Conn) -> Result<(), MigrateError> {
    conn.query_drop(format!(
        "CREATE TABLE IF NOT EXISTS {CHANGES_TABLE} (
           id           BIGINT        NOT NULL AUTO_INCREMENT,
           outbox_table VARCHAR(130)  NOT NULL,
           statements   TEXT          NOT NULL,
           applied_at   DATETIME(3)   NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
           PRIMARY KEY (id)
         ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4"
    ))
    .await?;
    conn.query_drop(format!(
        "CREATE TABLE IF NOT EXISTS {HISTORY_TABLE} (
           version    INT          NOT NULL,
           name       VARCHAR(255) NOT NULL,
           checksum   CHAR(64)     NOT NULL,
           applied_at DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
           PRIMARY KEY (version)
         ) ENGINE = InnoDB"
    ))
    .await?;
    Ok(())
}

/// The versions in the history. Each must be a migration this build knows, with the text it was
/// applied with: an unknown version or a changed file is an error, not a silent drift.
async fn applied_versions(conn: &mut Conn) -> Result<Vec<u32>, MigrateError> {
    let applied: Vec<(u32, String, String)> = conn
        .query(format!(
            "SELECT version, name, checksum FROM {HISTORY_TABLE} ORDER BY version"
        ))
        .await?;
    let mut versions = Vec::with_capacity(applied.len());
    for (version, name, sum) in applied {
        let Some(known) = MIGRATIONS.iter().find(|m| m.version == version) else {
            return Err(MigrateError::UnknownVersion { version, name });
        };
        let expected = checksum(known.sql);
        if sum != expected {
            return Err(MigrateError::ChecksumMismatch {
                version,
                name,
                applied: sum,
                expected,
            });
        }
        versions.push(version);
    }
    Ok(versions)
}

/// Runs the statements of `migration`, then records it in the history.
async fn apply(conn: &mut Conn, migration: &Migration) -> Result<(), MigrateError> {
    for statement in statements(migration.sql) {
        let result = conn.query_drop(&statement).await;
        // ER_DUP_KEYNAME / ER_DUP_FIELDNAME: an ADD INDEX / ADD COLUMN of a half-applied run
        // (or of the adoption) is already there; ER_CANT_DROP_FIELD_OR_KEY: a DROP INDEX of
        // one is already done.
        if matches!(&result, Err(mysql_async::Error::Server(e)) if [1060, 1061, 1091].contains(&e.code))
        {
            continue;
        }
        result.map_err(|source| MigrateError::Statement {
            version: migration.version,
            name: migration.name,
            statement: statement.lines().next().unwrap_or_default().to_string(),
            source,
        })?;
    }
    conn.exec_drop(
        format!("INSERT INTO {HISTORY_TABLE} (version, name, checksum) VALUES (?, ?, ?)"),
        (migration.version, migration.name, checksum(migration.sql)),
    )
    .await?;
    tracing::info!(
        version = migration.version,
        name = migration.name,
        "applied migration"
    );
    Ok(())
}

/// Creates each configured outbox table that does not exist yet `LIKE outbox_event`; returns
/// the tables created.
async fn create_configured_tables(
    conn: &mut Conn,
    outbox_tables: &[TableName],
) -> Result<Vec<String>, MigrateError> {
    let mut created = Vec::new();
    for table in outbox_tables {
        if table.is_default_outbox() {
            continue;
        }
        let exists: Option<i64> = conn
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.tables \
                 WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?",
                (table.schema.as_deref(), table.table.as_str()),
            )
            .await?;
        if exists.unwrap_or(0) == 0 {
            conn.query_drop(format!("CREATE TABLE {} LIKE {DEFAULT_TABLE}", table.sql()))
                .await?;
            created.push(table.to_string());
        }
    }
    Ok(created)
}

/// Adopts every existing outbox table under `rule`; returns each changed table and the
/// statements run on it.
async fn adopt_all(
    conn: &mut Conn,
    outbox_tables: &[TableName],
    rule: OnlineRule,
) -> Result<Vec<(String, Vec<String>)>, MigrateError> {
    let mut changed = Vec::new();
    for plan in adoption_plans(conn, outbox_tables, rule).await? {
        let statements = adopt_table(conn, &plan, rule).await?;
        if !statements.is_empty() {
            changed.push((plan.table.to_string(), statements));
        }
    }
    Ok(changed)
}

/// `outbox_event` and `outbox_tables`, each once: the tables `migrate` adopts or creates.
fn outbox_tables_with_default(outbox_tables: &[TableName]) -> Vec<TableName> {
    let mut tables = vec![TableName::default_outbox()];
    for table in outbox_tables {
        if !tables.contains(table) {
            tables.push(table.clone());
        }
    }
    tables
}

/// The adoption plan of every outbox table that exists (`outbox_event` and `outbox_tables`).
pub async fn adoption_plans(
    conn: &mut Conn,
    outbox_tables: &[TableName],
    rule: OnlineRule,
) -> Result<Vec<TablePlan>, MigrateError> {
    let mut plans = Vec::new();
    for table in outbox_tables_with_default(outbox_tables) {
        if let Some(shape) = TableShape::read(conn, &table).await? {
            plans.push(TablePlan::compare(&table, &shape, rule));
        }
    }
    Ok(plans)
}

/// Runs `plan`'s statements on its table and records them in `outbox_schema_changes` (what ran,
/// even when a later statement fails); returns them. Column adds fall back from instant to
/// online where the server has no instant ADD COLUMN for them, under `rule`.
async fn adopt_table(
    conn: &mut Conn,
    plan: &TablePlan,
    rule: OnlineRule,
) -> Result<Vec<String>, MigrateError> {
    let table = plan.table.to_string();
    let refused = |plan: &TablePlan| {
        let mut details = String::new();
        plan.render(&mut details);
        MigrateError::Refused {
            table: table.clone(),
            details,
        }
    };
    if plan.is_refused() {
        return Err(refused(plan));
    }
    let mut ran = Vec::new();
    let mut failure = None;
    for statement in plan.statements() {
        let mut result = conn.query_drop(&statement).await;
        let mut statement = statement;
        // ER_ALTER_OPERATION_NOT_SUPPORTED(_REASON): no instant ADD COLUMN here (an older server,
        // a table format without it): the same change online, which rebuilds the table.
        if matches!(&result, Err(mysql_async::Error::Server(e)) if e.code == 1845 || e.code == 1846)
            && statement.ends_with(adopt::INSTANT)
        {
            if rule.max_rows.is_some_and(|max| plan.estimated_rows > max) {
                let mut rebuilt = plan.clone();
                rebuilt.add_indexes.clear();
                rebuilt.refusals.push(adopt::Refusal {
                    kind: adopt::RefusalKind::TooLarge,
                    reason: format!(
                        "this server cannot add the columns instantly, and {table} has about {} \
                         rows, over the limit for a rebuild by migrate (--max-rows)",
                        plan.estimated_rows
                    ),
                    statement: statement.replace(adopt::INSTANT, adopt::ONLINE),
                });
                return Err(refused(&rebuilt));
            }
            tracing::info!(%table, "no instant ADD COLUMN on this server: adding the columns online");
            statement = statement.replace(adopt::INSTANT, adopt::ONLINE);
            result = conn.query_drop(&statement).await;
        }
        match result {
            Ok(()) => {
                tracing::info!(%table, %statement, "adopted outbox table");
                ran.push(statement);
            }
            Err(source) => {
                failure = Some(MigrateError::Adopt {
                    table: table.clone(),
                    statement,
                    source,
                });
                break;
            }
        }
    }
    if !ran.is_empty() {
        conn.exec_drop(
            format!("INSERT INTO {CHANGES_TABLE} (outbox_table, statements) VALUES (?, ?)"),
            (table.as_str(), ran.join(";\n")),
        )
        .await?;
    }
    match failure {
        Some(error) => Err(error),
        None => Ok(ran),
    }
}

/// Whether the connection's current database has `table`.
async fn has_table(conn: &mut Conn, table: &str) -> Result<bool, MigrateError> {
    let exists: Option<i64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = ?",
            (table,),
        )
        .await?;
    Ok(exists.unwrap_or(0) > 0)
}

/// The adoption steps recorded in `outbox_schema_changes`: `(outbox table, applied at, the
/// statements)`, oldest first, for `outbox-relay migrate --status`.
pub async fn adoptions(conn: &mut Conn) -> Result<Vec<(String, String, String)>, MigrateError> {
    if !has_table(conn, CHANGES_TABLE).await? {
        return Ok(Vec::new());
    }
    Ok(conn
        .query(format!(
            "SELECT outbox_table, CAST(applied_at AS CHAR), statements FROM {CHANGES_TABLE} ORDER BY id"
        ))
        .await?)
}

/// `(version, name, applied)` for every known migration, for `outbox-relay migrate --status`.
pub async fn status(conn: &mut Conn) -> Result<Vec<(u32, &'static str, bool)>, MigrateError> {
    let applied: Vec<u32> = if has_table(conn, HISTORY_TABLE).await? {
        conn.query(format!("SELECT version FROM {HISTORY_TABLE}"))
            .await?
    } else {
        Vec::new()
    };
    Ok(MIGRATIONS
        .iter()
        .map(|m| (m.version, m.name, applied.contains(&m.version)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_increasing_and_names_match_versions() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version as usize, i + 1);
            assert!(m.name.starts_with(&format!("{:04}_", m.version)));
            assert!(!statements(m.sql).is_empty(), "{} has no statement", m.name);
        }
    }

    #[test]
    fn statements_skip_comments_and_split_at_line_end_semicolons() {
        let sql = "-- a comment; with a semicolon\nCREATE TABLE a (x INT);\n\n  -- more\nCREATE TABLE b (\n  y INT -- trailing\n);\nSELECT 1";
        let got = statements(sql);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], "CREATE TABLE a (x INT)");
        assert!(got[1].starts_with("CREATE TABLE b (") && got[1].ends_with(')'));
        assert_eq!(got[2], "SELECT 1");
    }

    #[test]
    fn checksum_is_stable_hex_sha256() {
        assert_eq!(
            checksum(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
