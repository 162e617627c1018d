//! The queue list a topic's keys are hashed over.
//!
//! Guarantee (the default, `rocketmq.reroute_on_broker_loss = false`): losing a broker group
//! moves no key to another queue. The list holds every queue of every broker group seen serving
//! the topic in this process, in the order RocketMQ's own producers list them (groups by name,
//! queue ids in order), so while every group is up a key goes to the queue Java's
//! `SelectMessageQueueByHash` picks. A group that is *unavailable* — no longer registered with
//! the name server (killed, stopped, cut off) or registered without its master — keeps its place
//! in the list: sends to its queues fail as retryable, so its keys wait for it (bounded: the
//! topic's lanes and parking) while the other queues' keys go on.
//!
//! A group that is registered with its master but has offered the topic no writable queue for
//! [`LEAVE_AFTER`] (the topic deleted there, the group made read-only to drain it before it is
//! retired) leaves the list, and so does a changed queue count: those are an operator's
//! deliberate changes, which move keys for RocketMQ's own producers too; each is logged at WARN.
//! Until then its keys wait as for an unavailable group: a broker that is starting again
//! registers before its route shows the topic's queues, and must not move keys meanwhile.
//!
//! The book is kept beyond the process by a [`QueueStore`] (the relay's: `outbox_topic_queues`,
//! [`super::queue_table`]): a topic's remembered groups are read before its first route is
//! used, so an instance that starts, or takes over, while a group is down keeps that group's
//! keys waiting on their queues too; each change of a topic's groups is saved.
//!
//! With `reroute_on_broker_loss = true` the list is the live route: a lost group's keys move
//! to the other groups' queues at once, and a consumer may then read a key's newer events (on
//! the new queue) before its older ones (on the lost group's queue, once it returns).

use rocketmq_model::common::message::message_queue::MessageQueue;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A topic's broker groups and their write queue counts, as a [`QueueStore`] keeps them.
pub type Groups = BTreeMap<String, i32>;

/// What a [`QueueStore`] call returns.
pub type StoreFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Keeps each topic's groups beyond this process. Errors are the store's to report: a store
/// that cannot answer returns nothing remembered, and the book goes on in memory.
pub trait QueueStore: Send + Sync {
    /// The groups remembered for `topic` (empty when none or on an error).
    fn load<'a>(&'a self, topic: &'a str) -> StoreFuture<'a, Groups>;
    /// Remembers `groups` as `topic`'s, in place of what was.
    fn save<'a>(&'a self, topic: &'a str, groups: &'a Groups) -> StoreFuture<'a, ()>;
}

/// How long a registered group must offer a topic no writable queue before it leaves the
/// topic's list (and its keys move).
pub(super) const LEAVE_AFTER: Duration = Duration::from_secs(30);

/// A topic's queues as keys are hashed over them, and the groups among them that cannot take a
/// send now.
#[derive(Debug, Default)]
pub(super) struct TopicQueues {
    pub(super) list: Vec<MessageQueue>,
    /// Groups of `list` missing from the live route: sends to their queues wait.
    pub(super) lost: HashSet<String>,
}

impl TopicQueues {
    /// The queue at `index` if it can take a send now; else why not.
    pub(super) fn writable(&self, topic: &str, index: usize) -> Result<&MessageQueue, String> {
        let queue = self
            .list
            .get(index)
            .ok_or_else(|| format!("topic {topic} has fewer queues than before; re-routing"))?;
        if self.lost.contains(queue.broker_name().as_str()) {
            return Err(format!(
                "queue {} of topic {topic} is on broker group {}, which is unavailable (not \
                 registered with the name server, or without its master): the keys of that queue \
                 wait for it, the others go on (`rocketmq.reroute_on_broker_loss = true` sends \
                 them to the other groups' queues instead)",
                queue.queue_id(),
                queue.broker_name()
            ));
        }
        Ok(queue)
    }
}

/// The queue lists of the topics this process sends to (see the module documentation).
#[derive(Debug)]
pub(super) struct QueueBook {
    reroute: bool,
    /// Per topic, per broker group seen serving it: its write queue count, and whether it is
    /// unavailable now.
    topics: Mutex<HashMap<String, BTreeMap<String, Group>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Group {
    queues: i32,
    lost: bool,
    /// Since when it has been registered with its master without writable queues of the topic.
    leaving_since: Option<Instant>,
}

impl QueueBook {
    pub(super) fn new(reroute_on_broker_loss: bool) -> Self {
        QueueBook {
            reroute: reroute_on_broker_loss,
            topics: Mutex::default(),
        }
    }

    /// Whether a key keeps its queue while a broker group is lost.
    pub(super) fn stable(&self) -> bool {
        !self.reroute
    }

    /// Whether `topic` has a list in this process yet (else its remembered groups are
    /// [`QueueBook::recall`]ed first).
    pub(super) fn knows(&self, topic: &str) -> bool {
        self.reroute
            || self
                .topics
                .lock()
                .expect("not poisoned")
                .contains_key(topic)
    }

    /// Takes `remembered` (from a [`QueueStore`]) as `topic`'s groups seen so far; the next
    /// [`QueueBook::update`] sorts them into up, unavailable and gone.
    pub(super) fn recall(&self, topic: &str, remembered: Groups) {
        if self.reroute || remembered.is_empty() {
            return;
        }
        let mut topics = self.topics.lock().expect("not poisoned");
        let groups = topics.entry(topic.to_string()).or_default();
        for (name, queues) in remembered {
            groups.entry(name).or_insert(Group {
                queues,
                lost: false,
                leaving_since: None,
            });
        }
    }

    /// `topic`'s groups with their queue counts, as a [`QueueStore`] keeps them.
    pub(super) fn groups(&self, topic: &str) -> Groups {
        let topics = self.topics.lock().expect("not poisoned");
        topics.get(topic).map_or_else(Groups::new, |groups| {
            groups.iter().map(|(n, g)| (n.clone(), g.queues)).collect()
        })
    }

    /// The groups remembered for `topic` that `live` (its writable queues now) lacks: the caller
    /// asks the name server which of them are registered with their master (they left the
    /// topic on purpose) before [`QueueBook::update`].
    pub(super) fn missing(&self, topic: &str, live: &[MessageQueue]) -> Vec<String> {
        if self.reroute {
            return Vec::new();
        }
        let live = groups_of(live);
        let topics = self.topics.lock().expect("not poisoned");
        topics.get(topic).map_or_else(Vec::new, |groups| {
            groups
                .keys()
                .filter(|g| !live.contains_key(g.as_str()))
                .cloned()
                .collect()
        })
    }

    /// Records `live`, `topic`'s writable queues `now`, and returns the list keys are hashed
    /// over. `left`: groups missing from `live` that are registered with their master (they
    /// leave the topic once that has lasted [`LEAVE_AFTER`]); any other missing group is
    /// unavailable and keeps its queues.
    pub(super) fn update(
        &self,
        topic: &str,
        live: &[MessageQueue],
        left: &HashSet<String>,
        now: Instant,
    ) -> TopicQueues {
        if self.reroute {
            return TopicQueues {
                list: live.to_vec(),
                lost: HashSet::new(),
            };
        }
        let live = groups_of(live);
        let mut topics = self.topics.lock().expect("not poisoned");
        let groups = topics.entry(topic.to_string()).or_default();
        for (name, &queues) in &live {
            let seen = Group {
                queues,
                lost: false,
                leaving_since: None,
            };
            match groups.insert(name.to_string(), seen) {
                Some(was) if was.queues != queues => tracing::warn!(%topic, group = %name,
                    from = was.queues, to = queues,
                    "broker group {name} now has {queues} write queues of {topic}: keys move \
                     between its queues as they do for RocketMQ's own producers"),
                Some(was) if was.lost => tracing::info!(%topic, group = %name,
                    "broker group {name} is back: the keys of its queues of {topic} go on"),
                _ => {}
            }
        }
        groups.retain(|name, group| {
            if live.contains_key(name.as_str()) {
                return true;
            }
            if !left.contains(name) {
                group.leaving_since = None;
            } else if now >= *group.leaving_since.get_or_insert(now) + LEAVE_AFTER {
                tracing::warn!(%topic, group = %name,
                    "broker group {name} is up but has offered no writable queue of {topic} for \
                     {LEAVE_AFTER:?} (the topic deleted there, or the group made read-only): its \
                     keys move to the other groups' queues");
                return false;
            }
            if !group.lost {
                group.lost = true;
                tracing::warn!(%topic, group = %name,
                    "broker group {name} is unavailable: the keys of its queues of {topic} wait \
                     for it (they keep their queue), the other keys go on");
            }
            true
        });
        let mut list = Vec::new();
        let mut lost = HashSet::new();
        for (name, group) in groups.iter() {
            list.extend(
                (0..group.queues).map(|q| MessageQueue::from_parts(topic, name.as_str(), q)),
            );
            if group.lost {
                lost.insert(name.clone());
            }
        }
        TopicQueues { list, lost }
    }
}

/// Write queue count per broker group of a route's queues.
fn groups_of(queues: &[MessageQueue]) -> BTreeMap<&str, i32> {
    let mut groups = BTreeMap::new();
    for queue in queues {
        *groups.entry(queue.broker_name().as_str()).or_insert(0) += 1;
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(groups: &[(&str, i32)]) -> Vec<MessageQueue> {
        groups
            .iter()
            .flat_map(|(g, n)| (0..*n).map(move |q| MessageQueue::from_parts("t", *g, q)))
            .collect()
    }

    fn names(queues: &TopicQueues) -> Vec<String> {
        queues
            .list
            .iter()
            .map(|q| format!("{}:{}", q.broker_name(), q.queue_id()))
            .collect()
    }

    #[test]
    fn a_lost_group_keeps_its_queues_and_only_they_wait() {
        let book = QueueBook::new(false);
        let both = route(&[("broker-a", 2), ("broker-b", 2)]);
        let now = Instant::now();
        let all = book.update("t", &both, &HashSet::new(), now);
        assert_eq!(
            names(&all),
            ["broker-a:0", "broker-a:1", "broker-b:0", "broker-b:1"]
        );
        assert!(all.writable("t", 3).is_ok());

        // broker-b is killed: the name server routes broker-a's queues only.
        let a_only = route(&[("broker-a", 2)]);
        assert_eq!(book.missing("t", &a_only), ["broker-b"]);
        let kept = book.update("t", &a_only, &HashSet::new(), now);
        assert_eq!(names(&kept), names(&all), "no key changes queue");
        assert!(kept.writable("t", 1).is_ok(), "broker-a's keys go on");
        let waiting = kept.writable("t", 2).unwrap_err();
        assert!(waiting.contains("broker-b") && waiting.contains("reroute_on_broker_loss"));

        // Back: every queue takes sends again.
        let back = book.update("t", &both, &HashSet::new(), now);
        assert!(back.lost.is_empty() && back.writable("t", 2).is_ok());
        assert_eq!(names(&back), names(&all));
    }

    #[test]
    fn a_group_that_left_the_topic_on_purpose_leaves_the_list_once_that_lasts() {
        let book = QueueBook::new(false);
        let start = Instant::now();
        let both = route(&[("broker-a", 2), ("broker-b", 2)]);
        book.update("t", &both, &HashSet::new(), start);
        let a_only = route(&[("broker-a", 2)]);
        let left = HashSet::from(["broker-b".to_string()]);
        // Registered without the topic's queues (a restarting broker looks so for a moment):
        // its keys wait, they do not move.
        let waiting = book.update("t", &a_only, &left, start);
        assert_eq!(waiting.list.len(), 4);
        assert!(waiting.writable("t", 2).is_err());
        let waiting = book.update("t", &a_only, &left, start + LEAVE_AFTER / 2);
        assert_eq!(waiting.list.len(), 4);
        // Back within the time: nothing moved.
        let back = book.update("t", &both, &HashSet::new(), start + LEAVE_AFTER);
        assert_eq!(back.list.len(), 4);
        // Gone for good: it leaves once that has lasted LEAVE_AFTER.
        let later = start + 2 * LEAVE_AFTER;
        book.update("t", &a_only, &left, later);
        let moved = book.update("t", &a_only, &left, later + LEAVE_AFTER);
        assert_eq!(names(&moved), ["broker-a:0", "broker-a:1"]);
        assert!(moved.lost.is_empty());
        assert!(book.missing("t", &a_only).is_empty());
    }

    #[test]
    fn a_group_remembered_from_an_earlier_process_keeps_its_queues_while_down() {
        // An instance starts while broker-b is down: the name server routes broker-a only,
        // and the store remembers both.
        let book = QueueBook::new(false);
        assert!(!book.knows("t"));
        book.recall(
            "t",
            Groups::from([("broker-a".into(), 2), ("broker-b".into(), 2)]),
        );
        let a_only = route(&[("broker-a", 2)]);
        assert_eq!(book.missing("t", &a_only), ["broker-b"]);
        let queues = book.update("t", &a_only, &HashSet::new(), Instant::now());
        assert_eq!(
            names(&queues),
            ["broker-a:0", "broker-a:1", "broker-b:0", "broker-b:1"],
            "broker-b's keys keep their queues"
        );
        assert!(queues.writable("t", 2).is_err() && queues.writable("t", 0).is_ok());
        assert_eq!(book.groups("t")["broker-b"], 2);
    }

    #[test]
    fn rerouting_follows_the_live_route() {
        let book = QueueBook::new(true);
        let now = Instant::now();
        let both = route(&[("broker-a", 2), ("broker-b", 2)]);
        book.update("t", &both, &HashSet::new(), now);
        let a_only = route(&[("broker-a", 2)]);
        assert!(book.missing("t", &a_only).is_empty());
        assert_eq!(
            names(&book.update("t", &a_only, &HashSet::new(), now)),
            ["broker-a:0", "broker-a:1"]
        );
        assert!(!book.stable());
    }
}
