//! XA transactions and undone rows, live on MariaDB or MySQL (`OUTBOX_TEST_DB`): an XA
//! transaction's outbox rows are published only at `XA COMMIT` (or `XA COMMIT … ONE PHASE`),
//! never after `XA ROLLBACK`; while one is prepared the checkpoint stays below it and everything
//! else flows, until `relay.park_prepared_after`, when it is parked (the checkpoint passes it and
//! the sweeper sends its row at `XA COMMIT`); a relay restarted meanwhile still publishes it at its commit. Rows undone by
//! `ROLLBACK TO SAVEPOINT` (which MariaDB binlogs with the rows) are never published. Judged by
//! what the broker stored.

use crate::common;

use common::relay::{
    current_position, relay_fixture, seed_checkpoint, wait_for, wait_until_sent, write_events,
    RunningRelay,
};
use common::rocketmq::{new_topic, rocketmq};
use common::{database, TestDb};
use mysql_async::prelude::*;
use outbox_devenv::{DatabaseKind, TopicReader};
use rocketmq_outbox::binlog::BinlogPosition;
use rocketmq_outbox::config::Config;
use std::collections::HashMap;
use std::time::Duration;

/// Inserts one outbox event for `key` on `conn` (inside whatever transaction it has open).
async fn insert_event(conn: &mut impl Queryable, topic: &str, event_id: &str, key: &str) {
    conn.exec_drop(
        "INSERT INTO outbox_event (event_id, biz_key, topic, payload) VALUES (?, ?, ?, '{}')",
        (event_id, key, topic),
    )
    .await
    .unwrap();
}

/// `XA START`, one event, `XA END`, `XA PREPARE` on a connection of its own (an XA transaction
/// stays prepared after its session ends only on MySQL; the connection is kept here).
async fn prepare(db: &TestDb, xid: &str, topic: &str, event_id: &str) -> mysql_async::Conn {
    let mut conn = db.conn().await;
    conn.query_drop(format!("XA START '{xid}'")).await.unwrap();
    insert_event(&mut conn, topic, event_id, "xa-key").await;
    conn.query_drop(format!("XA END '{xid}'")).await.unwrap();
    conn.query_drop(format!("XA PREPARE '{xid}'"))
        .await
        .unwrap();
    conn
}

/// event_id → how many stored messages carry it, read until the topic has been quiet for 3 s.
async fn stored(topic: &str) -> HashMap<String, usize> {
    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), topic)
        .await
        .unwrap();
    let messages = reader.read_all_for(Duration::from_secs(3)).await.unwrap();
    reader.close().await;
    let mut per_event = HashMap::new();
    for m in messages {
        *per_event
            .entry(m.properties["event_id"].clone())
            .or_insert(0) += 1;
    }
    per_event
}

async fn status_of(db: &TestDb, event_id: &str) -> Option<u8> {
    db.conn()
        .await
        .exec_first(
            "SELECT status FROM outbox_event WHERE event_id = ?",
            (event_id,),
        )
        .await
        .unwrap()
}

/// The checkpoint the relay mirrored into `outbox_relay_state`.
async fn mirrored_checkpoint(db: &TestDb, config: &Config) -> Option<BinlogPosition> {
    let text: Option<Option<String>> = db
        .conn()
        .await
        .exec_first(
            "SELECT checkpoint FROM outbox_relay_state WHERE name = ?",
            (config.relay.name.as_str(),),
        )
        .await
        .unwrap();
    text.flatten()
        .map(|t| BinlogPosition::from_json(&t).unwrap())
}

/// A config whose sweeper stays away from the rows under test: only the stream can publish them.
fn stream_only(db: &TestDb) -> (Config, tempfile::TempDir) {
    let (config, dir) = relay_fixture(db).stream_only().build();
    (config, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_then_committed_is_published_once_and_rolled_back_never() {
    let db = TestDb::migrated("xa_outcomes").await;
    let topic = new_topic("xa_outcomes");
    let (config, _dir) = stream_only(&db);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;

    let mut committed = prepare(&db, "xa-commit", &topic, "xa-committed").await;
    let mut rolled_back = prepare(&db, "xa-rollback", &topic, "xa-rolled-back").await;
    // One phase: XA START … XA END, then XA COMMIT ONE PHASE (no prepare of its own).
    let mut one_phase = db.conn().await;
    one_phase.query_drop("XA START 'xa-one'").await.unwrap();
    insert_event(&mut one_phase, &topic, "xa-one-phase", "xa-key-1").await;
    one_phase.query_drop("XA END 'xa-one'").await.unwrap();
    one_phase
        .query_drop("XA COMMIT 'xa-one' ONE PHASE")
        .await
        .unwrap();
    // A plain transaction after the prepares: it flows past them.
    let mut plain = db.conn().await;
    insert_event(&mut plain, &topic, "plain", "plain-key").await;
    wait_until_sent(&db, 2, Duration::from_secs(60)).await;
    let before_outcomes = stored(&topic).await;
    assert!(
        !before_outcomes.contains_key("xa-committed")
            && !before_outcomes.contains_key("xa-rolled-back"),
        "nothing of a prepared transaction is published before its outcome: {before_outcomes:?}"
    );

    committed.query_drop("XA COMMIT 'xa-commit'").await.unwrap();
    rolled_back
        .query_drop("XA ROLLBACK 'xa-rollback'")
        .await
        .unwrap();
    let resolved = current_position(&db).await; // past both outcomes
    wait_until_sent(&db, 3, Duration::from_secs(60)).await;
    // No watermark entry is left open by an outcome: the checkpoint passes both.
    wait_for(
        "the checkpoint to pass both outcomes",
        Duration::from_secs(30),
        || async {
            mirrored_checkpoint(&db, &config)
                .await
                .is_some_and(|c| c.covers(&resolved))
        },
    )
    .await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.failed, 0);

    let per_event = stored(&topic).await;
    let expected: HashMap<String, usize> = ["xa-committed", "xa-one-phase", "plain"]
        .into_iter()
        .map(|id| (id.to_string(), 1))
        .collect();
    assert_eq!(
        per_event, expected,
        "committed XA events once each, the rolled-back one never"
    );
    assert_eq!(status_of(&db, "xa-rolled-back").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_transaction_holds_the_checkpoint_while_5000_other_events_flow_then_is_parked() {
    // A server of its own (as the restart test below): the relay holds its checkpoint at any
    // prepared XA transaction it reads in the binlog, of any database, so on the shared server
    // every other test's relay would be held too (CI: prepared_then_committed… timed out
    // waiting for its checkpoint beside it).
    let server = common::own_database("xa_hold");
    let db = TestDb::migrated_on(&server, "xa_hold").await;
    let topic = new_topic("xa_hold");
    // The sweeper on, as users run it; parked after 40 s instead of the default minute.
    let (mut config, _dir) = relay_fixture(&db).at_current_end().await;
    let park_after = Duration::from_secs(40);
    config.relay.park_prepared_after = park_after;
    let relay = RunningRelay::start(&config).await;
    // One event first, so that a checkpoint is mirrored before the prepare.
    insert_event(&mut db.conn().await, &topic, "first", "first-key").await;
    wait_for("a mirrored checkpoint", Duration::from_secs(30), || async {
        mirrored_checkpoint(&db, &config).await.is_some()
    })
    .await;

    let mut xa = prepare(&db, "xa-held", &topic, "xa-held").await;
    let prepared_at = current_position(&db).await; // covers the prepare
    let started = std::time::Instant::now();
    write_events(&db, &topic, 4, 1_250, 200).await;
    wait_until_sent(&db, 5_001, Duration::from_secs(180)).await;
    let after_writes = current_position(&db).await;
    // Meanwhile every other event was sent and the mirror moved on mirroring a checkpoint
    // below the prepare.
    let held = mirrored_checkpoint(&db, &config)
        .await
        .expect("a mirrored checkpoint");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= park_after || !held.covers(&prepared_at),
        "the checkpoint {held} passed the prepared transaction ({prepared_at}) after {elapsed:?}"
    );
    assert!(
        !stored(&topic).await.contains_key("xa-held"),
        "the prepared transaction's event is not published before XA COMMIT"
    );
    // `status` lists it (XA RECOVER) ...
    let report = rocketmq_outbox::operate::StatusReport::gather(
        &config,
        &rocketmq_outbox::operate::StatusOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        (report.prepared_xa, report.prepared_xa_error),
        (vec!["xa-held".to_string()], None),
        "status lists the prepared transaction"
    );
    // ... and `/metrics` names it, in the server's form (`XA ROLLBACK X'…',X'',1` takes it as is).
    let series = "outbox_xa_prepared_since_seconds{xid=\"X'78612d68656c64',X'',1\"}";
    assert!(
        rocketmq_outbox::metrics::relay().render().contains(series),
        "/metrics shows {series}"
    );

    // Still prepared past the limit: parked, the checkpoint passes it and what followed.
    wait_for(
        "the checkpoint to pass the parked prepare",
        park_after + Duration::from_secs(30),
        || async {
            mirrored_checkpoint(&db, &config)
                .await
                .is_some_and(|c| c.covers(&after_writes))
        },
    )
    .await;
    assert!(
        started.elapsed() >= park_after,
        "parked no sooner than relay.park_prepared_after"
    );
    assert_eq!(status_of(&db, "xa-held").await, None, "still prepared");

    // At XA COMMIT its row is PENDING; the sweeper sends it.
    xa.query_drop("XA COMMIT 'xa-held'").await.unwrap();
    wait_until_sent(&db, 5_002, Duration::from_secs(90)).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.failed, 0);
    let per_event = stored(&topic).await;
    assert_eq!(per_event.len(), 5_002, "every event, the held one included");
    assert!(per_event.contains_key("xa-held"));
    assert!(
        !rocketmq_outbox::metrics::relay().render().contains(series),
        "its series went at XA COMMIT"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_restarted_while_a_transaction_is_prepared_publishes_it_at_commit() {
    let server = common::own_database("xa_restart");
    let db = TestDb::migrated_on(&server, "xa_restart").await;
    let topic = new_topic("xa_restart");
    let (config, _dir) = stream_only(&db);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;
    let mut xa = prepare(&db, "xa-across", &topic, "xa-across").await;
    write_events(&db, &topic, 2, 100, 20).await;
    wait_until_sent(&db, 200, Duration::from_secs(60)).await;
    let first = relay.stop().await;
    assert_eq!(first.marked.sent, 200);

    let relay = RunningRelay::start(&config).await;
    write_events(&db, &topic, 2, 50, 20).await;
    wait_until_sent(&db, 300, Duration::from_secs(60)).await;
    xa.query_drop("XA COMMIT 'xa-across'").await.unwrap();
    wait_until_sent(&db, 301, Duration::from_secs(60)).await;
    let second = relay.stop().await;
    assert_eq!(
        second.marked.sent, 101,
        "the second run sends its own events and the committed one, not the first run's again"
    );
    let per_event = stored(&topic).await;
    assert_eq!(per_event.len(), 301);
    assert_eq!(per_event["xa-across"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_undone_inside_a_committed_transaction_are_never_published() {
    let db = TestDb::migrated("xa_undone").await;
    let topic = new_topic("xa_undone");
    let (config, _dir) = stream_only(&db);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;

    let mut conn = db.conn().await;
    conn.query_drop("CREATE TABLE side_effect (id INT PRIMARY KEY) ENGINE = MyISAM")
        .await
        .unwrap();
    // MariaDB binlogs the undone row between SAVEPOINT and ROLLBACK TO when a non-transactional
    // change follows it; MySQL drops it from the binlog. Either way it must not be published.
    let mut tx = conn.start_transaction(Default::default()).await.unwrap();
    insert_event(&mut tx, &topic, "kept-before", "k").await;
    tx.query_drop("SAVEPOINT s1").await.unwrap();
    insert_event(&mut tx, &topic, "undone", "k").await;
    if database().kind() == DatabaseKind::MariaDb {
        // (MySQL refuses a non-transactional change inside a transaction under GTIDs.)
        tx.query_drop("INSERT INTO side_effect VALUES (1)")
            .await
            .unwrap();
    }
    tx.query_drop("ROLLBACK TO SAVEPOINT s1").await.unwrap();
    insert_event(&mut tx, &topic, "kept-after", "k").await;
    tx.commit().await.unwrap();
    // A transaction rolled back whole.
    let mut tx = conn.start_transaction(Default::default()).await.unwrap();
    insert_event(&mut tx, &topic, "rolled-back", "k").await;
    tx.rollback().await.unwrap();
    insert_event(&mut conn, &topic, "last", "k").await;

    wait_until_sent(&db, 3, Duration::from_secs(60)).await;
    let summary = relay.stop().await;
    assert_eq!((summary.marked.sent, summary.marked.failed), (3, 0));
    let per_event = stored(&topic).await;
    let mut ids: Vec<&str> = per_event.keys().map(String::as_str).collect();
    ids.sort();
    assert_eq!(ids, ["kept-after", "kept-before", "last"]);
}
