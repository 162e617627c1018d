//! `docs/reference/schema.md` names exactly the tables, columns and indexes the migrations leave;
//! the user docs name only indexes that exist.

use super::{backticked, difference, repo_root, user_pages};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SCHEMA_PAGE: &str = include_str!("../../docs/reference/schema.md");

/// Indexes that exist without a migration: `outbox-relay partitions convert` replaces
/// `uk_event_id` with this one.
const INDEXES_BESIDE_MIGRATIONS: &[&str] = &["idx_event_id"];
/// The one page that names the relay's retired indexes (what `migrate` says of them).
const RETIRED_INDEXES_PAGE: &str = "guides/switching-over.md";

/// Columns and indexes of one table.
#[derive(Debug, Default, PartialEq, Eq)]
struct TableSchema {
    columns: BTreeSet<String>,
    indexes: BTreeSet<String>,
}

fn identifier(word: &str) -> String {
    word.trim_matches(|c: char| c == '`' || c == ',' || c == ';' || c == '(' || c == ')')
        .to_string()
}

/// The tables `migrations/*.sql` leave, applied in file-name order.
fn schema_from_migrations() -> BTreeMap<String, TableSchema> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("migrations"))
        .expect("migrations/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    let mut tables: BTreeMap<String, TableSchema> = BTreeMap::new();
    for file in files {
        let sql: String = std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .map(|l| l.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        for statement in sql.split(';') {
            apply_statement(statement, &mut tables, &file);
        }
    }
    tables
}

fn apply_statement(statement: &str, tables: &mut BTreeMap<String, TableSchema>, file: &Path) {
    let words: Vec<&str> = statement.split_whitespace().collect();
    let upper: Vec<String> = words.iter().map(|w| w.to_ascii_uppercase()).collect();
    let is = |i: usize, w: &str| upper.get(i).is_some_and(|u| u == w);
    if is(0, "CREATE") && is(1, "TABLE") {
        let name_at = if is(2, "IF") { 5 } else { 2 };
        let table = tables.entry(identifier(words[name_at])).or_default();
        apply_create_table(statement, table);
    } else if is(0, "ALTER") && is(1, "TABLE") {
        let name = identifier(words[2]);
        let table = tables
            .get_mut(&name)
            .unwrap_or_else(|| panic!("{}: ALTER of unknown table {name}", file.display()));
        let rest = words[3..].join(" ");
        for clause in top_level_clauses(&rest) {
            apply_alter_clause(&clause, table, file);
        }
    }
}

/// The columns and indexes of a `CREATE TABLE … (…)` body, one definition per line.
fn apply_create_table(statement: &str, table: &mut TableSchema) {
    let (_, body) = statement.split_once('(').expect("CREATE TABLE … (");
    for line in body.lines() {
        let line_words: Vec<&str> = line.split_whitespace().collect();
        let Some(first) = line_words.first() else {
            continue;
        };
        match first.to_ascii_uppercase().as_str() {
            "PRIMARY" => {
                table.indexes.insert("PRIMARY".into());
            }
            "UNIQUE" => {
                let keyword = line_words.get(1).map(|w| w.to_ascii_uppercase());
                let at = if matches!(keyword.as_deref(), Some("KEY" | "INDEX")) {
                    2
                } else {
                    1
                };
                table.indexes.insert(identifier(line_words[at]));
            }
            "KEY" | "INDEX" => {
                table.indexes.insert(identifier(line_words[1]));
            }
            "CONSTRAINT" | "CHECK" | "FOREIGN" => {}
            w if w.starts_with(')') => {}
            _ => {
                table.columns.insert(identifier(first));
            }
        }
    }
}

/// One clause of an `ALTER TABLE`: an index or column added or dropped; panics on a clause it
/// does not understand, or on dropping an index that does not exist.
fn apply_alter_clause(clause: &str, table: &mut TableSchema, file: &Path) {
    let w: Vec<&str> = clause.split_whitespace().collect();
    let u: Vec<String> = w.iter().map(|x| x.to_ascii_uppercase()).collect();
    let word = |i: usize| u.get(i).map(String::as_str).unwrap_or("");
    match (word(0), word(1)) {
        ("ADD", "INDEX" | "KEY") => {
            table.indexes.insert(identifier(w[2]));
        }
        ("ADD", "UNIQUE") => {
            let at = if matches!(word(2), "INDEX" | "KEY") {
                3
            } else {
                2
            };
            table.indexes.insert(identifier(w[at]));
        }
        ("DROP", "INDEX" | "KEY") => {
            assert!(
                table.indexes.remove(&identifier(w[2])),
                "{}: drops index {} that does not exist",
                file.display(),
                w[2]
            );
        }
        ("ADD", "COLUMN") => {
            table.columns.insert(identifier(w[2]));
        }
        ("DROP", "COLUMN") => {
            table.columns.remove(&identifier(w[2]));
        }
        ("ALGORITHM" | "LOCK", _) => {}
        _ => panic!(
            "{}: a clause this test does not understand: {clause}",
            file.display()
        ),
    }
}

/// `a, b (x, y), c` → `a`, `b (x, y)`, `c`.
fn top_level_clauses(text: &str) -> Vec<String> {
    let mut clauses = vec![String::new()];
    let mut depth = 0usize;
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                clauses.push(String::new());
                continue;
            }
            _ => {}
        }
        clauses.last_mut().unwrap().push(c);
    }
    clauses
        .into_iter()
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
        .collect()
}

/// The schema page: a `## `table`` heading per table, then tables whose header's first cell
/// is `column` or `index`, one backticked name per row.
fn schema_from_page(page: &str) -> BTreeMap<String, TableSchema> {
    let mut tables: BTreeMap<String, TableSchema> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut kind = "";
    for line in page.lines() {
        let line = line.trim();
        if let Some(heading) = line.strip_prefix("## ") {
            current = heading
                .strip_prefix('`')
                .and_then(|h| h.split_once('`'))
                .map(|(name, _)| name.to_string());
            if let Some(name) = &current {
                tables.entry(name.clone()).or_default();
            }
            kind = "";
            continue;
        }
        if !line.starts_with('|') {
            continue;
        }
        let first = line.trim_start_matches('|').split('|').next().unwrap_or("");
        let first = first.trim();
        match first {
            "column" => kind = "column",
            "index" => kind = "index",
            _ => {
                let (Some(table), Some(name)) = (
                    &current,
                    first.strip_prefix('`').and_then(|f| f.strip_suffix('`')),
                ) else {
                    continue;
                };
                let entry = tables.get_mut(table).unwrap();
                match kind {
                    "column" => entry.columns.insert(name.to_string()),
                    "index" => entry.indexes.insert(name.to_string()),
                    _ => continue,
                };
            }
        }
    }
    tables
}

fn schema_page_problems(page: &str) -> Vec<String> {
    let migrated = schema_from_migrations();
    let documented = schema_from_page(page);
    let mut problems = Vec::new();
    let migrated_tables: BTreeSet<String> = migrated.keys().cloned().collect();
    let documented_tables: BTreeSet<String> = documented.keys().cloned().collect();
    problems.extend(difference(
        "tables the page lacks",
        &migrated_tables,
        &documented_tables,
    ));
    problems.extend(difference(
        "tables the migrations do not make",
        &documented_tables,
        &migrated_tables,
    ));
    for (name, table) in &migrated {
        let Some(page_table) = documented.get(name) else {
            continue;
        };
        let label = |what: &str| format!("{name}: {what}");
        problems.extend(difference(
            &label("columns the page lacks"),
            &table.columns,
            &page_table.columns,
        ));
        problems.extend(difference(
            &label("columns the migrations do not leave"),
            &page_table.columns,
            &table.columns,
        ));
        problems.extend(difference(
            &label("indexes the page lacks"),
            &table.indexes,
            &page_table.indexes,
        ));
        problems.extend(difference(
            &label("indexes the migrations do not leave"),
            &page_table.indexes,
            &table.indexes,
        ));
    }
    problems
}

#[test]
fn the_schema_page_names_the_tables_columns_and_indexes_the_migrations_leave() {
    let problems = schema_page_problems(SCHEMA_PAGE);
    assert!(
        problems.is_empty(),
        "docs/reference/schema.md has drifted from migrations/:\n- {}",
        problems.join("\n- ")
    );
}

#[test]
fn the_migrations_leave_the_outbox_indexes_the_relay_needs() {
    let migrated = schema_from_migrations();
    let outbox = &migrated["outbox_event"];
    let expected: BTreeSet<String> = [
        "PRIMARY",
        "uk_event_id",
        "idx_created",
        "idx_pending",
        "idx_waiting_key",
    ]
    .map(String::from)
    .into();
    assert_eq!(
        outbox.indexes, expected,
        "the parser reads 0009, 0010, 0013, 0015"
    );
    assert!(outbox.columns.contains("deliver_at"), "0014");

    let stale = SCHEMA_PAGE.replace("| `idx_pending` |", "| `idx_claim` |");
    let problems = schema_page_problems(&stale).join("\n");
    assert!(problems.contains("[\"idx_pending\"]"), "{problems}");
    assert!(problems.contains("[\"idx_claim\"]"), "{problems}");
}

#[test]
fn the_user_docs_name_only_indexes_that_exist() {
    let migrated = schema_from_migrations();
    let mut known: BTreeSet<String> = migrated
        .values()
        .flat_map(|t| t.indexes.iter().cloned())
        .collect();
    known.extend(INDEXES_BESIDE_MIGRATIONS.iter().map(|s| s.to_string()));
    let mut stale = Vec::new();
    for page in user_pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for token in backticked(&text) {
            let looks_like_index = (token.starts_with("idx_") || token.starts_with("uk_"))
                && token
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            let retired = crate::schema::shape::RETIRED_INDEXES
                .iter()
                .any(|r| r.name == token);
            let named_as_retired = retired && page.ends_with(RETIRED_INDEXES_PAGE);
            if looks_like_index && !known.contains(&token) && !named_as_retired {
                stale.push(format!("{}: `{token}`", page.display()));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "the docs name indexes no migration leaves:\n{}",
        stale.join("\n")
    );
}
