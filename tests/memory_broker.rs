//! The stream, the marker and the checkpoint on a real MariaDB or MySQL (`OUTBOX_TEST_DB`),
//! publishing into a broker in memory (`rocketmq_outbox::test_utils::MemoryBroker`) that refuses
//! its first sends: the database side of the contract without a broker's timing. Every
//! committed event is stored once, each key's events on one queue in commit order, each SENT
//! row carries the id the broker returned for it, and the checkpoint passes the transaction of
//! the last event. What a real broker stores is proven by `relay::` and `message_ids::`.

use crate::common;

use common::relay::{count_status, current_position, relay_fixture, write_events};
use common::TestDb;
use mysql_async::prelude::*;
use rocketmq_outbox::checkpoint::{CheckpointStore, MemoryStore};
use rocketmq_outbox::db::Deployment;
use rocketmq_outbox::pipeline::{run_instance, PipelineBuilder, RunOptions};
use rocketmq_outbox::test_utils::{wait_notified, MemoryBroker};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sent_row_carries_the_id_the_broker_returned_and_keys_keep_commit_order() {
    let db = TestDb::migrated("memory_broker").await;
    let topic = "memory_broker";
    let (config, _dir) = relay_fixture(&db)
        .stream_only()
        .broker_retries(
            Duration::from_secs(3),
            Duration::from_millis(10),
            Duration::from_millis(50),
            8,
        )
        .build();
    let store = Arc::new(MemoryStore::default());
    store.save(&current_position(&db).await).unwrap();
    let broker = Arc::new(MemoryBroker::new(4).refusing_first(3));

    let cancel = CancellationToken::new();
    let relay = {
        let (config, broker, cancel) = (config.clone(), Arc::clone(&broker), cancel.clone());
        let store: Arc<dyn CheckpointStore> = store.clone();
        tokio::spawn(async move {
            let deployment = Deployment::resolve(&config).unwrap();
            let pipeline = PipelineBuilder::new(&config, &deployment, broker);
            run_instance(&pipeline, store, RunOptions::default(), cancel).await
        })
    };

    const TOTAL: usize = 2_000;
    write_events(&db, topic, 4, TOTAL / 4, 40).await;
    let last_commit = current_position(&db).await;
    // Woken by the broker's stores and the store's saves, not polled. (Other tests write to
    // the shared server too, so the checkpoint may pass the last commit by more.)
    wait_notified(
        "every event stored",
        Duration::from_secs(60),
        broker.stores(),
        |stored| *stored >= TOTAL,
    )
    .await;
    wait_notified(
        "the checkpoint to pass the last commit",
        Duration::from_secs(60),
        store.saves(),
        |saved| {
            saved
                .as_ref()
                .is_some_and(|saved| saved.covers(&last_commit))
        },
    )
    .await;
    // Stopping drains the marker: every row is SENT when the relay returns.
    cancel.cancel();
    let summary = relay.await.unwrap().expect("the relay stops cleanly");
    assert_eq!(summary.marked.sent, TOTAL as u64);
    assert_eq!(summary.marked.failed, 0);
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Sent).await,
        TOTAL as u64
    );

    // What the broker stored: each event once, each key on one queue, in commit order (ids
    // grow with commits within a key: each key has one writer).
    let rows: Vec<(u64, String, String, String)> = db
        .conn()
        .await
        .query("SELECT id, event_id, biz_key, NULLIF(msg_id, '') FROM outbox_event")
        .await
        .unwrap();
    let by_event: HashMap<&str, (u64, &str, &str)> = rows
        .iter()
        .map(|(id, event, key, msg_id)| (event.as_str(), (*id, key.as_str(), msg_id.as_str())))
        .collect();
    assert_eq!(broker.stored_count(), TOTAL, "each event stored once");
    let mut queue_of_key = BTreeMap::new();
    for ((stored_topic, queue), messages) in broker.stored() {
        assert_eq!(stored_topic, topic);
        let mut last_of_key = BTreeMap::new();
        for stored in messages {
            let (id, key, msg_id) = by_event[stored.message.event_id.as_str()];
            assert_eq!(
                msg_id, stored.msg_id,
                "the SENT row's msg_id is the id the broker returned"
            );
            assert_eq!(
                *queue_of_key.entry(key).or_insert(queue),
                queue,
                "{key} on one queue"
            );
            if let Some(before) = last_of_key.insert(key, id) {
                assert!(before < id, "{key}: row {before} stored before row {id}");
            }
        }
    }
    assert_eq!(queue_of_key.len(), 40);
}
