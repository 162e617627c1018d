//! Split primary: a failover promoted the replica and moved the server's address, but the old
//! primary is still alive, and an application still writes to it. The leader streaming from the
//! old primary keeps its lock there; it must stop sending once an instance on the new primary
//! leads under a newer epoch, because its renewals, on new connections through the moved
//! address, reach the new primary and find that epoch. Judged by what the broker stored: no
//! event the old primary committed after the newer epoch (plus the stated bound) was published.
//! The second instance waits as a standby from before the move, on the old primary: it must
//! find the new primary by itself (its lock connection is renewed every few seconds).

use crate::common;

use common::process::{write_config_file, RelayProcess};
use common::proxy::MovableProxy;
use common::relay::{copies_per_event, count_where, relay_fixture, stored_messages, wait_for};
use common::rocketmq::new_topic;
use common::TestDb;
use mysql_async::prelude::*;
use mysql_async::{Conn, Pool};
use outbox_devenv::{scratch_dir, Database, DatabaseKind, DatabaseOptions, SqlServer};
use rocketmq_outbox::outbox::status::codes::SENT;
use rocketmq_outbox::producer::NewEvent;
use serde_json::json;
use std::time::{Duration, Instant};

/// How long a superseded leader may go on sending after the newer epoch is committed: one
/// renewal period (1 s), the renewal's connection and query, and a send already in flight.
const OVERLAP_BOUND: Duration = Duration::from_secs(3);

fn start_server(label: &str, extra_args: &[&str]) -> Database {
    let kind = DatabaseKind::from_env().expect("OUTBOX_TEST_DB");
    let dir = scratch_dir(&format!("{}-{label}", kind.name())).expect("scratch dir");
    let options = DatabaseOptions {
        extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
        tls: None,
    };
    Database::start_with(kind, &dir, options).expect("server starts")
}

/// Makes `replica` a GTID replica of `primary` (both as root, no password), from the
/// primary's first transaction; the replica's own (its start-up grants) are forgotten first.
fn replicate(replica: &Database, primary: &Database) {
    let port = primary.endpoint().port;
    let sql = match replica.kind() {
        DatabaseKind::MariaDb => format!(
            "RESET MASTER; SET GLOBAL gtid_slave_pos = ''; CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {port}, \
             MASTER_USER = 'root', MASTER_USE_GTID = slave_pos; START SLAVE"
        ),
        DatabaseKind::MySql => format!(
            "RESET BINARY LOGS AND GTIDS; CHANGE REPLICATION SOURCE TO SOURCE_HOST = '127.0.0.1', SOURCE_PORT = {port}, \
             SOURCE_USER = 'root', SOURCE_AUTO_POSITION = 1, GET_SOURCE_PUBLIC_KEY = 1; \
             START REPLICA"
        ),
    };
    replica.run_sql_as_root(&sql).expect("replication starts");
}

/// Promotes `replica`: it stops replicating and takes writes of its own.
fn promote(replica: &Database) {
    let sql = match replica.kind() {
        DatabaseKind::MariaDb => "STOP SLAVE; RESET SLAVE ALL",
        DatabaseKind::MySql => "STOP REPLICA; RESET REPLICA ALL",
    };
    replica.run_sql_as_root(sql).expect("promotion");
}

/// `(leader, leader_epoch)` of deployment `name`, as `conn`'s server has it.
async fn leader(conn: &mut Conn, name: &str) -> Option<(Option<String>, u64)> {
    conn.exec_first(
        "SELECT leader, leader_epoch FROM outbox_relay_state WHERE name = ?",
        (name,),
    )
    .await
    .unwrap()
}

/// Commits one event of `key` on `pool`; its event_id.
async fn commit(pool: &Pool, topic: &str, key: &str) -> String {
    let mut conn = pool.get_conn().await.unwrap();
    let event = NewEvent::new(topic.to_string(), key.to_string(), json!({"key": key}));
    common::relay::commit_events(&mut conn, vec![event])
        .await
        .remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_on_a_superseded_primary_stops_sending() {
    let old = start_server("split-old", &[]);
    let new = start_server("split-new", &["--server-id=2", "--log-slave-updates=ON"]);
    replicate(&new, &old);
    let db = TestDb::migrated_on(&old, "split").await;
    let new_pool = Pool::new(new.endpoint().url(&db.name()).as_str());
    wait_for(
        "the replica has the schema",
        Duration::from_secs(60),
        || async {
            let Ok(mut conn) = new_pool.get_conn().await else {
                return false;
            };
            conn.query_drop("SELECT 1 FROM outbox_relay_state LIMIT 1")
                .await
                .is_ok()
        },
    )
    .await;

    // Both instances reach "the primary" through one address, as a virtual IP or DNS name.
    let proxy = MovableProxy::start(old.endpoint().port).await;
    let topic = new_topic("split_primary");
    let (mut config, dir_a) = relay_fixture(&db).at_current_end().await;
    config.mysql.url = Some(proxy.url(&db.url));
    config.relay.instance_id = Some("a".into());
    let name = config.relay.name.clone();
    let logs = tempfile::tempdir().unwrap();
    let a = RelayProcess::spawn_serving(
        &write_config_file(&config, dir_a.path()),
        "",
        &logs.path().join("a.log"),
        &[],
    );
    // a leads first; then b waits for the lock as a standby, on the old primary (its first
    // address).
    wait_for(
        "a leads on the old primary",
        Duration::from_secs(60),
        || async {
            let mut conn = db.conn().await;
            leader(&mut conn, &name)
                .await
                .is_some_and(|(l, _)| l.as_deref() == Some("a"))
        },
    )
    .await;
    let (mut config_b, dir_b) = relay_fixture(&db).build();
    config_b.mysql.url = Some(proxy.url(&db.url));
    config_b.relay.name = name.clone();
    config_b.relay.instance_id = Some("b".into());
    config_b.mysql.server_id = config.mysql.server_id + 1;
    let b = RelayProcess::spawn_serving(
        &write_config_file(&config_b, dir_b.path()),
        "",
        &logs.path().join("b.log"),
        &[],
    );
    for i in 0..100 {
        commit(&db.pool, &topic, &format!("before-{}", i % 8)).await;
    }
    wait_for(
        "the events before the failover SENT",
        Duration::from_secs(60),
        || async { count_where(&db, &format!("status = {SENT}")).await == 100 },
    )
    .await;

    // An application that still writes to the old primary, one event every 50 ms.
    let written: std::sync::Arc<std::sync::Mutex<Vec<(String, Instant)>>> = Default::default();
    let stop_writing = tokio_util::sync::CancellationToken::new();
    let writer = {
        let (pool, topic, written, stop) = (
            db.pool.clone(),
            topic.clone(),
            written.clone(),
            stop_writing.clone(),
        );
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.is_cancelled() {
                let id = commit(&pool, &topic, &format!("late-{}", i % 4)).await;
                written.lock().unwrap().push((id, Instant::now()));
                i += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The failover: the replica is promoted and the address moves; the old primary lives on.
    promote(&new);
    proxy.move_to(new.endpoint().port);
    let mut new_conn = new_pool.get_conn().await.unwrap();
    let (_, old_epoch) = leader(&mut new_conn, &name)
        .await
        .expect("the row replicated");
    // b's lock connection is renewed every 5 s; under a loaded machine, allow it several.
    let moved = Instant::now();
    loop {
        let mut conn = new_pool.get_conn().await.unwrap();
        let now = leader(&mut conn, &name).await;
        if now
            .as_ref()
            .is_some_and(|(l, e)| l.as_deref() == Some("b") && *e > old_epoch)
        {
            break;
        }
        if moved.elapsed() > Duration::from_secs(45) {
            let log = std::fs::read_to_string(logs.path().join("b.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "b did not lead on the new primary within 45 s of the move (its row: {now:?}); \
                 b's log, last lines first:\n{}",
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "b led on the new primary {:?} after the move",
        moved.elapsed()
    );
    let superseded = Instant::now();
    tokio::time::sleep(OVERLAP_BOUND + Duration::from_secs(3)).await;
    stop_writing.cancel();
    writer.await.unwrap();

    // The new primary's events flow through b.
    let mut after = Vec::new();
    for i in 0..50 {
        after.push(commit(&new_pool, &topic, &format!("after-{}", i % 8)).await);
    }
    wait_for(
        "the new primary's events SENT",
        Duration::from_secs(60),
        || async {
            let mut conn = new_pool.get_conn().await.unwrap();
            let sent: Option<u64> = conn
                .query_first(format!(
                "SELECT COUNT(*) FROM outbox_event WHERE status = {SENT} AND biz_key LIKE 'after-%'"
            ))
                .await
                .unwrap();
            sent == Some(50)
        },
    )
    .await;

    let messages = stored_messages(&topic, 150).await;
    let stored = copies_per_event(&messages);
    for id in &after {
        assert!(
            stored.contains_key(id.as_str()),
            "event {id} of the new primary is stored"
        );
    }
    let written = written.lock().unwrap().clone();
    let late_sent: Vec<Duration> = written
        .iter()
        .filter(|(id, _)| stored.contains_key(id.as_str()))
        .map(|(_, at)| at.saturating_duration_since(superseded))
        .collect();
    let last = late_sent.iter().max().copied().unwrap_or_default();
    let after_bound = written
        .iter()
        .filter(|(id, at)| {
            stored.contains_key(id.as_str())
                && at.saturating_duration_since(superseded) > OVERLAP_BOUND
        })
        .count();
    println!(
        "old primary's events: {} written, {} published; the last published was committed {last:?} after the newer epoch",
        written.len(),
        late_sent.len()
    );
    assert!(
        !late_sent.is_empty(),
        "the old leader published until it was superseded"
    );
    assert_eq!(
        after_bound, 0,
        "the superseded leader published events committed more than {OVERLAP_BOUND:?} after the newer epoch"
    );
    let log = std::fs::read_to_string(logs.path().join("a.log")).unwrap();
    assert!(
        log.contains("another instance leads under epoch"),
        "the old leader says why it stopped:\n{log}"
    );
    b.stop();
    a.stop();
}
