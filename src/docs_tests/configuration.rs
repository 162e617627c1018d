//! `docs/reference/configuration.md` names every configuration key the code has, with its default
//! and environment variable, and no other; the user docs name only keys the code has.

use super::{backticked, difference, normalised, user_pages};
use crate::config::{Config, ENV_PREFIX};
use std::collections::{BTreeMap, BTreeSet};

const CONFIGURATION_PAGE: &str = include_str!("../../docs/reference/configuration.md");

/// The line before the configuration page's complete example.
const EXAMPLE_MARKER: &str = "<!-- reference-example";

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

/// Problems of the configuration page `page` against the code (empty when it is right).
fn configuration_page_problems(page: &str) -> Vec<String> {
    let code = code_keys();
    let code_set: BTreeSet<String> = code.defaults.keys().cloned().collect();
    let mut problems = example_problems(page, &code, &code_set);
    problems.extend(key_table_problems(page, &code, &code_set));
    problems
}

/// The example as written: a configuration the relay accepts; with its commented-out keys:
/// every key, no other.
fn example_problems(page: &str, code: &CodeKeys, code_set: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    let example = example_block(page);
    match toml::from_str::<Config>(&example) {
        Ok(config) => {
            if let Err(error) = config.validate() {
                problems.push(format!("the example is not a valid configuration: {error}"));
            }
        }
        Err(error) => problems.push(format!("the example does not parse: {error}")),
    }
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
                code_set,
                &example_set,
            ));
            problems.extend(difference(
                "keys of the example the code does not have",
                &example_set,
                code_set,
            ));
        }
        Err(error) => problems.push(format!("the example is not TOML: {error}")),
    }
    problems
}

/// The key tables: every key once, its default and its environment variable.
fn key_table_problems(page: &str, code: &CodeKeys, code_set: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut table_set = BTreeSet::new();
    for row in &key_rows(page) {
        if !table_set.insert(row.key.clone()) {
            problems.push(format!("`{}` has two rows", row.key));
        }
        let Some(default) = code.defaults.get(&row.key) else {
            continue; // reported below
        };
        problems.extend(key_row_problems(row, default));
    }
    problems.extend(difference(
        "keys missing from the key tables",
        code_set,
        &table_set,
    ));
    problems.extend(difference(
        "keys in the key tables the code does not have",
        &table_set,
        code_set,
    ));
    problems
}

/// A key row's environment variable and default against the code's `default`.
fn key_row_problems(row: &KeyRow, default: &Option<toml::Value>) -> Vec<String> {
    let mut problems = Vec::new();
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
