//! Dead letters: what each watched consumer group's dead-letter queue holds, from the broker's
//! own offsets. A message its consumers failed `maxReconsumeTimes` times (16 by default; the
//! consumer library's handler answering `Retry`, or a panic, each time) is moved by the broker
//! to `%DLQ%<group>` and is delivered to nobody after that: an event the business never
//! processed although the relay delivered it. The article's production section asks to watch
//! how deep that queue is and how fast it grows.
//!
//! Guarantee: the figures are the broker's (the queue offsets of every master serving the DLQ
//! topic, as `mqadmin topicStatus` prints them), read with the relay's own account, TLS and
//! namespace; a group nothing was dead-lettered for yet (the broker creates its DLQ topic with
//! the first one) reads as 0; a read that fails is logged and counted, never shown as 0 — nor
//! one through a RocketMQ 5 proxy, which lists no brokers to ask.

use crate::config::RocketMqConfig;
use crate::rocketmq_client::{is_missing_topic, ClientHost, ClientSecurity};
use rocketmq_client_rust::{RouteAdmin, TopicAdmin};
use serde::Serialize;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// One group's dead-letter queue as the broker has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetterQueue {
    /// The consumer group, as configured (without the namespace).
    pub group: String,
    /// The broker's topic: `%DLQ%<group>`, in the namespace if one is set.
    pub topic: String,
    /// Messages ever dead-lettered (the queues' max offsets added up): grows, never falls.
    pub received: u64,
    /// Messages the broker still stores (max minus min offsets): what an operator can re-send.
    pub stored: u64,
}

/// Reads the dead-letter queue of each of `groups` from the cluster `config` names.
pub async fn read(
    config: &RocketMqConfig,
    groups: &[String],
) -> anyhow::Result<Vec<DeadLetterQueue>> {
    let namesrv = (config.namesrv_addr.clone()).ok_or_else(|| {
        anyhow::anyhow!("`rocketmq.namesrv_addr` is required to read dead letters")
    })?;
    let security = ClientSecurity::from_config(config)?;
    let host = ClientHost::on_current_runtime("outbox-dlq")?;
    let mut admin = security.admin(host.client_runtime());
    admin.set_namesrv_addr(namesrv.as_str());
    let topics: Vec<(String, String)> = (groups.iter())
        .map(|group| {
            (
                group.clone(),
                config.in_namespace(&format!("%DLQ%{group}")).into_owned(),
            )
        })
        .collect();
    let read = host
        .run(async move {
            admin.start().await?;
            // A RocketMQ 5 proxy routes topics to itself and answers no cluster request: asked
            // through it, a DLQ's statistics would read as empty, a silent 0.
            if let Err(e) = admin.examine_broker_cluster_info().await {
                admin.shutdown().await;
                return Err(anyhow::anyhow!(
                    "dead letters are read from the brokers, and {namesrv} lists none ({e}): it \
                     is probably a RocketMQ 5 proxy; give rocketmq.namesrv_addr the name servers \
                     to watch rocketmq.dead_letter_groups"
                ));
            }
            let mut queues = Vec::with_capacity(topics.len());
            for (group, topic) in topics {
                let stats = admin.examine_topic_stats(topic.as_str().into(), None).await;
                let (mut received, mut stored) = (0u64, 0u64);
                match stats {
                    Ok(stats) => {
                        for offsets in stats.get_offset_table().values() {
                            let (min, max) = (offsets.get_min_offset(), offsets.get_max_offset());
                            received += u64::try_from(max).unwrap_or(0);
                            stored += u64::try_from(max - min).unwrap_or(0);
                        }
                    }
                    Err(e) if is_missing_topic(&e) => {}
                    Err(e) => {
                        admin.shutdown().await;
                        return Err(anyhow::anyhow!("cannot read {topic} from the broker: {e}"));
                    }
                }
                queues.push(DeadLetterQueue {
                    group,
                    topic,
                    received,
                    stored,
                });
            }
            admin.shutdown().await;
            Ok(queues)
        })
        .await;
    host.shutdown().await;
    read?
}

/// Exports the dead-letter queues of `groups` as `outbox_dlq_received` / `outbox_dlq_messages`
/// every `every` until `cancel`; a failed read is logged and counts in
/// `outbox_dlq_read_errors_total`, and leaves the gauges as they were.
pub(crate) async fn watch(
    config: RocketMqConfig,
    groups: Vec<String>,
    every: Duration,
    cancel: CancellationToken,
) {
    let metrics = crate::metrics::relay();
    loop {
        match read(&config, &groups).await {
            Ok(queues) => {
                for queue in queues {
                    let label = crate::metrics::GroupLabel { group: queue.group };
                    let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                    metrics
                        .dlq_received
                        .get_or_create(&label)
                        .set(gauge(queue.received));
                    metrics
                        .dlq_messages
                        .get_or_create(&label)
                        .set(gauge(queue.stored));
                }
            }
            Err(e) => {
                metrics.dlq_read_errors.inc();
                tracing::warn!(error = %format!("{e:#}"), ?groups,
                    "cannot read the consumer groups' dead-letter queues");
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
