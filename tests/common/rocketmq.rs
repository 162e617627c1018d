//! Broker fixtures for consumer tests: one real RocketMQ per test binary, a topic per test, and
//! a producer that publishes messages the way the relay does (the message contract).

use outbox_devenv::{scratch_dir, ClientHost, RocketMq, RocketMqOptions};
use rocketmq_client_rust::{DefaultMQProducer, SendResult, SendStatus};
use rocketmq_model::common::message::message_queue::MessageQueue;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_model::common::message::MessageTrait;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// Queues of every test topic.
pub const TEST_QUEUES: u32 = 4;

/// The binary's RocketMQ (namesrv + broker). Tests must not stop it.
pub fn rocketmq() -> &'static RocketMq {
    static SERVER: OnceLock<RocketMq> = OnceLock::new();
    SERVER.get_or_init(|| {
        if let Some(shared) = outbox_devenv::shared::rocketmq() {
            return shared;
        }
        let dir = scratch_dir("rocketmq").expect("scratch dir");
        // Like a production broker: sending to a topic nobody created fails.
        let options = RocketMqOptions {
            auto_create_topics: false,
            ..RocketMqOptions::default()
        };
        RocketMq::start_with(&dir, options).expect("RocketMQ must start (run scripts/setup.sh)")
    })
}

/// A new topic `<prefix>_<pid>_<n>` with [`TEST_QUEUES`] queues on the binary's broker.
pub fn new_topic(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let topic = format!(
        "{prefix}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    rocketmq()
        .create_topic(&topic, TEST_QUEUES)
        .expect("create topic");
    topic
}

/// One message as the relay publishes an outbox row.
#[derive(Debug, Clone, Default)]
pub struct ContractMessage {
    pub topic: String,
    pub event_id: Option<String>,
    pub biz_key: Option<String>,
    pub tags: Option<String>,
    pub headers: BTreeMap<String, String>,
    pub payload: Vec<u8>,
}

impl ContractMessage {
    /// An event with an id and a business key, as every outbox row has.
    pub fn event(topic: &str, event_id: &str, biz_key: &str, payload: serde_json::Value) -> Self {
        Self {
            topic: topic.to_string(),
            event_id: Some(event_id.to_string()),
            biz_key: Some(biz_key.to_string()),
            payload: payload.to_string().into_bytes(),
            ..Self::default()
        }
    }

    /// KEYS = event_id and biz_key; user properties event_id, biz_key and the headers; tags.
    fn to_message(&self) -> Message {
        let keys: Vec<String> = self
            .event_id
            .iter()
            .chain(self.biz_key.iter())
            .cloned()
            .collect();
        let mut builder = Message::builder()
            .topic(self.topic.as_str())
            .keys(keys)
            .body_slice(&self.payload);
        if let Some(tags) = &self.tags {
            builder = builder.tags(tags.as_str());
        }
        let mut message = builder.build_unchecked();
        let properties = self
            .event_id
            .iter()
            .map(|v| ("event_id", v))
            .chain(self.biz_key.iter().map(|v| ("biz_key", v)))
            .chain(self.headers.iter().map(|(k, v)| (k.as_str(), v)));
        for (name, value) in properties {
            message
                .put_user_property(name.to_string().into(), value.clone().into())
                .expect("not a system property");
        }
        message
    }
}

/// A started producer on its own client runtime.
pub struct TestProducer {
    host: ClientHost,
    producer: DefaultMQProducer,
}

impl TestProducer {
    pub async fn start() -> Self {
        Self::start_on(&rocketmq().namesrv_addr()).await
    }

    /// A producer of the cluster of name server `namesrv`.
    pub async fn start_on(namesrv: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let host = ClientHost::new("test-producer").expect("client host");
        let producer = DefaultMQProducer::builder(host.client_runtime())
            .producer_group(format!(
                "test_producer_{}_{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ))
            .name_server_addr(namesrv)
            .send_msg_timeout(3_000)
            .build();
        let mut starting = producer.clone();
        host.run(async move { starting.start().await })
            .await
            .expect("client task")
            .expect("start producer");
        Self { host, producer }
    }

    /// Sends `message` (to queue `queue` if given) and asserts `SEND_OK`.
    pub async fn send(&self, message: &ContractMessage, queue: Option<i32>) -> SendResult {
        let (producer, topic, message) = (
            self.producer.clone(),
            message.topic.clone(),
            message.to_message(),
        );
        let sent = self
            .host
            .run(async move {
                match queue {
                    None => producer.send(message).await,
                    Some(queue) => {
                        let broker = outbox_devenv::rocketmq::BROKER_NAME;
                        let mq = MessageQueue::from_parts(topic, broker, queue);
                        producer.send_to_queue(message, mq).await
                    }
                }
            })
            .await
            .expect("client task")
            .expect("send")
            .expect("a synchronous send returns a SendResult");
        assert_eq!(sent.send_status, SendStatus::SendOk, "{sent:?}");
        sent
    }

    pub async fn shutdown(self) {
        let mut producer = self.producer;
        self.host
            .run(async move { producer.shutdown().await })
            .await
            .expect("client task");
    }
}
