//! Stalled topics: the topics whose events cannot be sent now, shared by the shards that hold
//! them, the dispatcher that parks their later events and the sweeper that leaves them alone.
//!
//! A topic stalls when a send to it, or a look-up of its route, fails for a reason worth
//! retrying (a read-only or deleted topic, a frozen or lost broker group, an account refused on
//! it): the shard moves that topic's events into a *lane* of their own and goes on with the
//! other topics (see `shard::lane`). Where a key keeps its queue whatever the route says (the
//! RocketMQ sink's default, see `Sink::stable_queues`), a failed send stalls only its queue: the
//! lane holds the events bound for that queue, and the topic's other queues go on. The topic
//! (or queue) stays stalled while any shard has a lane for it, and recovers when the last lane
//! has sent (or, per the retry policy, FAILED) what it held.
//!
//! Guarantee: only the stalled topic's (or queue's) events wait, and nothing else waits for
//! them. Memory stays bounded however long the stall lasts, and the checkpoint is held back by a
//! stalled topic (or queue) for `park_after` (plus the attempt in progress then) at most: from
//! then on the stream *parks* the topic's (or queue's) new events instead of handing them to
//! the shards, and the lanes *release* the streamed events they hold (their acknowledgements given back, see
//! [`crate::event::Origin::release`]), keeping in memory only the batch they are retrying, as a
//! probe of whether the topic accepts events again (and claimed rows, which their leases
//! cover). Parked and released events are PENDING rows in the outbox table already, so the
//! stream only lets its checkpoint pass them; the sweeper, which leaves a stalled topic's rows
//! alone, sends them in key order once the topic accepts events again.

use super::released::ReleaseLog;
use crate::metrics::TopicLabel;
use crate::route::{index_for, java_string_hash};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The stalled topics of one send stage (see the module documentation).
#[derive(Debug)]
pub struct Stalls {
    /// `None`: nothing parks a stalled topic's events (no sweeper would send them), so its
    /// lanes stop growing at [`LANE_LIMIT`] by making their shard wait.
    park_after: Option<Duration>,
    topics: Mutex<HashMap<String, Stall>>,
    /// How many topics are stalled: a shard checks whether another shard has found an event's
    /// queue stalled only while this is not zero.
    stalled: AtomicUsize,
    /// Broker groups that do not answer (a send to one of their queues timed out or could not
    /// connect), with how many lanes found so.
    groups: Mutex<HashMap<String, usize>>,
    /// The streamed events the shards and lanes released, for the key-order guard.
    pub(crate) released: ReleaseLog,
}

#[derive(Debug)]
struct Stall {
    since: Instant,
    /// The lanes of the topic, and how many events each holds.
    lanes: HashMap<LaneId, usize>,
    /// Since when each queue (`None`: the whole topic) has been held by a lane without a
    /// break: a queue parks `park_after` into its own stall, so one whose lanes closed (it
    /// accepted events again) and that fails anew is not parked at once because another queue
    /// of its topic is still stalled.
    held_since: HashMap<Option<QueueIndex>, Instant>,
    /// Whether the stream has started parking its events (logged once).
    parking: bool,
}

/// One lane of a topic: its shard, and the queue whose events it holds (`None`: all of the
/// topic's events in that shard). A lane that takes over from one that is closing has the same
/// shard and queue, and another serial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaneId {
    pub shard: u32,
    pub queue: Option<QueueIndex>,
    serial: u64,
}

impl LaneId {
    /// A new lane of `shard` for `queue`.
    pub fn new(shard: u32, queue: Option<QueueIndex>) -> Self {
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        LaneId {
            shard,
            queue,
            serial,
        }
    }
}

/// A queue of a topic as keys are hashed over its queue list: the key with hash `h` goes to
/// `index_for(h, count)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QueueIndex {
    pub index: usize,
    pub count: usize,
}

impl QueueIndex {
    /// Whether the keys with hash `hash` go to this queue.
    fn holds(&self, hash: i32) -> bool {
        index_for(hash, self.count) == self.index
    }
}

impl Stall {
    /// When the events bound for `queue` are parked and the lanes holding them release what
    /// they hold: `park_after` into that queue's stall, or at once once a lane holds
    /// [`LANE_LIMIT`] events. While a lane of the whole topic is open (`queue` `None`: its
    /// route could not be looked up), the topic stalls as one: every queue parks `park_after`
    /// into the topic's oldest stall.
    fn parks_from(&self, queue: Option<QueueIndex>, park_after: Duration) -> Instant {
        if self.lanes.values().any(|&held| held >= LANE_LIMIT) {
            return self.since;
        }
        let since = match queue {
            Some(_) if !self.held_since.contains_key(&None) => self.held_since.get(&queue),
            _ => self.held_since.values().min(),
        };
        since.copied().unwrap_or(self.since) + park_after
    }

    /// Whether the events bound for `queue` park at `now` ([`Stall::parks_from`]).
    fn parks(&self, queue: Option<QueueIndex>, park_after: Duration, now: Instant) -> bool {
        self.parks_from(queue, park_after) <= now
    }

    /// The queues with a lane (none while a lane of the whole topic is open: it stalls as one).
    fn stalled_queues(&self) -> Option<impl Iterator<Item = QueueIndex> + '_> {
        (!self.held_since.contains_key(&None)).then(|| self.held_since.keys().flatten().copied())
    }

    /// Which of the topic's events park at `now`; `None`: none.
    fn parking_scope(&self, park_after: Duration, now: Instant) -> Option<Scope> {
        let Some(queues) = self.stalled_queues() else {
            return self.parks(None, park_after, now).then_some(Scope::Topic);
        };
        let queues: HashSet<QueueIndex> = queues
            .filter(|&q| self.parks(Some(q), park_after, now))
            .collect();
        (!queues.is_empty()).then_some(Scope::Queues(queues))
    }

    /// Whether the topic's events with key `biz_key` park at `now` (as [`Stall::parking_scope`]
    /// says, without building it: asked per event).
    fn parks_key(&self, biz_key: &str, park_after: Duration, now: Instant) -> bool {
        let Some(mut queues) = self.stalled_queues() else {
            return self.parks(None, park_after, now);
        };
        let hash = java_string_hash(biz_key);
        queues.any(|q| q.holds(hash) && self.parks(Some(q), park_after, now))
    }

    /// Which of the topic's events it holds back.
    fn scope(&self) -> Scope {
        let mut queues = HashSet::new();
        for lane in self.lanes.keys() {
            match lane.queue {
                None => return Scope::Topic,
                Some(queue) => queues.insert(queue),
            };
        }
        Scope::Queues(queues)
    }
}

/// A snapshot of what is stalled (or parked): whole topics, or some queues of a topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StalledSet {
    topics: HashMap<String, Scope>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Scope {
    Topic,
    Queues(HashSet<QueueIndex>),
}

impl Scope {
    /// Whether the topic's events with key `biz_key` are in it.
    fn contains(&self, biz_key: &str) -> bool {
        match self {
            Scope::Topic => true,
            Scope::Queues(queues) => {
                let hash = java_string_hash(biz_key);
                queues.iter().any(|q| q.holds(hash))
            }
        }
    }
}

impl StalledSet {
    pub fn is_empty(&self) -> bool {
        self.topics.is_empty()
    }

    /// Whether some of `topic`'s events are held back (the whole topic or some of its queues).
    pub(crate) fn topics_contain(&self, topic: &str) -> bool {
        self.topics.contains_key(topic)
    }

    /// Whether an event of `topic` with key `biz_key` is held back.
    pub fn contains(&self, topic: &str, biz_key: &str) -> bool {
        self.topics
            .get(topic)
            .is_some_and(|scope| scope.contains(biz_key))
    }

    /// The topics of which this set holds back something `earlier` did not (the topic, or
    /// more of its queues), sorted.
    pub(crate) fn grown_since(&self, earlier: &StalledSet) -> Vec<String> {
        let mut grown: Vec<String> = (self.topics.iter())
            .filter(|(topic, scope)| earlier.topics.get(*topic) != Some(scope))
            .map(|(topic, _)| topic.clone())
            .collect();
        grown.sort();
        grown
    }

    /// Every topic held back, whole or some of its queues, sorted.
    pub(crate) fn topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = self.topics.keys().cloned().collect();
        topics.sort();
        topics
    }

    /// The topics held back whole, sorted.
    #[cfg(any(test, feature = "test-utils"))]
    pub fn whole_topics(&self) -> Vec<String> {
        let mut topics: Vec<String> = self
            .topics
            .iter()
            .filter(|(_, scope)| **scope == Scope::Topic)
            .map(|(topic, _)| topic.clone())
            .collect();
        topics.sort();
        topics
    }
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
            stalled: AtomicUsize::new(0),
            groups: Mutex::default(),
            released: ReleaseLog::default(),
        }
    }

    /// Stalls whose events are never parked (no sweeper runs to send them later).
    pub fn without_parking() -> Self {
        Stalls {
            park_after: None,
            topics: Mutex::default(),
            stalled: AtomicUsize::new(0),
            groups: Mutex::default(),
            released: ReleaseLog::default(),
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

    /// The lane `lane` holds `held` events of `topic` (opened, or grown or shrunk).
    pub(crate) fn holding(&self, topic: &str, lane: LaneId, held: usize) {
        let mut topics = self.topics();
        let stall = topics.entry(topic.to_string()).or_insert_with(|| {
            tracing::warn!(%topic, "topic {topic} does not accept events now: its events wait \
                (in memory, then PENDING in the outbox), other topics' events go on");
            let since = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            gauge_since(topic).set(since.as_secs_f64());
            self.stalled.fetch_add(1, Ordering::SeqCst);
            Stall {
                since: Instant::now(),
                lanes: HashMap::new(),
                held_since: HashMap::new(),
                parking: false,
            }
        });
        stall.lanes.insert(lane, held);
        stall.held_since.entry(lane.queue).or_insert_with(Instant::now);
        held_gauge(topic).set(stall.lanes.values().sum::<usize>() as i64);
    }

    /// The lane `lane` of `topic` closed: everything it held has its outcome.
    pub(crate) fn closed(&self, topic: &str, lane: LaneId) {
        let mut topics = self.topics();
        let Some(stall) = topics.get_mut(topic) else {
            return;
        };
        stall.lanes.remove(&lane);
        if !stall.lanes.keys().any(|other| other.queue == lane.queue) {
            stall.held_since.remove(&lane.queue);
        }
        held_gauge(topic).set(stall.lanes.values().sum::<usize>() as i64);
        if stall.lanes.is_empty() {
            let stall = topics.remove(topic).expect("present");
            self.stalled.fetch_sub(1, Ordering::SeqCst);
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

    /// Whether any topic is stalled now (one atomic read).
    pub fn any(&self) -> bool {
        self.stalled.load(Ordering::SeqCst) > 0
    }

    /// Whether some shard holds `queue` of `topic` in a lane now: a send to it failed.
    pub(crate) fn queue_stalled(&self, topic: &str, queue: QueueIndex) -> bool {
        self.topics()
            .get(topic)
            .is_some_and(|stall| stall.lanes.keys().any(|lane| lane.queue == Some(queue)))
    }

    /// A lane opened because broker group `group` does not answer.
    pub(crate) fn group_stalled(&self, group: &str) {
        let mut groups = self.groups.lock().expect("not poisoned");
        *groups.entry(group.to_string()).or_default() += 1;
    }

    /// Such a lane closed.
    pub(crate) fn group_lane_closed(&self, group: &str) {
        let mut groups = self.groups.lock().expect("not poisoned");
        if let Some(lanes) = groups.get_mut(group) {
            *lanes -= 1;
            if *lanes == 0 {
                groups.remove(group);
            }
        }
    }

    /// Whether some lane holds `topic`'s events, or some broker group does not answer: only then
    /// can an event of `topic` be bound for a queue another lane found stalled.
    pub(crate) fn may_hold(&self, topic: &str) -> bool {
        self.topics().contains_key(topic) || !self.groups.lock().expect("not poisoned").is_empty()
    }

    /// Whether some lane holds events because broker group `group` does not answer.
    pub(crate) fn is_group_stalled(&self, group: &str) -> bool {
        self.groups
            .lock()
            .expect("not poisoned")
            .contains_key(group)
    }

    /// What is stalled now (the sweeper claims none of its rows meanwhile).
    pub fn stalled(&self) -> StalledSet {
        let topics = self.topics();
        StalledSet {
            topics: topics
                .iter()
                .map(|(topic, stall)| (topic.clone(), stall.scope()))
                .collect(),
        }
    }

    /// The stalled topics (or queues) whose new streamed events are parked now: stalled for
    /// `park_after` or longer, or with a lane holding [`LANE_LIMIT`] events.
    /// The dispatcher takes this once per batch, so every event of one batch is treated alike.
    pub fn parking(&self) -> StalledSet {
        let Some(park_after) = self.park_after else {
            return StalledSet::default();
        };
        let mut topics = self.topics();
        let mut parking = StalledSet::default();
        let now = Instant::now();
        for (topic, stall) in topics.iter_mut() {
            let Some(scope) = stall.parking_scope(park_after, now) else {
                continue;
            };
            if !stall.parking {
                stall.parking = true;
                tracing::warn!(%topic, stalled_for = ?stall.since.elapsed(),
                    "topic {topic} has not accepted events for {:?}: its new events, and those \
                     held in memory but one batch, are left PENDING in the outbox (parked), the \
                     checkpoint goes on past them, and the sweeper sends them, in key order, once \
                     it accepts events again", park_after);
            }
            parking.topics.insert(topic.clone(), scope);
        }
        parking
    }

    /// When the events a lane of `topic` for `queue` (`None`: the whole topic) holds in memory
    /// are to be released (see [`crate::event::Origin::release`]): when that queue (or the
    /// topic) has been stalled for `park_after`, or now if one of the topic's lanes holds
    /// [`LANE_LIMIT`] events; the moment its new streamed events are parked. `None` where
    /// nothing parks, or `topic` is not stalled.
    pub(crate) fn release_due(&self, topic: &str, queue: Option<QueueIndex>) -> Option<Instant> {
        let park_after = self.park_after?;
        Some(self.topics().get(topic)?.parks_from(queue, park_after))
    }

    /// Whether a streamed event of `topic` with key `biz_key` that reaches a shard now is to be
    /// released rather than held (its topic, or its queue, parks now): the dispatcher handed it
    /// on just before parking began.
    pub(crate) fn releases(&self, topic: &str, biz_key: &str) -> bool {
        let Some(park_after) = self.park_after else {
            return false;
        };
        let topics = self.topics();
        (topics.get(topic))
            .is_some_and(|stall| stall.parks_key(biz_key, park_after, Instant::now()))
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

/// How often a parked topic's failed attempts are logged: its probe's failures are otherwise
/// at debug (one per lane per attempt), and an operator would see nothing after the line that
/// says the topic parked, however long it stays so.
const STILL_PARKED_LOG_EVERY: Duration = Duration::from_secs(60);

/// A parked topic's attempt (the batch its lane keeps to learn when the topic accepts events
/// again) failed for `reason`: once a minute per topic, a WARN line says it is still parked
/// and why.
pub fn still_parked(topic: &str, reason: &str, delay: Duration) {
    static LINES: std::sync::LazyLock<crate::logging::Throttle> =
        std::sync::LazyLock::new(|| crate::logging::Throttle::new(STILL_PARKED_LOG_EVERY));
    if let Some(failures) = LINES.admit(topic) {
        tracing::warn!(%topic, %reason, failures_since_last_line = failures, next_attempt_in = ?delay,
            "topic {topic} still does not accept events: they wait PENDING in the outbox (never \
             FAILED for this) and go out in key order once it does");
    }
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
#[path = "stall_tests.rs"]
mod tests;
