//! The stream's pipeline without any server: binlog items → dispatcher → router → ordered shard
//! senders → completions → watermark → checkpoint store, with an in-memory broker that refuses
//! its first sends. What it shows in milliseconds, the live tests show on real servers: every
//! event is published, each key's events reach one queue in commit order, and the checkpoint
//! reaches the last transaction only once all its events are acknowledged.

use super::dispatch::{self, Dispatched, Outputs};
use crate::binlog::{BinlogItem, BinlogPosition, DecodedRow, TxEnd};
use crate::checkpoint::{Acknowledgements, CheckpointStore, MemoryStore};
use crate::event::OutboxRow;
use crate::retry::RetryPolicy;
use crate::send::{SendOutcome, Shards};
use crate::test_utils::MemoryBroker;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

fn event(id: u64, key: &str) -> BinlogItem {
    let mut row = OutboxRow::sample(id);
    row.message.biz_key = key.to_string();
    BinlogItem::Row(DecodedRow::Event(row))
}

fn commit(end_pos: u64) -> BinlogItem {
    BinlogItem::TxEnd(TxEnd::sample(end_pos, 0))
}

/// Transactions streamed, each of two events.
const TRANSACTIONS: u64 = 200;
/// Keys the events spread over.
const KEYS: u64 = 7;

/// The pipeline's stages, running.
struct Running {
    shards: Shards,
    items_tx: mpsc::Sender<BinlogItem>,
    dispatcher: JoinHandle<Dispatched>,
    /// Every outcome, in the order the marker's part received them.
    acknowledger: JoinHandle<Vec<SendOutcome>>,
}

/// Starts the dispatcher and four shards sending to `broker` (retrying its refusals quickly),
/// and the marker's part acknowledging each outcome in `acks`.
fn start(broker: &Arc<MemoryBroker>, acks: &Acknowledgements) -> Running {
    let (completions_tx, mut completions) = mpsc::channel(64);
    let retry = RetryPolicy {
        initial: Duration::from_millis(1),
        max: Duration::from_millis(5),
        max_retries: Some(10),
        jitter: crate::retry::Jitter::Equal,
    };
    let (shards, inputs) = Shards::start(
        broker,
        4,
        64,
        retry,
        Default::default(),
        Default::default(),
        completions_tx,
    );
    let (items_tx, items) = mpsc::channel(64);
    let outputs = Outputs {
        inputs,
        key_order: None,
        park_prepared_after: None,
    };
    let dispatcher = tokio::spawn(dispatch::run(items, outputs, acks.clone(), None));

    // The marker's part: each outcome recorded acknowledges its event, and the checkpointer
    // saves the position the acknowledgements reach.
    let acknowledger = tokio::spawn(async move {
        let mut outcomes = Vec::new();
        while let Some(done) = completions.recv().await {
            assert!(done.origin.is_stream(), "a streamed event");
            done.origin.acknowledge();
            outcomes.push(done.outcome);
        }
        outcomes
    });
    Running {
        shards,
        items_tx,
        dispatcher,
        acknowledger,
    }
}

/// Streams [`TRANSACTIONS`] transactions: transaction t holds two events, of keys t % KEYS and
/// (t + 1) % KEYS.
async fn stream_transactions(items_tx: &mpsc::Sender<BinlogItem>) {
    for t in 0..TRANSACTIONS {
        items_tx.send(BinlogItem::TxBegin).await.unwrap();
        for (n, key) in [t % KEYS, (t + 1) % KEYS].into_iter().enumerate() {
            let id = t * 2 + n as u64;
            items_tx
                .send(event(id, &format!("key-{key}")))
                .await
                .unwrap();
        }
        items_tx.send(commit(100 * (t + 1))).await.unwrap();
    }
}

/// What the broker stored: each event once; each key on one queue, in commit order.
fn assert_each_key_on_one_queue_in_order(broker: &MemoryBroker, events: usize) {
    let queues = broker.stored();
    assert_eq!(broker.stored_count(), events, "each event stored once");
    let id_of = |event_id: &str| event_id[1..].parse::<u64>().unwrap();
    let key_of = |id: u64| {
        let t = id / 2;
        [t % KEYS, (t + 1) % KEYS][(id % 2) as usize]
    };
    let mut queue_of_key = BTreeMap::new();
    for ((_, queue), stored) in queues.iter() {
        let mut last_of_key = BTreeMap::new();
        for id in stored.iter().map(|s| id_of(&s.message.event_id)) {
            let key = key_of(id);
            assert_eq!(
                *queue_of_key.entry(key).or_insert(*queue),
                *queue,
                "key {key} on one queue"
            );
            if let Some(previous) = last_of_key.insert(key, id) {
                assert!(previous < id, "key {key}: {previous} before {id}");
            }
        }
    }
    assert_eq!(queue_of_key.len(), KEYS as usize);
}

#[tokio::test]
async fn events_flow_in_key_order_and_the_checkpoint_follows_the_acknowledgements() {
    let started = Instant::now();
    let broker = Arc::new(MemoryBroker::new(4).refusing_first(3));
    let acks = Acknowledgements::new(BinlogPosition::default());
    let store = MemoryStore::default();
    let running = start(&broker, &acks);

    stream_transactions(&running.items_tx).await;
    drop(running.items_tx);
    let dispatched = running.dispatcher.await.unwrap();
    assert_eq!(dispatched.unidentifiable, 0);
    running.shards.drain(Duration::from_secs(5), "test").await;
    let outcomes = running.acknowledger.await.unwrap();
    store.save(&acks.position()).unwrap();

    let events = (TRANSACTIONS * 2) as usize;
    assert_eq!(outcomes.len(), events, "one outcome per event");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, SendOutcome::Sent { .. })),
        "every event SENT after the broker's refusals: {outcomes:?}"
    );
    assert_eq!(
        store.load().unwrap().map(|p| p.pos),
        Some(100 * TRANSACTIONS),
        "the checkpoint reaches the last transaction once everything is acknowledged"
    );
    assert_eq!(acks.in_flight(), 0);

    assert_each_key_on_one_queue_in_order(&broker, events);
    println!(
        "{events} events through the serverless pipeline in {:?}",
        started.elapsed()
    );
}
