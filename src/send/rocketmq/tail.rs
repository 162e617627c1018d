//! Reading back what a topic's queues hold (see [`crate::send::tail`]) with the client's classic
//! pull consumer: per queue, the offset of the bound's time (`search_offset`) and the queue's end
//! (`max_offset`), then pulls from the later of that offset and `per_queue` before the end, up to
//! the end, keeping each message's `event_id` and `biz_key` properties and its `UNIQ_KEY` (the id
//! a send returns).
//!
//! The consumer lives for one read and pulls with explicit offsets: it commits no offset and
//! joins no rebalance that matters (its group subscribes to nothing). Its account needs `Sub` on
//! the topic and on the group `<producer_group>_tail` where ACL is on; the client 1.0's pull
//! consumer cannot use TLS, so over TLS nothing is read (and a takeover sends again what the
//! previous run did not record).

use super::RocketMqSink;
use crate::send::tail::{tail_start, StoredTail, TailBound};
use crate::send::SendError;
#[allow(deprecated)]
use rocketmq_client_rust::DefaultMQPullConsumer;
use rocketmq_client_rust::PullStatus;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_queue::MessageQueue;
use rocketmq_model::common::message::MessageConst;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, UNIX_EPOCH};

/// Messages asked for per pull (the broker may return fewer).
const PULL_BATCH: i32 = 64;
/// The longest one topic's read may take, the consumer's start included: the stream waits for
/// it (every topic's events, not only this one's). A queue not read by then is left out (its
/// stored events are sent again); the queues read are kept. Reads measured 0.1-1.1 s for
/// 3,000-5,000 messages (docs/performance.md, "Takeover").
const READ_DEADLINE: Duration = Duration::from_secs(5);

impl RocketMqSink {
    /// See [`crate::send::Sink::stored_tail`].
    pub(super) async fn read_tail(
        &self,
        topic: &str,
        bound: TailBound,
    ) -> Result<Option<StoredTail>, SendError> {
        let security = self.security();
        if security.tls() {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "over TLS the relay cannot read back what a previous run stored (the \
                     client's pull consumer has no TLS): a takeover sends again the events the \
                     previous leader sent but had not recorded"
                );
            }
            return Ok(None);
        }
        let group = format!("{}_tail", self.config.producer_group);
        #[allow(deprecated)]
        let consumer = security
            .pull_consumer_builder(DefaultMQPullConsumer::builder(self.host.client_runtime()))
            .consumer_group(group)
            .name_server_addr(self.namesrv.clone())
            .consumer_pull_timeout(self.config.send_timeout)
            .broker_suspend_max_time(Duration::from_millis(200))
            .consumer_timeout_when_suspend(Duration::from_secs(1))
            .build()
            .map_err(|e| SendError::Retryable(format!("cannot build a pull consumer: {e}")))?;
        let topic = self.config.in_namespace(topic).into_owned();
        let reading = consumer.clone();
        let read = self
            .host
            .run(async move {
                let deadline = tokio::time::Instant::now() + READ_DEADLINE;
                let started = tokio::time::timeout_at(deadline, reading.start()).await;
                match started {
                    Ok(Ok(())) => read_topic(&reading, &topic, bound, deadline).await,
                    Ok(Err(e)) => Err(SendError::Retryable(format!(
                        "cannot start a pull consumer: {e}"
                    ))),
                    Err(_) => Err(SendError::Retryable(format!(
                        "the pull consumer did not start within {READ_DEADLINE:?}"
                    ))),
                }
            })
            .await
            .map_err(|e| SendError::Retryable(format!("the tail read's task failed: {e}")))?;
        // Its end waits for the consumer's own background requests: not the caller's wait.
        self.host.spawn(async move {
            let _ = consumer.shutdown().await;
        });
        read.map(Some)
    }
}

/// Reads every queue of `topic` within `bound`, all at once. A queue that cannot be read (or not
/// within the deadline) is left out, logged once per broker group: its stored events are sent
/// again. Only a topic whose queues are unknown is an error.
#[allow(deprecated)]
async fn read_topic(
    consumer: &DefaultMQPullConsumer,
    topic: &str,
    bound: TailBound,
    deadline: tokio::time::Instant,
) -> Result<StoredTail, SendError> {
    let queues = tokio::time::timeout_at(deadline, consumer.fetch_subscribe_message_queues(topic))
        .await
        .map_err(|_| SendError::Retryable(format!("no route of {topic} within {READ_DEADLINE:?}")))?
        .map_err(|e| SendError::Retryable(format!("the queues of {topic}: {e}")))?;
    let since_ms = bound
        .since
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    // Every queue at once: a read is mostly round trips, and a broker group that does not
    // answer then costs one timeout, not one per queue, before the stream may start.
    let reads = queues.iter().map(|queue| async move {
        let mut part = StoredTail::default();
        let read = read_queue(consumer, queue, since_ms, bound.per_queue, &mut part);
        let read = match tokio::time::timeout_at(deadline, read).await {
            Ok(read) => read,
            Err(_) => Err(format!("not read within {READ_DEADLINE:?}")),
        };
        (queue, read, part)
    });
    let mut tail = StoredTail::default();
    let mut failed: HashSet<String> = HashSet::new();
    for (queue, read, part) in futures_util::future::join_all(reads).await {
        // What a cut-short read found is stored all the same.
        tail.merge(part);
        match read {
            Ok(capped) => {
                tail.queues += 1;
                tail.capped += usize::from(capped);
            }
            Err(e) => {
                let broker = queue.broker_name().to_string();
                if failed.insert(broker.clone()) {
                    tracing::warn!(%topic, %broker, queue = queue.queue_id(), error = %e,
                        "cannot read back what this broker group's queues hold: events the \
                         previous run stored there but did not record are sent again");
                }
            }
        }
    }
    Ok(tail)
}

/// Reads one queue from its bound to its end into `tail`; whether the bound's count cut it.
#[allow(deprecated)]
async fn read_queue(
    consumer: &DefaultMQPullConsumer,
    queue: &MessageQueue,
    since_ms: u64,
    per_queue: u64,
    tail: &mut StoredTail,
) -> Result<bool, String> {
    let end = consumer.max_offset(queue).await.map_err(|e| e.to_string())?;
    if end <= 0 {
        return Ok(false);
    }
    let since = consumer
        .search_offset(queue, since_ms)
        .await
        .map_err(|e| e.to_string())?;
    let (mut offset, capped) = tail_start(since, end, per_queue);
    while offset < end {
        let result = consumer
            .pull(queue, "*", offset, PULL_BATCH)
            .await
            .map_err(|e| e.to_string())?;
        let next = result.next_begin_offset() as i64;
        match result.pull_status() {
            PullStatus::Found => {
                for message in result.msg_found_list().unwrap_or_default().iter() {
                    let (event_id, biz_key, msg_id) = ids(message);
                    tail.record(event_id, biz_key, msg_id.unwrap_or_default());
                }
            }
            PullStatus::NoNewMsg | PullStatus::NoMatchedMsg | PullStatus::OffsetIllegal => {}
        }
        if next <= offset {
            break; // nothing further the broker would hand out
        }
        offset = next;
    }
    Ok(capped)
}

/// A stored message's `event_id` and `biz_key` properties and its `UNIQ_KEY`.
fn ids(message: &MessageExt) -> (Option<String>, Option<String>, Option<String>) {
    let mut found = (None, None, None);
    for (name, value) in message.properties() {
        let value = Some(value.to_string());
        match name.as_str() {
            "event_id" => found.0 = value,
            "biz_key" => found.1 = value,
            MessageConst::PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX => found.2 = value,
            _ => {}
        }
    }
    found
}
