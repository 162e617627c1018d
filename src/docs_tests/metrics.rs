//! `docs/reference/metrics.md` names every metric the relay registers.

use super::backticked;
use std::collections::BTreeSet;

const METRICS_PAGE: &str = include_str!("../../docs/reference/metrics.md");

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
