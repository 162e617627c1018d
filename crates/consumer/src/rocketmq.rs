//! [`IdempotentPushConsumer`]: a `rocketmq-client-rust` push consumer whose listener runs every
//! delivered message through an [`IdempotentProcessor`].
//!
//! # Threading model (why this cannot deadlock)
//!
//! The client (1.0) calls a listener synchronously, on a thread of the Tokio *blocking pool* of
//! the client's own runtime (`spawn_blocking` via its "metadata-io" lane: at most
//! `2 × parallelism` listener calls at once, a call may queue for 5 s and run for 30 s before the
//! client gives up on it and treats the delivery as failed). Database work is async, so the
//! listener:
//!
//! 1. spawns the processing of its batch as a task on the *application's* multi-thread Tokio
//!    runtime (the one [`IdempotentPushConsumer::start`] was awaited on; the `mysql_async` pool
//!    lives there), then
//! 2. blocks its own blocking-pool thread on a `std::sync::mpsc` channel until the task reports.
//!
//! No async worker thread is ever blocked: the waiting thread is a blocking-pool thread of the
//! client runtime, and the task runs on the application runtime's workers, which never wait for
//! the listener. A current-thread application runtime is refused at start: its only thread could
//! be the one that waits (e.g. while shutting the consumer down), and then nothing would run the
//! task. If the task panics or the application runtime is gone, the channel closes and the batch
//! is answered "retry", never "success".
//!
//! Handlers are bounded by the processor's timeout (20 s by default), below the client's 30 s,
//! so a slow handler is rolled back before the client gives up and redelivers.
//!
//! # Status mapping
//!
//! - Concurrent listener: every message ACKable → `ConsumeSuccess`; else `ReconsumeLater` for the
//!   batch (the client sends it back through `%RETRY%<group>`, delayed by the broker's delay
//!   levels: 10 s, 30 s, 1 min, ... for the 1st, 2nd, 3rd retry; after `max_reconsume_times`,
//!   16 by default, the broker moves it to `%DLQ%<group>`). Messages of the batch that were
//!   processed are dedup hits on redelivery.
//! - Orderly listener: messages are processed in order and processing stops at the first retry,
//!   which answers `SuspendCurrentQueueAMoment` (the queue pauses for `suspend_millis`, then the
//!   same messages come again). Rejected events are ACKed, so a poison event never blocks its
//!   queue.

use super::event::ConsumedEvent;
use super::idempotent::{Disposition, IdempotentProcessor};
use super::Handler;
use crate::rocketmq_client::{namespace, ClientHost, ClientSecurity};
use rocketmq_client_rust::{
    ClientResult, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus, ConsumeOrderlyContext,
    ConsumeOrderlyStatus, DefaultMQPushConsumer, MQPushConsumer,
};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::{MessageConst, STRING_HASH_SET};
use std::sync::{mpsc, Arc};
use tokio::runtime::{Handle, RuntimeFlavor};

/// How long [`IdempotentPushConsumer::shutdown`] lets in-flight deliveries finish.
const SHUTDOWN_GRACE_MILLIS: u64 = 5_000;

/// Which listener the consumer registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerMode {
    /// Queues are consumed in parallel; a failed message is retried later via the retry topic.
    Concurrent,
    /// Each queue is consumed in order (per-`biz_key` order); a failed message pauses its queue.
    Orderly,
}

/// Where the consumer connects and how it consumes. The consumer group is the processor's.
#[derive(Debug, Clone)]
pub struct PushConsumerOptions {
    /// `host:port` of the namesrv.
    pub namesrv_addr: String,
    pub topic: String,
    /// Subscription expression on tags, `*` for all.
    pub expression: String,
    pub mode: ListenerMode,
    /// A group with no stored offset starts at the first message (true) or only gets new ones.
    pub from_first_offset: bool,
    /// Concurrent mode: redeliveries before the broker moves a message to the DLQ (client
    /// default 16 when `None`).
    pub max_reconsume_times: Option<i32>,
    /// Orderly mode: how long a queue pauses before a failed message is retried.
    pub suspend_millis: u64,
    /// The ACL account the consumer signs its requests with, and TLS (none and off by default);
    /// `ClientSecurity::from_config(&config.rocketmq)` takes the relay's.
    pub security: ClientSecurity,
    /// The namespace of the topic and the group (`rocketmq.namespace`, see
    /// [`crate::rocketmq_client::namespace`]); events are handed over with the topic's name
    /// without it. None by default.
    pub namespace: Option<String>,
}

impl PushConsumerOptions {
    /// Concurrent consumption of every tag of `topic`, starting at the first message.
    pub fn new(namesrv_addr: impl Into<String>, topic: impl Into<String>) -> Self {
        Self {
            namesrv_addr: namesrv_addr.into(),
            topic: topic.into(),
            expression: "*".into(),
            mode: ListenerMode::Concurrent,
            from_first_offset: true,
            max_reconsume_times: None,
            suspend_millis: 1_000,
            security: ClientSecurity::default(),
            namespace: None,
        }
    }

    /// The same, signed with `security`'s account and over TLS if it says so.
    pub fn with_security(mut self, security: ClientSecurity) -> Self {
        self.security = security;
        self
    }

    /// The same, with the topic and the group in `namespace` (none: outside any).
    pub fn with_namespace(mut self, namespace: Option<String>) -> Self {
        self.namespace = namespace;
        self
    }
}

/// Why the consumer did not start.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerStartError {
    #[error(
        "IdempotentPushConsumer::start must be awaited on a multi-thread Tokio runtime (the \
         listener waits for database work scheduled there); {0}"
    )]
    Runtime(&'static str),
    #[error("cannot {action} the RocketMQ push consumer (group {group}, topic {topic}): {detail}")]
    Client {
        action: &'static str,
        group: String,
        topic: String,
        detail: String,
    },
}

/// A running push consumer; see the module docs. Stop it with [`Self::shutdown`].
pub struct IdempotentPushConsumer {
    host: Arc<ClientHost>,
    consumer: DefaultMQPushConsumer,
    group: String,
    topic: String,
}

impl IdempotentPushConsumer {
    /// Subscribes to `options.topic` as the processor's consumer group and starts consuming.
    pub async fn start<H: Handler>(
        host: Arc<ClientHost>,
        options: PushConsumerOptions,
        processor: Arc<IdempotentProcessor<H>>,
    ) -> Result<Self, ConsumerStartError> {
        let app = Handle::try_current()
            .map_err(|_| ConsumerStartError::Runtime("there is no current runtime"))?;
        if app.runtime_flavor() != RuntimeFlavor::MultiThread {
            return Err(ConsumerStartError::Runtime(
                "the current runtime is not multi-thread",
            ));
        }
        let group = processor.group().to_string();
        let topic = options.topic.clone();
        let client_error = |action: &'static str, detail: String| ConsumerStartError::Client {
            action,
            group: group.clone(),
            topic: topic.clone(),
            detail,
        };
        let namespace = options.namespace.clone();
        let builder = DefaultMQPushConsumer::builder(host.client_runtime());
        let mut builder = options
            .security
            .push_consumer_builder(builder)
            .consumer_group(namespace::inside(namespace.as_deref(), &group).into_owned())
            .name_server_addr(options.namesrv_addr.clone())
            .consume_message_batch_max_size(1)
            // Let in-flight deliveries finish (and their offsets be committed) on shutdown; the
            // client's default, 0 ms, aborts them, which only costs redeliveries (dedup hits).
            .await_termination_millis_when_shutdown(SHUTDOWN_GRACE_MILLIS)
            .suspend_current_queue_time_millis(options.suspend_millis)
            .consume_from_where(if options.from_first_offset {
                ConsumeFromWhere::ConsumeFromFirstOffset
            } else {
                ConsumeFromWhere::ConsumeFromLastOffset
            });
        if let Some(times) = options.max_reconsume_times {
            builder = builder.max_reconsume_times(times);
        }
        let mut consumer = builder.build();
        match options.mode {
            ListenerMode::Concurrent => consumer.register_message_listener_concurrently(
                concurrent_listener(app, Arc::clone(&processor), namespace.clone()),
            ),
            ListenerMode::Orderly => consumer.register_message_listener_orderly(orderly_listener(
                app,
                processor,
                options.suspend_millis,
                namespace.clone(),
            )),
        }
        let sub_topic = namespace::inside(namespace.as_deref(), &options.topic).into_owned();
        let expression = options.expression.clone();
        let (consumer, started) = host
            .run(async move {
                let mut consumer = consumer;
                let started = match consumer.subscribe(sub_topic, expression).await {
                    Ok(()) => consumer.start().await.map_err(|e| ("start", e.to_string())),
                    Err(e) => Err(("subscribe", e.to_string())),
                };
                if started.is_err() {
                    consumer.shutdown().await;
                }
                (consumer, started)
            })
            .await
            .map_err(|e| client_error("start", e.to_string()))?;
        started.map_err(|(action, detail)| client_error(action, detail))?;
        Ok(Self {
            host,
            consumer,
            group,
            topic,
        })
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Stops pulling, lets in-flight deliveries finish (up to 5 s) and persists the offsets. A
    /// delivery cut short is not ACKed and comes again (a dedup hit if it had committed).
    pub async fn shutdown(self) {
        let mut consumer = self.consumer;
        if let Err(e) = self
            .host
            .run(async move { consumer.shutdown().await })
            .await
        {
            tracing::warn!(group = %self.group, "consumer shutdown task failed: {e}");
        }
    }
}

impl std::fmt::Debug for IdempotentPushConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotentPushConsumer")
            .field("group", &self.group)
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

fn concurrent_listener<H: Handler>(
    app: Handle,
    processor: Arc<IdempotentProcessor<H>>,
    namespace: Option<String>,
) -> impl Fn(&[&MessageExt], &ConsumeConcurrentlyContext) -> ClientResult<ConsumeConcurrentlyStatus>
       + Send
       + Sync
       + 'static {
    move |messages, _context| {
        let all_ack = process_batch(&app, &processor, messages, namespace.as_deref(), false)
            .iter()
            .all(Disposition::is_ack);
        Ok(if all_ack {
            ConsumeConcurrentlyStatus::ConsumeSuccess
        } else {
            ConsumeConcurrentlyStatus::ReconsumeLater
        })
    }
}

fn orderly_listener<H: Handler>(
    app: Handle,
    processor: Arc<IdempotentProcessor<H>>,
    suspend_millis: u64,
    namespace: Option<String>,
) -> impl Fn(&[&MessageExt], &mut ConsumeOrderlyContext) -> ClientResult<ConsumeOrderlyStatus>
       + Send
       + Sync
       + 'static {
    move |messages, context| {
        let dispositions = process_batch(&app, &processor, messages, namespace.as_deref(), true);
        if dispositions.len() == messages.len() && dispositions.iter().all(Disposition::is_ack) {
            Ok(ConsumeOrderlyStatus::Success)
        } else {
            context.set_suspend_current_queue_time_millis(
                i64::try_from(suspend_millis).unwrap_or(i64::MAX),
            );
            Ok(ConsumeOrderlyStatus::SuspendCurrentQueueAMoment)
        }
    }
}

/// Runs `messages` (topic names without `namespace`) through the processor on the application
/// runtime and waits (on this blocking-pool thread) for the dispositions. With `stop_at_retry`, processing stops after the
/// first retry (orderly). If the task cannot report, every message counts as a retry.
fn process_batch<H: Handler>(
    app: &Handle,
    processor: &Arc<IdempotentProcessor<H>>,
    messages: &[&MessageExt],
    namespace: Option<&str>,
    stop_at_retry: bool,
) -> Vec<Disposition> {
    let decode_outside = |m: &&MessageExt| {
        let mut event = decode(m);
        event.topic = namespace::outside(namespace, &event.topic);
        event
    };
    let events: Vec<ConsumedEvent> = messages.iter().map(decode_outside).collect();
    let count = events.len();
    let (report, outcome) = mpsc::channel();
    let processor = Arc::clone(processor);
    drop(app.spawn(async move {
        let mut dispositions = Vec::with_capacity(events.len());
        for event in &events {
            let disposition = processor.process(event).await;
            let stop = stop_at_retry && !disposition.is_ack();
            dispositions.push(disposition);
            if stop {
                break;
            }
        }
        let _ = report.send(dispositions);
    }));
    outcome.recv().unwrap_or_else(|_| {
        let reason = "the processing task did not report (panicked, or the application runtime \
                      shut down)";
        tracing::error!("{reason}; answering retry for {count} message(s)");
        vec![
            Disposition::Retry {
                reason: reason.into()
            };
            count
        ]
    })
}

/// A delivered message as a [`ConsumedEvent`] (see [`super::event`] for the contract).
pub fn decode(message: &MessageExt) -> ConsumedEvent {
    let all = message.properties();
    let system = |name: &str| {
        all.iter()
            .find(|(k, _)| k.as_str() == name)
            .map(|(_, v)| v.to_string())
    };
    let mut event = ConsumedEvent::new(
        message.topic().to_string(),
        message.body().map(|b| b.to_vec()).unwrap_or_default(),
    );
    event.properties = all
        .iter()
        .filter(|(k, _)| !STRING_HASH_SET.contains(k.as_str()))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    event.keys = system(MessageConst::PROPERTY_KEYS)
        .map(|keys| {
            keys.split(' ')
                .filter(|k| !k.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    event.tags = message.get_tags().map(|t| t.to_string());
    event.msg_id = system(MessageConst::PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        .unwrap_or_else(|| message.msg_id().to_string());
    event.reconsume_times = message.reconsume_times();
    event.queue_id = message.queue_id();
    event.queue_offset = message.queue_offset();
    event.fill_from_properties();
    event
}
