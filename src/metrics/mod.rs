//! The relay's Prometheus metrics: one process-wide registry that every stage counts into, so an
//! instance that changes role (standby ↔ leader) keeps one continuous set of series.
//!
//! Alert on: `outbox_events_failed_total` increasing (a row needs an operator), and
//! `outbox_binlog_position_lost_total` increasing (the stream skipped purged binlogs; the sweeper
//! covers the gap, but binlog retention is too short for the relay's downtime), and
//! `outbox_checkpoint_save_errors_total` increasing (progress is not durable).

pub mod health;
pub mod server;
pub mod stages;

pub use health::{health, Role};

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

/// What the stream's key-order guard asked the database before a dispatcher batch of one table
/// was handed on: `none` (the table is known clean), `gap` (only the ids the stream skipped),
/// `keys` (each key's older waiting rows). See `pipeline::key_order`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyOrderAsked {
    pub asked: &'static str,
}

impl KeyOrderAsked {
    pub const NONE: &'static str = "none";
    pub const GAP: &'static str = "gap";
    pub const KEYS: &'static str = "keys";
    pub const ALL: [&'static str; 3] = [Self::NONE, Self::GAP, Self::KEYS];
}

/// A send error's class: `retryable` (timeouts, broker unavailable), `rejected` (a bad message),
/// `unauthorized` (the broker refuses the relay's account) or `misconfigured` (a topic's type
/// the relay cannot send).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorClass {
    pub class: &'static str,
}

impl ErrorClass {
    pub const RETRYABLE: &'static str = "retryable";
    pub const REJECTED: &'static str = "rejected";
    pub const UNAUTHORIZED: &'static str = "unauthorized";
    /// A topic whose RocketMQ 5 type the relay cannot send (see `SendError::Misconfigured`).
    pub const MISCONFIGURED: &'static str = "misconfigured";
    /// Every class `send` counts. Each is exported at 0 from the start, as Prometheus advises
    /// for label values known in advance: a series that appears only at its first error hides
    /// that error from `increase()` and `rate()`, and a query or alert on an absent series
    /// cannot tell "no errors" from "not exported".
    pub const ALL: [&'static str; 4] = [
        Self::RETRYABLE,
        Self::REJECTED,
        Self::UNAUTHORIZED,
        Self::MISCONFIGURED,
    ];
}

/// Why a leadership ended while it streamed (`outbox_leadership_ended_total{reason}`):
/// `superseded` (a renewal found a newer epoch), `mirror_refused` (the checkpoint mirror refused
/// its epoch), `mark_refused` (a SENT/FAILED mark found another epoch in the mirror row),
/// `lock_lost` (another connection holds the lock) or `expired` (no successful renewal within
/// its validity). The first three mean another instance led at the same time.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeadershipEnd {
    pub reason: &'static str,
}

impl LeadershipEnd {
    pub const SUPERSEDED: &'static str = "superseded";
    pub const MIRROR_REFUSED: &'static str = "mirror_refused";
    pub const MARK_REFUSED: &'static str = "mark_refused";
    pub const LOCK_LOST: &'static str = "lock_lost";
    pub const EXPIRED: &'static str = "expired";
    /// Every reason, each exported at 0 from the start (see [`ErrorClass::ALL`]).
    pub const ALL: [&'static str; 5] = [
        Self::SUPERSEDED,
        Self::MIRROR_REFUSED,
        Self::MARK_REFUSED,
        Self::LOCK_LOST,
        Self::EXPIRED,
    ];
}

/// One outbox table.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabel {
    pub table: String,
}

/// One ordered sender.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabel {
    pub shard: u32,
}

/// One RocketMQ topic.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabel {
    pub topic: String,
}

/// One consumer group (as configured, without a namespace).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabel {
    pub group: String,
}

/// One prepared XA transaction, by its xid as `XA RECOVER` shows it (few at a time: a label
/// lives from the prepare to its outcome).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct XidLabel {
    pub xid: String,
}

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
    /// Leaderships that ended while streaming, by reason.
    pub leadership_ended: Family<LeadershipEnd, Counter>,
    /// Failed send attempts by class (each retry counts).
    pub send_errors: Family<ErrorClass, Counter>,
    /// Sends retried after a retryable error.
    pub retries: Counter,
    /// Row created → recorded SENT, in seconds (database clock: `sent_at - created_at`).
    pub commit_to_sent: Histogram,
    /// Each step of a SENT event through the relay, in seconds (relay clock): see [`stages`].
    pub stage_seconds: Family<stages::StageLabel, Histogram>,
    /// Seconds between the newest binlog event read and now (0 when caught up).
    pub binlog_lag_seconds: Gauge<f64, AtomicU64>,
    /// Transactions / bytes the mirrored checkpoint is behind the server's end of binlog.
    pub binlog_behind_transactions: Gauge,
    pub binlog_behind_bytes: Gauge,
    /// Seconds since the checkpoint last moved while events were in flight (0 when idle).
    pub checkpoint_age_seconds: Gauge<f64, AtomicU64>,
    /// Prepared XA transactions whose outcome the stream waits for (each holds the checkpoint).
    pub xa_prepared_transactions: Gauge,
    /// Prepared XA transactions held for `relay.park_prepared_after` and parked.
    pub xa_parked: Counter,
    /// Events a starting relay found stored on the broker but not recorded, and recorded SENT
    /// without sending them again; and the time spent reading the topics' tails for them.
    pub catch_up_found_stored: Counter,
    pub catch_up_tail_read_seconds: Counter<f64, AtomicU64>,
    /// When (Unix seconds) the stream read each XA transaction's prepare that still has no
    /// outcome, held or parked; the series goes at its XA COMMIT or XA ROLLBACK.
    pub xa_prepared_since: Family<XidLabel, Gauge<f64, AtomicU64>>,
    /// Failed relay rounds whose error the relay does not classify (retried; alert).
    pub unclassified_errors: Counter,
    /// Keys whose stream events wait for an older row of the key the stream did not read.
    pub keys_held_for_order: Gauge,
    /// Dispatcher batches of one table by what the key-order guard asked ([`KeyOrderAsked`]).
    pub key_order_checks: Family<KeyOrderAsked, Counter>,
    /// Events waiting in each shard's input.
    pub shard_queue_depth: Family<ShardLabel, Gauge>,
    /// When (Unix seconds) a topic stopped accepting events; 0 once it accepts them again (see
    /// [`crate::send::Stalls`]).
    pub topic_stalled_since: Family<TopicLabel, Gauge<f64, AtomicU64>>,
    /// Events of a stalled topic held in memory (in the shards' lanes) to be retried.
    pub topic_held_events: Family<TopicLabel, Gauge>,
    /// Streamed events of a stalled topic left PENDING for the sweeper instead of held in memory.
    pub events_parked: Family<TopicLabel, Counter>,
    /// Age of the oldest PENDING row per table (0 when none): the key metric.
    pub oldest_pending_seconds: Family<TableLabel, Gauge<f64, AtomicU64>>,
    /// Rows per table in PENDING, SENDING and FAILED.
    pub pending: Family<TableLabel, Gauge>,
    pub sending: Family<TableLabel, Gauge>,
    pub failed: Family<TableLabel, Gauge>,
    /// 1 while `/readyz` answers 200 (set at every scrape from [`health()`]), so Prometheus can
    /// alert on readiness without probing the endpoint.
    pub ready: Gauge,
    /// Daily partitions of a partitioned outbox table that start after today (database clock):
    /// 0 means tomorrow's rows fall into the catch-all partition. Exported for partitioned tables
    /// only.
    pub partitions_ahead: Family<TableLabel, Gauge>,
    /// Checkpoint saves that failed (sled: disk full, unwritable directory) (alert).
    pub checkpoint_save_errors: Counter,
    /// Messages ever moved to each watched consumer group's dead-letter queue (alert on growth;
    /// see [`crate::operate::dead_letters`]).
    pub dlq_received: Family<GroupLabel, Gauge>,
    /// Messages each watched group's dead-letter queue stores now.
    pub dlq_messages: Family<GroupLabel, Gauge>,
    /// Reads of the dead-letter queues that failed.
    pub dlq_read_errors: Counter,
}

impl RelayMetrics {
    /// Every metric, registered group by group in the order `/metrics` shows them.
    fn new() -> Self {
        let mut registry = Registry::with_prefix("outbox");
        let metrics = Self::unregistered();
        metrics.register_outcomes(&mut registry);
        metrics.register_leadership(&mut registry);
        metrics.register_sends(&mut registry);
        metrics.register_stream(&mut registry);
        metrics.register_key_order(&mut registry);
        metrics.register_shards_and_topics(&mut registry);
        metrics.register_tables(&mut registry);
        metrics.register_upkeep(&mut registry);
        metrics.register_dead_letters(&mut registry);
        RelayMetrics {
            registry,
            ..metrics
        }
    }

    /// Every metric at its start value, registered nowhere yet (its `registry` is a placeholder
    /// that [`Self::new`] replaces).
    fn unregistered() -> Self {
        RelayMetrics {
            events_sent: Counter::default(),
            events_failed: Counter::default(),
            rows_swept: Counter::default(),
            leases_recovered: Counter::default(),
            binlog_position_lost: Counter::default(),
            leader: Gauge::default(),
            leadership_ended: Family::default(),
            send_errors: Family::default(),
            retries: Counter::default(),
            commit_to_sent: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            stage_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_1, 2.0, 18))
            }),
            binlog_lag_seconds: Gauge::default(),
            checkpoint_age_seconds: Gauge::default(),
            xa_prepared_transactions: Gauge::default(),
            xa_parked: Counter::default(),
            catch_up_found_stored: Counter::default(),
            catch_up_tail_read_seconds: Counter::default(),
            xa_prepared_since: Family::default(),
            unclassified_errors: Counter::default(),
            keys_held_for_order: Gauge::default(),
            key_order_checks: Family::default(),
            binlog_behind_transactions: Gauge::default(),
            binlog_behind_bytes: Gauge::default(),
            shard_queue_depth: Family::default(),
            topic_stalled_since: Family::default(),
            topic_held_events: Family::default(),
            events_parked: Family::default(),
            oldest_pending_seconds: Family::default(),
            pending: Family::default(),
            sending: Family::default(),
            failed: Family::default(),
            ready: Gauge::default(),
            partitions_ahead: Family::default(),
            checkpoint_save_errors: Counter::default(),
            dlq_received: Family::default(),
            dlq_messages: Family::default(),
            dlq_read_errors: Counter::default(),
            registry: Registry::default(),
        }
    }

    /// Counters of what became of rows (sent, failed, swept, leases recovered) and of restarts
    /// that lost the binlog position.
    fn register_outcomes(&self, registry: &mut Registry) {
        registry.register(
            "events_sent",
            "Events published with SEND_OK and marked SENT",
            self.events_sent.clone(),
        );
        registry.register(
            "events_failed",
            "Events marked FAILED (they need an operator: see last_error)",
            self.events_failed.clone(),
        );
        registry.register(
            "rows_swept",
            "PENDING rows the sweeper claimed beside the stream",
            self.rows_swept.clone(),
        );
        registry.register(
            "leases_recovered",
            "SENDING rows whose lease expired and went back to PENDING",
            self.leases_recovered.clone(),
        );
        registry.register(
            "binlog_position_lost",
            "Restarts from the oldest binlog because the checkpoint was purged from the server",
            self.binlog_position_lost.clone(),
        );
    }

    /// Whether this instance leads, and why its leaderships ended (each reason at 0 from the
    /// start).
    fn register_leadership(&self, registry: &mut Registry) {
        registry.register(
            "leader",
            "1 while this instance streams the binlog as the leader",
            self.leader.clone(),
        );
        register_at_zero(
            registry,
            "leadership_ended",
            "Leaderships of this instance that ended while it streamed, by reason (superseded and mirror_refused: another instance led at the same time)",
            &self.leadership_ended,
            LeadershipEnd::ALL.map(|reason| LeadershipEnd { reason }),
        );
    }

    /// Send errors (each class at 0 from the start), retries, and how long events take to be sent:
    /// every stage's histogram exists before its first observation.
    fn register_sends(&self, registry: &mut Registry) {
        register_at_zero(
            registry,
            "send_errors",
            "Failed send attempts by class (retryable, rejected or unauthorized)",
            &self.send_errors,
            ErrorClass::ALL.map(|class| ErrorClass { class }),
        );
        registry.register(
            "send_retries",
            "Sends retried after a retryable error",
            self.retries.clone(),
        );
        registry.register(
            "commit_to_sent_seconds",
            "Outbox row created to recorded SENT (after SEND_OK), database clock; a sample of up to 50 rows of one marking batch a second",
            self.commit_to_sent.clone(),
        );
        for stage in stages::StageLabel::ALL {
            drop(
                self.stage_seconds
                    .get_or_create(&stages::StageLabel { stage }),
            );
        }
        registry.register(
            "stage_seconds",
            "Each step of a SENT event through the relay (read_to_dispatched, dispatched_to_sent, sent_to_ack, ack_to_marked), relay clock",
            self.stage_seconds.clone(),
        );
    }

    /// The binlog stream: how far behind it is, the prepared XA transactions it holds, and its
    /// failed rounds.
    fn register_stream(&self, registry: &mut Registry) {
        registry.register(
            "binlog_lag_seconds",
            "Age of the newest binlog event read (0 when the stream is caught up)",
            self.binlog_lag_seconds.clone(),
        );
        registry.register(
            "binlog_behind_transactions",
            "Transactions between the mirrored checkpoint and the server's end of binlog",
            self.binlog_behind_transactions.clone(),
        );
        registry.register(
            "binlog_behind_bytes",
            "Bytes between the mirrored checkpoint and the server's end of binlog (same file only)",
            self.binlog_behind_bytes.clone(),
        );
        registry.register(
            "checkpoint_age_seconds",
            "Seconds since the checkpoint last moved while events were in flight (0 when idle)",
            self.checkpoint_age_seconds.clone(),
        );
        registry.register(
            "xa_prepared_transactions",
            "Prepared XA transactions the stream holds until XA COMMIT or XA ROLLBACK (the checkpoint stays below the oldest)",
            self.xa_prepared_transactions.clone(),
        );
        registry.register(
            "xa_prepared_since_seconds",
            "When (Unix seconds) the stream read the prepare of an XA transaction (label xid, as XA RECOVER shows it) that has no outcome yet; gone at its XA COMMIT or XA ROLLBACK",
            self.xa_prepared_since.clone(),
        );
        registry.register(
            "xa_parked",
            "Prepared XA transactions held for relay.park_prepared_after, then parked: the checkpoint passes them and the sweeper sends their events at XA COMMIT",
            self.xa_parked.clone(),
        );
        registry.register(
            "catch_up_found_stored",
            "Events a starting relay (restart or takeover) found stored on the broker but not recorded SENT, and recorded SENT with the stored message id instead of sending them again",
            self.catch_up_found_stored.clone(),
        );
        registry.register(
            "catch_up_tail_read_seconds",
            "Time a starting relay spent reading back the topics' tails (see relay.takeover_read_limit)",
            self.catch_up_tail_read_seconds.clone(),
        );
        registry.register(
            "unclassified_errors",
            "Failed relay rounds whose error is neither a lost connection nor a known configuration error (retried, logged at ERROR): report them",
            self.unclassified_errors.clone(),
        );
    }

    /// What the key-order guard holds and asks (each kind of question at 0 from the start).
    fn register_key_order(&self, registry: &mut Registry) {
        registry.register(
            "keys_held_for_order",
            "Keys whose streamed events wait until an older row of the key that the stream did not read (a purged binlog, a row written without binlog, a row put back) is sent",
            self.keys_held_for_order.clone(),
        );
        register_at_zero(
            registry,
            "key_order_checks",
            "Dispatcher batches of one table by what the key-order guard asked the database first: none (every waiting row of the batch's topics up to the highest id read is the stream's own), gap (only the ids the stream skipped), keys (the older waiting rows of each key of a topic not known clean)",
            &self.key_order_checks,
            KeyOrderAsked::ALL.map(|asked| KeyOrderAsked { asked }),
        );
    }

    /// What waits in the shards' inputs, and what a stalled topic holds or parks.
    fn register_shards_and_topics(&self, registry: &mut Registry) {
        registry.register(
            "shard_queue_depth",
            "Events waiting in each ordered sender's input",
            self.shard_queue_depth.clone(),
        );
        registry.register(
            "topic_stalled_since_seconds",
            "When (Unix seconds) a topic stopped accepting the relay's events, 0 once it accepts them again: only its keys wait meanwhile",
            self.topic_stalled_since.clone(),
        );
        registry.register(
            "topic_held_events",
            "Events of a stalled topic held in memory to be retried (bounded: later ones are parked)",
            self.topic_held_events.clone(),
        );
        registry.register(
            "events_parked",
            "Streamed events of a stalled topic left PENDING for the sweeper, which sends them in key order once the topic accepts events",
            self.events_parked.clone(),
        );
    }

    /// Each outbox table's rows by status and its oldest PENDING row's age.
    fn register_tables(&self, registry: &mut Registry) {
        registry.register(
            "oldest_pending_seconds",
            "Age of the oldest PENDING outbox row (0 when none): alert when it grows",
            self.oldest_pending_seconds.clone(),
        );
        registry.register("pending_rows", "Outbox rows PENDING", self.pending.clone());
        registry.register(
            "sending_rows",
            "Outbox rows SENDING (claimed under a lease)",
            self.sending.clone(),
        );
        registry.register(
            "failed_rows",
            "Outbox rows FAILED (kept for an operator)",
            self.failed.clone(),
        );
    }

    /// Readiness, and what keeps the relay able to run: partitions ahead, checkpoint saves.
    fn register_upkeep(&self, registry: &mut Registry) {
        registry.register(
            "ready",
            "1 while this instance is ready (/readyz answers 200), else 0",
            self.ready.clone(),
        );
        registry.register(
            "partitions_ahead",
            "Daily partitions of a partitioned outbox table that start after today (0: tomorrow's rows land in the catch-all partition)",
            self.partitions_ahead.clone(),
        );
        registry.register(
            "checkpoint_save_errors",
            "Checkpoint saves to relay.checkpoint_dir that failed (disk full, unwritable directory): /readyz is unready until a save works, and the relay stops if saves keep failing",
            self.checkpoint_save_errors.clone(),
        );
    }

    /// The watched consumer groups' dead-letter queues, and failed reads of them.
    fn register_dead_letters(&self, registry: &mut Registry) {
        registry.register(
            "dlq_received",
            "Messages ever moved to the dead-letter queue (%DLQ%<group>) of each consumer group in rocketmq.dead_letter_groups, from the broker's offsets: alert when it grows",
            self.dlq_received.clone(),
        );
        registry.register(
            "dlq_messages",
            "Messages the dead-letter queue of each consumer group in rocketmq.dead_letter_groups stores now",
            self.dlq_messages.clone(),
        );
        registry.register(
            "dlq_read_errors",
            "Reads of the watched dead-letter queues that failed (the dlq gauges keep their last values)",
            self.dlq_read_errors.clone(),
        );
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        self.ready.set(i64::from(health().readiness().ready));
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

/// Registers the counter `family` with a series at 0 for each of `labels`, known in advance
/// (see [`ErrorClass::ALL`] for why).
fn register_at_zero<L>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    family: &Family<L, Counter>,
    labels: impl IntoIterator<Item = L>,
) where
    L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
{
    for label in labels {
        drop(family.get_or_create(&label));
    }
    registry.register(name, help, family.clone());
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
            text.contains(r#"outbox_leadership_ended_total{reason="superseded"} 0"#),
            "{text}"
        );
        assert!(text.contains("outbox_ready 0"), "not serving yet: {text}");
        assert!(
            text.contains("outbox_binlog_position_lost_total 0"),
            "{text}"
        );
        assert!(
            text.contains("outbox_checkpoint_save_errors_total 0"),
            "{text}"
        );
    }

    #[test]
    fn every_send_error_class_is_exported_at_zero_before_any_error() {
        let metrics = RelayMetrics::new();
        let text = metrics.render();
        for class in ErrorClass::ALL {
            let series = format!("outbox_send_errors_total{{class=\"{class}\"}} 0");
            assert!(text.contains(&series), "{series} in {text}");
        }
        metrics
            .send_errors
            .get_or_create(&ErrorClass {
                class: "unauthorized",
            })
            .inc();
        let text = metrics.render();
        assert!(
            text.contains("outbox_send_errors_total{class=\"unauthorized\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("outbox_send_errors_total{class=\"retryable\"} 0"),
            "{text}"
        );
    }
}
