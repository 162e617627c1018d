//! Faults: the relay process killed with SIGKILL mid-stream, the broker stopped mid-stream, and
//! the relay's MySQL connections cut mid-packet.

use crate::common;

use common::process::{spawn_relay_process, write_config_file};
use common::proxy::CuttingProxy;
use common::relay::{
    assert_every_event_arrived_in_key_order, count_status, deliveries, last_committed_gtid,
    relay_fixture, stop_when_all_sent, wait_for, wait_until_sent, write_events, RunningRelay,
};
use common::rocketmq::{new_topic, rocketmq};
use common::TestDb;
use mysql_async::prelude::*;
use mysql_async::TxOpts;
use outbox_devenv::{scratch_dir, RocketMq};
use rocketmq_outbox::binlog::BinlogPosition;
use rocketmq_outbox::outbox::status::codes::FAILED;
use rocketmq_outbox::producer::{NewEvent, Outbox};
use serde_json::json;
use std::time::Duration;

/// Writes `count` events in transactions of 5, over 20 keys, pausing `pause` between commits.
async fn write_slowly(db: &TestDb, topic: &str, count: usize, pause: Duration) {
    let outbox = Outbox::default();
    for chunk in 0..count / 5 {
        let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
        let events = (0..5)
            .map(|i| {
                NewEvent::new(
                    topic,
                    format!("key-{}", (chunk * 5 + i) % 20),
                    json!({"n": chunk * 5 + i}),
                )
            })
            .collect();
        outbox.enqueue_batch(&mut tx, events).await.unwrap();
        tx.commit().await.unwrap();
        tokio::time::sleep(pause).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_then_restart_loses_nothing() {
    let db = TestDb::migrated("relay_kill").await;
    let topic = new_topic("relay_kill");
    let (config, dir) = relay_fixture(&db).at_current_end().await;
    let file = write_config_file(&config, dir.path());

    let mut relay = spawn_relay_process(&file);
    const TOTAL: usize = 3000;
    let writer = {
        let (pool, topic) = (db.pool.clone(), topic.clone());
        let db = TestDb {
            url: db.url.clone(),
            pool,
            config: db.config.clone(),
        };
        tokio::spawn(
            async move { write_slowly(&db, &topic, TOTAL, Duration::from_millis(5)).await },
        )
    };
    wait_for("some events SENT", Duration::from_secs(60), || async {
        count_status(&db, rocketmq_outbox::outbox::Status::Sent).await >= 300
    })
    .await;
    relay.kill().unwrap(); // SIGKILL
    relay.wait().unwrap();
    let sent_at_kill = count_status(&db, rocketmq_outbox::outbox::Status::Sent).await;
    assert!(sent_at_kill < TOTAL as u64, "killed mid-stream");

    let mut relay = spawn_relay_process(&file);
    writer.await.unwrap();
    wait_until_sent(&db, TOTAL as u64, Duration::from_secs(120)).await;
    // SIGTERM drains and exits cleanly.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(relay.id() as libc::pid_t, libc::SIGTERM) };
    let status = relay.wait().unwrap();
    assert!(status.success(), "SIGTERM is a clean stop: {status:?}");

    let per_event = deliveries(&rocketmq().namesrv_addr(), &topic, TOTAL).await;
    assert_eq!(per_event.len(), TOTAL, "every event arrived");
    let duplicates: usize = per_event.values().map(|n| n - 1).sum();
    println!(
        "SIGKILL after {sent_at_kill} of {TOTAL} SENT: 0 lost, {duplicates} duplicates ({:.2}%)",
        100.0 * duplicates as f64 / TOTAL as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_outage_holds_the_checkpoint_and_everything_arrives_after() {
    let db = TestDb::migrated("relay_outage").await;
    let mut broker = RocketMq::start(&scratch_dir("outage-broker").unwrap()).unwrap();
    let topic = "relay_outage";
    broker.create_topic(topic, 4).unwrap();
    let (config, _dir) = relay_fixture(&db)
        .on(&broker.namesrv_addr())
        .broker_retries(
            Duration::from_secs(1),
            Duration::from_millis(200),
            Duration::from_secs(1),
            1000,
        )
        .at_current_end()
        .await;
    // Held in memory for the whole outage: after `park_after` the stalled topic's events would
    // be left PENDING for the sweeper and the checkpoint would pass them (tests/isolation.rs,
    // tests/memory.rs); here the checkpoint must wait for them.
    let mut config = config;
    config.relay.park_after = Duration::from_secs(300);
    let relay = RunningRelay::start(&config).await;

    write_slowly(&db, topic, 50, Duration::ZERO).await;
    wait_until_sent(&db, 50, Duration::from_secs(60)).await;

    broker.stop_broker();
    // The first transaction of the outage, and its GTID: the checkpoint must stay before it.
    let mut conn = db.conn().await;
    let mut tx = conn.start_transaction(TxOpts::default()).await.unwrap();
    Outbox::default()
        .enqueue(
            &mut tx,
            NewEvent::new(topic, "key-0", json!({"first": "of the outage"})),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let first_unsent = last_committed_gtid(&mut conn).await;
    write_slowly(&db, topic, 100, Duration::from_millis(20)).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Sent).await,
        50,
        "nothing is SENT while the broker is down"
    );
    let mirrored: String = db
        .conn()
        .await
        .exec_first(
            "SELECT checkpoint FROM outbox_relay_state WHERE name = ?",
            (&config.relay.name,),
        )
        .await
        .unwrap()
        .expect("checkpoint mirrored");
    let mirrored = BinlogPosition::from_json(&mirrored).unwrap();
    let failed: Vec<(String, Option<String>)> = db
        .conn()
        .await
        .query(format!(
            "SELECT event_id, last_error FROM outbox_event WHERE status = {FAILED}"
        ))
        .await
        .unwrap();
    assert!(
        failed.is_empty(),
        "a broker outage FAILs nothing: it is retryable: {failed:?}"
    );
    assert!(
        !mirrored.is_unknown() && !mirrored.covers(&first_unsent),
        "the persisted checkpoint {mirrored} passed the unsent transaction {first_unsent}"
    );

    broker.start_broker().unwrap();
    let namesrv = broker.namesrv_addr();
    stop_when_all_sent(relay, &db, (&namesrv, topic), 151, Duration::from_secs(90)).await;
}

/// The relay's MySQL connections cut in turn once the server has sent them 20 KB, twelve times,
/// while events stream. The binlog dump carries most bytes, so most cuts land inside one of its
/// events ("bytes remaining on stream"): the reader reopens the stream from its last whole
/// transaction (whose rows already handed on are not sent again), and every event arrives, per
/// key in commit order, none FAILED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cut_mid_stream_lose_nothing() {
    let db = TestDb::migrated("relay_cut_stream").await;
    let topic = new_topic("relay_cut_stream");
    let (mut config, _dir) = relay_fixture(&db).at_current_end().await;
    let proxy = CuttingProxy::reroute(&mut config, vec![20_000; 12]).await;
    let relay = RunningRelay::start(&config).await;
    write_events(&db, &topic, 2, 1000, 40).await;
    wait_until_sent(&db, 2000, Duration::from_secs(90)).await;
    assert!(proxy.all_cut(), "{} cuts", proxy.cut());
    let summary = relay.stop().await;
    assert_eq!(summary.marked.failed, 0);
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Failed).await,
        0,
        "nothing FAILED"
    );
    assert_every_event_arrived_in_key_order(&db, &topic, 2000).await;
}
