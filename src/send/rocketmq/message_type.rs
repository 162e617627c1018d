//! What kind of messages each topic takes (RocketMQ 5's `message.type`), and so what the relay
//! sends it: on a FIFO or MIXED topic every event carries its `biz_key` as its message group, so
//! a RocketMQ 5 proxy accepts it and a FIFO consumer group delivers each key in order; a NORMAL
//! topic's events carry none, as before RocketMQ 5. A DELAY or TRANSACTION topic takes no event
//! of the relay (it has no delivery time nor transaction to give): a configuration error.
//!
//! Where a topic's type comes from, first match wins: `rocketmq.topic_types`; the broker's topic
//! config, asked at the topic's first route (and again while it names a type the relay cannot
//! send, so a fix is seen at the next route refresh); through a RocketMQ 5 proxy, which answers
//! no topic-config request and whose refusals this client keeps without their text, the proxy's
//! answer to a send: a NORMAL message refused as malformed (code 13, which the proxy answers for
//! a message of the wrong type) is sent again as a FIFO message, and the topic is FIFO if that
//! is accepted.
//!
//! Guarantee: a topic's events are never FAILED for its type. A type the relay cannot send is a
//! [`SendError::Misconfigured`]: the events wait, in order, until it is changed.

use super::SendError;
use crate::config::TopicType;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// How a topic's events are sent now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Form {
    /// Plain messages: a NORMAL topic, or one whose type is not known.
    Plain,
    /// With their `biz_key` as message group: a FIFO or MIXED topic.
    Grouped,
    /// Not at all: the reason, and what to change.
    Refused(String),
}

/// What the cluster told about a topic.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Facts {
    /// Its type, if the cluster told it.
    pub of_cluster: Option<TopicType>,
    /// Its route names a RocketMQ 5 proxy (the address the relay was given) as its broker.
    pub behind_proxy: bool,
}

/// The topics' types (see the module docs).
#[derive(Debug, Default)]
pub(super) struct TopicTypes {
    configured: BTreeMap<String, TopicType>,
    learnt: Mutex<HashMap<String, Facts>>,
}

impl TopicTypes {
    pub(super) fn new(configured: BTreeMap<String, TopicType>) -> Self {
        TopicTypes {
            configured,
            learnt: Mutex::default(),
        }
    }

    /// How `topic`'s events are sent now.
    pub(super) fn form(&self, topic: &str) -> Form {
        match self.known(topic) {
            None | Some(TopicType::Normal) => Form::Plain,
            Some(TopicType::Fifo | TopicType::Mixed) => Form::Grouped,
            Some(other) => Form::Refused(self.cannot_send(topic, other)),
        }
    }

    /// Whether the cluster should be asked about `topic` (at a route look-up): never once it is
    /// configured; once, unless its answer is a type the relay cannot send (then at each route
    /// refresh, so a fix is seen without a restart).
    pub(super) fn ask_cluster(&self, topic: &str) -> bool {
        if self.configured.contains_key(topic) {
            return false;
        }
        match self.learnt.lock().expect("not poisoned").get(topic) {
            None => true,
            Some(facts) => matches!(
                facts.of_cluster,
                Some(TopicType::Delay | TopicType::Transaction)
            ),
        }
    }

    /// What the cluster told about `topic`; logs a type that changes what the relay sends.
    pub(super) fn learn(&self, topic: &str, facts: Facts) {
        let before = self
            .learnt
            .lock()
            .expect("not poisoned")
            .insert(topic.to_string(), facts);
        let (Some(now), false) = (facts.of_cluster, self.configured.contains_key(topic)) else {
            return;
        };
        if before.and_then(|b| b.of_cluster) != Some(now) && now != TopicType::Normal {
            tracing::info!(%topic, message_type = now.name(),
            "topic {topic} is a {} topic: {}", now.name(), match self.form(topic) {
                Form::Grouped => "each event carries its biz_key as its message group",
                _ => "the relay cannot send to it (see the ERROR when its events wait)",
            });
        }
    }

    /// The proxy took `topic`'s events as FIFO messages after refusing them as NORMAL ones.
    pub(super) fn learn_fifo(&self, topic: &str) {
        let mut facts = self.facts(topic);
        facts.of_cluster = Some(TopicType::Fifo);
        self.learn(topic, facts);
    }

    /// Whether a refusal of `topic`'s plain messages as malformed may be the proxy refusing
    /// their type, so the same events are tried as FIFO messages: its type is not known and a
    /// proxy is its broker.
    pub(super) fn may_want_groups(&self, topic: &str) -> bool {
        self.known(topic).is_none() && self.facts(topic).behind_proxy
    }

    /// Whether a refusal as malformed is the proxy's (of a type the relay was told), not the
    /// message's.
    pub(super) fn behind_proxy(&self, topic: &str) -> bool {
        self.facts(topic).behind_proxy
    }

    /// The error of a proxy that refused `topic`'s events in every form the relay can send.
    pub(super) fn refused_every_form(&self, topic: &str) -> SendError {
        let told = match self.configured.get(topic) {
            Some(t) => format!(
                "rocketmq.topic_types names it {}: check that this is its message.type",
                t.name()
            ),
            None => "it is probably a DELAY or TRANSACTION topic, which the relay cannot send \
                     to"
            .to_string(),
        };
        SendError::Misconfigured(format!(
            "the RocketMQ 5 proxy refused the events of topic {topic} as malformed (code 13, \
             MESSAGE_ILLEGAL, its answer to a message of another type than the topic's): {told}; \
             give {topic} message.type NORMAL, FIFO or MIXED (`mqadmin updateTopic -t {topic} -a \
             +message.type=FIFO`) or name its type in rocketmq.topic_types; the events wait, \
             never FAILED for this"
        ))
    }

    fn known(&self, topic: &str) -> Option<TopicType> {
        (self.configured.get(topic).copied()).or_else(|| self.facts(topic).of_cluster)
    }

    fn facts(&self, topic: &str) -> Facts {
        (self.learnt.lock().expect("not poisoned").get(topic))
            .copied()
            .unwrap_or_default()
    }

    fn cannot_send(&self, topic: &str, kind: TopicType) -> String {
        let source = match self.configured.contains_key(topic) {
            true => "rocketmq.topic_types says so",
            false => "its broker says so",
        };
        format!(
            "topic {topic} is a {kind} topic ({source}): the relay sends NORMAL or FIFO messages \
             and has no {what} to give; give {topic} message.type NORMAL, FIFO or MIXED \
             (`mqadmin updateTopic -t {topic} -a +message.type=FIFO`) or send its events to \
             another topic; they wait, never FAILED for this",
            kind = kind.name(),
            what = match kind {
                TopicType::Delay => "delivery time",
                _ => "transaction",
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(of_cluster: Option<TopicType>, behind_proxy: bool) -> Facts {
        Facts {
            of_cluster,
            behind_proxy,
        }
    }

    #[test]
    fn fifo_and_mixed_topics_group_normal_and_unknown_ones_do_not() {
        let types = TopicTypes::new([("conf".to_string(), TopicType::Mixed)].into());
        types.learn("fifo", facts(Some(TopicType::Fifo), false));
        types.learn("normal", facts(Some(TopicType::Normal), false));
        types.learn("unknown", facts(None, true));
        assert_eq!(types.form("conf"), Form::Grouped);
        assert_eq!(types.form("fifo"), Form::Grouped);
        assert_eq!(types.form("normal"), Form::Plain);
        assert_eq!(types.form("unknown"), Form::Plain);
        assert_eq!(types.form("never-routed"), Form::Plain);
    }

    #[test]
    fn delay_and_transaction_topics_are_refused_with_what_to_change() {
        let types = TopicTypes::new([("tx".to_string(), TopicType::Transaction)].into());
        types.learn("delay", facts(Some(TopicType::Delay), false));
        for topic in ["tx", "delay"] {
            let Form::Refused(reason) = types.form(topic) else {
                panic!("{topic} must be refused");
            };
            assert!(
                reason.contains("message.type NORMAL, FIFO or MIXED"),
                "{reason}"
            );
        }
        // Asked again while it names a type the relay cannot send; a configured one never.
        assert!(types.ask_cluster("delay") && !types.ask_cluster("tx"));
        types.learn("delay", facts(Some(TopicType::Fifo), false));
        assert_eq!(types.form("delay"), Form::Grouped);
        assert!(!types.ask_cluster("delay"));
    }

    #[test]
    fn behind_a_proxy_an_unknown_type_is_learnt_from_the_send_it_accepts() {
        let types = TopicTypes::default();
        types.learn("t", facts(None, true));
        assert!(types.may_want_groups("t"));
        types.learn_fifo("t");
        assert_eq!(types.form("t"), Form::Grouped);
        assert!(!types.may_want_groups("t"), "known now");
        assert!(types.behind_proxy("t"));
        types.learn("straight", facts(None, false));
        assert!(
            !types.may_want_groups("straight"),
            "a broker's refusal is the message's"
        );
        assert!(matches!(
            types.refused_every_form("t"),
            SendError::Misconfigured(reason) if reason.contains("DELAY or TRANSACTION")
        ));
    }
}
