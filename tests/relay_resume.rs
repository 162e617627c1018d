//! The relay across rotations, big transactions, bad rows and restarts (from sled and from the
//! MySQL mirror).

use crate::common;

use common::proxy::CuttingProxy;
use common::relay::{
    count_status, relay_config, relay_fixture, stop_when_all_sent, wait_for, wait_until_sent,
    RunningRelay,
};
use common::rocketmq::{new_topic, rocketmq};
use common::TestDb;
use mysql_async::prelude::*;
use mysql_async::TxOpts;
use outbox_devenv::TopicReader;
use rocketmq_outbox::binlog::BinlogPosition;
use rocketmq_outbox::outbox::status::codes::FAILED;
use rocketmq_outbox::producer::{NewEvent, Outbox};
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

async fn write(db: &TestDb, topic: &str, keys: &[&str]) {
    let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
    let events = keys
        .iter()
        .map(|k| NewEvent::new(topic, *k, json!({"k": k})))
        .collect();
    Outbox::default()
        .enqueue_batch(&mut tx, events)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rows_fail_with_reasons_while_big_transactions_and_rotations_flow() {
    let db = TestDb::migrated("relay_bad").await;
    let topic = new_topic("relay_bad");
    // A legacy schema without the JSON check lets a broken payload in.
    db.conn()
        .await
        .query_drop("ALTER TABLE outbox_event MODIFY payload LONGTEXT NOT NULL")
        .await
        .unwrap();
    let (config, _dir) = relay_fixture(&db).at_current_end().await;
    let relay = RunningRelay::start(&config).await;

    write(&db, &topic, &["a", "b"]).await;
    let mut conn = db.conn().await;
    conn.exec_drop(
        "INSERT INTO outbox_event (event_id, biz_key, topic, payload) VALUES ('bad-json', 'a', ?, '{oops'), ('no-topic', 'a', '', '{}')",
        (&topic,),
    )
    .await
    .unwrap();
    conn.query_drop("FLUSH BINARY LOGS").await.unwrap();
    let thousand: Vec<String> = (0..1000).map(|i| format!("big-{}", i % 37)).collect();
    let keys: Vec<&str> = thousand.iter().map(String::as_str).collect();
    write(&db, &topic, &keys).await;
    conn.query_drop("FLUSH BINARY LOGS").await.unwrap();
    write(&db, &topic, &["c"]).await;

    wait_for(
        "1003 SENT and 2 FAILED",
        Duration::from_secs(90),
        || async {
            count_status(&db, rocketmq_outbox::outbox::Status::Sent).await == 1003
                && count_status(&db, rocketmq_outbox::outbox::Status::Failed).await == 2
        },
    )
    .await;
    let failed: Vec<(String, u8, Option<String>, Option<String>)> = conn
        .query(format!("SELECT event_id, status, last_error, NULLIF(msg_id, '') FROM outbox_event WHERE status = {FAILED} ORDER BY id"))
        .await
        .unwrap();
    assert_eq!(failed[0].0, "bad-json");
    assert!(
        failed[0].2.as_deref().unwrap().contains("not valid JSON"),
        "{failed:?}"
    );
    assert_eq!(failed[1].0, "no-topic");
    assert!(
        failed[1].2.as_deref().unwrap().contains("invalid topic"),
        "{failed:?}"
    );
    assert!(
        failed.iter().all(|f| f.3.is_none()),
        "a FAILED row has no msg_id"
    );
    let summary = relay.stop().await;
    assert_eq!((summary.marked.sent, summary.marked.failed), (1003, 2));

    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), &topic)
        .await
        .unwrap();
    let messages = reader
        .read_at_least(1003, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(messages
        .iter()
        .all(|m| m.properties["event_id"] != "bad-json"));
    reader.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_resume_from_sled_then_from_the_mysql_mirror_without_resending() {
    let db = TestDb::migrated("relay_resume").await;
    let topic = new_topic("relay_resume");
    let (config, _dir) = relay_fixture(&db).at_current_end().await;

    // Run 1.
    let relay = RunningRelay::start(&config).await;
    write(&db, &topic, &["k1", "k2", "k3"]).await;
    wait_until_sent(&db, 3, Duration::from_secs(60)).await;
    let first = relay.stop().await;
    assert_eq!(first.marked.sent, 3);

    // Written while the relay is down; run 2 resumes from the local (sled) checkpoint.
    write(&db, &topic, &["k1", "k4"]).await;
    let relay = RunningRelay::start(&config).await;
    wait_until_sent(&db, 5, Duration::from_secs(60)).await;
    let second = relay.stop().await;
    assert_eq!(
        second.marked.sent, 2,
        "only the new events: resumed from sled"
    );

    // A replacement machine: no sled directory, same relay name → resumes from the mirror.
    write(&db, &topic, &["k5"]).await;
    let (mut fresh, _fresh_dir) = relay_config(&db);
    fresh.relay.name = config.relay.name.clone();
    let mirror: Option<String> = db
        .conn()
        .await
        .exec_first(
            "SELECT checkpoint FROM outbox_relay_state WHERE name = ?",
            (&config.relay.name,),
        )
        .await
        .unwrap();
    assert!(
        mirror.is_some(),
        "the final checkpoint is mirrored into MySQL"
    );
    // It names a binlog file the server has: a file/offset resume (a server without GTIDs) and
    // `status` can use it. The stream's first rotate event names the file; on MariaDB its name
    // carries checksum bytes, on MySQL it does not.
    let mirror = BinlogPosition::from_json(&mirror.unwrap()).unwrap();
    let files: Vec<String> = db
        .conn()
        .await
        .query_map("SHOW BINARY LOGS", |mut row: mysql_async::Row| {
            row.take::<String, _>(0).unwrap()
        })
        .await
        .unwrap();
    assert!(
        mirror
            .file
            .as_ref()
            .is_some_and(|file| files.contains(file)),
        "the checkpoint {mirror} names a binlog file of the server's {files:?}"
    );
    let relay = RunningRelay::start(&fresh).await;
    wait_until_sent(&db, 6, Duration::from_secs(60)).await;
    let third = relay.stop().await;
    assert_eq!(
        third.marked.sent, 1,
        "only the new event: resumed from the mirror"
    );

    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), &topic)
        .await
        .unwrap();
    let messages = reader.read_all_for(Duration::from_secs(2)).await.unwrap();
    let mut per_event: HashMap<String, usize> = HashMap::new();
    for m in &messages {
        *per_event
            .entry(m.properties["event_id"].clone())
            .or_default() += 1;
    }
    assert_eq!(per_event.len(), 6);
    assert!(
        per_event.values().all(|&n| n == 1),
        "graceful restarts resend nothing: {per_event:?}"
    );
    reader.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mysql_connections_are_reopened_and_nothing_is_lost() {
    let db = TestDb::migrated("relay_kill_conn").await;
    let topic = new_topic("relay_kill_conn");
    let (config, _dir) = relay_fixture(&db).at_current_end().await;
    let relay = RunningRelay::start(&config).await;
    let mut admin = db.conn().await;
    let (mut killed, mut dumps) = (0, 0);
    for round in 0..5 {
        let keys: Vec<String> = (0..40)
            .map(|i| format!("k{}", (round * 40 + i) % 13))
            .collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        write(&db, &topic, &keys).await;
        let cut = kill_relay_connections(&mut admin, &db).await;
        killed += cut.killed;
        dumps += cut.binlog_dumps;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        killed >= 5 && dumps >= 1,
        "killed {killed} ({dumps} binlog dumps)"
    );
    let namesrv = rocketmq().namesrv_addr();
    stop_when_all_sent(relay, &db, (&namesrv, &topic), 200, Duration::from_secs(90)).await;
}

/// Connections cut while the relay is still starting (in the middle of its server checks, the
/// election, the first binlog read) fail that round, which is retried: the relay never gives up
/// on a server it has reached. A proxy cuts the first connections after a growing number of
/// bytes, so the cuts land inside start-up on every run, not only when a `KILL` is lucky.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cut_while_the_relay_starts_are_retried() {
    let db = TestDb::migrated("relay_cut_start").await;
    let topic = new_topic("relay_cut_start");
    let (mut config, _dir) = relay_fixture(&db).at_current_end().await;
    write(&db, &topic, &["a", "b", "c"]).await;
    let proxy = CuttingProxy::reroute(&mut config, vec![150, 400, 700, 1000, 1400, 1900]).await;
    let relay = RunningRelay::start(&config).await;
    wait_for("the proxy's cuts", Duration::from_secs(60), || async {
        proxy.all_cut()
    })
    .await;
    write(&db, &topic, &["d", "e"]).await;
    let namesrv = rocketmq().namesrv_addr();
    stop_when_all_sent(relay, &db, (&namesrv, &topic), 5, Duration::from_secs(60)).await;
}

/// What [`kill_relay_connections`] cut.
struct Cut {
    killed: usize,
    binlog_dumps: usize,
}

/// Kills every connection to `db`'s database but `admin`'s own: the relay's SQL connections and
/// its binlog dump (whose default database is the test's), never another test's.
async fn kill_relay_connections(admin: &mut mysql_async::Conn, db: &TestDb) -> Cut {
    let own: u64 = admin
        .query_first("SELECT CONNECTION_ID()")
        .await
        .unwrap()
        .unwrap();
    let victims: Vec<(u64, String)> = admin
        .exec(
            "SELECT id, command FROM information_schema.processlist WHERE db = ? AND id <> ?",
            (db.name(), own),
        )
        .await
        .unwrap();
    let mut cut = Cut {
        killed: 0,
        binlog_dumps: 0,
    };
    for (id, command) in victims {
        if admin.query_drop(format!("KILL {id}")).await.is_ok() {
            cut.killed += 1;
            // "Binlog Dump" (file/offset, MariaDB's GTID resume) or "Binlog Dump GTID" (MySQL).
            cut.binlog_dumps += usize::from(command.starts_with("Binlog Dump"));
        }
    }
    cut
}

/// A server the relay cannot reach at its first start is reported at once (the user must see a
/// wrong address), not retried for ever like the cut connections above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_at_first_start_stops_the_relay_at_once() {
    use rocketmq_outbox::pipeline::RunOptions;
    use rocketmq_outbox::relay::RelayHandle;
    use tokio_util::sync::CancellationToken;

    let db = TestDb::migrated("relay_unreachable").await;
    let (mut config, _dir) = relay_config(&db);
    config.mysql.url = Some("mysql://root@127.0.0.1:1/app".into());
    let relay = RelayHandle::spawn(&config, RunOptions::default(), CancellationToken::new())
        .await
        .expect("the relay starts (it connects in its first round)");
    let ended = tokio::time::timeout(Duration::from_secs(30), relay.join())
        .await
        .expect("the relay stops by itself");
    let error = format!("{:#}", ended.expect_err("an error"));
    assert!(error.contains("cannot connect to MySQL"), "{error}");
}
