//! What `migrate` would do, said before it does it (`migrate --plan`), and the check `run` makes
//! before it starts: both from the same comparison of each outbox table with what the relay
//! needs ([`super::adopt::TablePlan`]).

use super::adopt::{OnlineRule, TablePlan};
use super::shape::TableShape;
use super::{
    adoption_plans, outbox_tables_with_default, statements, status, MigrateError, HISTORY_TABLE,
    MIGRATIONS,
};
use crate::outbox::{TableName, DEFAULT_TABLE};
use mysql_async::Conn;

/// What `migrate` would do now, changing nothing: the adoption of each existing outbox table,
/// then each migration not yet applied, as SQL with comments (`outbox-relay migrate --plan`).
pub async fn plan(
    conn: &mut Conn,
    outbox_tables: &[TableName],
    rule: OnlineRule,
) -> Result<String, MigrateError> {
    use std::fmt::Write as _;
    let mut out = String::from(
        "-- Applied by hand? Then run `outbox-relay migrate` once: it finds this done and records \
         the migrations.\n\n",
    );
    let plans = adoption_plans(conn, outbox_tables, rule).await?;
    for table_plan in &plans {
        table_plan.render(&mut out);
        out.push('\n');
    }
    let applied: Vec<u32> = status(conn)
        .await?
        .into_iter()
        .filter_map(|(version, _, applied)| applied.then_some(version))
        .collect();
    let adopted = TableShape::read(conn, &TableName::default_outbox()).await?;
    for migration in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
        let _ = writeln!(
            out,
            "-- migration {} (recorded in {HISTORY_TABLE})",
            migration.name
        );
        for statement in statements(migration.sql) {
            if adopted
                .as_ref()
                .is_some_and(|shape| no_op_after_adoption(shape, &statement))
            {
                // A no-op for migrate, an error for a DBA running the script by hand.
                let first = statement.lines().next().unwrap_or_default();
                let _ = writeln!(
                    out,
                    "-- (nothing to do on the adopted {DEFAULT_TABLE}): {first}"
                );
            } else {
                let _ = writeln!(out, "{statement};");
            }
        }
        out.push('\n');
    }
    for table in outbox_tables_with_default(outbox_tables) {
        let exists = plans.iter().any(|p| p.table == table);
        if !exists && !table.is_default_outbox() {
            let _ = writeln!(out, "CREATE TABLE {} LIKE {DEFAULT_TABLE};", table.sql());
        }
    }
    if plans.iter().all(TablePlan::is_empty) && applied.len() == MIGRATIONS.len() {
        out = "-- nothing to do: the schema is up to date\n".into();
        for note in plans.iter().flat_map(|p| &p.notes) {
            let _ = writeln!(out, "-- note: {note}");
        }
    }
    Ok(out)
}

/// Whether a migration's `statement` does nothing on `outbox_event` once it is adopted: the
/// table it creates is there, an index it adds is there (adoption adds every index the relay
/// needs, or the name is taken), or the index it drops is not there.
fn no_op_after_adoption(shape: &TableShape, statement: &str) -> bool {
    if !statement.contains(DEFAULT_TABLE) {
        return false;
    }
    let words: Vec<&str> = statement.split_whitespace().collect();
    let index_after = |verb: &str| {
        words
            .windows(3)
            .find(|w| w[0].eq_ignore_ascii_case(verb) && w[1].eq_ignore_ascii_case("INDEX"))
            .map(|w| w[2])
    };
    if statement.starts_with("CREATE TABLE IF NOT EXISTS") || index_after("ADD").is_some() {
        true
    } else if let Some(name) = index_after("DROP") {
        shape.index(name).is_none()
    } else {
        false
    }
}

/// The check `run` makes before it starts, the same comparison `migrate --plan` prints: an
/// error naming what each table lacks (and how to add it) when the relay cannot run on it;
/// otherwise the warnings of tables it runs on more slowly.
pub async fn check_for_run(
    conn: &mut Conn,
    outbox_tables: &[TableName],
) -> Result<Result<Vec<String>, String>, MigrateError> {
    let mut warnings = Vec::new();
    let mut blocked = Vec::new();
    for table in outbox_tables {
        match TableShape::read(conn, table).await? {
            None => blocked.push(format!(
                "outbox table {table} does not exist: run `outbox-relay migrate` (it creates it), \
                 or fix outbox.tables"
            )),
            Some(shape) => {
                let plan = TablePlan::compare(table, &shape, OnlineRule { max_rows: None });
                blocked.extend(plan.blocks_run());
                warnings.extend(plan.slows_run());
            }
        }
    }
    Ok(if blocked.is_empty() {
        Ok(warnings)
    } else {
        Err(blocked.join("\n"))
    })
}
