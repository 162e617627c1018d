//! Start-up checks and `run --dry-run`. The checks' test changes global server settings, one
//! after another, on a server of its own (the suite's other tests share theirs).

use crate::common;

use common::proxy::CuttingProxy;
use common::relay::relay_fixture;
use common::TestDb;
use mysql_async::prelude::*;
use mysql_async::TxOpts;
use rocketmq_outbox::binlog::reader::{check_server, StartupError};
use rocketmq_outbox::db::Deployment;
use rocketmq_outbox::producer::{NewEvent, Outbox};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

async fn check(db: &TestDb, url: &str) -> Result<(), StartupError> {
    let mut config = db.config.clone();
    config.mysql.url = Some(url.to_string());
    let deployment = Deployment::resolve(&config).unwrap();
    check_server(&deployment.opts, &deployment.tables)
        .await
        .map(|_| ())
}

/// A connection cut at any byte of the checks' conversation, the handshake included, is a
/// database error, which the relay retries; never a connect error, a misconfiguration or a
/// missing privilege, which stop it at its first start.
async fn cuts_anywhere_are_database_errors(db: &TestDb) {
    let mut cut_at = 0;
    loop {
        let proxy = CuttingProxy::start(&db.url, vec![cut_at]).await;
        match check(db, &proxy.url(&db.url)).await {
            Ok(()) => break,
            Err(StartupError::Database(_)) => {}
            Err(e) => panic!("connection cut after {cut_at} bytes: {e:?}"),
        }
        assert_eq!(proxy.cut(), 1, "only a cut fails the checks");
        cut_at += 37;
    }
    assert!(cut_at > 1000, "the checks read {cut_at} bytes");
}

async fn set_global(db: &TestDb, sql: &str) {
    db.conn()
        .await
        .query_drop(format!("SET GLOBAL {sql}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn start_up_checks_name_what_to_change() {
    let server = common::own_database("relay_checks");
    let db = TestDb::migrated_on(&server, "relay_checks").await;
    check(&db, &db.url)
        .await
        .expect("a well configured server passes");
    cuts_anywhere_are_database_errors(&db).await;

    let mut settings = vec![
        (
            "binlog_format = 'STATEMENT'",
            "binlog_format = 'ROW'",
            "binlog_format",
        ),
        (
            "binlog_row_image = 'MINIMAL'",
            "binlog_row_image = 'FULL'",
            "binlog_row_image=FULL",
        ),
        (
            "binlog_row_metadata = 'MINIMAL'",
            "binlog_row_metadata = 'FULL'",
            "binlog_row_metadata=FULL",
        ),
    ];
    if server.kind() == outbox_devenv::DatabaseKind::MySql {
        settings.push((
            "binlog_row_value_options = 'PARTIAL_JSON'",
            "binlog_row_value_options = ''",
            "binlog_row_value_options=PARTIAL_JSON",
        ));
    }
    for (setting, restore, expected) in settings {
        set_global(&db, setting).await;
        let err = check(&db, &db.url).await.unwrap_err().to_string();
        set_global(&db, restore).await;
        assert!(err.contains(expected), "{setting}: {err}");
    }

    // A user without replication privileges, then one without UPDATE on the outbox.
    let database = db.name();
    let mut conn = db.conn().await;
    conn.query_drop("CREATE USER 'weak'@'127.0.0.1' IDENTIFIED BY 'pw'")
        .await
        .unwrap();
    conn.query_drop(format!(
        "GRANT SELECT ON `{database}`.* TO 'weak'@'127.0.0.1'"
    ))
    .await
    .unwrap();
    let weak_url = db.url.replacen("root@", "weak:pw@", 1);
    let err = check(&db, &weak_url).await.unwrap_err().to_string();
    assert!(
        err.contains("REPLICATION CLIENT") || err.contains("BINLOG MONITOR"),
        "{err}"
    );
    conn.query_drop("GRANT REPLICATION CLIENT, REPLICATION SLAVE ON *.* TO 'weak'@'127.0.0.1'")
        .await
        .unwrap();
    let err = check(&db, &weak_url).await.unwrap_err().to_string();
    assert!(err.contains("grant UPDATE"), "{err}");
    assert!(!err.contains("pw@"), "no password in errors: {err}");

    // The outbox table is missing.
    let mut missing = db.config.clone();
    missing.outbox.tables = vec!["no_such_outbox".into()];
    let deployment = Deployment::resolve(&missing).unwrap();
    let err = check_server(&deployment.opts, &deployment.tables)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("outbox-relay migrate"), "{err}");
}

#[tokio::test]
async fn dry_run_prints_events_and_changes_nothing() {
    let db = TestDb::migrated("relay_dry").await;
    let (config, dir) = relay_fixture(&db).at_current_end().await;
    let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
    let events = (0..3)
        .map(|i| NewEvent::new("dry-topic", format!("k{i}"), serde_json::json!({"i": i})))
        .collect();
    let ids = Outbox::default()
        .enqueue_batch(&mut tx, events)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let file = dir.path().join("relay.toml");
    std::fs::write(&file, toml::to_string(&config).unwrap()).unwrap();
    let mut child = Command::new(outbox_devenv::workspace_binary("outbox-relay"))
        .args(["-c", file.to_str().unwrap(), "run", "--dry-run"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut printed = Vec::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        if let Some(id) = value.get("event_id").and_then(|v| v.as_str()) {
            assert_eq!(value["topic"], "dry-topic");
            printed.push(id.to_string());
        }
        if printed.len() == 3 || Instant::now() > deadline {
            break;
        }
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    let ids: Vec<String> = ids.into_iter().map(String::from).collect();
    assert_eq!(printed, ids);
    assert_eq!(
        common::relay::count_status(&db, rocketmq_outbox::outbox::Status::Pending).await,
        3,
        "a dry run marks nothing"
    );
}
