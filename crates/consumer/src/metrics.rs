//! Consumer counters, exported in the Prometheus/OpenMetrics text format.
//!
//! [`ConsumerMetrics`] works on its own (tests read exact values with [`ConsumerMetrics::counts`])
//! and can be registered into a caller's [`Registry`], so a process that runs the relay and a
//! consumer serves both sets of metrics from one `/metrics` endpoint. Clones share the counters.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Labels of the per-delivery counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConsumeLabels {
    pub consumer_group: String,
    pub topic: String,
}

/// Labels of [`ConsumerMetrics`]' guard counter: which guard ignored an update, and why.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GuardLabels {
    /// `version` or `state`.
    pub guard: String,
    /// `stale`, `repeated`, `illegal` or `missing`.
    pub reason: String,
}

/// Exact counter values for one `(consumer_group, topic)`; see [`ConsumerMetrics::counts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumeCounts {
    /// Deliveries handled, whatever the outcome (`consume_total`).
    pub consumed: u64,
    /// Deliveries whose handler ran and committed (`consume_processed_total`).
    pub processed: u64,
    /// Deliveries ACKed as already handled (`dedup_hit_total`).
    pub dedup_hits: u64,
    /// Deliveries quarantined as unprocessable (`consume_rejected_total`).
    pub rejected: u64,
    /// Deliveries rolled back and handed back for redelivery (`consume_retry_total`).
    pub retries: u64,
}

/// The consumer library's counters. Cheap to clone; clones count into the same counters.
#[derive(Debug, Clone, Default)]
pub struct ConsumerMetrics {
    consumed: Family<ConsumeLabels, Counter>,
    processed: Family<ConsumeLabels, Counter>,
    dedup_hits: Family<ConsumeLabels, Counter>,
    rejected: Family<ConsumeLabels, Counter>,
    retries: Family<ConsumeLabels, Counter>,
    guard_ignored: Family<GuardLabels, Counter>,
}

/// What happened to one delivery, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    Processed,
    DedupHit,
    Rejected,
    Retry,
}

impl ConsumerMetrics {
    /// Counters not yet registered anywhere.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers every counter into `registry` (names get the `_total` suffix on export:
    /// `consume_total`, `consume_processed_total`, `dedup_hit_total`, `consume_rejected_total`,
    /// `consume_retry_total`, `consume_guard_ignored_total`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "consume",
            "Deliveries handled by the idempotent consumer, any outcome",
            self.consumed.clone(),
        );
        registry.register(
            "consume_processed",
            "Deliveries whose handler ran and whose transaction committed",
            self.processed.clone(),
        );
        registry.register(
            "dedup_hit",
            "Deliveries ACKed without running the handler because the event was already handled",
            self.dedup_hits.clone(),
        );
        registry.register(
            "consume_rejected",
            "Deliveries quarantined as never processable (marked REJECTED and ACKed)",
            self.rejected.clone(),
        );
        registry.register(
            "consume_retry",
            "Deliveries rolled back and handed back to the broker for redelivery",
            self.retries.clone(),
        );
        registry.register(
            "consume_guard_ignored",
            "Out-of-order or illegal updates ignored by a version or state-machine guard",
            self.guard_ignored.clone(),
        );
    }

    pub(crate) fn record(&self, group: &str, topic: &str, what: Counted) {
        let labels = ConsumeLabels {
            consumer_group: group.to_string(),
            topic: topic.to_string(),
        };
        let family = match what {
            Counted::Processed => &self.processed,
            Counted::DedupHit => &self.dedup_hits,
            Counted::Rejected => &self.rejected,
            Counted::Retry => &self.retries,
        };
        family.get_or_create(&labels).inc();
        // Last, so that a reader who sees `consume_total` = N also sees all N outcomes.
        self.consumed.get_or_create(&labels).inc();
    }

    pub(crate) fn record_guard_ignored(&self, guard: &str, reason: &str) {
        self.guard_ignored
            .get_or_create(&GuardLabels {
                guard: guard.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// The current values for one consumer group and topic (zeros if nothing was counted).
    pub fn counts(&self, group: &str, topic: &str) -> ConsumeCounts {
        let labels = ConsumeLabels {
            consumer_group: group.to_string(),
            topic: topic.to_string(),
        };
        let get = |family: &Family<ConsumeLabels, Counter>| {
            family
                .get(&labels)
                .map(|counter| counter.get())
                .unwrap_or(0)
        };
        ConsumeCounts {
            consumed: get(&self.consumed),
            processed: get(&self.processed),
            dedup_hits: get(&self.dedup_hits),
            rejected: get(&self.rejected),
            retries: get(&self.retries),
        }
    }

    /// How many updates a guard ignored for `reason` (see [`GuardLabels`]).
    pub fn guard_ignored(&self, guard: &str, reason: &str) -> u64 {
        self.guard_ignored
            .get(&GuardLabels {
                guard: guard.to_string(),
                reason: reason.to_string(),
            })
            .map(|counter| counter.get())
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn counts_per_group_and_topic_and_exports_total_names() {
        let metrics = ConsumerMetrics::new();
        metrics.record("g", "t", Counted::Processed);
        metrics.record("g", "t", Counted::DedupHit);
        metrics.record("g", "t", Counted::DedupHit);
        metrics.record("g", "other", Counted::Retry);
        metrics.record_guard_ignored("state", "repeated");
        assert_eq!(
            metrics.counts("g", "t"),
            ConsumeCounts {
                consumed: 3,
                processed: 1,
                dedup_hits: 2,
                rejected: 0,
                retries: 0
            }
        );
        assert_eq!(metrics.counts("g", "other").retries, 1);
        assert_eq!(metrics.counts("nobody", "t"), ConsumeCounts::default());
        assert_eq!(metrics.guard_ignored("state", "repeated"), 1);

        let mut registry = Registry::default();
        metrics.clone().register(&mut registry);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"dedup_hit_total{consumer_group="g",topic="t"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"consume_total{consumer_group="g",topic="t"} 3"#),
            "{text}"
        );
        assert!(text.contains("# TYPE consume_retry counter"), "{text}");
    }
}
