//! The soak's consumer: the idempotency library (`IdempotentPushConsumer`, orderly listener) with
//! a handler that writes one `soak_effect` row per event. Every delivery is recorded in the order
//! the processor finished it, so the audit sees first deliveries per key in order.

use mysql_async::prelude::*;
use mysql_async::{Pool, Transaction};
use outbox_devenv::ClientHost;
use rocketmq_outbox::consumer::{
    ConsumedEvent, Disposition, Handler, IdempotentProcessor, IdempotentPushConsumer, ListenerMode,
    Outcome, PushConsumerOptions,
};
use std::sync::{Arc, Mutex};

pub const GROUP: &str = "soak_consumer";

/// One delivery as the processor finished it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub event_id: String,
    /// The producer-side message id: a relay resend has a new one, a broker redelivery not.
    pub msg_id: String,
    pub disposition: Disposition,
}

struct Effect;

impl Handler for Effect {
    async fn handle(
        &self,
        event: &ConsumedEvent,
        tx: &mut Transaction<'static>,
    ) -> anyhow::Result<Outcome> {
        tx.exec_drop(
            "INSERT INTO soak_effect (event_id, biz_key) VALUES (?, ?)",
            (&event.event_id, &event.biz_key),
        )
        .await?;
        Ok(Outcome::Success)
    }
}

pub struct SoakConsumer {
    consumer: IdempotentPushConsumer,
    deliveries: Arc<Mutex<Vec<Delivery>>>,
}

impl SoakConsumer {
    pub async fn start(pool: Pool, namesrv: String, topic: &str) -> Self {
        let deliveries = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&deliveries);
        let processor = IdempotentProcessor::new(pool, GROUP, Effect)
            .expect("processor")
            .with_observer(Arc::new(move |event: &ConsumedEvent, d: &Disposition| {
                log.lock().unwrap().push(Delivery {
                    event_id: event.event_id.clone().unwrap_or_default(),
                    msg_id: event.msg_id.clone(),
                    disposition: d.clone(),
                });
            }));
        let mut options = PushConsumerOptions::new(namesrv, topic);
        options.mode = ListenerMode::Orderly;
        options.suspend_millis = 200;
        let host = Arc::new(ClientHost::new("soak-consumer").expect("client host"));
        let consumer = IdempotentPushConsumer::start(host, options, Arc::new(processor))
            .await
            .expect("start consumer");
        SoakConsumer {
            consumer,
            deliveries,
        }
    }

    /// How many distinct events had a delivery ACKed so far (processed, or a dedup hit of an
    /// earlier commit).
    pub fn acked(&self) -> usize {
        let deliveries = self.deliveries.lock().unwrap();
        deliveries
            .iter()
            .filter(|d| d.disposition.is_ack())
            .map(|d| d.event_id.as_str())
            .collect::<std::collections::HashSet<_>>()
            .len()
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        self.deliveries.lock().unwrap().clone()
    }

    pub async fn shutdown(self) {
        self.consumer.shutdown().await;
    }
}
