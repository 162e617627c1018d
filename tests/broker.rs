//! The local RocketMQ harness against the real `rocketmq-client-rust` producer: start namesrv +
//! broker, create a topic with 8 queues, send with keys, tags and user properties (some to a
//! chosen queue, some by `SelectMessageQueueByHash`), read everything back with `TopicReader`,
//! then stop the broker, check that a send fails, restart it and check that the topic still
//! holds the old messages and accepts new ones.
//!
//! Needs the broker binaries: run `scripts/setup.sh` (or set `OUTBOX_DEVENV_ROCKETMQ_BIN`).

use std::time::{Duration, Instant};

use outbox_devenv::rocketmq::ClientHost;
use outbox_devenv::{ReceivedMessage, RocketMq, TopicReader};
use rocketmq_client_rust::{
    ClientError, DefaultMQProducer, JavaHashCode, MessageQueueSelector, SelectMessageQueueByHash,
    SendResult, SendStatus,
};
use rocketmq_model::common::message::message_queue::MessageQueue;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_model::common::message::MessageTrait;

const TOPIC: &str = "outbox_relay_broker_test";
const QUEUES: u32 = 8;
const CHOSEN_QUEUE: i32 = 5;

fn message(i: usize, key: &str) -> Message {
    let mut message = Message::builder()
        .topic(TOPIC)
        .tags("created")
        .key(key)
        .body_slice(format!("body-{i}").as_bytes())
        .build_unchecked();
    message
        .put_user_property("event_id".into(), format!("ev-{i}").into())
        .expect("event_id is not a system property");
    message
}

/// Sends through `producer` on the host's runtime; `queue` picks a queue by its id.
async fn send(
    host: &ClientHost,
    producer: &DefaultMQProducer,
    message: Message,
    queue: Option<i32>,
) -> Result<SendResult, ClientError> {
    let producer = producer.clone();
    let sent = host
        .run(async move {
            match queue {
                None => producer.send_with_timeout(message, 3_000).await,
                Some(queue) => {
                    let pick = |mqs: &[MessageQueue], _: &Message, wanted: &i32| {
                        mqs.iter().find(|q| q.queue_id() == *wanted).cloned()
                    };
                    producer
                        .send_with_selector_timeout(message, pick, queue, 3_000)
                        .await
                }
            }
        })
        .await
        .expect("client task");
    sent.map(|result| result.expect("a synchronous send returns a SendResult"))
}

/// Sends with `SelectMessageQueueByHash` on `key`, as the relay will.
async fn send_by_hash(
    host: &ClientHost,
    producer: &DefaultMQProducer,
    message: Message,
    key: String,
) -> SendResult {
    let producer = producer.clone();
    host.run(async move {
        let by_hash = |mqs: &[MessageQueue], m: &Message, k: &String| {
            SelectMessageQueueByHash.select(mqs, m, k)
        };
        producer
            .send_with_selector_timeout(message, by_hash, key, 3_000)
            .await
    })
    .await
    .expect("client task")
    .expect("send by hash")
    .expect("a synchronous send returns a SendResult")
}

fn assert_ok(result: &SendResult) {
    assert_eq!(result.send_status, SendStatus::SendOk, "{result:?}");
    assert!(
        result.msg_id.is_some(),
        "SEND_OK without msg_id: {result:?}"
    );
}

/// `(msg_id, offset_msg_id)` of a send: what a consumer sees as `UNIQ_KEY` and `MessageExt::msg_id`.
fn ids(sent: &SendResult) -> (String, String) {
    let msg_id = sent
        .msg_id
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    (msg_id, sent.offset_msg_id.clone().unwrap_or_default())
}

fn bodies(messages: &[ReceivedMessage]) -> Vec<String> {
    let mut all: Vec<String> = messages.iter().map(ReceivedMessage::body_str).collect();
    all.sort();
    all
}

#[tokio::test]
async fn broker_send_read_stop_restart() {
    // The client logs a lot (and every pull error of the readers' background pulls while the
    // broker is down): see it with RUST_LOG=warn.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    }
    let root = tempfile::tempdir().expect("tempdir");
    let started = Instant::now();
    let mut mq = RocketMq::start(root.path()).expect("start RocketMQ");
    println!(
        "RocketMQ ready in {:?}: namesrv {} broker {}",
        started.elapsed(),
        mq.namesrv_addr(),
        mq.broker_addr()
    );
    mq.create_topic(TOPIC, QUEUES).expect("create topic");

    let host = ClientHost::new("broker-test").expect("client host");
    let producer = DefaultMQProducer::builder(host.client_runtime())
        .producer_group("outbox_relay_broker_test")
        .name_server_addr(mq.namesrv_addr())
        .send_msg_timeout(3_000)
        .build();
    {
        let mut starting = producer.clone();
        host.run(async move { starting.start().await })
            .await
            .unwrap()
            .expect("start producer");
    }
    let queues = {
        let mut p = producer.clone();
        host.run(async move { p.fetch_publish_message_queues(TOPIC).await })
            .await
            .unwrap()
            .expect("queues")
    };
    assert_eq!(queues.len(), QUEUES as usize, "{queues:?}");

    // 4 messages routed by the producer, 3 to a chosen queue, 3 by key hash.
    let mut expected_ids = Vec::new();
    for i in 0..4 {
        let sent = send(&host, &producer, message(i, &format!("auto-{i}")), None)
            .await
            .expect("send");
        assert_ok(&sent);
        expected_ids.push(ids(&sent));
    }
    for i in 4..7 {
        let sent = send(&host, &producer, message(i, "chosen"), Some(CHOSEN_QUEUE))
            .await
            .expect("send to queue");
        assert_ok(&sent);
        assert_eq!(
            sent.message_queue.as_ref().map(MessageQueue::queue_id),
            Some(CHOSEN_QUEUE)
        );
        expected_ids.push(ids(&sent));
    }
    // Java: "order-1".hashCode() == -1207111310; Math.abs(-1207111310 % 8) == 6.
    let hash_key = "order-1".to_string();
    assert_eq!(hash_key.java_hash_code(), -1_207_111_310);
    let hash_queue = 6;
    for i in 7..10 {
        let sent = send_by_hash(&host, &producer, message(i, &hash_key), hash_key.clone()).await;
        assert_ok(&sent);
        assert_eq!(
            sent.message_queue.as_ref().map(MessageQueue::queue_id),
            Some(hash_queue),
            "{sent:?}"
        );
        expected_ids.push(ids(&sent));
    }

    let mut reader = TopicReader::new(&mq.namesrv_addr(), TOPIC)
        .await
        .expect("reader");
    let read = reader
        .read_at_least(10, Duration::from_secs(30))
        .await
        .expect("read back");
    let read = reader
        .read_all_for(Duration::from_millis(500))
        .await
        .map(|_| read)
        .expect("quiet");
    assert_eq!(
        reader.received().len(),
        10,
        "no extra messages: {:?}",
        reader.received()
    );
    // The count the bench's drains poll: the broker's max offsets, without reading a message.
    assert_eq!(reader.stored_count().await.expect("stored count"), 10);
    assert_eq!(
        bodies(&read),
        (0..10).map(|i| format!("body-{i}")).collect::<Vec<_>>()
    );
    for m in &read {
        let i: usize = m.body_str()["body-".len()..].parse().unwrap();
        assert_eq!(m.topic, TOPIC);
        assert_eq!(m.tags.as_deref(), Some("created"));
        assert_eq!(
            m.properties.get("event_id").map(String::as_str),
            Some(format!("ev-{i}").as_str()),
            "{m:?}"
        );
        let pair = (m.msg_id.clone(), m.offset_msg_id.clone());
        assert!(
            expected_ids.contains(&pair),
            "(msg_id, offset_msg_id) {pair:?} does not match any SendResult: {expected_ids:?}"
        );
        match i {
            0..=3 => assert_eq!(m.keys, vec![format!("auto-{i}")]),
            4..=6 => {
                assert_eq!(m.keys, vec!["chosen".to_string()]);
                assert_eq!(m.queue_id, CHOSEN_QUEUE);
            }
            _ => {
                assert_eq!(m.keys, vec![hash_key.clone()]);
                assert_eq!(m.queue_id, hash_queue);
            }
        }
    }
    // Per-queue order: the "chosen" messages sit in their queue in send order.
    let chosen: Vec<String> = read
        .iter()
        .filter(|m| m.keys == ["chosen"])
        .map(ReceivedMessage::body_str)
        .collect();
    assert_eq!(
        chosen,
        ["body-4", "body-5", "body-6"],
        "sorted by (queue_id, queue_offset)"
    );

    // Broker down: a send must fail (and say so in a recognisable way).
    mq.stop_broker();
    let failed = send(&host, &producer, message(10, "down"), None).await;
    match &failed {
        Ok(result) => panic!("send succeeded with the broker stopped: {result:?}"),
        Err(e) => println!(
            "send with broker stopped failed: code={} class={} broker_code={:?} display={e}",
            e.descriptor().code().as_str(),
            e.descriptor().class().as_str(),
            e.broker_response_code()
        ),
    }

    // Back up: old messages survive, new sends work and are readable.
    mq.start_broker().expect("restart broker");
    let sent = send(
        &host,
        &producer,
        message(11, "after-restart"),
        Some(CHOSEN_QUEUE),
    )
    .await
    .expect("send after restart");
    assert_ok(&sent);
    let read = reader
        .read_at_least(11, Duration::from_secs(30))
        .await
        .expect("read after restart");
    assert!(read
        .iter()
        .any(|m| m.body_str() == "body-11" && m.queue_id == CHOSEN_QUEUE));
    assert!(
        !read.iter().any(|m| m.body_str() == "body-10"),
        "the failed send must not be stored"
    );
    let mut fresh = TopicReader::new(&mq.namesrv_addr(), TOPIC)
        .await
        .expect("second reader");
    assert_eq!(
        fresh
            .read_at_least(11, Duration::from_secs(30))
            .await
            .expect("fresh read")
            .len(),
        11
    );

    fresh.close().await;
    reader.close().await;
    {
        let mut stopping = producer.clone();
        host.run(async move { stopping.shutdown().await })
            .await
            .unwrap();
    }
    drop(host);
    drop(mq);
    println!("done in {:?}", started.elapsed());
}

/// How each failure the relay must tell apart shows up in `ClientError`.
#[tokio::test]
async fn send_errors_are_classifiable() {
    use outbox_devenv::rocketmq::RocketMqOptions;
    use rocketmq_client_rust::MQClientException;

    let root = tempfile::tempdir().expect("tempdir");
    // Like production: no auto-created topics.
    let mut mq = RocketMq::start_with(
        root.path(),
        RocketMqOptions {
            auto_create_topics: false,
            ..RocketMqOptions::default()
        },
    )
    .expect("start RocketMQ");
    mq.create_topic(TOPIC, 2).expect("create topic");
    let host = ClientHost::new("errors-test").expect("client host");
    let producer = DefaultMQProducer::builder(host.client_runtime())
        .producer_group("outbox_relay_errors_test")
        .name_server_addr(mq.namesrv_addr())
        .send_msg_timeout(1_000)
        .build();
    {
        let mut starting = producer.clone();
        host.run(async move { starting.start().await })
            .await
            .unwrap()
            .expect("start producer");
    }
    let send_to = |topic: &'static str, body: Vec<u8>| {
        let producer = producer.clone();
        host.run(async move {
            producer
                .send(Message::builder().topic(topic).body(body).build_unchecked())
                .await
        })
    };
    let client_code = |e: &ClientError| {
        e.source_ref::<MQClientException>()
            .map(MQClientException::response_code)
    };

    // Unknown topic: validation error whose MQClientException carries 17 (TOPIC_NOT_EXIST).
    let e = send_to("no_such_topic", b"x".to_vec())
        .await
        .unwrap()
        .expect_err("unknown topic");
    assert_eq!(
        e.descriptor().code().as_str(),
        "core.argument.invalid",
        "{e:?}"
    );
    assert_eq!(client_code(&e), Some(17), "{e:?}");

    // Too large for the producer's max_message_size (4 MiB): MQClientException 13 (MESSAGE_ILLEGAL).
    let e = send_to(TOPIC, vec![b'x'; 4 * 1024 * 1024 + 1])
        .await
        .unwrap()
        .expect_err("too large");
    assert_eq!(
        e.descriptor().code().as_str(),
        "core.argument.invalid",
        "{e:?}"
    );
    assert_eq!(client_code(&e), Some(13), "{e:?}");

    // A broker that accepts the connection but never answers: timeout (the message may be stored).
    mq.freeze_broker();
    let e = send_to(TOPIC, b"frozen".to_vec())
        .await
        .unwrap()
        .expect_err("frozen broker");
    mq.thaw_broker();
    assert_eq!(e.descriptor().class().as_str(), "timeout", "{e:?}");
    assert_eq!(
        e.descriptor().code().as_str(),
        "transport.response.timeout",
        "{e:?}"
    );

    // A stopped broker: connection refused, class UNAVAILABLE (nothing was stored).
    mq.stop_broker();
    let e = send_to(TOPIC, b"down".to_vec())
        .await
        .unwrap()
        .expect_err("stopped broker");
    assert_eq!(e.descriptor().class().as_str(), "unavailable", "{e:?}");
    assert_eq!(
        e.descriptor().code().as_str(),
        "transport.connection.failed",
        "{e:?}"
    );

    {
        let mut stopping = producer.clone();
        host.run(async move { stopping.shutdown().await })
            .await
            .unwrap();
    }
}
