//! The broker ceiling: the same messages sent by the RocketMQ Rust client alone
//! (`DefaultMQProducer`, as `src/send/rocketmq.rs` uses it), no database and no relay.

use futures_util::future::join_all;
use rocketmq_client_rust::{DefaultMQProducer, SendStatus};
use rocketmq_model::common::message::message_queue::MessageQueue;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_model::common::message::MessageTrait;
use rocketmq_outbox::rocketmq_client::ClientHost;
use rocketmq_outbox::route::{index_for, java_string_hash};
use std::sync::Arc;
use std::time::Instant;

/// One message as the relay would send it: topic, biz_key, event_id, JSON body.
#[derive(Clone)]
pub struct Sample {
    pub key: String,
    pub event_id: String,
    pub body: Arc<String>,
}

/// Results of the three client-alone runs.
#[derive(Debug, Clone, Default)]
pub struct Ceiling {
    pub single_count: usize,
    pub single_rate: f64,
    pub single_p50_ms: f64,
    pub single_p99_ms: f64,
    /// This process's CPU per single send (the client's whole cost of one request and its
    /// answer: what the relay pays per send on top of its own work).
    pub single_cpu_us: f64,
    pub batch_count: usize,
    /// Batches of 100 (same queue), one batch in flight.
    pub batch_rate: f64,
    /// Batches of 100, one stream per queue in parallel (as the relay's shards do).
    pub batch_parallel_rate: f64,
    /// Batches the broker refused (busy) and that were sent again.
    pub refused: u32,
}

/// The message `src/send/rocketmq.rs::build_message` builds for an event without tags/headers.
fn build(topic: &str, s: &Sample) -> Message {
    let mut message = Message::builder()
        .topic(topic)
        .body(s.body.as_bytes().to_vec())
        .keys(vec![s.event_id.clone(), s.key.clone()])
        .build()
        .expect("valid message");
    for (name, value) in [("event_id", &s.event_id), ("biz_key", &s.key)] {
        message
            .put_user_property(name.to_string().into(), value.to_string().into())
            .expect("user property");
    }
    message
}

fn check(status: SendStatus) {
    assert_eq!(status, SendStatus::SendOk, "the broker answered {status:?}");
}

/// Sends `chunk` as one batch; a refused batch (the broker sheds load with SYSTEM_BUSY when its
/// send queue waits over 200 ms, which a loaded 2-core machine reaches) is sent again after
/// 10 ms, as the relay would. Returns how many attempts were refused.
async fn send_batch(
    producer: &DefaultMQProducer,
    topic: &str,
    chunk: &[&Sample],
    queue: &MessageQueue,
) -> u32 {
    let mut refused = 0;
    loop {
        let batch = chunk.iter().map(|s| build(topic, s)).collect();
        match producer.send_batch_to_queue(batch, queue.clone()).await {
            Ok(r) => {
                check(r.send_status);
                return refused;
            }
            Err(e) => {
                refused += 1;
                assert!(refused < 100, "batch send keeps failing: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
}

/// `singles` synchronous single sends, then every sample in batches of 100 (sequential, then one
/// stream per queue), to `topic` (created beforehand with its queues).
pub async fn measure(namesrv: &str, topic: &str, samples: Vec<Sample>, singles: usize) -> Ceiling {
    let host = ClientHost::new("bench-ceiling").expect("client runtime");
    let producer = DefaultMQProducer::builder(host.client_runtime())
        .producer_group(format!("bench_ceiling_{}", std::process::id()).as_str())
        .name_server_addr(namesrv)
        .send_msg_timeout(3000)
        .build();
    let topic = topic.to_string();
    let result = host
        .run(async move {
            let mut producer = producer;
            producer.start().await.expect("producer starts");
            let queues: Vec<MessageQueue> = producer
                .fetch_publish_message_queues(&topic)
                .await
                .expect("route");
            let queue_of =
                |s: &Sample| queues[index_for(java_string_hash(&s.key), queues.len())].clone();
            let mut ceiling = Ceiling::default();

            // Warm-up: connections and route.
            for s in samples.iter().take(50) {
                let r = producer.send_to_queue(build(&topic, s), queue_of(s)).await;
                check(r.expect("send").expect("result").send_status);
            }

            // 1. Synchronous single sends, one at a time.
            let singles = singles.min(samples.len());
            let mut latencies = Vec::with_capacity(singles);
            let cpu_before = crate::procs::cpu_seconds(std::process::id());
            let began = Instant::now();
            for s in &samples[..singles] {
                let sent = Instant::now();
                let r = producer.send_to_queue(build(&topic, s), queue_of(s)).await;
                latencies.push(sent.elapsed().as_secs_f64() * 1000.0);
                check(r.expect("send").expect("result").send_status);
            }
            ceiling.single_count = singles;
            ceiling.single_rate = singles as f64 / began.elapsed().as_secs_f64();
            ceiling.single_cpu_us =
                (crate::procs::cpu_seconds(std::process::id()) - cpu_before) * 1e6 / singles as f64;
            latencies.sort_by(f64::total_cmp);
            ceiling.single_p50_ms = latencies[latencies.len() / 2];
            ceiling.single_p99_ms =
                latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];

            // 2. Batches of 100 messages of one queue (the relay batches per queue too).
            let mut per_queue: Vec<Vec<&Sample>> = vec![Vec::new(); queues.len()];
            for s in &samples {
                per_queue[index_for(java_string_hash(&s.key), queues.len())].push(s);
            }
            let began = Instant::now();
            for (q, group) in per_queue.iter().enumerate() {
                for chunk in group.chunks(100) {
                    ceiling.refused += send_batch(&producer, &topic, chunk, &queues[q]).await;
                }
            }
            ceiling.batch_count = samples.len();
            ceiling.batch_rate = samples.len() as f64 / began.elapsed().as_secs_f64();

            // 3. The same, one stream per queue at once.
            let began = Instant::now();
            let streams = per_queue.iter().enumerate().map(|(q, group)| {
                let (producer, queue, topic) = (producer.clone(), queues[q].clone(), &topic);
                async move {
                    let mut refused = 0;
                    for chunk in group.chunks(100) {
                        refused += send_batch(&producer, topic, chunk, &queue).await;
                    }
                    refused
                }
            });
            ceiling.refused += join_all(streams).await.into_iter().sum::<u32>();
            ceiling.batch_parallel_rate = samples.len() as f64 / began.elapsed().as_secs_f64();
            producer.shutdown().await;
            ceiling
        })
        .await
        .expect("ceiling task");
    host.shutdown().await;
    result
}
