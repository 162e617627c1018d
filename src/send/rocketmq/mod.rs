//! The RocketMQ sink: synchronous sends to an explicit queue with `rocketmq-client-rust` 1.0.
//!
//! Guarantee: `Ok` only for `SEND_OK` (the client returns `FLUSH_DISK_TIMEOUT`,
//! `FLUSH_SLAVE_TIMEOUT` and `SLAVE_NOT_AVAILABLE` as successes; here they are retryable errors).
//! Every message carries KEYS = `event_id biz_key`, the user properties `event_id` and `biz_key`,
//! its tags and its headers.

mod message;
mod message_type;
mod queue_table;
mod queues;
mod route;
mod tail;
mod topics;

pub use queue_table::QueueTable;
pub use queues::QueueStore;

use super::{OutboundMessage, SendError, SendFailure, Sink};
use crate::config::RocketMqConfig;
use crate::leader::Fence;
use crate::rocketmq_client::{is_missing_topic, ClientHost, ClientSecurity};
use message::{accept, Request, Shape};
use message_type::{Form, Judgement, TopicTypes};
use queues::{QueueBook, TopicQueues};
use rocketmq_client_rust::{ClientError, DefaultMQProducer, MQClientException, SendResult};
use rocketmq_model::common::message::message_queue::MessageQueue;
use rocketmq_model::common::message::message_single::Message;
use route::Route;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;
use topics::{ClusterMemory, Missing};

/// After this many consecutive "broker unavailable" errors the producer is rebuilt: the client
/// keeps a per-address circuit breaker open for 30 s after 5 failed connects, even once the
/// broker is back; a fresh client connects at once.
const REBUILD_AFTER_UNAVAILABLE: u32 = 3;

/// A topic's queue list and when it was fetched.
type CachedRoute = (Arc<TopicQueues>, Instant);
/// Queues a topic the broker auto-creates gets: the producer's `defaultTopicQueueNums`.
const AUTO_CREATED_QUEUES: usize = 4;

/// See the module documentation.
pub struct RocketMqSink {
    host: ClientHost,
    config: RocketMqConfig,
    /// The account and TLS of the producer and the admin client; replaced when the secret in
    /// `rocketmq.secret_key_file` changes.
    security: RwLock<ClientSecurity>,
    namesrv: String,
    producer: RwLock<DefaultMQProducer>,
    /// Queue lists per topic, shared (`Arc`) so the per-event queue look-up copies nothing.
    routes: Mutex<HashMap<String, CachedRoute>>,
    /// Every queue each topic was seen with, so a lost broker group moves no key.
    queue_book: QueueBook,
    /// Where the book is kept beyond this process (none: in memory only).
    queue_store: Option<Arc<dyn QueueStore>>,
    /// Topics and broker groups seen, for the verdict on "no such topic" (see [`topics`]).
    memory: ClusterMemory,
    unavailable_in_a_row: AtomicU32,
    /// Set while a sender rebuilds the producer.
    rebuilding: AtomicBool,
    /// What kind of messages each topic takes (see [`message_type`]).
    types: TopicTypes,
}

/// Gives the client a runtime of its own with this many worker threads (see `client_host`).
pub const CLIENT_WORKERS_ENV: &str = "OUTBOX_ROCKETMQ_WORKER_THREADS";

/// The runtime the producer runs on. By default the caller's, when that is a multi-thread
/// runtime (the relay's: one worker): a send and its answer then stay on one thread instead of
/// crossing to a client runtime's worker and back, each crossing a thread wake-up. Measured in
/// `bench/`, four rounds back to back against one worker each for pipeline and client (means):
/// relay CPU per event at 5k/s 36.6 → 32.1 µs, at 7.5k/s 32.2 → 28.8 µs; at 1k/s and in the
/// drain within the noise (156 → 135, 15.1 → 14.8 µs). A current-thread runtime (a
/// `#[tokio::test]`'s) gets a client runtime of its own, so a blocking call of the caller cannot
/// stall the client; so does [`CLIENT_WORKERS_ENV`]` = N` (N worker threads).
fn client_host() -> std::io::Result<ClientHost> {
    const NAME: &str = "outbox-relay-mq";
    let shared = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    match crate::config::thread_count_from_env(CLIENT_WORKERS_ENV, 0) {
        0 if shared => ClientHost::on_current_runtime(NAME),
        0 => ClientHost::with_workers(NAME, 1),
        workers => ClientHost::with_workers(NAME, workers),
    }
}

impl RocketMqSink {
    /// Starts a producer for `config` (its `namesrv_addr` is required), signed with its
    /// credentials and over TLS if it says so.
    pub async fn start(config: &RocketMqConfig) -> anyhow::Result<Self> {
        let namesrv = config
            .namesrv_addr
            .clone()
            .ok_or_else(|| anyhow::anyhow!("`rocketmq.namesrv_addr` is required to send"))?;
        let security = ClientSecurity::from_config(config)?;
        let host = client_host()?;
        let producer = start_producer(&host, config, &security, &namesrv).await?;
        Ok(RocketMqSink {
            host,
            config: config.clone(),
            security: RwLock::new(security),
            namesrv,
            producer: RwLock::new(producer),
            routes: Mutex::new(HashMap::new()),
            queue_book: QueueBook::new(config.reroute_on_broker_loss),
            queue_store: None,
            memory: ClusterMemory::default(),
            unavailable_in_a_row: AtomicU32::new(0),
            rebuilding: AtomicBool::new(false),
            types: TopicTypes::new(
                (config.topic_types.iter())
                    .map(|(topic, kind)| (config.in_namespace(topic).into_owned(), *kind))
                    .collect(),
            ),
        })
    }

    /// Keeps the topics' queue lists in `store` too (see the `queues` module), so an instance that
    /// starts while a broker group is down still keeps that group's keys on their queues.
    pub fn with_queue_store(mut self, store: Arc<dyn QueueStore>) -> Self {
        self.queue_store = Some(store);
        self
    }

    fn producer(&self) -> DefaultMQProducer {
        self.producer.read().expect("not poisoned").clone()
    }

    /// Maps a client error to retryable, rejected (the event's fault) or unauthorized (the
    /// account's), and rebuilds the producer when the broker has
    /// looked unavailable several times in a row.
    fn classify(&self, error: &ClientError) -> SendError {
        let class = error.descriptor().class().as_str().to_string();
        let code = error.descriptor().code().as_str().to_string();
        let client_code = error
            .source_ref::<MQClientException>()
            .map(MQClientException::response_code);
        let detail = error
            .source_ref::<MQClientException>()
            .map(|e| format!(": {}", e.error_message().unwrap_or_default()))
            .unwrap_or_default();
        let broker = error
            .broker_response_code()
            .map(|code| format!(", broker code {code}"))
            .unwrap_or_default();
        let text = format!("{code} ({class}){broker}{detail}");
        if class == "unavailable" {
            self.unavailable_in_a_row.fetch_add(1, Ordering::Relaxed);
        }
        match (class.as_str(), client_code, error.broker_response_code()) {
            (_, Some(17), _) | (_, _, Some(17)) => {
                SendError::Rejected(format!("no such topic: {text}"))
            }
            (_, Some(NO_PERMISSION), _) | (_, _, Some(NO_PERMISSION)) => {
                SendError::Unauthorized(format!("NO_PERMISSION ({NO_PERMISSION}): {text}"))
            }
            (_, Some(13), _) | (_, _, Some(13)) => {
                SendError::Rejected(format!("message too large or malformed: {text}"))
            }
            // Other client-side refusals are mostly routing trouble ("No route available"):
            // retried, and FAILED only when the retry policy gives up.
            _ => SendError::Retryable(text),
        }
    }

    /// Sends `messages` one by one through the default topic's route, so the broker creates
    /// `topic` on the first; `queue_index` picks the queue as for a routed topic. Forgets the
    /// auto-create state afterwards: the next send looks the new route up.
    async fn send_creating(
        &self,
        queue_index: usize,
        messages: Vec<Message>,
        fence: &Fence,
    ) -> Result<Vec<String>, SendFailure> {
        let mut ids = Vec::with_capacity(messages.len());
        for message in messages {
            if !fence.holds() {
                return Err(SendFailure {
                    stored: ids,
                    error: super::fenced(),
                });
            }
            let topic = message.topic().to_string();
            let producer = self.producer();
            let outcome = self
                .host
                .run(async move {
                    let pick = |queues: &[MessageQueue], _: &Message, index: &usize| {
                        (!queues.is_empty()).then(|| queues[*index % queues.len()].clone())
                    };
                    producer
                        .send_with_selector(message, pick, queue_index)
                        .await
                })
                .await;
            let answered = match outcome {
                Ok(outcome) => self.answer(&topic, outcome, 1).await,
                Err(e) => Err(SendError::Retryable(e.to_string())),
            };
            match answered {
                Ok(sent) => ids.extend(sent),
                Err(error) => return Err(SendFailure { stored: ids, error }),
            }
        }
        tracing::info!(
            queue_index,
            "sent through the auto-create route; the broker created the topic"
        );
        Ok(ids)
    }

    /// The ids of a send's messages, or why it failed.
    async fn answer(
        &self,
        topic: &str,
        outcome: Result<Option<SendResult>, ClientError>,
        count: usize,
    ) -> Result<Vec<String>, SendError> {
        match outcome {
            Ok(Some(result)) => {
                self.unavailable_in_a_row.store(0, Ordering::Relaxed);
                accept(result, count)
            }
            Ok(None) => Err(SendError::Retryable(
                "the client returned no send result".into(),
            )),
            Err(error) => {
                let classified = match self.classify_route_error(topic, &error).await {
                    Missing::Rejected(e) => e,
                    Missing::Retry(e) => e,
                    Missing::AutoCreate => SendError::Retryable(format!(
                        "the broker did not create {topic} on its first message yet: {error}"
                    )),
                };
                // A changed route may explain it; look again next time. Not after a timeout or a
                // refused connection: the route still names the broker (a frozen or restarting
                // one), and every sender of the topic would then look it up again while the
                // broker's queues retry.
                let class = error.descriptor().class().as_str();
                if class != "timeout" && class != "unavailable" {
                    self.routes.lock().expect("not poisoned").remove(topic);
                }
                Err(classified)
            }
        }
    }

    fn security(&self) -> ClientSecurity {
        self.security.read().expect("not poisoned").clone()
    }

    async fn rebuild_if_stuck(&self) {
        if self.unavailable_in_a_row.load(Ordering::Relaxed) < REBUILD_AFTER_UNAVAILABLE {
            return;
        }
        // One sender rebuilds; the others go on with the producer they have.
        if self.rebuilding.swap(true, Ordering::SeqCst) {
            return;
        }
        self.unavailable_in_a_row.store(0, Ordering::Relaxed);
        self.rebuild(self.security(), "after repeated connection failures")
            .await;
        self.rebuilding.store(false, Ordering::SeqCst);
    }

    /// After a refusal: if the secret is read from `rocketmq.secret_key_file` and the file now
    /// holds another one (a rotated Kubernetes Secret), the producer is rebuilt with it, so the
    /// waiting events go out without a restart.
    async fn reload_secret_file(&self) {
        if self.config.secret_key_file.is_none() {
            return;
        }
        match ClientSecurity::from_config(&self.config) {
            Ok(fresh) if fresh != self.security() => {
                self.rebuild(fresh, "with the new secret of rocketmq.secret_key_file")
                    .await
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot read the secret again"),
        }
    }

    /// Replaces the producer by a fresh one secured by `security` (then also used by the admin
    /// client); keeps the old one if the new one does not start.
    async fn rebuild(&self, security: ClientSecurity, why: &str) {
        match start_producer(&self.host, &self.config, &security, &self.namesrv).await {
            Ok(fresh) => {
                let mut old =
                    std::mem::replace(&mut *self.producer.write().expect("not poisoned"), fresh);
                *self.security.write().expect("not poisoned") = security;
                // The old producer ends in the background, once the sends it carries have had
                // their time: its end unregisters from every broker, which takes a timeout per
                // broker that does not answer (a frozen one), and a sender must not wait for
                // that, nor see its send on the old producer cut short.
                let linger = self.config.send_timeout * 2;
                self.host.spawn(async move {
                    tokio::time::sleep(linger).await;
                    old.shutdown().await;
                });
                self.routes.lock().expect("not poisoned").clear();
                tracing::info!("rebuilt the RocketMQ producer {why}");
            }
            Err(e) => tracing::warn!(error = %e, "could not rebuild the RocketMQ producer {why}"),
        }
    }

    /// Stops the producer and the client runtime.
    pub async fn shutdown(self) {
        let mut producer = self.producer();
        let _ = self
            .host
            .run(async move { producer.shutdown().await })
            .await;
        self.host.shutdown().await;
    }
}

async fn start_producer(
    host: &ClientHost,
    config: &RocketMqConfig,
    security: &ClientSecurity,
    namesrv: &str,
) -> anyhow::Result<DefaultMQProducer> {
    let timeout_ms = u32::try_from(config.send_timeout.as_millis()).unwrap_or(u32::MAX);
    let mut producer = DefaultMQProducer::builder(host.client_runtime())
        .client_config(security.client_config())
        .producer_group(config.producer_group.as_str())
        .name_server_addr(namesrv)
        .send_msg_timeout(timeout_ms)
        .build();
    security.sign_producer(&mut producer);
    let mut starting = producer.clone();
    host.run(async move { starting.start().await })
        .await?
        .map_err(|e| {
            anyhow::anyhow!("cannot start the RocketMQ producer (namesrv {namesrv}): {e}")
        })?;
    Ok(producer)
}

/// The broker's NO_PERMISSION. Apache RocketMQ 5.3 with ACL 2.0 answers it (measured by
/// `tests/acl.rs`) for an unknown access key ("User:x is not found"), a wrong secret ("check
/// signature failed") and an account without `Pub` on the topic ("User:x has no permission to
/// access Topic:t ..."); the client 1.0 keeps only the code. A topic or broker made read-only
/// answers it too: also the operator's to fix, never the event's.
const NO_PERMISSION: i32 = 16;

impl Sink for RocketMqSink {
    /// Shuts the producer and its client runtime down when no one else holds the sink (a replay
    /// or a test may still share it).
    async fn close(self: Arc<Self>) {
        if let Ok(sink) = Arc::try_unwrap(self) {
            sink.shutdown().await;
        }
    }

    fn stable_queues(&self) -> bool {
        self.queue_book.stable()
    }

    fn queue_group(&self, topic: &str, queue: usize) -> Option<String> {
        let topic = self.config.in_namespace(topic);
        let routes = self.routes.lock().expect("not poisoned");
        let (queues, _) = routes.get(topic.as_ref())?;
        Some(queues.list.get(queue)?.broker_name().to_string())
    }

    fn stored_tail<'a>(
        &'a self,
        topic: &'a str,
        bound: crate::send::TailBound,
    ) -> futures_util::future::BoxFuture<'a, Result<Option<crate::send::StoredTail>, SendError>>
    {
        Box::pin(self.read_tail(topic, bound))
    }

    async fn queue_count(&self, topic: &str) -> Result<usize, SendError> {
        match self.route(&self.config.in_namespace(topic)).await? {
            Route::Queues(queues) => Ok(queues.list.len()),
            Route::AutoCreate => Ok(AUTO_CREATED_QUEUES),
        }
    }

    async fn send(
        &self,
        topic: &str,
        queue_index: usize,
        messages: &[&OutboundMessage],
        fence: &Fence,
    ) -> Result<Vec<String>, SendFailure> {
        // Below here every topic is the broker's name for it.
        let topic = &self.config.in_namespace(topic);
        self.rebuild_if_stuck().await;
        let queues = match self.route(topic).await? {
            Route::Queues(queues) => queues,
            Route::AutoCreate => {
                let built = (messages.iter())
                    .map(|m| message::build_message(m, topic, Shape::PLAIN))
                    .collect::<Result<Vec<_>, _>>()?;
                return self.send_creating(queue_index, built, fence).await;
            }
        };
        let queue = queues
            .writable(topic, queue_index)
            .map_err(SendError::Retryable)?
            .clone();
        let scheduled = messages.iter().any(|m| m.deliver_at_ms.is_some());
        let mut form = self.types.form(topic, scheduled);
        let (mut stored, mut rest) = (Vec::with_capacity(messages.len()), messages);
        let failed = |stored: Vec<String>, error: SendError| SendFailure { stored, error };
        loop {
            let shape = match &form {
                Form::Refused(reason) => {
                    return Err(failed(stored, SendError::Misconfigured(reason.clone())))
                }
                Form::Plain => Shape::PLAIN,
                Form::Grouped => Shape::GROUPED,
                Form::Timed => Shape::TIMED,
            };
            // What was stored stays stored: a form tried next carries on after it.
            let (sent, refused) = self.send_as(topic, &queue, rest, shape, fence).await;
            let taken = &rest[..sent.len()];
            if taken.iter().any(|m| m.deliver_at_ms.is_none()) {
                self.types.learn_accepted(topic, &form);
            } else if !taken.is_empty() && form != Form::Grouped {
                // Scheduled events only: timer messages whatever the form.
                self.types.learn_accepted(topic, &Form::Timed);
            }
            rest = &rest[sent.len()..];
            stored.extend(sent);
            match refused {
                None => return Ok(stored),
                Some(Refused::Illegal { error, count }) => {
                    match self
                        .types
                        .judge_illegal(topic, &form, count, rest[0], &error)
                    {
                        Judgement::TryForm(next) => form = next,
                        Judgement::Split => return Err(failed(stored, error)),
                        Judgement::EventsFault(reason) => {
                            return Err(failed(stored, SendError::Rejected(reason)))
                        }
                        Judgement::Undecided(reason) => {
                            return Err(failed(stored, SendError::Misconfigured(reason)))
                        }
                    }
                }
                Some(Refused::Other(error)) => return Err(failed(stored, error)),
            }
        }
    }
}

/// Why [`RocketMqSink::send_as`] did not end in `SEND_OK`.
enum Refused {
    /// A request of `count` messages refused as malformed (`MESSAGE_ILLEGAL`, 13): the message's
    /// fault from a broker, but from a RocketMQ 5 proxy also its answer to a message of another
    /// type than the topic's (see [`TopicTypes::judge_illegal`]).
    Illegal {
        error: SendError,
        count: usize,
    },
    Other(SendError),
}

impl RocketMqSink {
    /// Sends `messages` to `queue`, built as `shape` says, in as few requests as that allows
    /// (see [`message::requests`]), each once the one before it is stored and only while
    /// `fence` holds: the ids of the
    /// messages stored (a prefix of `messages`), and why the others were not.
    async fn send_as(
        &self,
        topic: &str,
        queue: &MessageQueue,
        messages: &[&OutboundMessage],
        shape: Shape,
        fence: &Fence,
    ) -> (Vec<String>, Option<Refused>) {
        let requests = match message::requests(messages, topic, shape) {
            Ok(requests) => requests,
            Err(error) => return (Vec::new(), Some(Refused::Other(error))),
        };
        let mut ids = Vec::with_capacity(messages.len());
        for (request, count) in requests {
            if !fence.holds() {
                return (ids, Some(Refused::Other(super::fenced())));
            }
            let (producer, queue) = (self.producer(), queue.clone());
            let outcome = self
                .host
                .run(async move {
                    match request {
                        Request::One(message) => producer.send_to_queue(message, queue).await,
                        Request::Batch(batch) => producer.send_to_queue(batch, queue).await,
                    }
                })
                .await;
            let outcome = match outcome {
                Ok(outcome) => outcome,
                Err(e) => {
                    return (
                        ids,
                        Some(Refused::Other(SendError::Retryable(e.to_string()))),
                    )
                }
            };
            let illegal = matches!(&outcome, Err(e) if e.broker_response_code() == Some(13));
            match self.answer(topic, outcome, count).await {
                Ok(sent) => ids.extend(sent),
                Err(error) if illegal => return (ids, Some(Refused::Illegal { error, count })),
                Err(error) => return (ids, Some(Refused::Other(error))),
            }
        }
        (ids, None)
    }
}
