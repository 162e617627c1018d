//! The Grafana dashboard (`deploy/grafana/outbox-relay.json`) and the Prometheus alert rules
//! (`deploy/prometheus/outbox-relay-rules.yml`) name only metrics that really exist: every
//! metric name in every panel query, template variable query and rule expression must appear in
//! a live `/metrics` scrape of a running `outbox-relay run` (which has sent events, so its
//! per-table and per-shard families have label sets) or in the consumer library's export
//! (`ConsumerMetrics::register` into a registry, after it has counted each outcome once).
//!
//! A name counts as exported when it is a sample's name or is implied by a `# TYPE` line
//! (`counter` X: `X_total`; `histogram` X: `X_bucket`, `X_sum`, `X_count`). Names that are not
//! the relay's are accepted only from [`NOT_EXPORTED_HERE`], each with its reason.
//!
//! The names come from a small PromQL scanner ([`metric_names`], in `dashboard/promql.rs`): an
//! identifier outside label matchers (`{…}`), ranges (`[…]`) and strings that is not a function
//! (followed by `(`), not a keyword or aggregation operator, and not in a `by`/`without`/`on`/
//! `ignoring`/`group_left`/`group_right` label list. Grafana variables (`$job`) are skipped.

use crate::common;
#[path = "dashboard/promql.rs"]
mod promql;

use common::http::{free_addr, get};
use common::ledger::{ledger_db, Failure, Ledger};
use common::process::{write_config_file, RelayProcess};
use common::relay::{relay_config, wait_for, wait_until_sent, write_events};
use common::rocketmq::new_topic;
use prometheus_client::registry::Registry;
use promql::metric_names;
use rocketmq_outbox::consumer::{ConsumedEvent, ConsumerMetrics, Disposition, IdempotentProcessor};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

const DASHBOARD: &str = "deploy/grafana/outbox-relay.json";
const RULES: &str = "deploy/prometheus/outbox-relay-rules.yml";
const RULE_TESTS: &str = "deploy/prometheus/outbox-relay-rules.test.yml";

/// Names a query may use that the live scrape does not show, and why. Keep this short: every
/// entry is a name nothing here proves to exist.
const NOT_EXPORTED_HERE: &[(&str, &str)] = &[
    (
        "up",
        "Prometheus's own per-target series (1 when the scrape worked); no target exports it",
    ),
    (
        "outbox_topic_stalled_since_seconds",
        "one series per topic that stopped accepting events, only once one has: \
         tests/isolation.rs reads it from the relay's registry while a topic is read-only",
    ),
    (
        "outbox_xa_prepared_since_seconds",
        "one series per XA transaction prepared and not yet committed or rolled back: \
         tests/xa.rs finds it in the relay's /metrics text while one is prepared",
    ),
];

/// One PromQL expression and where it comes from.
#[derive(Debug, Clone)]
struct Query {
    origin: String,
    expr: String,
}

/// The selector a Grafana `label_values(SELECTOR, label)` variable reads (its first argument),
/// or the whole query for any other kind.
fn variable_selector(query: &str) -> &str {
    match query.trim().strip_prefix("label_values(") {
        Some(args) => args.rsplit_once(',').map_or(args, |(selector, _)| selector),
        None => query,
    }
}

/// Every query of a dashboard: panel targets (rows' nested panels too) and template variables.
fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<Query> {
    fn panels(list: &serde_json::Value, out: &mut Vec<Query>) {
        for panel in list.as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("?");
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push(Query {
                        origin: format!("dashboard panel {title:?}"),
                        expr: expr.to_string(),
                    });
                }
            }
            panels(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"]
            .as_str()
            .or_else(|| variable["query"].as_str())
            .expect("a query variable has a query");
        out.push(Query {
            origin: format!("dashboard variable ${}", variable["name"].as_str().unwrap()),
            expr: variable_selector(query).to_string(),
        });
    }
    out
}

#[derive(Debug, Deserialize)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(Debug, Deserialize)]
struct RuleGroup {
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
struct Rule {
    alert: Option<String>,
    record: Option<String>,
    expr: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn load_dashboard() -> serde_json::Value {
    serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON")
}

fn load_rules() -> Vec<Rule> {
    let file: RuleFile = serde_yaml::from_str(&read(RULES)).expect("the rules are YAML");
    file.groups.into_iter().flat_map(|g| g.rules).collect()
}

/// The parts of a promtool test file this test reads: which alert is expected when.
#[derive(Debug, Deserialize)]
struct RuleTestFile {
    tests: Vec<RuleTest>,
}

#[derive(Debug, Deserialize)]
struct RuleTest {
    #[serde(default)]
    alert_rule_test: Vec<AlertCase>,
}

#[derive(Debug, Deserialize)]
struct AlertCase {
    alertname: String,
    #[serde(default)]
    exp_alerts: Vec<serde_yaml::Value>,
}

fn rule_queries(rules: &[Rule]) -> Vec<Query> {
    rules
        .iter()
        .map(|rule| Query {
            origin: format!(
                "rule {}",
                rule.alert.as_deref().or(rule.record.as_deref()).unwrap()
            ),
            expr: rule.expr.clone(),
        })
        .collect()
}

/// The names a Prometheus text exposition shows: sample names, and those implied by `# TYPE`.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let (name, kind) = declared.split_once(' ').expect("# TYPE name kind");
            names.insert(name.to_string());
            let suffixes: &[&str] = match kind.trim() {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["_sum", "_count"],
                _ => &[],
            };
            names.extend(suffixes.iter().map(|suffix| format!("{name}{suffix}")));
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

/// Each name a query uses that is neither exported nor allowed, with the query naming it.
fn unexported(
    queries: &[Query],
    exported: &BTreeSet<String>,
    allowed: &[(&str, &str)],
) -> Vec<String> {
    let mut missing = Vec::new();
    for query in queries {
        for name in metric_names(&query.expr) {
            if !exported.contains(&name) && !allowed.iter().any(|(a, _)| *a == name) {
                missing.push(format!("{name} (in {}: {})", query.origin, query.expr));
            }
        }
    }
    missing
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn exposition_names_include_those_implied_by_type_lines() {
    let text = "# HELP c Things.\n# TYPE c counter\n# TYPE h histogram\n\
                h_bucket{le=\"1.0\"} 0\n# TYPE g gauge\ng{table=\"t\"} 1\nplain 2\n# EOF\n";
    assert_eq!(
        exported_names(text),
        names(&["c", "c_total", "h", "h_bucket", "h_sum", "h_count", "g", "plain"])
    );
}

#[test]
fn a_query_naming_a_metric_that_does_not_exist_is_reported() {
    let exported = exported_names(&rocketmq_outbox::metrics::relay().render());
    let queries = vec![
        Query {
            origin: "real".into(),
            expr: "rate(outbox_events_sent_total[5m])".into(),
        },
        Query {
            origin: "typo".into(),
            expr: "rate(outbox_events_snet_total[5m]) + up".into(),
        },
    ];
    let missing = unexported(&queries, &exported, NOT_EXPORTED_HERE);
    assert_eq!(missing.len(), 1, "{missing:?}");
    assert!(
        missing[0].starts_with("outbox_events_snet_total (in typo:"),
        "{missing:?}"
    );
    assert_eq!(
        unexported(&queries[1..], &exported, &[]).len(),
        2,
        "without the allow-list `up` is missing too"
    );
}

#[test]
fn the_dashboard_and_the_rules_are_complete() {
    let dashboard = load_dashboard();
    assert_eq!(dashboard["schemaVersion"], 39);
    let variables: BTreeSet<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    for wanted in ["datasource", "instance", "table"] {
        assert!(variables.contains(wanted), "variable {wanted}");
    }
    let queries = dashboard_queries(&dashboard);
    let rules = load_rules();
    for query in queries.iter().chain(&rule_queries(&rules)) {
        assert!(
            !metric_names(&query.expr).is_empty(),
            "{}: no metric in {}",
            query.origin,
            query.expr
        );
    }
    for rule in &rules {
        let name = rule.alert.as_deref().expect("only alerting rules");
        assert!(
            ["critical", "warning"].contains(&rule.labels["severity"].as_str()),
            "{name}"
        );
        for annotation in ["summary", "description"] {
            assert!(rule.annotations.contains_key(annotation), "{name}");
        }
    }
    let used: BTreeSet<String> = queries
        .iter()
        .chain(&rule_queries(&rules))
        .flat_map(|q| metric_names(&q.expr))
        .collect();
    for (name, _) in NOT_EXPORTED_HERE {
        assert!(used.contains(*name), "stale allow-list entry {name}");
    }
}

#[test]
fn every_alert_has_a_promtool_case_that_fires_it_and_one_that_must_not() {
    let file: RuleTestFile = serde_yaml::from_str(&read(RULE_TESTS)).expect("promtool tests");
    let cases: Vec<AlertCase> = file
        .tests
        .into_iter()
        .flat_map(|t| t.alert_rule_test)
        .collect();
    for rule in load_rules() {
        let name = rule.alert.expect("only alerting rules");
        let of_it = || cases.iter().filter(|c| c.alertname == name);
        assert!(
            of_it().any(|c| !c.exp_alerts.is_empty()),
            "{RULE_TESTS}: no case fires {name}"
        );
        assert!(
            of_it().any(|c| c.exp_alerts.is_empty()),
            "{RULE_TESTS}: no case shows when {name} must not fire"
        );
    }
}

/// The consumer library's export after it has counted every outcome once: a processed event,
/// its duplicate, a rejected event and one handed back for a retry.
async fn consumer_export() -> String {
    let db = ledger_db("dashboard_consumer").await;
    let ledger = Ledger::new("dashboard");
    ledger.fail("dashboard-retry", 1, Failure::Retry);
    let metrics = ConsumerMetrics::new();
    let processor = IdempotentProcessor::new(db.pool.clone(), "dashboard", ledger)
        .unwrap()
        .with_metrics(metrics.clone());
    let event = |id: &str, payload: &str| {
        ConsumedEvent::new("orders", payload.as_bytes().to_vec()).with_property("event_id", id)
    };
    let credit = event("dashboard-1", r#"{"account":"a","amount":1}"#);
    assert_eq!(processor.process(&credit).await, Disposition::Processed);
    assert!(matches!(
        processor.process(&credit).await,
        Disposition::Duplicate { .. }
    ));
    let bad = event("dashboard-bad", r#"{"bad":"no account"}"#);
    assert!(matches!(
        processor.process(&bad).await,
        Disposition::Rejected { .. }
    ));
    let retried = event("dashboard-retry", r#"{"account":"a","amount":2}"#);
    assert!(matches!(
        processor.process(&retried).await,
        Disposition::Retry { .. }
    ));
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_the_rules_use_is_exported() {
    let started = Instant::now();
    let db = ledger_db("dashboard").await;
    let topic = new_topic("dashboard");
    let (mut config, dir) = relay_config(&db);
    config.metrics.refresh = Duration::from_millis(300);
    // A watched consumer group, so the relay exports the dead-letter gauges (0: no DLQ yet).
    config.rocketmq.dead_letter_groups = vec!["dashboard".into()];
    let addr = free_addr();
    let file = write_config_file(&config, dir.path());
    // Daily partitions, so the relay exports `outbox_partitions_ahead` for the table.
    let convert = std::process::Command::new(outbox_devenv::workspace_binary("outbox-relay"))
        .arg("-c")
        .arg(&file)
        .args([
            "partitions",
            "convert",
            "--operator",
            "test",
            "--reason",
            "dashboard",
        ])
        .output()
        .unwrap();
    assert!(
        convert.status.success(),
        "{}",
        String::from_utf8_lossy(&convert.stderr)
    );
    let relay = RelayProcess::spawn_serving(&file, &addr, &dir.path().join("relay.log"), &[]);
    wait_for("ready", Duration::from_secs(60), || async {
        get(&addr, "/readyz").is_some_and(|(status, _)| status == 200)
    })
    .await;
    write_events(&db, &topic, 2, 10, 4).await;
    wait_until_sent(&db, 20, Duration::from_secs(60)).await;
    // The families whose label sets only a running relay knows: the table gauges (set by the
    // refresher; partitions ahead for a partitioned table), the shards' queue depths (set
    // once the leader's shards run) and the watched groups' dead-letter gauges.
    let scrape = || {
        get(&addr, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    };
    wait_for(
        "the table and shard families",
        Duration::from_secs(30),
        || async {
            let body = scrape();
            body.contains("outbox_oldest_pending_seconds{")
                && body.contains("outbox_failed_rows{")
                && body.contains("outbox_partitions_ahead{")
                && body.contains("outbox_shard_queue_depth{")
                && body.contains("outbox_dlq_received{")
        },
    )
    .await;
    let mut exported = exported_names(&scrape());
    relay.stop();
    exported.extend(exported_names(&consumer_export().await));

    let dashboard = dashboard_queries(&load_dashboard());
    let rules = rule_queries(&load_rules());
    let missing = unexported(
        &[dashboard.as_slice(), rules.as_slice()].concat(),
        &exported,
        NOT_EXPORTED_HERE,
    );
    assert!(
        missing.is_empty(),
        "names the relay and the consumer library do not export:\n{}\n\nexported: {exported:?}\n\
         (a CARGO_TARGET_DIR shared with another checkout: cargo links each checkout's build to \
         the same {}, so the relay started here may be the other checkout's)",
        missing.join("\n"),
        outbox_devenv::workspace_binary("outbox-relay").display()
    );
    let used: BTreeSet<String> = dashboard
        .iter()
        .chain(&rules)
        .flat_map(|q| metric_names(&q.expr))
        .collect();
    println!(
        "{} queries name {} metrics, all exported ({} allowed by name); {:.1} s",
        dashboard.len() + rules.len(),
        used.len(),
        NOT_EXPORTED_HERE.len(),
        started.elapsed().as_secs_f64()
    );
}
