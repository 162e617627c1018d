//! Scheduled events (`deliver_at`, `NewEvent::deliver_at`): the relay sends them at once as
//! RocketMQ 5 timer messages to a DELAY topic, and the broker hands them to consumers from their
//! time on. Judged by what a consumer on the official Java 5.x client (gRPC, through the proxy)
//! receives and when, beside the rows: each scheduled event no earlier than its time, one due in
//! the past and an unscheduled one at once, one further ahead than the broker keeps timer
//! messages FAILED with the reason, and scheduled events for a NORMAL topic waiting, named in
//! `/readyz`, never FAILED. Then a scheduled event straight to the broker, and the broker's own
//! store: every message of the DELAY topic stored there no earlier than its time.

use crate::common;
use crate::rocketmq5::{proxy, typed_topic};

use common::http::{free_addr, wait_until_refused};
use common::java_client::JavaConsumer;
use common::process::{write_config_file, RelayProcess};
use common::relay::{count_where, current_position, relay_fixture, seed_checkpoint};
use common::rocketmq::rocketmq;
use common::TestDb;
use mysql_async::prelude::*;
use outbox_devenv::TopicReader;
use rocketmq_outbox::config::RocketMqConfig;
use rocketmq_outbox::leader::Fence;
use rocketmq_outbox::outbox::Status;
use rocketmq_outbox::producer::{NewEvent, Outbox};
use rocketmq_outbox::send::{RocketMqSink, Sink};
use rocketmq_outbox::test_utils::sample_message;
use serde_json::json;
use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_events_reach_consumers_no_earlier_than_their_time() {
    common::init_logging();
    let Some(proxy) = proxy() else { return };
    let db = TestDb::migrated("scheduled").await;
    let (delay, normal) = (typed_topic("DELAY"), typed_topic("NORMAL"));
    let group = format!("scheduled_{}", std::process::id());
    let consumer = JavaConsumer::start(
        &proxy.grpc_addr(),
        &delay,
        &group,
        8,
        Duration::from_secs(120),
    )
    .await;

    let (config, dir) = relay_fixture(&db).on(&proxy.addr()).build();
    seed_checkpoint(&config, &current_position(&db).await);
    let file = write_config_file(&config, dir.path());
    let addr = free_addr();
    let relay = RelayProcess::spawn_serving(&file, &addr, &dir.path().join("relay.log"), &[]);

    // In one transaction, as business code writes them: six events due in 5-10 s on three keys,
    // one due a minute ago, one with no time (a DELAY topic's: at once), one 4 days ahead, and
    // a scheduled event for the NORMAL topic.
    let now = SystemTime::now();
    let mut events: Vec<(NewEvent, Option<SystemTime>)> = (0..6)
        .map(|i| {
            let at = now + Duration::from_millis(5_000 + 900 * i);
            let event = NewEvent::new(&delay, format!("order-{}", i % 3), json!({"i": i}));
            (event.deliver_at(at), Some(at))
        })
        .collect();
    let past = now - Duration::from_secs(60);
    events.push((
        NewEvent::new(&delay, "order-past", json!({})).deliver_at(past),
        Some(past),
    ));
    events.push((NewEvent::new(&delay, "order-now", json!({})), None));
    let far = now + Duration::from_secs(4 * 86_400);
    events.push((
        NewEvent::new(&delay, "order-far", json!({})).deliver_at(far),
        Some(far),
    ));
    let soon = now + Duration::from_secs(5);
    events.push((
        NewEvent::new(&normal, "order-n", json!({})).deliver_at(soon),
        Some(soon),
    ));
    let due: Vec<Option<SystemTime>> = events.iter().map(|(_, at)| *at).collect();
    let mut tx = db.pool.start_transaction(Default::default()).await.unwrap();
    let ids = Outbox::default()
        .enqueue_batch(&mut tx, events.into_iter().map(|(e, _)| e).collect())
        .await
        .expect("enqueue");
    tx.commit().await.unwrap();
    let committed = unix_ms(SystemTime::now());
    let due: HashMap<String, Option<u64>> = (ids.iter())
        .map(|id| id.to_string())
        .zip(due.into_iter().map(|at| at.map(unix_ms)))
        .collect();

    let deliveries = consumer.deliveries().await;
    let sent = format!("topic = '{delay}' AND status = {}", Status::Sent.code());
    assert_eq!(
        count_where(&db, &sent).await,
        8,
        "the DELAY topic's events SENT"
    );
    let far_id = ids[8].to_string();
    let reason: Option<String> = db
        .conn()
        .await
        .exec_first(
            "SELECT last_error FROM outbox_event WHERE event_id = ? AND status = ?",
            (&far_id, Status::Failed.code()),
        )
        .await
        .unwrap()
        .flatten();
    let reason = reason.expect("the event 4 days ahead is FAILED");
    assert!(reason.contains("outbox.max_delay"), "{reason}");

    // Every event of the DELAY topic delivered, none before its time; the others at once.
    assert_eq!(deliveries.len(), 8, "{deliveries:?}");
    for d in &deliveries {
        let at = due[&d.event_id];
        match at {
            Some(at) if at > committed => {
                assert!(d.at_ms >= at, "{d:?} received {} ms early", at - d.at_ms);
                assert_eq!(d.delivery_ms, Some(at), "{d:?}: its delivery time");
            }
            _ => assert!(
                d.at_ms < committed + 5_000,
                "{d:?}: due at once, received {} ms after the commit",
                d.at_ms.saturating_sub(committed)
            ),
        }
        println!(
            "scheduled: {} due {:?}, received {:+} ms from due",
            d.biz_key,
            at.map(|at| at as i64 - committed as i64),
            d.at_ms as i64 - at.unwrap_or(committed) as i64
        );
    }

    // The NORMAL topic's scheduled event waits as a configuration error, named in /readyz.
    let body = wait_until_refused(&addr, &normal).await;
    assert!(body.contains("message.type DELAY"), "{body}");
    let pending = format!("topic = '{normal}' AND status = {}", Status::Pending.code());
    assert_eq!(count_where(&db, &pending).await, 1, "it waits, not FAILED");
    drop(relay);

    // Straight to the broker too (no proxy): a scheduled event due 3 s from now.
    let straight = RocketMqSink::start(&RocketMqConfig {
        namesrv_addr: Some(rocketmq().namesrv_addr()),
        producer_group: format!("scheduled_straight_{}", std::process::id()),
        ..RocketMqConfig::default()
    })
    .await
    .expect("sink");
    let mut event = sample_message(&delay, 0);
    let straight_due = unix_ms(SystemTime::now()) + 3_000;
    event.deliver_at_ms = Some(straight_due);
    let straight_id = straight
        .send(&delay, 0, &[&event], &Fence::open())
        .await
        .expect("sent")[0]
        .clone();
    straight.shutdown().await;

    // The broker's own store: every event of the DELAY topic stored in it no earlier than its
    // time, under the msg_id its row was marked SENT with (or its send returned).
    let marked: Vec<(String, String)> = db
        .conn()
        .await
        .exec(
            "SELECT event_id, msg_id FROM outbox_event WHERE topic = ? AND status = ?",
            (&delay, Status::Sent.code()),
        )
        .await
        .unwrap();
    let mut expected: HashMap<String, (String, u64)> = (marked.into_iter())
        .map(|(event_id, msg_id)| {
            let at = due[&event_id].unwrap_or(committed);
            (event_id, (msg_id, at))
        })
        .collect();
    expected.insert(event.event_id.clone(), (straight_id, straight_due));
    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), &delay)
        .await
        .expect("reader");
    let stored = reader
        .read_at_least(expected.len(), Duration::from_secs(60))
        .await
        .expect("the DELAY topic's messages");
    reader.close().await;
    assert_eq!(stored.len(), expected.len(), "each stored once");
    for m in &stored {
        let (msg_id, at) = &expected[&m.properties["event_id"]];
        assert_eq!(&m.msg_id, msg_id, "{m:?}");
        if *at > committed {
            assert!(
                m.store_timestamp as u64 >= *at,
                "{m:?} stored {} ms before its time",
                at - m.store_timestamp as u64
            );
        }
    }
}

/// One event's refusal is that event's: a DELAY topic through the proxy, with
/// `outbox.max_delay` above the broker's `timerMaxDelaySec` (3 days), an event due in 5 days
/// among ordinary ones. The broker refuses it (code 13, as it refuses a message of the wrong
/// type); the relay, which has seen the topic take timer messages, FAILs it at its first
/// attempt with what is known of why, and its neighbours go out within a second. The two events
/// of its key stored before it in the same send are stored once: the relay's retry of the
/// rest carries on after what the broker stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_proxy_an_event_due_beyond_the_broker_s_limit_fails_alone_at_once() {
    use common::relay::{count_status, wait_for, wait_until_sent, write_events, RunningRelay};
    common::init_logging();
    let Some(proxy) = proxy() else { return };
    let db = TestDb::migrated("sched_refused").await;
    let delay = typed_topic("DELAY");
    let (mut config, _dir) = relay_fixture(&db).on(&proxy.addr()).build();
    config.outbox.max_delay = Duration::from_secs(7 * 86_400);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;
    // The topic takes timer messages: learnt from its first events.
    write_events(&db, &delay, 1, 20, 5).await;
    wait_until_sent(&db, 20, Duration::from_secs(60)).await;

    let mut tx = db.pool.start_transaction(Default::default()).await.unwrap();
    // Two events of its key due in 2 s go before it in the same send (a timer message is a
    // request of its own): stored before the refusal, they are not sent again; one after it.
    let soon = SystemTime::now() + Duration::from_secs(2);
    let far = SystemTime::now() + Duration::from_secs(5 * 86_400);
    let of_key = |at| NewEvent::new(&delay, "order-far", json!({})).deliver_at(at);
    let mut events = vec![of_key(soon), of_key(soon), of_key(far)];
    events.push(NewEvent::new(&delay, "order-far", json!({})));
    events.extend((0..5).map(|i| NewEvent::new(&delay, format!("order-{i}"), json!({ "i": i }))));
    let ids = Outbox::default()
        .enqueue_batch(&mut tx, events)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let committed = std::time::Instant::now();
    let far_id = ids[2].to_string();
    let failed = format!(
        "event_id = '{far_id}' AND status = {}",
        Status::Failed.code()
    );
    wait_for(
        "the event due in 5 days FAILED",
        Duration::from_secs(30),
        || async { count_where(&db, &failed).await == 1 },
    )
    .await;
    let failed_after = committed.elapsed();
    wait_until_sent(&db, 28, Duration::from_secs(30)).await;
    let sent_after = committed.elapsed();
    relay.stop().await;

    let (reason, retries): (String, u32) = db
        .conn()
        .await
        .exec_first(
            "SELECT last_error, retry_count FROM outbox_event WHERE event_id = ?",
            (&far_id,),
        )
        .await
        .unwrap()
        .unwrap();
    println!("refused event FAILED after {failed_after:?}: {reason}; the others SENT after {sent_after:?}");
    assert_eq!(retries, 0, "FAILED at its first attempt");
    assert!(
        reason.contains("5days ahead") && reason.contains("timerMaxDelaySec"),
        "the reason says what is known: {reason}"
    );
    assert!(
        reason.contains("not the topic's type") && !reason.contains("probably"),
        "{reason}"
    );
    assert!(failed_after < Duration::from_secs(5), "{failed_after:?}");
    assert!(
        sent_after < Duration::from_secs(3),
        "its neighbours went out at once: {sent_after:?}"
    );
    assert_eq!(count_status(&db, Status::Failed).await, 1, "only that one");
    // The broker stored the other 28, each once: the two stored before the refusal too.
    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), &delay)
        .await
        .expect("reader");
    let stored = reader
        .read_at_least(28, Duration::from_secs(60))
        .await
        .expect("the topic's messages");
    reader.close().await;
    let stored_ids: std::collections::HashSet<&str> = stored
        .iter()
        .map(|m| m.properties["event_id"].as_str())
        .collect();
    assert_eq!(
        (stored.len(), stored_ids.len()),
        (28, 28),
        "each stored once"
    );
    assert!(!stored_ids.contains(far_id.as_str()));
}
