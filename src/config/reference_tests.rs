//! The reference pages in `docs/` cannot drift from the code.
//!
//! - `docs/reference/configuration.md` names every configuration key the code has (a key table
//!   with each key's default and environment variable, and one complete TOML example), and no
//!   other. The code's keys come from serde itself: every section refuses unknown keys, and the
//!   refusal lists the keys it knows, `Option` fields included.
//! - Every `section.key` the user docs name is a key the code has.
//! - `docs/reference/schema.md` names exactly the tables, columns and indexes that
//!   `crates/producer/migrations/*.sql` leave, applied in order.
//! - `docs/reference/metrics.md` names every metric the relay registers.
//! - Every relative link in `README.md`, `DEVELOPMENT.md` and `docs/**/*.md` points to a file
//!   that exists, and every `#anchor` to a heading of its page.

use super::{Config, ENV_PREFIX};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CONFIGURATION_PAGE: &str = include_str!("../../docs/reference/configuration.md");
const SCHEMA_PAGE: &str = include_str!("../../docs/reference/schema.md");
const METRICS_PAGE: &str = include_str!("../../docs/reference/metrics.md");

/// The line before the configuration page's complete example.
const EXAMPLE_MARKER: &str = "<!-- reference-example";

/// Indexes that exist without a migration: `outbox-relay partitions convert` replaces
/// `uk_event_id` with this one.
const INDEXES_BESIDE_MIGRATIONS: &[&str] = &["idx_event_id"];

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------------------------------------
// The configuration page

/// The keys serde knows at `path` (a section, or the root): what its refusal of an unknown key
/// lists ("unknown field `__probe__`, expected one of `a`, `b`").
fn fields_at(path: &[String]) -> Vec<String> {
    let mut document = String::new();
    if !path.is_empty() {
        document.push_str(&format!("[{}]\n", path.join(".")));
    }
    document.push_str("__probe__ = 1\n");
    let error = toml::from_str::<Config>(&document)
        .expect_err("every section refuses unknown keys (deny_unknown_fields)")
        .to_string();
    let (_, expected) = error.split_once("expected").unwrap_or_else(|| {
        panic!("{path:?}: serde's refusal does not list the known keys: {error}")
    });
    backticked(expected)
}

/// The `text` between pairs of backticks.
fn backticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

fn lookup<'a>(root: &'a toml::Value, path: &[String]) -> Option<&'a toml::Value> {
    path.iter().try_fold(root, |value, key| value.get(key))
}

/// The code's configuration: every dotted key, its default (`None` for an `Option` that is
/// unset by default) and the dotted paths of its sections.
struct CodeKeys {
    defaults: BTreeMap<String, Option<toml::Value>>,
    sections: BTreeSet<String>,
}

fn code_keys() -> CodeKeys {
    let defaults = toml::Value::try_from(Config::default()).expect("defaults serialise");
    let mut keys = CodeKeys {
        defaults: BTreeMap::new(),
        sections: BTreeSet::new(),
    };
    collect_code_keys(&defaults, &mut Vec::new(), &mut keys);
    keys
}

fn collect_code_keys(defaults: &toml::Value, path: &mut Vec<String>, keys: &mut CodeKeys) {
    for field in fields_at(path) {
        path.push(field);
        match lookup(defaults, path) {
            // A non-empty table by default is a section (a struct); an empty one is a map key
            // (`rocketmq.topic_types`).
            Some(toml::Value::Table(table)) if !table.is_empty() => {
                keys.sections.insert(path.join("."));
                collect_code_keys(defaults, path, keys);
            }
            default => {
                keys.defaults.insert(path.join("."), default.cloned());
            }
        }
        path.pop();
    }
}

/// The dotted keys of `value`, descending only into `sections`.
fn document_keys(
    value: &toml::Value,
    sections: &BTreeSet<String>,
    path: &mut Vec<String>,
    keys: &mut Vec<String>,
) {
    let toml::Value::Table(table) = value else {
        return;
    };
    for (key, value) in table {
        path.push(key.clone());
        let dotted = path.join(".");
        if sections.contains(&dotted) && value.is_table() {
            document_keys(value, sections, path, keys);
        } else {
            keys.push(dotted);
        }
        path.pop();
    }
}

/// The complete example: the first ```toml block after [`EXAMPLE_MARKER`].
fn example_block(page: &str) -> String {
    let (_, after) = page
        .split_once(EXAMPLE_MARKER)
        .expect("the configuration page marks its complete example");
    let mut lines = after.lines().skip_while(|l| l.trim() != "```toml").skip(1);
    let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
    assert!(!block.is_empty(), "an empty example after {EXAMPLE_MARKER}");
    block.join("\n")
}

/// The example with its commented-out settings (`# key = value`, e.g. the secret that may not
/// be set beside the secret file) made live, so that they are checked too.
fn uncommented(example: &str) -> String {
    example
        .lines()
        .map(|line| {
            let rest = line.trim_start().strip_prefix('#').map(str::trim_start);
            match rest {
                Some(rest) if is_assignment(rest) => rest,
                _ => line,
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_assignment(line: &str) -> bool {
    line.split_once('=').is_some_and(|(key, _)| {
        let key = key.trim();
        !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    })
}

/// A row of a key table: `| `section.key` | default | `ENV` | what it does |`.
struct KeyRow {
    key: String,
    default: String,
    env: String,
}

fn key_rows(page: &str) -> Vec<KeyRow> {
    let mut rows = Vec::new();
    for line in page.lines() {
        let cells: Vec<&str> = line.trim().split('|').map(str::trim).collect();
        // "", key, default, env, what, ""
        if cells.len() < 5 || !cells[0].is_empty() {
            continue;
        }
        let Some(key) = cells[1].strip_prefix('`').and_then(|k| k.strip_suffix('`')) else {
            continue;
        };
        if !key.contains('.') {
            continue;
        }
        rows.push(KeyRow {
            key: key.to_string(),
            default: cells[2].to_string(),
            env: cells[3].to_string(),
        });
    }
    rows
}

/// `OUTBOX_RELAY_<SECTION>__<KEY>`.
fn env_var(key: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        key.replace('.', "__").to_ascii_uppercase()
    )
}

/// A value as the page may write it: no quotes, no spaces.
fn normalised(text: &str) -> String {
    text.chars()
        .filter(|c| *c != '"' && !c.is_whitespace())
        .collect()
}

fn difference(label: &str, a: &BTreeSet<String>, b: &BTreeSet<String>) -> Option<String> {
    let missing: Vec<&String> = a.difference(b).collect();
    (!missing.is_empty()).then(|| format!("{label}: {missing:?}"))
}

/// Problems of the configuration page `page` against the code (empty when it is right).
fn configuration_page_problems(page: &str) -> Vec<String> {
    let code = code_keys();
    let code_set: BTreeSet<String> = code.defaults.keys().cloned().collect();
    let mut problems = Vec::new();

    // The example as written: a configuration the relay accepts.
    let example = example_block(page);
    match toml::from_str::<Config>(&example) {
        Ok(config) => {
            if let Err(error) = config.validate() {
                problems.push(format!("the example is not a valid configuration: {error}"));
            }
        }
        Err(error) => problems.push(format!("the example does not parse: {error}")),
    }
    // With its commented-out keys: every key, no other.
    let full = uncommented(&example);
    if let Err(error) = toml::from_str::<Config>(&full) {
        problems.push(format!(
            "the example, commented keys included, does not parse: {error}"
        ));
    }
    match full.parse::<toml::Table>() {
        Ok(table) => {
            let mut keys = Vec::new();
            document_keys(
                &toml::Value::Table(table),
                &code.sections,
                &mut Vec::new(),
                &mut keys,
            );
            let example_set: BTreeSet<String> = keys.into_iter().collect();
            problems.extend(difference(
                "keys the example does not set",
                &code_set,
                &example_set,
            ));
            problems.extend(difference(
                "keys of the example the code does not have",
                &example_set,
                &code_set,
            ));
        }
        Err(error) => problems.push(format!("the example is not TOML: {error}")),
    }

    // The key tables: every key once, its default and its environment variable.
    let rows = key_rows(page);
    let mut table_set = BTreeSet::new();
    for row in &rows {
        if !table_set.insert(row.key.clone()) {
            problems.push(format!("`{}` has two rows", row.key));
        }
        let Some(default) = code.defaults.get(&row.key) else {
            continue; // reported below
        };
        let expected_env = format!("`{}`", env_var(&row.key));
        if row.env != expected_env {
            problems.push(format!(
                "`{}`: environment variable {} instead of {expected_env}",
                row.key, row.env
            ));
        }
        let written = backticked(&row.default);
        match default {
            Some(value) => {
                let expected = normalised(&value.to_string());
                if !row.default.starts_with('`')
                    || written.first().map(|w| normalised(w)) != Some(expected.clone())
                {
                    problems.push(format!(
                        "`{}`: default {:?}, the code's is `{expected}`",
                        row.key, row.default
                    ));
                }
            }
            None => {
                if !row.default.starts_with("none") {
                    problems.push(format!(
                        "`{}` is unset by default: its default cell should start with \"none\", not {:?}",
                        row.key, row.default
                    ));
                }
            }
        }
    }
    problems.extend(difference(
        "keys missing from the key tables",
        &code_set,
        &table_set,
    ));
    problems.extend(difference(
        "keys in the key tables the code does not have",
        &table_set,
        &code_set,
    ));
    problems
}

#[test]
fn the_configuration_page_names_every_key_with_its_default_and_environment_variable() {
    let problems = configuration_page_problems(CONFIGURATION_PAGE);
    assert!(
        problems.is_empty(),
        "docs/reference/configuration.md has drifted from the config structs:\n- {}",
        problems.join("\n- ")
    );
}

#[test]
fn the_configuration_check_catches_a_missing_and_an_unknown_key() {
    let code = code_keys();
    assert!(code.defaults.contains_key("mysql.url"), "Option keys count");
    assert!(code.defaults.contains_key("rocketmq.secret_key_file"));
    assert!(code.defaults.contains_key("rocketmq.topic_types"));

    let unknown = CONFIGURATION_PAGE.replace("max_retry = 8\n", "max_retry = 8\nmax_retries = 8\n");
    let problems = configuration_page_problems(&unknown).join("\n");
    assert!(problems.contains("retry.max_retries"), "{problems}");

    let missing = CONFIGURATION_PAGE.replace("| `sweeper.lease` |", "| `sweeper.leased` |");
    let problems = configuration_page_problems(&missing).join("\n");
    assert!(
        problems.contains("keys missing from the key tables: [\"sweeper.lease\"]"),
        "{problems}"
    );
}

/// The user docs: `README.md` and `docs/`, not `docs/development/`.
fn user_pages() -> Vec<PathBuf> {
    markdown_pages()
        .into_iter()
        .filter(|p| {
            let relative = p.strip_prefix(repo_root()).unwrap_or(p);
            !relative.starts_with("docs/development") && relative != Path::new("DEVELOPMENT.md")
        })
        .collect()
}

#[test]
fn the_user_docs_name_only_configuration_keys_the_code_has() {
    let code = code_keys();
    let sections: BTreeSet<&str> = code
        .sections
        .iter()
        .filter(|s| !s.contains('.'))
        .map(String::as_str)
        .collect();
    let mut unknown = Vec::new();
    for page in user_pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for token in backticked(&text) {
            let Some((section, key)) = token.split_once('.') else {
                continue;
            };
            let is_key = sections.contains(section)
                && !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            let is_file = ["toml", "md", "rs", "sql", "yml", "json", "sh"].contains(&key);
            if is_key && !is_file && !code.defaults.contains_key(&token) {
                unknown.push(format!("{}: `{token}`", page.display()));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "the docs name configuration keys the code does not have:\n{}",
        unknown.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// The schema page

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

/// The tables `crates/producer/migrations/*.sql` leave, applied in file-name order.
fn schema_from_migrations() -> BTreeMap<String, TableSchema> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("crates/producer/migrations"))
        .expect("crates/producer/migrations/")
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
    } else if is(0, "ALTER") && is(1, "TABLE") {
        let name = identifier(words[2]);
        let table = tables
            .get_mut(&name)
            .unwrap_or_else(|| panic!("{}: ALTER of unknown table {name}", file.display()));
        let rest = words[3..].join(" ");
        for clause in top_level_clauses(&rest) {
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
        "docs/reference/schema.md has drifted from crates/producer/migrations/:\n- {}",
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
        "idx_status_created",
        "idx_pending",
        "idx_waiting_key",
    ]
    .map(String::from)
    .into();
    assert_eq!(
        outbox.indexes, expected,
        "the parser reads 0009, 0010, 0013"
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
            if looks_like_index && !known.contains(&token) {
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

// ---------------------------------------------------------------------------------------------
// The metrics page

#[test]
fn the_metrics_page_names_every_metric_the_relay_registers() {
    let text = crate::metrics::relay().render();
    let documented: BTreeSet<String> = backticked(METRICS_PAGE)
        .into_iter()
        .map(|t| t.split('{').next().unwrap_or("").to_string())
        .collect();
    let mut missing = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        let exported = if kind == "counter" {
            format!("{name}_total")
        } else {
            name.to_string()
        };
        if !documented.contains(&exported) {
            missing.push(exported);
        }
    }
    assert!(
        missing.is_empty(),
        "docs/reference/metrics.md lacks these metrics: {missing:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Links

/// `README.md`, `DEVELOPMENT.md` and every page under `docs/`.
fn markdown_pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, pages: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, pages);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    let root = repo_root();
    let mut pages = vec![root.join("README.md"), root.join("DEVELOPMENT.md")];
    walk(&root.join("docs"), &mut pages);
    pages.sort();
    pages
}

/// The page's lines outside fenced code blocks.
fn prose_lines(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for line in prose_lines(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let slug = slug(heading.trim_start_matches('#'));
        let n = seen.entry(slug.clone()).or_default();
        anchors.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    anchors
}

/// The targets of the inline links `[text](target)` of a page's prose.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose_lines(text) {
        // Inline code is not a link.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join("");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.to_string());
            rest = &rest[end..];
        }
    }
    targets
}

#[test]
fn every_relative_link_in_the_docs_points_to_a_file_and_heading_that_exist() {
    let mut broken = Vec::new();
    for page in markdown_pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !path.exists() {
                broken.push(format!("{}: ({target}): no such file", page.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                if path.extension().is_some_and(|e| e == "md") {
                    let linked = std::fs::read_to_string(&path).unwrap();
                    if !anchors(&linked).contains(anchor) {
                        broken.push(format!("{}: ({target}): no such heading", page.display()));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn headings_become_githubs_anchors() {
    assert_eq!(
        slug(" `status`: is it healthy?"),
        "status-is-it-healthy".to_string()
    );
    assert_eq!(
        slug(" Retry, resend, mark-failed"),
        "retry-resend-mark-failed".to_string()
    );
    let text = "# A\n```\n# not a heading\n```\n## A\n";
    assert_eq!(anchors(text), ["a".to_string(), "a-1".to_string()].into());
    assert_eq!(
        link_targets("see [x](a.md#b) and `[y](c.md)` and [z](d.md)"),
        vec!["a.md#b".to_string(), "d.md".to_string()]
    );
}
