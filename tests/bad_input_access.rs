//! The bad-input campaign, part 3: the relay's account and its secrets. Start-up names each
//! missing privilege and what to grant, the least-privilege grants of `deploy/mysql-init` are
//! enough to relay, and the MySQL password never appears in anything the binary prints (debug
//! logs, `config show`, connection and authentication errors). Start-up checks of the server's
//! binlog settings: `tests/relay_checks.rs`.

use crate::common;

#[allow(dead_code)]
use crate::common::rows;

use common::process::write_config_file;
use common::relay::relay_config;
use common::rocketmq::new_topic;
use common::TestDb;
use mysql_async::prelude::*;
use outbox_devenv::SqlServer;
use rocketmq_outbox::config::Config;
use rocketmq_outbox::pipeline::RunOptions;
use rocketmq_outbox::relay::RelayHandle;
use rows::{enqueue, start_relay_from_now, wait_statuses, SENT};
use serde_json::json;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The database name of a test database's URL.
fn database(db: &TestDb) -> String {
    db.name()
}

/// `db.url` with `user:password` instead of `root`.
fn url_as(db: &TestDb, user: &str, password: &str) -> String {
    db.url.replacen("root@", &format!("{user}:{password}@"), 1)
}

async fn sql(db: &TestDb, statement: &str) {
    db.conn()
        .await
        .query_drop(statement)
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
}

/// Starts a relay as `url`'s user and returns how it ended within 30 s: start-up failures end
/// it at once.
async fn start_up_error(config: &Config, url: &str) -> String {
    let mut config = config.clone();
    config.mysql.url = Some(url.to_string());
    let handle = RelayHandle::spawn(&config, RunOptions::default(), CancellationToken::new())
        .await
        .expect("the sink starts");
    match tokio::time::timeout(Duration::from_secs(30), handle.join()).await {
        Ok(Err(e)) => format!("{e:#}"),
        Ok(Ok(summary)) => panic!("the relay ran and stopped: {summary:?}"),
        Err(_) => panic!("the relay did not fail at start-up within 30 s"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_names_each_missing_privilege_and_the_documented_grants_suffice() {
    let db = TestDb::migrated("bad_grants").await;
    let topic = new_topic("bad_grants");
    let (config, _dir) = relay_config(&db);
    let d = database(&db);
    let user = format!("'bi_grants_{}'@'127.0.0.1'", std::process::id());
    let password = format!("grants-pw-{}", std::process::id());
    let url = url_as(&db, &format!("bi_grants_{}", std::process::id()), &password);
    sql(
        &db,
        &format!("CREATE USER {user} IDENTIFIED BY '{password}'"),
    )
    .await;
    sql(
        &db,
        &format!("GRANT SELECT ON `{d}`.outbox_event TO {user}"),
    )
    .await;
    sql(
        &db,
        &format!("GRANT SELECT, INSERT, UPDATE ON `{d}`.outbox_relay_state TO {user}"),
    )
    .await;
    sql(
        &db,
        &format!("GRANT SELECT, INSERT, DELETE ON `{d}`.outbox_topic_queues TO {user}"),
    )
    .await;

    // Each step adds one grant of deploy/mysql-init/01-users.sql (or holds one back) and the
    // start-up names the next missing one.
    let steps: [(&str, &[&str]); 5] = [
        ("", &["REPLICATION CLIENT"]),
        (
            "GRANT REPLICATION CLIENT ON *.* TO {user}",
            &["REPLICATION SLAVE", "GRANT REPLICATION SLAVE ON *.*"],
        ),
        (
            "GRANT REPLICATION SLAVE ON *.* TO {user}",
            &["grant UPDATE on", "outbox_event"],
        ),
        ("GRANT UPDATE ON `{d}`.outbox_event TO {user}", &[]),
        (
            "REVOKE INSERT ON `{d}`.outbox_relay_state FROM {user}",
            &["grant INSERT on outbox_relay_state"],
        ),
    ];
    for (grant, expected) in steps {
        if !grant.is_empty() {
            sql(&db, &grant.replace("{user}", &user).replace("{d}", &d)).await;
        }
        if expected.is_empty() {
            continue;
        }
        let err = start_up_error(&config, &url).await;
        println!("after `{grant}`: {err}");
        for text in expected {
            assert!(err.contains(text), "after `{grant}`: {err}");
        }
        assert!(!err.contains(&password), "no password in errors: {err}");
    }

    // The documented least-privilege grants are enough: the relay streams and marks.
    sql(
        &db,
        &format!("GRANT INSERT ON `{d}`.outbox_relay_state TO {user}"),
    )
    .await;
    let mut least = config.clone();
    least.mysql.url = Some(url.clone());
    let relay = start_relay_from_now(&db, &least).await;
    let (id, _) = enqueue(
        &db,
        "outbox_event",
        rocketmq_outbox::producer::NewEvent::new(&topic, "k", json!({"least": true})),
    )
    .await;
    wait_statuses(&db, "outbox_event", &[(id, SENT)], Duration::from_secs(30)).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.sent, 1);
}

/// Runs the binary with `args` and debug logs until it exits, or for at most `limit` (then
/// SIGTERM); returns its output. Blocking: call it from `spawn_blocking`.
fn run_binary(args: Vec<String>, env: Vec<(String, String)>, limit: Duration) -> Output {
    use std::io::Read;
    let mut child = Command::new(outbox_devenv::workspace_binary("outbox-relay"))
        .args(&args)
        .env("RUST_LOG", "debug")
        .env_remove("OUTBOX_RELAY_CONFIG")
        .envs(env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start outbox-relay");
    // Drain both pipes while it runs: debug logs fill a pipe buffer in moments.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            pipe.read_to_end(&mut bytes).unwrap();
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    if child.try_wait().unwrap().is_none() {
        // SAFETY: kill(2) on our own, still running child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    }
    let status = child.wait().unwrap();
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// [`run_binary`] without blocking the test's runtime.
async fn run(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    let args = args.iter().map(|a| a.to_string()).collect();
    let env = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || run_binary(args, env, limit))
        .await
        .unwrap()
}

/// Fails if `secret` is anywhere in `output`; returns the text for further checks.
fn assert_no_secret(what: &str, output: &Output, secrets: &[&str]) -> String {
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    for secret in secrets {
        assert!(
            !text.contains(secret),
            "{what} printed the password {secret:?}:\n{text}"
        );
    }
    println!("{what}: {} bytes of output, no password", text.len());
    text
}

/// Creates the account `'name'@'127.0.0.1'` with `password` and exactly the grants a relay needs
/// on `db`'s outbox; returns the account as SQL names it.
async fn relay_account(db: &TestDb, name: &str, password: &str) -> String {
    let d = database(db);
    let user = format!("'{name}'@'127.0.0.1'");
    for statement in [
        format!("CREATE USER {user} IDENTIFIED BY '{password}'"),
        format!("GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO {user}"),
        format!("GRANT SELECT, UPDATE ON `{d}`.outbox_event TO {user}"),
        format!("GRANT SELECT, INSERT, UPDATE ON `{d}`.outbox_relay_state TO {user}"),
    ] {
        sql(db, &statement).await;
    }
    user
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mysql_password_never_appears_in_output_or_debug_logs() {
    let db = TestDb::migrated("bad_secret").await;
    let topic = new_topic("bad_secret");
    let d = database(&db);
    let name = format!("bi_secret_{}", std::process::id());
    let password = format!("Sup3rSecret-{}-pw", std::process::id());
    let wrong = format!("Wr0ngSecret-{}-pw", std::process::id());
    let user = relay_account(&db, &name, &password).await;
    // `migrate --status` reads the schema history.
    sql(
        &db,
        &format!("GRANT SELECT ON `{d}`.outbox_schema_history TO {user}"),
    )
    .await;
    let url = url_as(&db, &name, &password);
    let (mut config, dir) = relay_config(&db);
    config.mysql.url = Some(url.clone());
    let file = write_config_file(&config, dir.path());
    let file = file.to_str().unwrap();
    let secrets = [password.as_str(), wrong.as_str()];

    // `config show` / `config check`, the URL from the file, the environment or a flag.
    let quick = Duration::from_secs(20);
    let out = run(&["-c", file, "config", "show"], &[], quick).await;
    assert!(out.status.success());
    let text = assert_no_secret("config show", &out, &secrets);
    assert!(text.contains(&format!("{name}:***@")), "{text}");
    let out = run(
        &["config", "show"],
        &[("OUTBOX_RELAY_MYSQL__URL", &url)],
        quick,
    )
    .await;
    assert_no_secret("config show (environment)", &out, &secrets);
    let out = run(&["--mysql-url", &url, "config", "check"], &[], quick).await;
    assert_no_secret("config check (flag)", &out, &secrets);
    let out = run(&["--mysql-url", &url, "migrate", "--status"], &[], quick).await;
    assert!(out.status.success(), "{out:?}");
    assert_no_secret("migrate --status", &out, &secrets);

    // A few seconds of operation at debug level, with an event relayed.
    let writer = {
        let db = db.clone_handle();
        let topic = topic.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let (id, _) = enqueue(
                &db,
                "outbox_event",
                rocketmq_outbox::producer::NewEvent::new(&topic, "k", json!({"n": 1})),
            )
            .await;
            wait_statuses(&db, "outbox_event", &[(id, SENT)], Duration::from_secs(20)).await;
        })
    };
    let run_args = ["-c", file, "--metrics-listen", "", "run"];
    let out = run(&run_args, &[], Duration::from_secs(8)).await;
    writer
        .await
        .expect("the event was relayed while the binary ran");
    let text = assert_no_secret("run (debug logs)", &out, &secrets);
    assert!(text.contains("DEBUG"), "debug logs were captured: {text}");

    // Connection errors: a closed port, a wrong password, a URL that does not parse.
    let port = outbox_devenv::process::free_port().unwrap();
    let closed = url.replace(
        &format!(":{}/", common::database().port()),
        &format!(":{port}/"),
    );
    assert_ne!(closed, url);
    let wrong_url = url_as(&db, &name, &wrong);
    let unparsable = format!("mysql://{name}:{password}@127.0.0.1:notaport/{d}");
    for (what, bad) in [
        ("closed port", closed.as_str()),
        ("wrong password", wrong_url.as_str()),
        ("unparsable URL", unparsable.as_str()),
    ] {
        for args in [
            vec![
                "-c",
                file,
                "--mysql-url",
                bad,
                "--metrics-listen",
                "",
                "run",
            ],
            vec!["--mysql-url", bad, "migrate", "--status"],
        ] {
            let out = run(&args, &[], quick).await;
            assert!(!out.status.success(), "{what}: {out:?}");
            let text = assert_no_secret(what, &out, &secrets);
            assert!(
                text.contains("rror"),
                "{what}: an error is reported: {text}"
            );
        }
    }
}

/// Enqueues `n` events of `topic` (key `k-i`), each in its own transaction; returns their ids
/// and event ids.
async fn enqueue_many(db: &TestDb, topic: &str, from: usize, n: usize) -> Vec<(u64, String)> {
    let mut rows = Vec::new();
    for i in from..from + n {
        let event =
            rocketmq_outbox::producer::NewEvent::new(topic, format!("k-{i}"), json!({"i": i}));
        rows.push(enqueue(db, "outbox_event", event).await);
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_update_privilege_stops_the_relay_with_the_grant_to_run_and_loses_nothing() {
    // Found by reading the marker: a permanent SQL error (here UPDATE revoked while running) was
    // retried for ever, every shard stalled behind it, and nothing said what to fix.
    let db = TestDb::migrated("bad_revoke").await;
    let topic = new_topic("bad_revoke");
    let d = database(&db);
    let name = format!("bi_revoke_{}", std::process::id());
    let password = format!("revoke-pw-{}", std::process::id());
    let user = relay_account(&db, &name, &password).await;
    let (mut config, dir) = relay_config(&db);
    config.mysql.url = Some(url_as(&db, &name, &password));
    common::relay::seed_checkpoint(&config, &common::relay::current_position(&db).await);
    let file = write_config_file(&config, dir.path());
    let file = file.to_str().unwrap().to_string();
    let relay = tokio::spawn(async move {
        let args = ["-c", file.as_str(), "--metrics-listen", "", "run"];
        run(&args, &[], Duration::from_secs(90)).await
    });
    let before = enqueue_many(&db, &topic, 0, 5).await;
    let sent: Vec<(u64, i8)> = before.iter().map(|(id, _)| (*id, SENT)).collect();
    wait_statuses(&db, "outbox_event", &sent, Duration::from_secs(60)).await;

    sql(
        &db,
        &format!("REVOKE UPDATE ON `{d}`.outbox_event FROM {user}"),
    )
    .await;
    let revoked = Instant::now();
    let after = enqueue_many(&db, &topic, 5, 10).await;
    let out = relay.await.unwrap();
    let stopped = revoked.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    println!(
        "stopped {stopped:?} after the REVOKE, {}: {last}",
        out.status
    );
    assert!(!out.status.success(), "the relay must fail: {last}");
    assert!(
        stopped < Duration::from_secs(30),
        "stopped within seconds: {stopped:?}"
    );
    let grant = format!("GRANT SELECT, UPDATE ON `{d}`.`outbox_event` TO {user}");
    assert!(last.starts_with("error: cannot record outcomes"), "{last}");
    assert!(
        last.contains(&grant),
        "the message names the fix `{grant}`: {last}"
    );
    assert!(!last.contains(&password), "no password in errors: {last}");
    let pending = common::relay::count_status(&db, rocketmq_outbox::outbox::Status::Pending).await;
    assert!(pending > 0, "the events after the REVOKE are not marked");

    // After the grant, a restart from the checkpoint sends and records everything.
    sql(
        &db,
        &format!("GRANT UPDATE ON `{d}`.outbox_event TO {user}"),
    )
    .await;
    let handle = RelayHandle::spawn(&config, RunOptions::default(), CancellationToken::new())
        .await
        .expect("the relay starts again");
    let all: Vec<(u64, i8)> = before
        .iter()
        .chain(&after)
        .map(|(id, _)| (*id, SENT))
        .collect();
    wait_statuses(&db, "outbox_event", &all, Duration::from_secs(60)).await;
    handle.stop().await.expect("relay run");
    let namesrv = common::rocketmq::rocketmq().namesrv_addr();
    let got = common::relay::deliveries(&namesrv, &topic, all.len()).await;
    for (_, event_id) in before.iter().chain(&after) {
        assert!(
            got.get(event_id).is_some_and(|n| *n >= 1),
            "{event_id} lost: {got:?}"
        );
    }
    println!(
        "{pending} events waited for the grant; all {} delivered",
        all.len()
    );
}
