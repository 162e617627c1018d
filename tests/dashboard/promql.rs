//! A small PromQL scanner: the metric names an expression reads (see the module docs of
//! `tests/dashboard.rs` for what counts as one).

use super::{names, variable_selector};
use std::collections::BTreeSet;

/// PromQL words that look like identifiers but name no metric (besides
/// [`LABEL_LIST_KEYWORDS`]).
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "offset",
    "bool",
    "atan2",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "inf",
    "nan",
];

/// Keywords followed by a parenthesised list of label names, not of expressions.
const LABEL_LIST_KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The index just past the bracket that closes the one at `open` (`{`, `[` or `(`), skipping
/// quoted strings; the end of `s` if it never closes.
fn skip_balanced(s: &[char], open: usize) -> usize {
    let (opening, closing) = match s[open] {
        '{' => ('{', '}'),
        '[' => ('[', ']'),
        _ => ('(', ')'),
    };
    let mut depth = 0;
    let mut i = open;
    while i < s.len() {
        match s[i] {
            '"' | '\'' | '`' => i = skip_string(s, i) - 1,
            c if c == opening => depth += 1,
            c if c == closing => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    s.len()
}

/// The index just past the string literal starting at `start` (its quote character).
fn skip_string(s: &[char], start: usize) -> usize {
    let quote = s[start];
    let mut i = start + 1;
    while i < s.len() && s[i] != quote {
        i += if s[i] == '\\' && quote != '`' { 2 } else { 1 };
    }
    (i + 1).min(s.len())
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The metric names a PromQL expression reads (see the module docs for the rules).
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let s: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&s, i);
        } else if c == '{' || c == '[' {
            i = skip_balanced(&s, i);
        } else if c == '$' {
            // A Grafana variable: `$name` or `${name}`.
            i += 1;
            if s.get(i) == Some(&'{') {
                i = skip_balanced(&s, i);
            }
            while i < s.len() && is_ident_char(s[i]) {
                i += 1;
            }
        } else if c.is_ascii_digit() || c == '.' {
            // A number or a duration (`0.99`, `1e6`, `15m`).
            while i < s.len() && (is_ident_char(s[i]) || s[i] == '.') {
                i += 1;
            }
        } else if is_ident_start(c) {
            let start = i;
            while i < s.len() && is_ident_char(s[i]) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let mut next = i;
            while next < s.len() && s[next].is_whitespace() {
                next += 1;
            }
            let called = s.get(next) == Some(&'(');
            if called && LABEL_LIST_KEYWORDS.contains(&word.as_str()) {
                i = skip_balanced(&s, next);
            } else if !called
                && !KEYWORDS.contains(&word.as_str())
                && !LABEL_LIST_KEYWORDS.contains(&word.as_str())
            {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn the_scanner_finds_metric_names_and_nothing_else() {
    let cases: &[(&str, &[&str])] = &[
        (
            r#"sum by (job) (increase(outbox_events_failed_total{class="x",job=~"$job"}[10m])) > 0"#,
            &["outbox_events_failed_total"],
        ),
        (
            "histogram_quantile(0.99, sum by (le) (rate(latency_seconds_bucket{a=\"b\"}[$__rate_interval])))",
            &["latency_seconds_bucket"],
        ),
        (
            "max by (job, instance) (age) > 60\nand on (job, instance) outbox_leader == 1",
            &["age", "outbox_leader"],
        ),
        (
            "max by (table) (failed) - max by (table) (failed offset 15m) > 0",
            &["failed"],
        ),
        (r#"absent(up{job=~"outbox-relay.*"})"#, &["up"]),
        (r#"odd{a="}{[(", b!~'q\'}', c=`x"`}"#, &["odd"]),
        (
            "sum without(instance) (m) / ignoring (class) group_left(le) n",
            &["m", "n"],
        ),
        (
            "sum(rate(a[5m])) / sum(rate(b[${__range}] offset 1d))",
            &["a", "b"],
        ),
        ("1e3 * inf + 2.5 > bool 0", &[]),
        ("ns:recorded_rule:rate5m", &["ns:recorded_rule:rate5m"]),
    ];
    for (expr, expected) in cases {
        assert_eq!(metric_names(expr), names(expected), "{expr}");
    }
    assert_eq!(
        variable_selector(r#"label_values(outbox_leader{job=~"$job"}, instance)"#),
        r#"outbox_leader{job=~"$job"}"#
    );
}
