//! Stalled topics: the topics whose events cannot be sent now, shared by the shards that hold
//! them, the dispatcher that parks their later events and the sweeper that leaves them alone.
//!
//! A topic stalls when a send to it, or a look-up of its route, fails for a reason worth
//! retrying (a read-only or deleted topic, a frozen or lost broker group, an account refused on
//! it): the shard moves that topic's events into a *lane* of their own and goes on with the
//! other topics (see `shard::lane`). The topic stays stalled while any shard has a lane for it,
//! and recovers when the last lane has sent (or, per the retry policy, FAILED) what it held.
//!
//! Guarantee: only the stalled topic's events wait. Memory stays bounded however long the stall
//! lasts: once a topic has been stalled for `park_after`, the stream *parks* its new events
//! instead of handing them to the shards — they are PENDING rows in the outbox table already, so
//! the stream only lets its checkpoint pass them — and the sweeper, which leaves a stalled topic's
//! rows alone, sends them in key order once the topic accepts events again.

use crate::metrics::TopicLabel;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The stalled topics of one send stage (see the module documentation).
#[derive(Debug)]
pub struct Stalls {
    /// `None`: nothing parks a stalled topic's events (no sweeper would send them), so its
    /// lanes stop growing at [`LANE_LIMIT`] by making their shard wait.
    park_after: Option<Duration>,
    topics: Mutex<HashMap<String, Stall>>,
}

#[derive(Debug)]
struct Stall {
    since: Instant,
    /// The shards with a lane for the topic, and how many events each holds there.
    lanes: HashMap<u32, usize>,
    /// Whether the stream has started parking its events (logged once).
    parking: bool,
}

impl Default for Stalls {
    fn default() -> Self {
        Stalls::without_parking()
    }
}

/// Events one shard's lane of one topic holds before the topic's new streamed events are parked
/// at once (whatever `park_after` says), or, where nothing parks, before the shard waits.
pub const LANE_LIMIT: usize = 512;

impl Stalls {
    /// No topic stalled; a stalled topic's streamed events are parked once it has been stalled
    /// for `park_after` (or one of its lanes holds [`LANE_LIMIT`] events).
    pub fn new(park_after: Duration) -> Self {
        Stalls {
            park_after: Some(park_after),
            topics: Mutex::default(),
        }
    }

    /// Stalls whose events are never parked (no sweeper runs to send them later).
    pub fn without_parking() -> Self {
        Stalls {
            park_after: None,
            topics: Mutex::default(),
        }
    }

    /// Whether a stalled topic's streamed events are parked (else its lanes are bounded by
    /// making their shard wait).
    pub fn parks(&self) -> bool {
        self.park_after.is_some()
    }

    fn topics(&self) -> std::sync::MutexGuard<'_, HashMap<String, Stall>> {
        self.topics.lock().expect("not poisoned")
    }

    /// `shard` holds `held` events of `topic` in a lane (opened, or grown or shrunk).
    pub(crate) fn holding(&self, topic: &str, shard: u32, held: usize) {
        let mut topics = self.topics();
        let stall = topics.entry(topic.to_string()).or_insert_with(|| {
            tracing::warn!(%topic, "topic {topic} does not accept events now: its events wait \
                (in memory, then PENDING in the outbox), other topics' events go on");
            let since = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            gauge_since(topic).set(since.as_secs_f64());
            Stall {
                since: Instant::now(),
                lanes: HashMap::new(),
                parking: false,
            }
        });
        stall.lanes.insert(shard, held);
        held_gauge(topic).set(stall.lanes.values().sum::<usize>() as i64);
    }

    /// `shard` closed its lane of `topic`: everything it held there has its outcome.
    pub(crate) fn closed(&self, topic: &str, shard: u32) {
        let mut topics = self.topics();
        let Some(stall) = topics.get_mut(topic) else {
            return;
        };
        stall.lanes.remove(&shard);
        held_gauge(topic).set(stall.lanes.values().sum::<usize>() as i64);
        if stall.lanes.is_empty() {
            let stall = topics.remove(topic).expect("present");
            gauge_since(topic).set(0.0);
            tracing::info!(%topic, stalled_for = ?stall.since.elapsed(),
                "topic {topic} accepts events again");
        }
    }

    /// Whether `topic` is stalled now.
    #[cfg(test)]
    pub fn is_stalled(&self, topic: &str) -> bool {
        self.topics().contains_key(topic)
    }

    /// The stalled topics (the sweeper claims none of their rows meanwhile).
    pub fn stalled_topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = self.topics().keys().cloned().collect();
        topics.sort();
        topics
    }

    /// The topics whose new streamed events are parked now: stalled for `park_after` or longer,
    /// or with a lane holding [`LANE_LIMIT`] events.
    /// The dispatcher takes this once per batch, so every event of one batch is treated alike.
    pub fn parking(&self) -> HashSet<String> {
        let Some(park_after) = self.park_after else {
            return HashSet::new();
        };
        let mut topics = self.topics();
        let mut parking = HashSet::new();
        for (topic, stall) in topics.iter_mut() {
            let full = stall.lanes.values().any(|&held| held >= LANE_LIMIT);
            if stall.since.elapsed() < park_after && !full {
                continue;
            }
            if !stall.parking {
                stall.parking = true;
                tracing::warn!(%topic, stalled_for = ?stall.since.elapsed(),
                    "topic {topic} has not accepted events for {:?}: its new events are left \
                     PENDING in the outbox (parked) and the sweeper sends them, in key order, once \
                     it accepts events again", park_after);
            }
            parking.insert(topic.clone());
        }
        parking
    }

    /// Events held in memory for `topic`, in every shard's lane.
    #[cfg(test)]
    pub fn held(&self, topic: &str) -> usize {
        self.topics()
            .get(topic)
            .map_or(0, |stall| stall.lanes.values().sum())
    }
}

/// Counts a streamed event of `topic` parked (left PENDING for the sweeper).
pub fn count_parked(topic: &str) {
    crate::metrics::relay()
        .events_parked
        .get_or_create(&TopicLabel {
            topic: topic.to_string(),
        })
        .inc();
}

fn gauge_since(
    topic: &str,
) -> prometheus_client::metrics::gauge::Gauge<f64, std::sync::atomic::AtomicU64> {
    crate::metrics::relay()
        .topic_stalled_since
        .get_or_create(&TopicLabel {
            topic: topic.to_string(),
        })
        .clone()
}

fn held_gauge(topic: &str) -> prometheus_client::metrics::gauge::Gauge {
    crate::metrics::relay()
        .topic_held_events
        .get_or_create(&TopicLabel {
            topic: topic.to_string(),
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_is_stalled_while_any_shard_holds_a_lane_for_it() {
        let stalls = Stalls::new(Duration::ZERO);
        stalls.holding("t", 0, 3);
        stalls.holding("t", 1, 2);
        assert!(stalls.is_stalled("t"));
        assert!(!stalls.is_stalled("u"));
        assert_eq!(stalls.held("t"), 5);
        stalls.closed("t", 0);
        assert!(stalls.is_stalled("t"), "shard 1 still holds it");
        stalls.closed("t", 1);
        assert!(!stalls.is_stalled("t"));
        assert!(stalls.stalled_topics().is_empty());
    }

    #[test]
    fn new_events_are_parked_only_after_the_hold() {
        let stalls = Stalls::new(Duration::from_secs(3600));
        stalls.holding("t", 0, 1);
        assert!(stalls.parking().is_empty(), "not stalled for an hour yet");
        stalls.holding("t", 1, LANE_LIMIT);
        assert_eq!(stalls.parking().len(), 1, "a full lane parks at once");
        let stalls = Stalls::without_parking();
        stalls.holding("t", 0, LANE_LIMIT);
        assert!(
            stalls.parking().is_empty(),
            "nothing parks without a sweeper"
        );
        let stalls = Stalls::new(Duration::ZERO);
        stalls.holding("t", 0, 1);
        assert_eq!(stalls.parking(), HashSet::from(["t".to_string()]));
    }
}
