//! `outbox-relay status` and `outbox-relay replay`, as the binary, on a real MariaDB or MySQL
//! and broker:
//! the status of an outbox with rows in every status (counts, oldest PENDING, FAILED reasons,
//! verdicts and exit codes, no password in any output), and the replay of a GTID range that
//! re-sends exactly the events in it without touching outbox rows.

use crate::common;

use common::process::write_config_file;
use common::relay::{
    commit_events, copies_per_event, current_position, relay_fixture, stored_messages,
    wait_until_sent, RunningRelay,
};
use common::rocketmq::new_topic;
use common::{database, TestDb};
use mysql_async::prelude::*;
use outbox_devenv::DatabaseKind;
use rocketmq_outbox::binlog::BinlogPosition;
use rocketmq_outbox::outbox::status::codes::{FAILED, SENDING};
use rocketmq_outbox::producer::NewEvent;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::process::Output;
use std::time::Duration;

/// A position's GTID part as `--from-gtid` takes it: MariaDB's `D-S-N,…` or MySQL's GTID set.
fn gtid(position: BinlogPosition) -> String {
    match (position.mariadb_gtid, position.mysql_gtid_set) {
        (Some(mariadb), _) => mariadb.to_string(),
        (None, Some(mysql)) => mysql.to_string(),
        (None, None) => panic!("the server has GTIDs"),
    }
}

/// How a position's GTID part starts when printed: `gtid 0-1-` (MariaDB, server id 1) or
/// `gtid set ` (MySQL).
fn printed_gtid() -> &'static str {
    match database().kind() {
        DatabaseKind::MariaDb => "gtid 0-1-",
        DatabaseKind::MySql => "gtid set ",
    }
}

async fn outbox_relay(args: &[&str]) -> Output {
    tokio::process::Command::new(outbox_devenv::workspace_binary("outbox-relay"))
        .args(args)
        .env_remove("OUTBOX_RELAY_CONFIG")
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("run outbox-relay")
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `status --json` with `url`: the exit code and the parsed report.
async fn status_json(url: &str) -> (i32, Value) {
    let out = outbox_relay(&["--mysql-url", url, "status", "--json"]).await;
    let (stdout, stderr) = text(&out);
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("status --json is JSON ({e}): {stdout} {stderr}"));
    (out.status.code().unwrap(), report)
}

/// A connection holding the election lock of deployment `default` in `db`, as its leader's
/// would: `status` finds the leader it names alive while this is open.
async fn hold_election_lock(db: &TestDb) -> mysql_async::Conn {
    let lock = rocketmq_outbox::leader::lock::lock_name(&db.name(), "default");
    let mut holder = db.conn().await;
    let took: Option<i64> = holder
        .exec_first("SELECT GET_LOCK(?, 0)", (&lock,))
        .await
        .unwrap();
    assert_eq!(took, Some(1), "the election lock is free");
    holder
}

/// A user with a password that may read the outbox and the binlog position; its URL.
async fn user_with_password(db: &TestDb, password: &str) -> String {
    let database = db.name();
    let user = format!("st_{}", std::process::id());
    let mut conn = db.conn().await;
    for sql in [
        format!("CREATE USER IF NOT EXISTS '{user}'@'%' IDENTIFIED BY '{password}'"),
        format!("GRANT SELECT, UPDATE ON `{database}`.* TO '{user}'@'%'"),
        format!(
            "GRANT {} ON *.* TO '{user}'@'%'",
            match common::database().kind() {
                DatabaseKind::MariaDb => "BINLOG MONITOR",
                DatabaseKind::MySql => "REPLICATION CLIENT",
            }
        ),
    ] {
        conn.query_drop(sql).await.unwrap();
    }
    db.url.replacen("root@", &format!("{user}:{password}@"), 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_rows_names_reasons_and_judges() {
    let db = TestDb::migrated("status_busy").await;
    let mut conn = db.conn().await;
    conn.query_drop(
        "INSERT INTO outbox_event (event_id, biz_key, topic, payload, status, created_at, lease_until, msg_id, last_error) VALUES \
         ('old-pending', 'k1', 'orders', '{}', 0, NOW(3) - INTERVAL 120 SECOND, NULL, DEFAULT, NULL), \
         ('new-pending', 'k2', 'orders', '{}', 0, NOW(3), NULL, DEFAULT, NULL), \
         ('sending', 'k3', 'orders', '{}', 1, NOW(3), NOW(3) + INTERVAL 60 SECOND, DEFAULT, NULL), \
         ('sent-1', 'k4', 'orders', '{}', 2, NOW(3), NULL, 'M1', NULL), \
         ('sent-2', 'k5', 'orders', '{}', 2, NOW(3), NULL, 'M2', NULL), \
         ('failed-1', 'k6', 'gone', '{}', 3, NOW(3), NULL, DEFAULT, 'rejected: no route for topic gone'), \
         ('failed-2', 'k7', 'gone', '{}', 3, NOW(3), NULL, DEFAULT, 'rejected: no route for topic gone'), \
         ('failed-3', 'k8', 'orders', '{}', 3, NOW(3), NULL, DEFAULT, 'rejected: message too large')",
    )
    .await
    .unwrap();
    let checkpoint = current_position(&db).await.to_json();
    conn.exec_drop(
        "INSERT INTO outbox_relay_state (name, checkpoint, checkpoint_at, leader, leader_epoch) \
         VALUES ('default', ?, NOW(3), 'host-a-1', 3)",
        (checkpoint,),
    )
    .await
    .unwrap();
    // The leader holds the election lock (a live instance elected by lock).
    let _holder = hold_election_lock(&db).await;
    let password = "Pw-status-7f3c9e";
    let url = user_with_password(&db, password).await;

    // Fresh checkpoint, recent FAILED rows, a PENDING row 120 s old: failing (and lagging).
    let (code, report) = status_json(&url).await;
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["verdict"], "failing", "{report:#}");
    let table = &report["tables"][0];
    let counts: Vec<u64> = ["pending", "sending", "sent", "failed"]
        .iter()
        .map(|k| table[k].as_u64().unwrap())
        .collect();
    assert_eq!(counts, vec![2, 1, 2, 3]);
    let oldest = table["oldest_pending_seconds"].as_f64().unwrap();
    assert!((119.0..200.0).contains(&oldest), "{oldest}");
    assert_eq!(report["oldest_pending_seconds"].as_f64().unwrap(), oldest);
    assert_eq!(table["oldest_pending"]["event_id"], "old-pending");
    assert_eq!(table["oldest_pending"]["topic"], "orders");
    assert_eq!(table["expired_leases"], 0);
    assert_eq!(table["failed_recently"], 3);
    assert_eq!(
        table["failed_reasons"],
        json!([
            {"reason": "rejected: no route for topic gone", "count": 2},
            {"reason": "rejected: message too large", "count": 1},
        ])
    );
    let reasons = report["reasons"].to_string();
    assert!(
        reasons.contains("3 row(s) FAILED in the last 1h"),
        "{reasons}"
    );
    // The topic that waits is named, with its oldest keys.
    assert!(
        reasons.contains("topic orders has 2 PENDING row(s), the oldest")
            && reasons.contains("its oldest keys: k1, k2"),
        "{reasons}"
    );
    assert_eq!(table["waiting"][0]["topic"], "orders", "{table:#}");
    assert_eq!(table["waiting"][0]["oldest_keys"], json!(["k1", "k2"]));
    // (`prepared_xa`, the server's prepared XA transactions, is tested in tests/xa.rs, on a
    // server of its own: one prepared there holds every relay's checkpoint on that server.)
    assert!(report["prepared_xa"].is_array(), "{report:#}");
    assert_eq!(report["relay"]["leader"], "host-a-1");
    assert_eq!(report["relay"]["leader_epoch"], 3);
    assert!(report["relay"]["checkpoint_age_seconds"].as_f64().unwrap() < 30.0);
    let binlog = &report["binlog"];
    assert!(
        binlog["server_position"]
            .as_str()
            .unwrap()
            .contains(printed_gtid()),
        "{report:#}"
    );
    assert!(
        binlog["transactions_behind"].as_u64().unwrap() >= 2,
        "{binlog}"
    );

    // The FAILED rows are old news: only the PENDING row's age is left.
    conn.query_drop(format!(
        "UPDATE outbox_event SET updated_at = NOW(3) - INTERVAL 2 HOUR WHERE status = {FAILED}"
    ))
    .await
    .unwrap();
    let (code, report) = status_json(&url).await;
    assert_eq!((code, report["verdict"].as_str()), (1, Some("lagging")));
    assert_eq!(
        report["tables"][0]["failed_reasons"][0]["count"], 2,
        "still listed"
    );
    let out = outbox_relay(&["--mysql-url", &url, "status", "--lag-threshold", "10m"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out).1);
    assert!(text(&out).0.contains("verdict: healthy"));

    // The checkpoint stopped moving while the row waits: stuck.
    conn.query_drop("UPDATE outbox_relay_state SET checkpoint_at = NOW(3) - INTERVAL 5 MINUTE")
        .await
        .unwrap();
    let (code, report) = status_json(&url).await;
    assert_eq!((code, report["verdict"].as_str()), (1, Some("stuck")));
    // So is a SENDING row whose sender is gone.
    conn.query_drop("UPDATE outbox_relay_state SET checkpoint_at = NOW(3)")
        .await
        .unwrap();
    conn.query_drop(format!(
        "UPDATE outbox_event SET lease_until = NOW(3) - INTERVAL 1 SECOND WHERE status = {SENDING}"
    ))
    .await
    .unwrap();
    let (code, report) = status_json(&url).await;
    assert_eq!((code, report["verdict"].as_str()), (1, Some("stuck")));
    assert_eq!(report["tables"][0]["expired_leases"], 1);

    // The human table, and no password anywhere (nor when the server is unreachable).
    let out = outbox_relay(&["--mysql-url", &url, "status"]).await;
    assert_eq!(out.status.code(), Some(1));
    let (stdout, stderr) = text(&out);
    println!("{stdout}");
    for expected in [
        "PENDING",
        "rejected: no route for topic gone",
        "oldest PENDING id",
        "topics with PENDING rows, longest waiting first:",
        "XA          ",
        "leader      host-a-1 (epoch 3, elected by lock)",
        "verdict: stuck",
    ] {
        assert!(stdout.contains(expected), "{expected:?} in {stdout}");
    }
    assert!(!format!("{stdout}{stderr}").contains(password));
    let unreachable = format!("mysql://st:{password}@127.0.0.1:1/nowhere");
    let out = outbox_relay(&["--mysql-url", &unreachable, "status"]).await;
    assert_eq!(out.status.code(), Some(2), "cannot tell: exit 2");
    let (stdout, stderr) = text(&out);
    assert!(stderr.contains("cannot read the status"), "{stderr}");
    assert!(!format!("{stdout}{stderr}").contains(password), "{stderr}");
    let (_, json_report) = status_json(&url).await;
    assert!(!json_report.to_string().contains(password));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_outbox_is_healthy_while_an_instance_streams() {
    let db = TestDb::migrated("status_empty").await;
    // No relay has run here: nothing would read the binlog, so not healthy (issue 31).
    let (code, report) = status_json(&db.url).await;
    assert_eq!(
        (code, report["verdict"].as_str()),
        (1, Some("stuck")),
        "{report:#}"
    );
    assert_eq!(report["oldest_pending_seconds"], 0.0);
    let out = outbox_relay(&["--mysql-url", &db.url, "status"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out).1);
    let (stdout, _) = text(&out);
    for expected in [
        "leader      none: no relay named `default` has run here",
        "verdict: stuck — no instance streams: no relay named `default` has run here",
    ] {
        assert!(stdout.contains(expected), "{expected:?} in {stdout}");
    }

    // An instance leads (by lock) at the server's current position: healthy while a
    // connection holds the election lock.
    let checkpoint = current_position(&db).await.to_json();
    db.conn()
        .await
        .exec_drop(
            "INSERT INTO outbox_relay_state (name, checkpoint, checkpoint_at, leader, leader_epoch) \
             VALUES ('default', ?, NOW(3), 'host-a-1', 1)",
            (checkpoint,),
        )
        .await
        .unwrap();
    let holder = hold_election_lock(&db).await;
    let (code, report) = status_json(&db.url).await;
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["verdict"], "healthy");
    assert_eq!(report["reasons"], json!([]));
    // The lock free (its holder gone), nobody took it: nobody streams.
    drop(holder);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (code, report) = status_json(&db.url).await;
    assert_eq!(
        (code, report["verdict"].as_str()),
        (1, Some("stuck")),
        "{report:#}"
    );
}

/// The only instance killed (`kill -9`): its lock is freed and nobody takes it. `status` says
/// so, and its exit code is not 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_tells_that_no_instance_streams_once_the_only_one_is_killed() {
    use common::process::RelayProcess;
    use common::relay::wait_for;
    let db = TestDb::migrated("status_killed").await;
    let (config, dir) = relay_fixture(&db).at_current_end().await;
    let file = write_config_file(&config, dir.path());
    let relay = RelayProcess::spawn_serving(&file, "", &dir.path().join("relay.log"), &[]);
    let file = file.to_str().unwrap();
    wait_for("the instance leads", Duration::from_secs(60), || async {
        let out = outbox_relay(&["--config", file, "status", "--json"]).await;
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        out.status.code() == Some(0) && report["relay"]["lock_held"] == json!(true)
    })
    .await;
    relay.kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let out = outbox_relay(&["--config", file, "status"]).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout} {stderr}");
    for expected in [
        "elected by lock: the lock is free, nobody holds it",
        "verdict: stuck",
        "no longer holds the election lock and no instance took it",
    ] {
        assert!(stdout.contains(expected), "{expected:?} in {stdout}");
    }
}

/// Commits one transaction of `count` events with keys `<prefix>-<i>`; their event_ids.
async fn write(db: &TestDb, topic: &str, prefix: &str, count: usize) -> Vec<String> {
    let events = (0..count)
        .map(|i| NewEvent::new(topic, format!("{prefix}-{}", i % 3), json!({ "i": i })))
        .collect();
    commit_events(&mut db.conn().await, events).await
}

/// Deliveries per event_id once `at_least` messages arrived and nothing more comes for 3 s.
async fn deliveries_settled(topic: &str, at_least: usize) -> HashMap<String, usize> {
    copies_per_event(&stored_messages(topic, at_least).await)
}

type RowState = (u64, String, u8, Option<String>, Option<String>, String);

async fn rows(db: &TestDb) -> Vec<RowState> {
    db.conn()
        .await
        .query(
            "SELECT id, event_id, status, NULLIF(msg_id, ''), CAST(sent_at AS CHAR), CAST(updated_at AS CHAR) \
             FROM outbox_event ORDER BY id",
        )
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_of_a_gtid_range_resends_exactly_its_events() {
    let db = TestDb::migrated("replay_range").await;
    let topic = new_topic("replay_range");
    let (config, _dir) = relay_fixture(&db).at_current_end().await;
    let relay = RunningRelay::start(&config).await;
    let files = tempfile::tempdir().unwrap();
    let config_file = write_config_file(&config, files.path());
    let config_file = config_file.to_str().unwrap();

    let a = write(&db, &topic, "a", 4).await;
    let after_a = gtid(current_position(&db).await);
    let mut b = write(&db, &topic, "b", 3).await;
    b.extend(write(&db, &topic, "b", 3).await);
    let after_b = gtid(current_position(&db).await);
    let c = write(&db, &topic, "c", 4).await;
    wait_until_sent(&db, 14, Duration::from_secs(60)).await;
    let before = deliveries_settled(&topic, 14).await;
    let rows_before = rows(&db).await;

    // The dry run lists exactly B's events and sends nothing.
    let listed = dry_run_ids(&db.url, &after_a, &["--to-gtid", &after_b]).await;
    assert_eq!(listed, b);

    // A real replay wants to know who and why.
    let out = outbox_relay(&["-c", config_file, "replay", "--from-gtid", &after_a]).await;
    assert!(!out.status.success());
    assert!(text(&out)
        .1
        .contains("--operator and --reason are required"));

    let out = outbox_relay(&[
        "-c",
        config_file,
        "replay",
        "--from-gtid",
        &after_a,
        "--to-gtid",
        &after_b,
        "--operator",
        "tester",
        "--reason",
        "INC-1: consumer restore",
    ])
    .await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    println!("{stdout}\n{stderr}");
    // Other transactions in the range (the running relay's SENT marks, checkpoint mirror)
    // count as transactions but carry no events.
    assert!(
        stdout.contains("replayed 6 events (6 sent, 0 failed) of "),
        "{stdout}"
    );
    assert!(
        stderr.contains("replay: 6 events (6 sent"),
        "progress on stderr: {stderr}"
    );

    let after = deliveries_settled(&topic, 20).await;
    for (batch, extra) in [(&a, 0), (&b, 1), (&c, 0)] {
        for event_id in batch {
            assert_eq!(
                after[event_id],
                before[event_id] + extra,
                "{event_id}: before {before:?} after {after:?}"
            );
        }
    }
    assert_eq!(after.len(), 14, "no other event_id appeared");
    assert_eq!(rows(&db).await, rows_before, "replay changes no outbox row");
    let audit: Vec<(String, String, String, String)> = db
        .conn()
        .await
        .query("SELECT operator, reason, action, result FROM outbox_audit")
        .await
        .unwrap();
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(
        (
            audit[0].0.as_str(),
            audit[0].1.as_str(),
            audit[0].2.as_str()
        ),
        ("tester", "INC-1: consumer restore", "replay")
    );
    assert!(audit[0].3.starts_with("replayed 6 events"), "{audit:?}");

    // The checkpoint history: locked while the relay runs, listed once it stopped.
    let out = outbox_relay(&["-c", config_file, "replay", "--list-checkpoints"]).await;
    assert!(!out.status.success());
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains("stop the relay or copy the directory"),
        "{stderr}"
    );
    relay.stop().await;
    let out = outbox_relay(&["-c", config_file, "replay", "--list-checkpoints"]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    println!("{stdout}");
    assert!(stdout.contains("saved at (UTC)"), "{stdout}");
    assert!(
        stdout
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains(printed_gtid())),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_to_time_bound_stops_at_the_first_later_transaction() {
    let db = TestDb::migrated("replay_time").await;
    let start = gtid(current_position(&db).await);
    let early = write(&db, "t", "early", 2).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let bound = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let late = write(&db, "t", "late", 2).await;
    let end = gtid(current_position(&db).await);

    let bounded = dry_run_ids(&db.url, &start, &["--to-time", &bound]).await;
    assert_eq!(bounded, early, "only the transaction before --to-time");
    let everything: Vec<String> = early.iter().chain(&late).cloned().collect();
    assert_eq!(dry_run_ids(&db.url, &start, &[]).await, everything);
    assert!(
        dry_run_ids(&db.url, &end, &[]).await.is_empty(),
        "an empty range ends at once"
    );
}

/// The event_ids `replay --dry-run --json --from-gtid FROM EXTRA…` lists.
async fn dry_run_ids(url: &str, from: &str, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--mysql-url",
        url,
        "replay",
        "--from-gtid",
        from,
        "--dry-run",
        "--json",
    ];
    args.extend(extra);
    let out = outbox_relay(&args).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["event_id"].as_str().map(str::to_string))
        .collect()
}
