//! The article's checks, literally, with the broker's own tool (`mqadmin`, Apache RocketMQ's
//! `MQAdminStartup`) against the relay and a real MariaDB:
//! - a rolled-back transaction: `queryMsgByKey -k <event_id>` finds nothing;
//! - rows committed while the relay is stopped stay PENDING, become SENT after it starts, and
//!   `queryMsgByKey` finds exactly one message for each;
//! - a SENT row put back to PENDING is sent again, and the consumer library's de-duplication
//!   answers success without a second business change;
//! - `queryMsgById <msg_id>` finds the message of every SENT row of a batched drain.

use crate::common;

use common::ledger::{ledger_db, Ledger};
use common::relay::{
    count_status, current_position, relay_fixture, seed_checkpoint, sweeping_config,
    wait_until_sent, write_events, RunningRelay,
};
use common::rocketmq::{new_topic, rocketmq};
use common::TestDb;
use mysql_async::prelude::*;
use mysql_async::TxOpts;
use outbox_devenv::rocketmq::apache::printed_message_ids;
use outbox_devenv::ClientHost;
use rocketmq_outbox::consumer::{IdempotentProcessor, IdempotentPushConsumer, PushConsumerOptions};
use rocketmq_outbox::outbox::status::codes::{PENDING, SENT};
use rocketmq_outbox::producer::{NewEvent, Outbox};
use rocketmq_outbox::test_utils::wait_notified;
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// How many stored messages of `topic` carry `key` (an event_id) in KEYS, per
/// `mqadmin queryMsgByKey`.
fn messages_with_key(topic: &str, key: &str) -> usize {
    let out = rocketmq()
        .mqadmin(&["queryMsgByKey", "-t", topic, "-k", key])
        .expect("mqadmin queryMsgByKey");
    eprintln!("queryMsgByKey {key}:\n{out}");
    out.lines().filter(|line| is_message_row(line)).count()
}

/// A result row of `queryMsgByKey`: `<message id> <queue id> <queue offset>` (the header line
/// starts with `#`).
fn is_message_row(line: &str) -> bool {
    let fields: Vec<&str> = line.split_whitespace().collect();
    fields.len() >= 3
        && fields[0].len() == 32
        && fields[0].chars().all(|c| c.is_ascii_hexdigit())
        && fields[1].parse::<u32>().is_ok()
}

async fn one_event(db: &TestDb, topic: &str, key: &str, commit: bool) -> String {
    let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
    let id = Outbox::default()
        .enqueue(&mut tx, NewEvent::new(topic, key, json!({"key": key})))
        .await
        .unwrap()
        .to_string();
    if commit {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transaction_publishes_nothing_and_a_stopped_relay_catches_up_once() {
    let db = TestDb::migrated("article_rollback").await;
    let topic = new_topic("article_rollback");
    let (config, _dir) = relay_fixture(&db).at_current_end().await;

    // Committed while no relay runs: they wait PENDING.
    let mut committed = Vec::new();
    for i in 0..3 {
        committed.push(one_event(&db, &topic, &format!("stopped-{i}"), true).await);
    }
    let rolled_back = one_event(&db, &topic, "rolled-back", false).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Pending).await,
        3,
        "PENDING while the relay is stopped"
    );

    let relay = RunningRelay::start(&config).await;
    committed.push(one_event(&db, &topic, "after-start", true).await);
    wait_until_sent(&db, 4, Duration::from_secs(60)).await;
    relay.stop().await;

    assert_eq!(
        messages_with_key(&topic, &rolled_back),
        0,
        "rolled back: nothing"
    );
    for event_id in &committed {
        assert_eq!(
            messages_with_key(&topic, event_id),
            1,
            "{event_id}: exactly one"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sent_row_of_a_batched_drain_is_found_by_its_msg_id() {
    let db = TestDb::migrated("article_drain").await;
    let topic = new_topic("article_drain");
    let (config, _dir) = relay_fixture(&db).at_current_end().await;
    // A backlog written before the relay starts drains in batches.
    write_events(&db, &topic, 2, 250, 20).await;
    let relay = RunningRelay::start(&config).await;
    wait_until_sent(&db, 500, Duration::from_secs(90)).await;
    relay.stop().await;
    let ids: Vec<String> = db
        .conn()
        .await
        .query(format!(
            "SELECT msg_id FROM outbox_event WHERE status = {SENT}"
        ))
        .await
        .unwrap();
    assert_eq!(ids.len(), 500);
    let out = rocketmq()
        .mqadmin(&["queryMsgById", "-t", &topic, "-i", &ids.join(",")])
        .expect("mqadmin queryMsgById");
    let found: HashSet<String> = printed_message_ids(&out).into_iter().collect();
    let missing: Vec<&String> = ids.iter().filter(|id| !found.contains(*id)).collect();
    assert!(
        missing.is_empty(),
        "queryMsgById does not find {} of 500 SENT rows' msg_id: {:?}",
        missing.len(),
        missing.iter().take(5).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sent_row_put_back_to_pending_is_sent_again_and_deduplicated_by_the_consumer() {
    let db = ledger_db("article_resend").await;
    let topic = new_topic("article_resend");
    let (config, _dir) = sweeping_config(&db);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;
    let event_id = one_event(&db, &topic, "order-1", true).await;
    wait_until_sent(&db, 1, Duration::from_secs(60)).await;

    let ledger = Arc::new(Ledger::new("article"));
    // Each delivery is announced after it is counted: the waits below are woken, not polled.
    let (announce, delivered) = tokio::sync::watch::channel(0_usize);
    let processor = Arc::new(
        IdempotentProcessor::new(db.pool.clone(), "article", Arc::clone(&ledger))
            .unwrap()
            .with_observer(Arc::new(move |_: &_, _: &_| {
                announce.send_modify(|count| *count += 1)
            })),
    );
    let mut options = PushConsumerOptions::new(rocketmq().namesrv_addr(), &topic);
    options.suspend_millis = 100;
    let host = Arc::new(ClientHost::new("article-consumer").unwrap());
    let consumer = IdempotentPushConsumer::start(host, options, Arc::clone(&processor))
        .await
        .unwrap();
    wait_notified(
        "the first delivery",
        Duration::from_secs(60),
        delivered.clone(),
        |_| ledger.calls() == 1,
    )
    .await;

    // The article's step: an operator puts the SENT row back to PENDING; the sweeper sends it.
    db.conn()
        .await
        .exec_drop(
            format!("UPDATE outbox_event SET status = {PENDING}, msg_id = DEFAULT, sent_at = DEFAULT WHERE event_id = ?"),
            (&event_id,),
        )
        .await
        .unwrap();
    wait_until_sent(&db, 1, Duration::from_secs(60)).await;
    relay.stop().await;
    assert_eq!(messages_with_key(&topic, &event_id), 2, "published twice");
    let counts = || processor.metrics().counts(processor.group(), &topic);
    wait_notified(
        "the duplicate to be answered",
        Duration::from_secs(60),
        delivered,
        |_| counts().dedup_hits >= 1,
    )
    .await;
    let business_rows: u64 = db
        .conn()
        .await
        .query_first("SELECT COUNT(*) FROM ledger")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(business_rows, 1, "one business change for two deliveries");
    assert_eq!(ledger.calls(), 1, "the handler ran once");
    consumer.shutdown().await;
}
