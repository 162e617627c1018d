//! What a "no such topic" answer means. The client says the same thing for a topic nobody
//! created, for a topic whose only broker is down (a stopped broker unregisters from the name
//! server, and its topics look missing until it returns), and for a topic the cluster will
//! create on its first message (`autoCreateTopicEnable`, Apache's default).
//!
//! Guarantee: a missing topic is final (the event goes FAILED at once, contract 7) only when the
//! name server has no route for it, will not auto-create it, and no broker is missing: brokers
//! are registered, each group has its master, and every broker this process has seen is still
//! there. In any doubt it is retried under the retry policy, so an outage never fails events
//! before the policy's time.

use super::SendError;
use std::collections::HashSet;
use std::sync::Mutex;

/// The topic the brokers route when they auto-create topics: a send to an unknown topic is
/// routed by it, and the broker creates the topic.
pub(super) const AUTO_CREATE_TOPIC: &str = "TBW102";

/// What the name server says now, for one topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct NameServerView {
    /// Broker groups (`brokerName`) with a registered master.
    pub groups: HashSet<String>,
    /// Groups registered without a master (the master is down, a slave is left).
    pub groups_without_master: usize,
    /// The topic has a route.
    pub routed: bool,
    /// [`AUTO_CREATE_TOPIC`] has a route: some broker auto-creates topics.
    pub auto_create: bool,
}

/// The decision about a topic the client could not find.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Missing {
    /// Final: the event goes FAILED with this reason.
    Rejected(SendError),
    /// Not (yet) final: retried under the policy.
    Retry(SendError),
    /// The cluster creates it on the first message routed by the default topic.
    AutoCreate,
}

/// Topics and brokers seen by this process.
#[derive(Debug, Default)]
pub(super) struct ClusterMemory {
    known_topics: Mutex<HashSet<String>>,
    seen_groups: Mutex<HashSet<String>>,
}

impl ClusterMemory {
    /// `topic` had a route, served by `groups`.
    pub(super) fn routed(&self, topic: &str, groups: impl IntoIterator<Item = String>) {
        self.known_topics
            .lock()
            .expect("not poisoned")
            .insert(topic.to_string());
        self.seen_groups
            .lock()
            .expect("not poisoned")
            .extend(groups);
    }

    /// The verdict on "no such topic" for a topic that had a route in this process: retried
    /// (its broker restarting, the topic made read-only), whatever the name server says, so
    /// the name server need not be asked. `None` for a topic never routed here.
    pub(super) fn known(&self, topic: &str, reason: &str) -> Option<Missing> {
        let known = (self.known_topics.lock().expect("not poisoned")).contains(topic);
        known.then(|| {
            Missing::Retry(SendError::Retryable(format!(
                "topic {topic} had a route in this process (its broker restarting, or the \
                 topic not writable?); {reason}"
            )))
        })
    }

    /// The verdict on "no such topic" for `topic` (`reason` is the client's words), given
    /// what the name server says now (`view`; an error if it could not be asked).
    pub(super) fn verdict(
        &self,
        topic: &str,
        reason: &str,
        view: Result<NameServerView, String>,
    ) -> Missing {
        if let Some(known) = self.known(topic, reason) {
            return known;
        }
        let view = match view {
            Ok(view) => view,
            Err(e) => {
                return Missing::Retry(SendError::Retryable(format!(
                    "cannot ask the name server about {topic}: {e}"
                )))
            }
        };
        let mut seen = self.seen_groups.lock().expect("not poisoned");
        let gone: Vec<&String> = seen.difference(&view.groups).collect();
        let doubt = if view.routed {
            Some(format!(
                "the name server has a route for {topic}; the client's view was stale"
            ))
        } else if view.auto_create {
            None
        } else if view.groups.is_empty() {
            Some("no broker is registered with the name server (down?)".to_string())
        } else if !gone.is_empty() {
            Some(format!(
                "broker group(s) {gone:?} seen earlier are not registered now; {topic} may live there"
            ))
        } else if view.groups_without_master > 0 {
            Some(format!(
                "{} broker group(s) have no master registered; {topic} may live there",
                view.groups_without_master
            ))
        } else {
            seen.extend(view.groups.iter().cloned());
            return Missing::Rejected(SendError::Rejected(format!(
                "no such topic {topic}: the name server has no route for it and no broker is \
                 missing (create the topic, then `outbox-relay retry` the FAILED rows); {reason}"
            )));
        };
        seen.extend(view.groups.iter().cloned());
        match doubt {
            Some(doubt) => {
                tracing::warn!(%topic, %doubt, "topic not found, retrying");
                Missing::Retry(SendError::Retryable(format!("{doubt}; {reason}")))
            }
            None => Missing::AutoCreate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(groups: &[&str]) -> NameServerView {
        NameServerView {
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..NameServerView::default()
        }
    }

    #[test]
    fn a_topic_nobody_routes_is_final_only_when_no_broker_is_missing() {
        // Found by the bad-input campaign: the client's "Can not find Message Queue" (-1) was
        // classified retryable, so an unknown topic held its shard through every retry.
        let reason = "Can not find Message Queue for this topic, t";
        let memory = ClusterMemory::default();
        let rejected = memory.verdict("t", reason, Ok(view(&["broker-a"])));
        assert!(
            matches!(&rejected, Missing::Rejected(SendError::Rejected(r)) if r.contains("no such topic t")),
            "{rejected:?}"
        );
        // broker-b was seen (it served another topic) and is gone now: retried, not FAILED.
        memory.routed("other", ["broker-a".to_string(), "broker-b".to_string()]);
        let retried = memory.verdict("t", reason, Ok(view(&["broker-a"])));
        assert!(matches!(retried, Missing::Retry(_)), "{retried:?}");
        // Back: final again.
        let rejected = memory.verdict("t", reason, Ok(view(&["broker-a", "broker-b"])));
        assert!(matches!(rejected, Missing::Rejected(_)), "{rejected:?}");
    }

    #[test]
    fn any_doubt_is_retried() {
        let reason = "no route";
        let known = ClusterMemory::default();
        known.routed("t", ["broker-a".to_string()]);
        let no_master = NameServerView {
            groups_without_master: 1,
            ..view(&["broker-a"])
        };
        let routed = NameServerView {
            routed: true,
            ..view(&["broker-a"])
        };
        let cases = [
            (
                known.verdict("t", reason, Ok(view(&["broker-a"]))),
                "known topic",
            ),
            (
                ClusterMemory::default().verdict("t", reason, Ok(view(&[]))),
                "no broker",
            ),
            (
                ClusterMemory::default().verdict("t", reason, Ok(no_master)),
                "no master",
            ),
            (
                ClusterMemory::default().verdict("t", reason, Ok(routed)),
                "stale view",
            ),
            (
                ClusterMemory::default().verdict("t", reason, Err("timeout".into())),
                "no answer",
            ),
        ];
        for (verdict, case) in cases {
            assert!(matches!(verdict, Missing::Retry(_)), "{case}: {verdict:?}");
        }
    }

    #[test]
    fn a_cluster_that_auto_creates_gets_the_topic_created() {
        let auto = NameServerView {
            auto_create: true,
            ..view(&["broker-a"])
        };
        let verdict = ClusterMemory::default().verdict("t", "no route", Ok(auto));
        assert_eq!(verdict, Missing::AutoCreate);
    }
}
