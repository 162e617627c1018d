//! The consumer library against a real MariaDB and a real RocketMQ broker: messages are published
//! with the real producer per the relay's message contract and consumed by
//! `IdempotentPushConsumer` (concurrent and orderly listeners).
//!
//! Needs the broker binaries: run `scripts/setup.sh` (or set `OUTBOX_DEVENV_ROCKETMQ_BIN`).

use crate::common;

use common::ledger::{ledger_db, wait_for_lock_wait, Failure, Ledger};
use common::rocketmq::{new_topic, rocketmq, ContractMessage, TestProducer};
use common::TestDb;
use mysql_async::prelude::*;
use outbox_devenv::ClientHost;
use rocketmq_outbox::consumer::{
    ConsumeCounts, ConsumedEvent, Disposition, IdempotentProcessor, IdempotentPushConsumer,
    ListenerMode, PushConsumerOptions,
};
use rocketmq_outbox::test_utils::wait_notified;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// One delivery as the observer saw it.
type Delivery = (ConsumedEvent, Disposition);

/// A running consumer with everything a test inspects.
struct Consumer {
    consumer: IdempotentPushConsumer,
    processor: Arc<IdempotentProcessor<Arc<Ledger>>>,
    ledger: Arc<Ledger>,
    deliveries: Arc<Mutex<Vec<Delivery>>>,
    /// How many deliveries the observer saw, announced after each one (after its counts).
    delivered: watch::Receiver<usize>,
    topic: String,
}

impl Consumer {
    async fn start(
        db: &TestDb,
        group: &str,
        topic: &str,
        mode: ListenerMode,
        ledger: Ledger,
    ) -> Self {
        let ledger = Arc::new(ledger);
        let deliveries = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&deliveries);
        let (announce, delivered) = watch::channel(0);
        let processor = IdempotentProcessor::new(db.pool.clone(), group, Arc::clone(&ledger))
            .expect("processor")
            .with_observer(Arc::new(
                move |event: &ConsumedEvent, outcome: &Disposition| {
                    log.lock().unwrap().push((event.clone(), outcome.clone()));
                    announce.send_modify(|count| *count += 1);
                },
            ));
        let processor = Arc::new(processor);
        let mut options = PushConsumerOptions::new(rocketmq().namesrv_addr(), topic);
        options.mode = mode;
        options.suspend_millis = 100;
        let host = Arc::new(ClientHost::new("consumer-test").expect("client host"));
        let consumer = IdempotentPushConsumer::start(host, options, Arc::clone(&processor))
            .await
            .expect("start consumer");
        Consumer {
            consumer,
            processor,
            ledger,
            deliveries,
            delivered,
            topic: topic.to_string(),
        }
    }

    fn counts(&self) -> ConsumeCounts {
        self.processor
            .metrics()
            .counts(self.processor.group(), &self.topic)
    }

    /// Waits until `done` holds for the counts, woken by each delivery (the processor counts a
    /// delivery before it calls the observer).
    async fn wait_for(&self, what: &str, timeout: Duration, done: impl Fn(ConsumeCounts) -> bool) {
        wait_notified(what, timeout, self.delivered.clone(), |_| {
            done(self.counts())
        })
        .await;
    }

    fn deliveries(&self) -> Vec<Delivery> {
        self.deliveries.lock().unwrap().clone()
    }
}

/// Waits until `done` holds, woken by a change announced on either receiver (two consumers'
/// deliveries, two gates); panics naming `what` after `timeout`.
async fn wait_for_either<A, B>(
    what: &str,
    timeout: Duration,
    (mut a, mut b): (watch::Receiver<A>, watch::Receiver<B>),
    done: impl Fn() -> bool,
) {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        // Seen before checking, so a change after the check wakes the select below.
        a.borrow_and_update();
        b.borrow_and_update();
        if done() {
            return;
        }
        tokio::select! {
            Ok(()) = a.changed() => {}
            Ok(()) = b.changed() => {}
            _ = tokio::time::sleep_until(deadline) => panic!("timed out after {timeout:?} waiting for {what}"),
        }
    }
}

async fn dedup_rows(db: &TestDb, group: &str) -> Vec<(String, String)> {
    db.conn()
        .await
        .exec(
            "SELECT event_id, status FROM event_dedup WHERE consumer_group = ? ORDER BY event_id",
            (group,),
        )
        .await
        .expect("dedup rows")
}

fn credit(topic: &str, event_id: &str, account: &str, amount: i64) -> ContractMessage {
    ContractMessage::event(
        topic,
        event_id,
        account,
        json!({"type": "Credited", "account": account, "amount": amount}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_event_delivered_five_times_changes_state_once() {
    let db = ledger_db("consume_five").await;
    let topic = new_topic("consume_five");
    let producer = TestProducer::start().await;
    let consumer = Consumer::start(
        &db,
        "five",
        &topic,
        ListenerMode::Concurrent,
        Ledger::new("a"),
    )
    .await;

    // A relay resend, a duplicate after a lost SENT mark, and manual replays: five copies of
    // one event, spread over the queues.
    let event = credit(&topic, "ev-five", "acct-1", 100);
    for queue in [None, None, Some(0), Some(1), Some(3)] {
        producer.send(&event, queue).await;
    }
    consumer
        .wait_for("5 deliveries", Duration::from_secs(60), |c| c.consumed >= 5)
        .await;

    assert_eq!(
        consumer.counts(),
        ConsumeCounts {
            consumed: 5,
            processed: 1,
            dedup_hits: 4,
            rejected: 0,
            retries: 0
        }
    );
    assert!(
        consumer.deliveries().iter().all(|(_, d)| d.is_ack()),
        "{:?}",
        consumer.deliveries()
    );
    assert_eq!(db.count("ledger").await, 1, "one business effect");
    assert_eq!(consumer.ledger.calls(), 1, "the handler ran once");
    assert_eq!(
        dedup_rows(&db, "five").await,
        [("ev-five".to_string(), "PROCESSED".to_string())]
    );
    let delivered = consumer.deliveries();
    let (first, _) = &delivered[0];
    assert_eq!(first.biz_key.as_deref(), Some("acct-1"));
    assert_eq!(first.keys, ["ev-five", "acct-1"]);
    consumer.consumer.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_first_delivery_leaves_no_mark_and_the_redelivery_processes_it() {
    let db = ledger_db("consume_redeliver").await;
    let topic = new_topic("consume_redeliver");
    let producer = TestProducer::start().await;
    let ledger = Ledger::new("a");
    // An error swallowed after the business write (event 180 of this batch): the write happens,
    // then an error escapes. It must roll back with the mark and come back.
    ledger.fail("ev-180", 1, Failure::Error);
    let consumer =
        Consumer::start(&db, "redeliver", &topic, ListenerMode::Concurrent, ledger).await;
    producer
        .send(&credit(&topic, "ev-180", "acct-180", 180), None)
        .await;

    consumer
        .wait_for("the failed first attempt", Duration::from_secs(60), |c| {
            c.retries >= 1
        })
        .await;
    let marks = dedup_rows(&db, "redeliver").await;
    let effects = db.count("ledger").await;
    // The broker's first retry comes 10 s later, long after these reads.
    assert_eq!(
        consumer.counts().processed,
        0,
        "redelivered before the check"
    );
    assert!(
        marks.is_empty(),
        "the failed attempt left a mark: {marks:?}"
    );
    assert_eq!(effects, 0, "the failed attempt left its business write");

    // RECONSUME_LATER: the broker redelivers through %RETRY%<group> (10 s for the first retry).
    consumer
        .wait_for("the redelivery", Duration::from_secs(90), |c| {
            c.processed >= 1
        })
        .await;
    assert_eq!(
        consumer.counts(),
        ConsumeCounts {
            consumed: 2,
            processed: 1,
            dedup_hits: 0,
            rejected: 0,
            retries: 1
        }
    );
    assert_eq!(db.count("ledger").await, 1);
    assert_eq!(
        dedup_rows(&db, "redeliver").await,
        [("ev-180".to_string(), "PROCESSED".to_string())]
    );
    let deliveries = consumer.deliveries();
    assert!(
        matches!(&deliveries[0].1, Disposition::Retry { reason } if reason.contains("planned error"))
    );
    let (redelivered, outcome) = &deliveries[1];
    assert_eq!(outcome, &Disposition::Processed);
    assert!(
        redelivered.reconsume_times >= 1,
        "a broker redelivery: {redelivered:?}"
    );
    assert_eq!(
        redelivered.topic, topic,
        "the original topic, not the retry topic"
    );
    assert_eq!(redelivered.event_id.as_deref(), Some("ev-180"));
    consumer.consumer.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_events_are_quarantined_marked_and_acked_once() {
    let db = ledger_db("consume_reject").await;
    let topic = new_topic("consume_reject");
    let producer = TestProducer::start().await;
    let consumer = Consumer::start(
        &db,
        "reject",
        &topic,
        ListenerMode::Concurrent,
        Ledger::new("a"),
    )
    .await;

    let bad = ContractMessage::event(&topic, "ev-bad", "acct-9", json!({"bad": "amount missing"}));
    let mut not_json = credit(&topic, "ev-garbled", "acct-9", 1);
    not_json.payload = b"{not json".to_vec();
    let keyless = ContractMessage {
        topic: topic.clone(),
        payload: br#"{"account":"acct-9","amount":5}"#.to_vec(),
        ..ContractMessage::default()
    };
    for message in [
        &bad,
        &not_json,
        &keyless,
        &credit(&topic, "ev-good", "acct-9", 7),
    ] {
        producer.send(message, None).await;
    }
    consumer
        .wait_for("4 deliveries", Duration::from_secs(60), |c| c.consumed >= 4)
        .await;
    assert_eq!(
        consumer.counts(),
        ConsumeCounts {
            consumed: 4,
            processed: 1,
            dedup_hits: 0,
            rejected: 3,
            retries: 0
        }
    );
    assert_eq!(
        db.count("ledger").await,
        1,
        "only the good event has an effect"
    );
    assert_eq!(
        dedup_rows(&db, "reject").await,
        [
            ("ev-bad".to_string(), "REJECTED".to_string()),
            ("ev-garbled".to_string(), "REJECTED".to_string()),
            ("ev-good".to_string(), "PROCESSED".to_string()),
        ]
    );
    let quarantined: Vec<(Option<String>, String, String, Option<String>)> = db
        .conn()
        .await
        .query("SELECT event_id, reason, payload, message_keys FROM consumer_quarantine ORDER BY event_id")
        .await
        .unwrap();
    assert_eq!(quarantined.len(), 3, "{quarantined:?}");
    assert_eq!(quarantined[0].0, None, "the keyless message");
    assert!(
        quarantined[0].1.contains("cannot be de-duplicated"),
        "{quarantined:?}"
    );
    assert_eq!(quarantined[1].0.as_deref(), Some("ev-bad"));
    assert_eq!(quarantined[1].1, "bad event: amount missing");
    assert_eq!(quarantined[1].3.as_deref(), Some("ev-bad acct-9"));
    assert_eq!(quarantined[2].0.as_deref(), Some("ev-garbled"));
    assert!(
        quarantined[2].1.starts_with("payload is not JSON"),
        "{quarantined:?}"
    );
    assert_eq!(
        quarantined[2].2, "{not json",
        "the invalid payload is kept as it was"
    );

    // The relay resends the bad event: ACKed as a duplicate, not quarantined again.
    producer.send(&bad, None).await;
    consumer
        .wait_for("the resend", Duration::from_secs(60), |c| c.consumed >= 5)
        .await;
    assert_eq!(consumer.counts().dedup_hits, 1);
    assert_eq!(
        consumer.counts().retries,
        0,
        "a rejected event is never handed back"
    );
    assert_eq!(db.count("consumer_quarantine").await, 3);
    assert!(matches!(
        consumer.deliveries().last(),
        Some((_, Disposition::Duplicate { previous: Some(status) })) if status.as_str() == "REJECTED"
    ));
    consumer.consumer.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_consumers_handling_one_event_concurrently_produce_one_effect() {
    let db = ledger_db("consume_race").await;
    let topic = new_topic("consume_race");
    let producer = TestProducer::start().await;
    let first = Consumer::start(
        &db,
        "race",
        &topic,
        ListenerMode::Concurrent,
        Ledger::new("first").with_gate(),
    )
    .await;
    let second = Consumer::start(
        &db,
        "race",
        &topic,
        ListenerMode::Concurrent,
        Ledger::new("second").with_gate(),
    )
    .await;

    // One copy per queue: whichever consumer owns a queue gets its copy, in parallel.
    let event = credit(&topic, "ev-race", "acct-7", 70);
    for queue in 0..4 {
        producer.send(&event, Some(queue)).await;
    }
    // An attempt holds its uncommitted mark inside the handler; wait until another attempt is
    // blocked on the same key, then let the first commit.
    wait_for_either(
        "one attempt inside the handler",
        Duration::from_secs(60),
        (first.ledger.gate().held(), second.ledger.gate().held()),
        || first.ledger.gate().is_holding() || second.ledger.gate().is_holding(),
    )
    .await;
    wait_for_lock_wait(&db, Duration::from_secs(15)).await;
    first.ledger.gate().open();
    second.ledger.gate().open();

    let total = |a: ConsumeCounts, b: ConsumeCounts| ConsumeCounts {
        consumed: a.consumed + b.consumed,
        processed: a.processed + b.processed,
        dedup_hits: a.dedup_hits + b.dedup_hits,
        rejected: a.rejected + b.rejected,
        retries: a.retries + b.retries,
    };
    wait_for_either(
        "4 deliveries",
        Duration::from_secs(60),
        (first.delivered.clone(), second.delivered.clone()),
        || {
            let sum = total(first.counts(), second.counts());
            sum.consumed >= 4
                && sum.consumed == sum.processed + sum.dedup_hits + sum.rejected + sum.retries
        },
    )
    .await;
    let sum = total(first.counts(), second.counts());
    println!(
        "first consumer {:?}\nsecond consumer {:?}",
        first.counts(),
        second.counts()
    );
    assert_eq!(sum.processed, 1, "{sum:?}");
    assert_eq!(
        sum.dedup_hits,
        sum.consumed - 1,
        "every other delivery is a dedup hit: {sum:?}"
    );
    assert_eq!(sum.retries, 0, "{sum:?}");
    assert_eq!(db.count("ledger").await, 1, "one business effect");
    assert_eq!(
        first.ledger.calls() + second.ledger.calls(),
        1,
        "the handler ran once"
    );
    first.consumer.shutdown().await;
    second.consumer.shutdown().await;
    producer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_events_orderly_every_processed_mark_has_its_result() {
    const EVENTS: i64 = 1_000;
    const ACCOUNTS: i64 = 8;
    let db = ledger_db("consume_thousand").await;
    let topic = new_topic("consume_thousand");
    let producer = TestProducer::start().await;
    // Every 10th event is sent twice; two events fail on their first attempt.
    let started = Instant::now();
    let mut sent = 0;
    for i in 0..EVENTS {
        let account = format!("acct-{}", i % ACCOUNTS);
        let event = ContractMessage::event(
            &topic,
            &format!("ev-{i:04}"),
            &account,
            json!({"account": account, "amount": i, "seq": i}),
        );
        let queue = Some(i32::try_from(i % ACCOUNTS % 4).unwrap()); // one queue per account
        producer.send(&event, queue).await;
        sent += 1;
        if i % 10 == 0 {
            producer.send(&event, queue).await;
            sent += 1;
        }
    }
    println!("published {sent} messages in {:?}", started.elapsed());

    let ledger = Ledger::new("orderly");
    ledger.fail("ev-0100", 1, Failure::Retry);
    ledger.fail("ev-0500", 1, Failure::Panic);
    let consumer = Consumer::start(&db, "thousand", &topic, ListenerMode::Orderly, ledger).await;
    consumer
        .wait_for("the first delivery", Duration::from_secs(60), |c| {
            c.consumed >= 1
        })
        .await;
    let started = Instant::now();
    consumer
        .wait_for("every delivery", Duration::from_secs(180), |c| {
            c.consumed >= sent + 2
        })
        .await;
    let elapsed = started.elapsed();
    println!(
        "consumed {} deliveries ({EVENTS} events) in {elapsed:?} after the first: {:.0} deliveries/s \
         through the idempotent path (orderly, 4 queues)",
        sent + 1,
        (sent + 1) as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(
        consumer.counts(),
        ConsumeCounts {
            consumed: sent + 2,
            processed: 1_000,
            dedup_hits: 100,
            rejected: 0,
            retries: 2
        }
    );

    // The audit an operator would sample, over all of them: every PROCESSED mark has its business result,
    // and no business result lacks its mark.
    let mut conn = db.conn().await;
    let marks_without_result: u64 = conn
        .query_first(
            "SELECT COUNT(*) FROM event_dedup d LEFT JOIN ledger l ON l.event_key = d.event_id \
             WHERE d.consumer_group = 'thousand' AND d.status = 'PROCESSED' AND l.id IS NULL",
        )
        .await
        .unwrap()
        .unwrap();
    let results_without_mark: u64 = conn
        .query_first(
            "SELECT COUNT(*) FROM ledger l LEFT JOIN event_dedup d \
             ON d.consumer_group = 'thousand' AND d.event_id = l.event_key WHERE d.event_id IS NULL",
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!((marks_without_result, results_without_mark), (0, 0));
    assert_eq!(db.count("ledger").await, EVENTS as u64);
    assert_eq!(db.count("event_dedup").await, EVENTS as u64);
    // Orderly: each account's events were applied in publish order, retries included.
    let out_of_order: u64 = conn
        .query_first(
            "SELECT COUNT(*) FROM ledger a JOIN ledger b ON a.account = b.account \
             AND a.id < b.id AND a.seq > b.seq",
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out_of_order, 0, "per-account order broken");
    drop(conn);
    consumer.consumer.shutdown().await;
    producer.shutdown().await;
}
