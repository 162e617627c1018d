//! Reads back everything that reached a RocketMQ topic, for tests.
//!
//! Guarantees:
//! - Every message stored in any queue of the topic is returned exactly once per reader, from
//!   offset 0 of each queue (nothing is skipped, nothing committed to the broker: each reader
//!   keeps its own offsets in memory, so two readers each see the whole topic).
//! - Within a queue, messages come back in queue-offset order; results are sorted by
//!   `(broker_name, queue_id, queue_offset)`, which is what per-key order checks need. Queues
//!   are told apart by broker group too: in a cluster each group has its own queues `0..n`.
//! - Duplicates the broker stored (a resend) come back as separate messages with their own queue
//!   offsets, so tests can count them.
//!
//! It uses the client's classic pull consumer with explicit queue + offset pulls, so there is no
//! consumer-group offset and no start-position race as with a push consumer. (In 1.0 the classic
//! facade still subscribes and runs background pulls of its own; they only cost a little CPU and,
//! while the broker is down or at `close()`, log `Pull error` lines at ERROR level.)

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
#[allow(deprecated)]
use rocketmq_client_rust::DefaultMQPullConsumer;
use rocketmq_client_rust::PullStatus;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::{MessageConst, STRING_HASH_SET};

use super::rocketmq::{AclAccount, ClientHost};
use rocketmq_outbox_consumer::rocketmq_client::ClientSecurity;

/// Messages pulled per request.
const PULL_BATCH: i32 = 64;
/// Pause between polling rounds that found nothing new.
const IDLE_POLL: Duration = Duration::from_millis(50);

/// One stored message, as a consumer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMessage {
    pub topic: String,
    /// The broker group (`brokerName`) whose queue holds it: in a cluster each group has queues
    /// `0..n` of its own.
    pub broker_name: String,
    pub queue_id: i32,
    /// Position in its queue (0, 1, 2, ...): per-key order is `queue_offset` order.
    pub queue_offset: i64,
    /// The producer-side unique id (property `UNIQ_KEY`): equals `SendResult::msg_id`. Empty if
    /// the producer did not set one.
    pub msg_id: String,
    /// The broker's id (store host + commit-log offset): equals `SendResult::offset_msg_id`.
    pub offset_msg_id: String,
    /// `KEYS`, split on spaces (RocketMQ's key separator).
    pub keys: Vec<String>,
    pub tags: Option<String>,
    /// Its RocketMQ 5 message group (`__SHARDINGKEY`): what a FIFO consumer group orders by.
    pub message_group: Option<String>,
    /// User properties only (system properties such as `KEYS`, `TAGS`, `UNIQ_KEY` are left out).
    pub properties: BTreeMap<String, String>,
    pub body: Vec<u8>,
    pub store_timestamp: i64,
}

impl ReceivedMessage {
    fn from_ext(broker_name: &str, message: &MessageExt) -> Self {
        let all = message.properties();
        let get = |name: &str| {
            all.iter()
                .find(|(k, _)| k.as_str() == name)
                .map(|(_, v)| v.to_string())
        };
        let properties = all
            .iter()
            .filter(|(k, _)| !STRING_HASH_SET.contains(k.as_str()))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self {
            topic: message.topic().to_string(),
            broker_name: broker_name.to_string(),
            queue_id: message.queue_id(),
            queue_offset: message.queue_offset(),
            msg_id: get(MessageConst::PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX).unwrap_or_default(),
            offset_msg_id: message.msg_id().to_string(),
            keys: get(MessageConst::PROPERTY_KEYS)
                .map(|k| {
                    k.split(' ')
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
            tags: get(MessageConst::PROPERTY_TAGS),
            message_group: get(MessageConst::PROPERTY_SHARDING_KEY),
            properties,
            body: message.body().map(|b| b.to_vec()).unwrap_or_default(),
            store_timestamp: message.store_timestamp(),
        }
    }

    /// The body as UTF-8 (lossy), for assertions and messages.
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Reads a topic from the beginning; see the module docs for the guarantees.
#[allow(deprecated)]
pub struct TopicReader {
    host: ClientHost,
    consumer: DefaultMQPullConsumer,
    topic: String,
    /// Next offset to pull, per queue (broker group, queue id).
    next_offsets: HashMap<(String, i32), i64>,
    received: Vec<ReceivedMessage>,
    last_error: Option<String>,
}

impl TopicReader {
    /// Starts a reader of `topic` through the namesrv at `namesrv_addr` (`host:port`).
    /// The topic does not have to exist yet.
    pub async fn new(namesrv_addr: &str, topic: &str) -> Result<Self> {
        Self::with_credentials(namesrv_addr, topic, None).await
    }

    /// [`Self::new`] on a cluster with ACL on: pulls signed as `account` (which needs `Sub` on
    /// the topic and on the reader's own group, or to be a super user).
    pub async fn with_credentials(
        namesrv_addr: &str,
        topic: &str,
        account: Option<AclAccount>,
    ) -> Result<Self> {
        let security = account.as_ref().map(AclAccount::security);
        Self::with_security(namesrv_addr, topic, security.unwrap_or_default()).await
    }

    /// [`Self::new`] with requests signed as `security`'s account. Not over TLS: the classic
    /// pull consumer of client 1.0 cannot (its builder turns TLS off), so a TLS `security` is an
    /// error; read a TLS cluster with `mqadmin` or a push consumer instead.
    #[allow(deprecated)]
    pub async fn with_security(
        namesrv_addr: &str,
        topic: &str,
        security: ClientSecurity,
    ) -> Result<Self> {
        if security.tls() {
            bail!("TopicReader cannot use TLS (the client's classic pull consumer turns it off)");
        }
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let host = ClientHost::new("topic-reader")?;
        let group = format!(
            "outbox_relay_reader_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let builder =
            security.pull_consumer_builder(DefaultMQPullConsumer::builder(host.client_runtime()));
        let consumer = builder
            .consumer_group(group)
            .name_server_addr(namesrv_addr.to_string())
            .consumer_pull_timeout(Duration::from_secs(5))
            // The classic pull facade also subscribes and rebalances, and its background pull
            // tasks long-poll the broker; shutdown waits for an in-flight long poll, so keep it
            // short (the default 20 s made every close() take up to 20 s).
            .broker_suspend_max_time(Duration::from_millis(500))
            .consumer_timeout_when_suspend(Duration::from_secs(2))
            .build()
            .map_err(|e| anyhow::anyhow!("cannot build the pull consumer: {e}"))?;
        let starting = consumer.clone();
        host.run(async move { starting.start().await })
            .await?
            .map_err(|e| {
                anyhow::anyhow!("cannot start the pull consumer (namesrv {namesrv_addr}): {e}")
            })?;
        Ok(Self {
            host,
            consumer,
            topic: topic.to_string(),
            next_offsets: HashMap::new(),
            received: Vec::new(),
            last_error: None,
        })
    }

    /// Everything read so far, sorted by `(broker_name, queue_id, queue_offset)`.
    pub fn received(&self) -> &[ReceivedMessage] {
        &self.received
    }

    /// Reads until at least `n` messages have arrived in total (since the beginning of the topic)
    /// and returns all of them; fails after `timeout` with the count and the last pull error.
    pub async fn read_at_least(
        &mut self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<ReceivedMessage>> {
        let deadline = Instant::now() + timeout;
        loop {
            let new = self.poll_once().await?;
            if self.received.len() >= n {
                return Ok(self.received.clone());
            }
            if Instant::now() >= deadline {
                bail!(
                    "topic {}: only {} of {n} messages arrived within {timeout:?} (last pull error: {})",
                    self.topic,
                    self.received.len(),
                    self.last_error.as_deref().unwrap_or("none")
                );
            }
            if new == 0 {
                tokio::time::sleep(IDLE_POLL).await;
            }
        }
    }

    /// Reads until nothing new has arrived for `quiet_period`, then returns everything read so
    /// far. Use it to prove that *no more* messages (e.g. no duplicates) arrive.
    pub async fn read_all_for(&mut self, quiet_period: Duration) -> Result<Vec<ReceivedMessage>> {
        let mut quiet_since = Instant::now();
        loop {
            if self.poll_once().await? > 0 {
                quiet_since = Instant::now();
            } else if quiet_since.elapsed() >= quiet_period {
                return Ok(self.received.clone());
            } else {
                tokio::time::sleep(IDLE_POLL).await;
            }
        }
    }

    /// How many messages the broker holds in the topic: the sum of every queue's max offset
    /// (one request per queue, no message read). Cheap enough to poll while a system drains.
    pub async fn stored_count(&self) -> Result<u64> {
        let consumer = self.consumer.clone();
        let topic = self.topic.clone();
        self.host
            .run(async move {
                let queues = consumer
                    .fetch_subscribe_message_queues(&topic)
                    .await
                    .map_err(|e| anyhow::anyhow!("fetch queues of {topic}: {e}"))?;
                let mut total = 0u64;
                for queue in &queues {
                    let max = consumer.max_offset(queue).await.map_err(|e| {
                        anyhow::anyhow!("max offset of {topic}/{}: {e}", queue.queue_id())
                    })?;
                    total += max.max(0) as u64;
                }
                Ok(total)
            })
            .await
            .context("topic reader task failed")?
    }

    /// Stops the consumer and its client runtime.
    pub async fn close(self) {
        let consumer = self.consumer.clone();
        let _ = self
            .host
            .run(async move { consumer.shutdown().await })
            .await;
    }

    /// One round over every queue of the topic, returning only what arrived since the last read
    /// and *not* keeping it ([`Self::received`] leaves it out): for following a long stream
    /// without holding it. A route or pull error that ended a round which found nothing is an
    /// error (the topic may not exist yet); after messages, it is only remembered.
    pub async fn read_new(&mut self) -> Result<Vec<ReceivedMessage>> {
        let (found, error) = self.pull_new().await?;
        match error {
            Some(e) if found.is_empty() => bail!(e),
            Some(e) => {
                self.last_error = Some(e);
                Ok(found)
            }
            None => Ok(found),
        }
    }

    /// One round over every queue of the topic, pulling each until it has nothing new: the new
    /// messages and the route/pull error that ended the round early, if any.
    async fn pull_new(&mut self) -> Result<(Vec<ReceivedMessage>, Option<String>)> {
        let consumer = self.consumer.clone();
        let topic = self.topic.clone();
        let mut offsets = self.next_offsets.clone();
        let (found, offsets, error) = self
            .host
            .run(async move {
                let mut found = Vec::new();
                let error = pull_all_queues(&consumer, &topic, &mut offsets, &mut found)
                    .await
                    .err();
                (found, offsets, error)
            })
            .await
            .context("topic reader task failed")?;
        self.next_offsets = offsets;
        Ok((found, error))
    }

    /// One round over every queue of the topic, pulling each until it has nothing new.
    /// Returns how many new messages arrived. Route/pull errors are remembered, not fatal: the
    /// topic may not exist yet, or the broker may be restarting.
    async fn poll_once(&mut self) -> Result<usize> {
        let (found, error) = self.pull_new().await?;
        if let Some(e) = error {
            self.last_error = Some(e);
        }
        let new = found.len();
        if new > 0 {
            self.received.extend(found);
            self.received.sort_by(|a, b| {
                (&a.broker_name, a.queue_id, a.queue_offset).cmp(&(
                    &b.broker_name,
                    b.queue_id,
                    b.queue_offset,
                ))
            });
        }
        Ok(new)
    }
}

#[allow(deprecated)]
async fn pull_all_queues(
    consumer: &DefaultMQPullConsumer,
    topic: &str,
    offsets: &mut HashMap<(String, i32), i64>,
    found: &mut Vec<ReceivedMessage>,
) -> std::result::Result<(), String> {
    let queues = consumer
        .fetch_subscribe_message_queues(topic)
        .await
        .map_err(|e| format!("fetch queues of {topic}: {e}"))?;
    for queue in queues {
        let broker = queue.broker_name().to_string();
        let offset = offsets
            .entry((broker.clone(), queue.queue_id()))
            .or_insert(0);
        loop {
            let result = consumer
                .pull(&queue, "*", *offset, PULL_BATCH)
                .await
                .map_err(|e| format!("pull {topic}/{} at {}: {e}", queue.queue_id(), *offset))?;
            let next = result.next_begin_offset() as i64;
            match result.pull_status() {
                PullStatus::Found => {
                    found.extend(
                        result
                            .msg_found_list()
                            .unwrap_or_default()
                            .iter()
                            .map(|m| ReceivedMessage::from_ext(&broker, m)),
                    );
                    *offset = next;
                }
                // Nothing at or after this offset yet.
                PullStatus::NoNewMsg | PullStatus::NoMatchedMsg => {
                    *offset = (*offset).max(next);
                    break;
                }
                // Below the queue's minimum (files cleaned) or past its end: jump to where the
                // broker says the data is.
                PullStatus::OffsetIllegal => {
                    if next == *offset {
                        break;
                    }
                    *offset = next;
                }
            }
        }
    }
    Ok(())
}
