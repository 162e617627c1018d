//! The relay's Prometheus metrics: one process-wide registry that every stage counts into, so an
//! instance that changes role (standby ↔ leader) keeps one continuous set of series.
//!
//! Alert on: `outbox_events_failed_total` increasing (a row needs an operator), and
//! `outbox_binlog_position_lost_total` increasing (the stream skipped purged binlogs; the sweeper
//! covers the gap, but binlog retention is too short for the relay's downtime).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::OnceLock;

/// Every relay metric.
pub struct RelayMetrics {
    registry: Registry,
    /// Events recorded SENT.
    pub events_sent: Counter,
    /// Events recorded FAILED (alert).
    pub events_failed: Counter,
    /// Rows the sweeper claimed beside the stream (rows the stream missed or that were put back).
    pub rows_swept: Counter,
    /// SENDING rows whose lease expired and went back to PENDING.
    pub leases_recovered: Counter,
    /// Restarts from the oldest binlog because the checkpoint was purged (alert).
    pub binlog_position_lost: Counter,
    /// 1 while this instance leads (streams the binlog), else 0.
    pub leader: Gauge,
}

impl RelayMetrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("outbox");
        let metrics = RelayMetrics {
            events_sent: Counter::default(),
            events_failed: Counter::default(),
            rows_swept: Counter::default(),
            leases_recovered: Counter::default(),
            binlog_position_lost: Counter::default(),
            leader: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "events_sent",
            "Events published with SEND_OK and marked SENT",
            metrics.events_sent.clone(),
        );
        registry.register(
            "events_failed",
            "Events marked FAILED (they need an operator: see last_error)",
            metrics.events_failed.clone(),
        );
        registry.register(
            "rows_swept",
            "PENDING rows the sweeper claimed beside the stream",
            metrics.rows_swept.clone(),
        );
        registry.register(
            "leases_recovered",
            "SENDING rows whose lease expired and went back to PENDING",
            metrics.leases_recovered.clone(),
        );
        registry.register(
            "binlog_position_lost",
            "Restarts from the oldest binlog because the checkpoint was purged from the server",
            metrics.binlog_position_lost.clone(),
        );
        registry.register(
            "leader",
            "1 while this instance streams the binlog as the leader",
            metrics.leader.clone(),
        );
        RelayMetrics {
            registry,
            ..metrics
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }
}

/// The process's metrics.
pub fn relay() -> &'static RelayMetrics {
    static METRICS: OnceLock<RelayMetrics> = OnceLock::new();
    METRICS.get_or_init(RelayMetrics::new)
}

/// Counts a restart from the oldest binlog position.
pub fn binlog_position_lost() {
    relay().binlog_position_lost.inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_as_prometheus_text() {
        let metrics = RelayMetrics::new();
        metrics.events_failed.inc();
        metrics.leader.set(1);
        let text = metrics.render();
        assert!(
            text.contains("# TYPE outbox_events_failed counter"),
            "{text}"
        );
        assert!(text.contains("outbox_events_failed_total 1"), "{text}");
        assert!(text.contains("outbox_leader 1"), "{text}");
        assert!(
            text.contains("outbox_binlog_position_lost_total 0"),
            "{text}"
        );
    }
}
