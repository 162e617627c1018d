//! Fixtures for tests of the pipeline (feature `test-utils`; this crate's own unit tests always
//! have them): a broker in memory behind the [`Sink`] seam, and sample events.
//!
//! Nothing here talks to a server. The integration suite uses [`MemoryBroker`] to run the real
//! stream, marker and checkpoint against a real database without a broker, and the unit tests to
//! run the pipeline without any server; a claim about a broker is proven on a real one.

use crate::outbox::OutboundMessage;
use crate::send::{SendError, SendFailure, Sink};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;

/// A message as [`MemoryBroker`] stored it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredMessage {
    /// The id the send returned for it (unique per broker).
    pub msg_id: String,
    pub message: OutboundMessage,
}

/// A broker in memory. Every topic has the same number of queues; the first sends it is told to
/// refuse fail as retryable (a broker restarting), later ones are stored in their queue's order.
///
/// Guarantee: like a real broker's `SEND_OK`, `send` returns `Ok` only after storing the whole
/// batch, with one id per message, in order; a refused send stores nothing.
pub struct MemoryBroker {
    queues_per_topic: usize,
    refuse: AtomicU32,
    /// (topic, queue) → what was stored there, in order.
    queues: Mutex<BTreeMap<(String, usize), Vec<StoredMessage>>>,
    /// How many messages are stored in all, announced at every store.
    stored_total: watch::Sender<usize>,
}

impl MemoryBroker {
    /// A broker with `queues_per_topic` queues in every topic, refusing nothing.
    pub fn new(queues_per_topic: usize) -> Self {
        MemoryBroker {
            queues_per_topic,
            refuse: AtomicU32::new(0),
            queues: Mutex::default(),
            stored_total: watch::Sender::new(0),
        }
    }

    /// The same broker, refusing its next `sends` sends.
    pub fn refusing_first(self, sends: u32) -> Self {
        self.refuse.store(sends, Ordering::SeqCst);
        self
    }

    /// What is stored, by (topic, queue), in each queue's order.
    pub fn stored(&self) -> BTreeMap<(String, usize), Vec<StoredMessage>> {
        self.queues.lock().expect("not poisoned").clone()
    }

    /// How many messages are stored in all.
    pub fn stored_count(&self) -> usize {
        *self.stored_total.borrow()
    }

    /// How many messages are stored in all, woken at every store (see [`wait_notified`]).
    pub fn stores(&self) -> watch::Receiver<usize> {
        self.stored_total.subscribe()
    }
}

impl Sink for MemoryBroker {
    async fn queue_count(&self, _topic: &str) -> Result<usize, SendError> {
        Ok(self.queues_per_topic)
    }

    async fn send(
        &self,
        topic: &str,
        queue_index: usize,
        messages: &[&OutboundMessage],
        _fence: &crate::leader::Fence,
    ) -> Result<Vec<String>, SendFailure> {
        let refuse = |left: u32| left.checked_sub(1);
        if self
            .refuse
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, refuse)
            .is_ok()
        {
            return Err(SendError::Retryable("broker restarting".into()).into());
        }
        let mut queues = self.queues.lock().expect("not poisoned");
        let queue = queues.entry((topic.to_string(), queue_index)).or_default();
        let ids = messages
            .iter()
            .map(|message| {
                let msg_id = format!("{topic}-{queue_index}-{}", queue.len());
                queue.push(StoredMessage {
                    msg_id: msg_id.clone(),
                    message: (*message).clone(),
                });
                msg_id
            })
            .collect();
        self.stored_total
            .send_modify(|total| *total += messages.len());
        Ok(ids)
    }
}

/// Message `i` of a sample stream on `topic`: event id `ev-{i}`, one of three keys, a tag, a
/// header and a small JSON payload.
pub fn sample_message(topic: &str, i: usize) -> OutboundMessage {
    OutboundMessage {
        event_id: format!("ev-{i}"),
        biz_key: format!("key-{}", i % 3),
        topic: topic.to_string(),
        tags: Some("created".into()),
        headers: vec![("h".into(), "v".into())],
        payload: format!("{{\"i\":{i}}}"),
        deliver_at_ms: None,
    }
}

/// Waits until `ready` holds for the value `changes` carries, woken by each change rather than
/// polling; panics naming `what`, with the last value, after `timeout`. For state the code under
/// test announces ([`MemoryBroker::stores`], `checkpoint::MemoryStore::saves`, a test's own
/// observer); state held by a server or another process is polled.
pub async fn wait_notified<T: Debug>(
    what: &str,
    timeout: Duration,
    mut changes: watch::Receiver<T>,
    mut ready: impl FnMut(&T) -> bool,
) {
    let waited = tokio::time::timeout(timeout, changes.wait_for(|value| ready(value)))
        .await
        .map(|seen| seen.map(drop));
    match waited {
        Ok(Ok(())) => {}
        Ok(Err(_)) => panic!("{what}: nothing announces changes any more (its owner ended)"),
        Err(_) => panic!(
            "timed out after {timeout:?} waiting for {what}; last value: {:?}",
            *changes.borrow()
        ),
    }
}
