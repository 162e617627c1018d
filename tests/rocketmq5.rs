//! RocketMQ 5 as its users deploy it: the proxy (cluster mode, Remoting) in front of the
//! brokers, and typed topics (`message.type`). Through the proxy and straight to the broker, a
//! FIFO topic's events carry their `biz_key` as their message group, a NORMAL topic's carry none,
//! and every id a send returns is the id stored; a topic whose type the relay cannot send (TRANSACTION)
//! holds only its own events, never FAILED, named in `/readyz` until it is fixed. Judged by what
//! the broker stored. In a namespace (`rocketmq.namespace`) the relay and the consumer library
//! use the broker's `<namespace>%<name>` for topics and groups, and the rows keep the plain name.

use crate::common;

use common::http::{free_addr, get, wait_until_refused};
use common::java_client::JavaConsumer;
use common::process::{write_config_file, RelayProcess};
use common::relay::{
    assert_key_order, assert_msg_ids_stored, count_status, count_where, current_position,
    relay_fixture, seed_checkpoint, wait_for, wait_until_sent, write_events, OutboxRow,
};
use common::rocketmq::{rocketmq, TEST_QUEUES};
use common::TestDb;
use mysql_async::prelude::*;
use outbox_devenv::rocketmq::{BrokerKind, CLUSTER_NAME};
use outbox_devenv::{ClientHost, Proxy, ReceivedMessage, TopicReader};
use rocketmq_outbox::config::RocketMqConfig;
use rocketmq_outbox::consumer::{
    ConsumedEvent, Disposition, Handler, IdempotentProcessor, IdempotentPushConsumer, Outcome,
    PushConsumerOptions,
};
use rocketmq_outbox::leader::Fence;
use rocketmq_outbox::outbox::OutboundMessage;
use rocketmq_outbox::outbox::Status;
use rocketmq_outbox::send::{RocketMqSink, SendError, SendFailure, Sink};
use rocketmq_outbox::test_utils::sample_message;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The binary's proxy in front of its cluster; `None` on rocketmq-rust (Apache has the proxy).
pub(crate) fn proxy() -> Option<&'static Proxy> {
    static PROXY: OnceLock<Option<Proxy>> = OnceLock::new();
    PROXY
        .get_or_init(|| match rocketmq().kind() {
            BrokerKind::Apache => Some(Proxy::start(rocketmq()).expect("the RocketMQ 5 proxy")),
            BrokerKind::Rust => {
                println!("rocketmq-rust has no proxy: RocketMQ 5 proxy tests skipped");
                None
            }
        })
        .as_ref()
}

/// A new topic of message type `kind` (`NORMAL`, `FIFO`, `DELAY`, ...), as a RocketMQ 5 user
/// creates it: `mqadmin updateTopic -a +message.type=<kind>`.
pub(crate) fn typed_topic(kind: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let topic = format!(
        "r5_{}_{}_{}",
        kind.to_lowercase(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let queues = TEST_QUEUES.to_string();
    update_topic(&topic, kind, &["-r", &queues, "-w", &queues]);
    topic
}

/// `mqadmin updateTopic` of `topic` with message type `kind` and `more` arguments.
pub(crate) fn update_topic(topic: &str, kind: &str, more: &[&str]) {
    let attribute = format!("+message.type={kind}");
    let mut args = vec![
        "updateTopic",
        "-c",
        CLUSTER_NAME,
        "-t",
        topic,
        "-a",
        &attribute,
    ];
    args.extend_from_slice(more);
    rocketmq().mqadmin(&args).expect("mqadmin updateTopic");
}

async fn sink_through(addr: &str, label: &str) -> RocketMqSink {
    let config = RocketMqConfig {
        namesrv_addr: Some(addr.to_string()),
        producer_group: format!("r5_{label}_{}", std::process::id()),
        send_timeout: Duration::from_secs(5),
        ..RocketMqConfig::default()
    };
    RocketMqSink::start(&config).await.expect("sink")
}

/// Sends `count` events (keys `key-0..2`) to `topic` through `sink`, a single send and then
/// batches of one queue; returns each event's id by `event_id`.
async fn send_events(sink: &RocketMqSink, topic: &str, count: usize) -> HashMap<String, String> {
    let mut ids = HashMap::new();
    let queues = sink.queue_count(topic).await.expect("route");
    let events: Vec<OutboundMessage> = (0..count).map(|i| sample_message(topic, i)).collect();
    for (n, chunk) in events.chunks(8).enumerate() {
        let refs: Vec<&OutboundMessage> = chunk.iter().collect();
        let sent = match sink.send(topic, n % queues, &refs, &Fence::open()).await {
            Ok(sent) => sent,
            Err(e) => panic!("{topic}: send of {} events refused: {e:?}", refs.len()),
        };
        assert_eq!(sent.len(), refs.len());
        ids.extend(chunk.iter().map(|m| m.event_id.clone()).zip(sent));
    }
    ids
}

/// At least `count` messages of `topic`, read from the broker.
async fn read_back(topic: &str, count: usize) -> Vec<ReceivedMessage> {
    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), topic)
        .await
        .expect("reader");
    let stored = reader
        .read_at_least(count, Duration::from_secs(60))
        .await
        .expect("read back");
    reader.close().await;
    stored
}

/// Reads `topic` back from the broker and checks every event is stored once under the id its
/// send returned, with its `biz_key` as its message group when `grouped`, with none otherwise.
async fn assert_stored(topic: &str, returned: &HashMap<String, String>, grouped: bool) {
    let stored = read_back(topic, returned.len()).await;
    assert_eq!(stored.len(), returned.len(), "{topic}: stored once each");
    for m in &stored {
        let event_id = &m.properties["event_id"];
        assert_eq!(
            &m.msg_id, &returned[event_id],
            "{topic}: stored id of {event_id}"
        );
        let expected = grouped.then(|| m.properties["biz_key"].clone());
        assert_eq!(
            m.message_group, expected,
            "{topic}: message group of {event_id}"
        );
    }
}

#[tokio::test]
async fn fifo_events_carry_their_key_as_message_group_through_the_proxy_and_straight() {
    common::init_logging();
    let Some(proxy) = proxy() else { return };
    let (normal, fifo) = (typed_topic("NORMAL"), typed_topic("FIFO"));
    let through_proxy = sink_through(&proxy.addr(), "proxy").await;
    let normal_ids = send_events(&through_proxy, &normal, 20).await;
    let fifo_ids = send_events(&through_proxy, &fifo, 20).await;
    through_proxy.shutdown().await;
    assert_stored(&normal, &normal_ids, false).await;
    assert_stored(&fifo, &fifo_ids, true).await;

    let straight_fifo = typed_topic("FIFO");
    let straight = sink_through(&rocketmq().namesrv_addr(), "straight").await;
    let ids = send_events(&straight, &straight_fifo, 20).await;
    straight.shutdown().await;
    assert_stored(&straight_fifo, &ids, true).await;
}

#[tokio::test]
async fn a_topic_type_the_relay_cannot_serve_is_a_configuration_error_not_the_events() {
    common::init_logging();
    let Some(proxy) = proxy() else { return };
    let transaction = typed_topic("TRANSACTION");
    let sink = sink_through(&proxy.addr(), "transaction").await;
    let message = sample_message(&transaction, 0);
    let queues = sink.queue_count(&transaction).await.expect("route");
    assert!(queues > 0);
    let refused = sink
        .send(&transaction, 0, &[&message], &Fence::open())
        .await;
    sink.shutdown().await;
    match refused {
        Err(SendFailure {
            error: SendError::Misconfigured(reason),
            ..
        }) => {
            assert!(
                reason.contains(&transaction) && reason.contains("TRANSACTION"),
                "{reason}"
            )
        }
        other => panic!("a TRANSACTION topic must be a configuration error, got {other:?}"),
    }

    // Straight to the broker, which would store it: its topic config says TRANSACTION, nothing
    // sent.
    let straight = sink_through(&rocketmq().namesrv_addr(), "transaction_straight").await;
    let refused = straight
        .send(&transaction, 0, &[&message], &Fence::open())
        .await;
    straight.shutdown().await;
    match refused {
        Err(SendFailure {
            error: SendError::Misconfigured(reason),
            ..
        }) => {
            assert!(
                reason.contains("TRANSACTION topic (its broker says so)"),
                "{reason}"
            )
        }
        other => panic!("a TRANSACTION topic must be a configuration error, got {other:?}"),
    }
    let reader = TopicReader::new(&rocketmq().namesrv_addr(), &transaction).await;
    let stored = reader.expect("reader").stored_count().await.expect("count");
    assert_eq!(stored, 0, "nothing stored on the TRANSACTION topic");
}

/// The rows of `topic` as the delivery checks read them, in id order.
async fn rows_of(db: &TestDb, topic: &str) -> Vec<OutboxRow> {
    db.conn()
        .await
        .exec(
            "SELECT id, event_id, biz_key, NULLIF(msg_id, '') FROM outbox_event \
             WHERE topic = ? ORDER BY id",
            (topic,),
        )
        .await
        .unwrap()
}

/// Every row of `topic` stored under its `msg_id`, each key in commit order, each message with
/// its key as its message group.
async fn assert_fifo_delivery(db: &TestDb, topic: &str) {
    let rows = rows_of(db, topic).await;
    let stored = read_back(topic, rows.len()).await;
    assert_msg_ids_stored(&rows, &stored);
    assert_key_order(&rows, &stored);
    for m in &stored {
        assert_eq!(m.message_group.as_ref(), Some(&m.properties["biz_key"]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_proxy_a_topic_of_the_wrong_type_waits_named_in_readyz_and_others_flow() {
    common::init_logging();
    let Some(proxy) = proxy() else { return };
    let db = TestDb::migrated("r5_relay").await;
    let (fifo, transaction) = (typed_topic("FIFO"), typed_topic("TRANSACTION"));
    let (config, dir) = relay_fixture(&db).on(&proxy.addr()).build();
    seed_checkpoint(&config, &current_position(&db).await);
    let addr = free_addr();
    let log = dir.path().join("relay.log");
    let file = write_config_file(&config, dir.path());
    let relay = RelayProcess::spawn_serving(&file, &addr, &log, &[]);
    write_events(&db, &transaction, 1, 6, 3).await;
    write_events(&db, &fifo, 2, 20, 4).await;
    let sent = format!("topic = '{fifo}' AND status = {}", Status::Sent.code());
    wait_for(
        "the FIFO topic's 40 events SENT",
        Duration::from_secs(90),
        || async { count_where(&db, &sent).await == 40 },
    )
    .await;
    let body = wait_until_refused(&addr, &transaction).await;
    assert!(
        body.contains("message.type NORMAL, FIFO, DELAY or MIXED"),
        "{body}"
    );
    let pending = format!(
        "topic = '{transaction}' AND status = {}",
        Status::Pending.code()
    );
    assert_eq!(
        count_where(&db, &pending).await,
        6,
        "the TRANSACTION topic's events wait"
    );
    assert_eq!(count_status(&db, Status::Failed).await, 0, "nothing FAILED");

    // The operator makes it a FIFO topic: its events go out, without a restart.
    update_topic(&transaction, "FIFO", &[]);
    wait_until_sent(&db, 46, Duration::from_secs(120)).await;
    wait_for("/readyz ready again", Duration::from_secs(30), || async {
        get(&addr, "/readyz").is_some_and(|(status, _)| status == 200)
    })
    .await;
    drop(relay);
    assert_eq!(count_status(&db, Status::Failed).await, 0, "nothing FAILED");
    assert_fifo_delivery(&db, &fifo).await;
    assert_fifo_delivery(&db, &transaction).await;
}

/// Accepts every event; the processor's observer records what arrived.
struct Accept;

impl Handler for Accept {
    async fn handle(
        &self,
        _event: &ConsumedEvent,
        _tx: &mut mysql_async::Transaction<'static>,
    ) -> anyhow::Result<Outcome> {
        Ok(Outcome::Success)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_namespace_the_relay_and_the_consumer_library_use_the_brokers_names() {
    common::init_logging();
    let Some(proxy) = proxy() else { return };
    let db = TestDb::migrated("r5_namespace").await;
    let namespace = format!("tenant-{}", std::process::id());
    // The operator creates the namespaced topic, as a cloud console does; the application and
    // its rows name it without the namespace.
    let topic = format!("orders_{}", std::process::id());
    let on_broker = format!("{namespace}%{topic}");
    let queues = TEST_QUEUES.to_string();
    update_topic(&on_broker, "NORMAL", &["-r", &queues, "-w", &queues]);

    let (mut config, dir) = relay_fixture(&db).build();
    config.rocketmq.namespace = Some(namespace.clone());
    seed_checkpoint(&config, &current_position(&db).await);
    let file = write_config_file(&config, dir.path());
    let relay = RelayProcess::spawn_serving(&file, "", &dir.path().join("relay.log"), &[]);
    write_events(&db, &topic, 2, 20, 4).await;
    wait_until_sent(&db, 40, Duration::from_secs(90)).await;
    drop(relay);
    let rows = rows_of(&db, &topic).await;
    let stored = read_back(&on_broker, rows.len()).await;
    assert_eq!(stored.len(), 40, "stored once each in {on_broker}");
    assert_msg_ids_stored(&rows, &stored);
    assert_key_order(&rows, &stored);
    let outside = TopicReader::new(&rocketmq().namesrv_addr(), &topic).await;
    let outside = match outside {
        Ok(reader) => reader.stored_count().await.unwrap_or(0),
        Err(_) => 0,
    };
    assert_eq!(outside, 0, "nothing went to {topic} outside the namespace");

    // A consumer of the same namespace, through the proxy: its group is the broker's
    // `<namespace>%<group>`, and its handler sees the topic's name without the namespace.
    let group = format!("billing_{}", std::process::id());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    let processor = IdempotentProcessor::new(db.pool.clone(), &group, Accept)
        .expect("processor")
        .with_observer(Arc::new(move |event: &ConsumedEvent, _: &Disposition| {
            record
                .lock()
                .unwrap()
                .push((event.topic.clone(), event.event_id.clone()));
        }));
    let options =
        PushConsumerOptions::new(proxy.addr(), &topic).with_namespace(Some(namespace.clone()));
    let host = Arc::new(ClientHost::new("r5-namespace").expect("client host"));
    let consumer = IdempotentPushConsumer::start(host, options, Arc::new(processor))
        .await
        .expect("consumer");
    wait_for(
        "the consumer to handle 40 events",
        Duration::from_secs(90),
        || async { seen.lock().unwrap().len() >= 40 },
    )
    .await;
    // The broker knows the group by its `<namespace>%<group>` name. Its subscription group
    // (`getConsumerConfig`, created by the first pull and kept) is asked first: the online
    // consumer (`consumerConnection`, the proxy's heartbeats) and its committed offsets
    // (`consumerProgress`) can each lag for minutes on a loaded machine (CI saw neither in 90 s
    // while the retry topic's consumer list was still unknown), so they only back it up.
    let group_on_broker = format!("{namespace}%{group}");
    let mut progress = String::new();
    let asked = std::time::Instant::now();
    let views = [
        "getConsumerConfig",
        "consumerConnection",
        "consumerProgress",
    ];
    let mut view = views.iter().cycle();
    let mut known = false;
    while !known && asked.elapsed() < Duration::from_secs(90) {
        let command = *view.next().expect("cycles");
        progress = rocketmq()
            .mqadmin(&[command, "-g", &group_on_broker])
            .map(|out| format!("{command}:\n{out}"))
            .unwrap_or_else(|e| e.to_string());
        known = match command {
            "getConsumerConfig" => names_group(&progress, &group_on_broker),
            _ => progress.contains(&on_broker),
        };
        match known {
            true => eprintln!(
                "{command} knows {group_on_broker} after {:?}",
                asked.elapsed()
            ),
            false => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
    consumer.shutdown().await;
    let seen = seen.lock().unwrap().clone();
    assert!(seen.iter().all(|(t, _)| t == &topic), "{seen:?}");
    let events: HashSet<&str> = seen.iter().filter_map(|(_, id)| id.as_deref()).collect();
    assert_eq!(events.len(), 40, "every event handled");
    assert!(
        known,
        "the broker knows group {group_on_broker} (on {on_broker}):\n{progress}"
    );
    // And not by the name the application gave it: nothing subscribed outside the namespace.
    let bare = rocketmq()
        .mqadmin(&["getConsumerConfig", "-g", &group])
        .unwrap_or_else(|e| e.to_string());
    assert!(
        !names_group(&bare, &group),
        "no group {group} outside the namespace:\n{bare}"
    );
}

/// Whether `mqadmin getConsumerConfig` output describes `group` (one line per field:
/// `groupName<padding>=  <name>`).
fn names_group(output: &str, group: &str) -> bool {
    output.lines().any(|line| {
        line.split_once('=')
            .is_some_and(|(field, value)| field.trim() == "groupName" && value.trim() == group)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_java_5_client_reads_a_fifo_topic_in_each_keys_commit_order() {
    common::init_logging();
    let Some(proxy) = proxy() else { return };
    let db = TestDb::migrated("r5_java").await;
    let fifo = typed_topic("FIFO");
    // A FIFO consumer group, as a RocketMQ 5 user creates one.
    let group = format!("r5_java_{}", std::process::id());
    rocketmq()
        .mqadmin(&[
            "updateSubGroup",
            "-c",
            CLUSTER_NAME,
            "-g",
            &group,
            "-o",
            "true",
        ])
        .expect("mqadmin updateSubGroup");
    let consumer = JavaConsumer::start(
        &proxy.grpc_addr(),
        &fifo,
        &group,
        60,
        Duration::from_secs(150),
    )
    .await;

    let (config, dir) = relay_fixture(&db).on(&proxy.addr()).build();
    seed_checkpoint(&config, &current_position(&db).await);
    let file = write_config_file(&config, dir.path());
    let relay = RelayProcess::spawn_serving(&file, "", &dir.path().join("relay.log"), &[]);
    write_events(&db, &fifo, 2, 30, 6).await;
    wait_until_sent(&db, 60, Duration::from_secs(90)).await;
    drop(relay);
    let deliveries = consumer.deliveries().await;

    // Every event, with its key as message group and its SENT msg_id; each key's events in the
    // order they were committed (the row ids), as the Java listener got them.
    let rows = rows_of(&db, &fifo).await;
    let delivered: HashSet<&str> = deliveries.iter().map(|d| d.event_id.as_str()).collect();
    assert_eq!(
        delivered.len(),
        rows.len(),
        "every event delivered: {deliveries:?}"
    );
    let msg_ids: HashMap<&str, &str> = (rows.iter())
        .map(|r| (r.1.as_str(), r.3.as_deref().unwrap_or_default()))
        .collect();
    for d in &deliveries {
        assert_eq!(
            d.message_group.as_deref(),
            Some(d.biz_key.as_str()),
            "{d:?}"
        );
        assert_eq!(
            msg_ids[d.event_id.as_str()],
            d.msg_id,
            "the SENT msg_id of {d:?}"
        );
    }
    let mut committed: HashMap<&str, Vec<&str>> = HashMap::new();
    for row in &rows {
        committed
            .entry(row.2.as_str())
            .or_default()
            .push(row.1.as_str());
    }
    let mut received: HashMap<&str, Vec<&str>> = HashMap::new();
    for d in &deliveries {
        let seen = received.entry(d.biz_key.as_str()).or_default();
        if !seen.contains(&d.event_id.as_str()) {
            seen.push(d.event_id.as_str());
        }
    }
    assert_eq!(received, committed, "each key's events in commit order");
    println!(
        "java 5.x FIFO consumer: {} deliveries of {} events, {} keys",
        deliveries.len(),
        rows.len(),
        committed.len()
    );
}
