//! What kind of messages each topic takes (RocketMQ 5's `message.type`), and so what the relay
//! sends it: on a FIFO or MIXED topic every event carries its `biz_key` as its message group, so
//! a RocketMQ 5 proxy accepts it and a FIFO consumer group delivers each key in order; a NORMAL
//! topic's events carry none, as before RocketMQ 5; a DELAY topic's events are timer messages,
//! due at their `deliver_at` (at once without one). Scheduled events (`deliver_at` set) on a
//! NORMAL or FIFO topic, and any event on a TRANSACTION topic (the relay has no transaction to
//! give), are a configuration error.
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
    /// As timer messages, each due at its `deliver_at` or at once: a DELAY topic.
    Timed,
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

    /// How `topic`'s events are sent now; `scheduled`: some of them have a `deliver_at`.
    pub(super) fn form(&self, topic: &str, scheduled: bool) -> Form {
        match self.known(topic) {
            Some(kind @ (TopicType::Normal | TopicType::Fifo)) if scheduled => {
                Form::Refused(self.not_scheduled(topic, kind))
            }
            None | Some(TopicType::Normal) => Form::Plain,
            Some(TopicType::Fifo | TopicType::Mixed) => Form::Grouped,
            Some(TopicType::Delay) => Form::Timed,
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
            Some(facts) => matches!(facts.of_cluster, Some(TopicType::Transaction)),
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
            "topic {topic} is a {} topic: {}", now.name(), match self.form(topic, false) {
                Form::Grouped => "each event carries its biz_key as its message group",
                Form::Timed => "its events are timer messages, due at their deliver_at",
                _ => "the relay cannot send to it (see the ERROR when its events wait)",
            });
        }
    }

    /// The form to try after a RocketMQ 5 proxy refused `tried` as malformed (its answer to a
    /// message of another type than the topic's), while `topic`'s type is not known: plain,
    /// then with message groups (a FIFO topic), then as timer messages (a DELAY topic). None
    /// once every form was tried, or where the refusal is the message's (a broker, or a known
    /// type).
    pub(super) fn next_try(&self, topic: &str, tried: &Form) -> Option<Form> {
        if self.known(topic).is_some() || !self.facts(topic).behind_proxy {
            return None;
        }
        match tried {
            Form::Plain => Some(Form::Grouped),
            Form::Grouped => Some(Form::Timed),
            Form::Timed | Form::Refused(_) => None,
        }
    }

    /// The proxy took `topic`'s events in `form` after refusing an earlier one: the topic is of
    /// the type that form is for.
    pub(super) fn learn_accepted(&self, topic: &str, form: &Form) {
        let kind = match form {
            Form::Grouped => TopicType::Fifo,
            Form::Timed => TopicType::Delay,
            Form::Plain | Form::Refused(_) => return,
        };
        let mut facts = self.facts(topic);
        facts.of_cluster = Some(kind);
        self.learn(topic, facts);
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
            None => "it refused NORMAL, FIFO and DELAY messages alike: it is probably a \
                     TRANSACTION topic, which the relay cannot send to, or a NORMAL or FIFO one \
                     that events with a deliver_at were written for (those need message.type \
                     DELAY)"
                .to_string(),
        };
        SendError::Misconfigured(format!(
            "the RocketMQ 5 proxy refused the events of topic {topic} as malformed (code 13, \
             MESSAGE_ILLEGAL, its answer to a message of another type than the topic's): {told}; \
             give {topic} message.type NORMAL, FIFO, DELAY or MIXED (`mqadmin updateTopic -t \
             {topic} -a +message.type=FIFO`) or name its type in rocketmq.topic_types; the events \
             wait, never FAILED for this"
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

    fn source(&self, topic: &str) -> &'static str {
        match self.configured.contains_key(topic) {
            true => "rocketmq.topic_types says so",
            false => "its broker says so",
        }
    }

    fn cannot_send(&self, topic: &str, kind: TopicType) -> String {
        format!(
            "topic {topic} is a {kind} topic ({source}): the relay has no transaction to give; \
             give {topic} message.type NORMAL, FIFO, DELAY or MIXED (`mqadmin updateTopic -t \
             {topic} -a +message.type=FIFO`) or send its events to another topic; they wait, \
             never FAILED for this",
            kind = kind.name(),
            source = self.source(topic),
        )
    }

    fn not_scheduled(&self, topic: &str, kind: TopicType) -> String {
        format!(
            "topic {topic} is a {kind} topic ({source}) and events for it have a deliver_at: \
             RocketMQ 5 delivers scheduled messages only from DELAY (or MIXED) topics; give \
             {topic} message.type DELAY (`mqadmin updateTopic -t {topic} -a \
             +message.type=DELAY`) or schedule events on another topic; they wait, never FAILED \
             for this",
            kind = kind.name(),
            source = self.source(topic),
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
        assert_eq!(types.form("conf", false), Form::Grouped);
        assert_eq!(types.form("fifo", false), Form::Grouped);
        assert_eq!(types.form("normal", false), Form::Plain);
        assert_eq!(types.form("unknown", false), Form::Plain);
        assert_eq!(types.form("never-routed", false), Form::Plain);
    }

    #[test]
    fn delay_topics_take_timer_messages_and_scheduled_events_want_one() {
        let types = TopicTypes::default();
        types.learn("delay", facts(Some(TopicType::Delay), false));
        types.learn("normal", facts(Some(TopicType::Normal), false));
        types.learn("fifo", facts(Some(TopicType::Fifo), false));
        types.learn("mixed", facts(Some(TopicType::Mixed), false));
        assert_eq!(types.form("delay", true), Form::Timed);
        assert_eq!(types.form("delay", false), Form::Timed, "due at once");
        assert_eq!(types.form("mixed", true), Form::Grouped);
        assert_eq!(types.form("unknown", true), Form::Plain, "tried as it is");
        for topic in ["normal", "fifo"] {
            let Form::Refused(reason) = types.form(topic, true) else {
                panic!("scheduled events on {topic} must be refused");
            };
            assert!(reason.contains("message.type DELAY"), "{reason}");
        }
        assert!(!types.ask_cluster("delay"), "a DELAY topic is served");
    }

    #[test]
    fn transaction_topics_are_refused_with_what_to_change() {
        let types = TopicTypes::new([("tx".to_string(), TopicType::Transaction)].into());
        types.learn("tx2", facts(Some(TopicType::Transaction), false));
        for topic in ["tx", "tx2"] {
            let Form::Refused(reason) = types.form(topic, false) else {
                panic!("{topic} must be refused");
            };
            assert!(
                reason.contains("message.type NORMAL, FIFO, DELAY or MIXED"),
                "{reason}"
            );
        }
        // Asked again while it names a type the relay cannot send; a configured one never.
        assert!(types.ask_cluster("tx2") && !types.ask_cluster("tx"));
        types.learn("tx2", facts(Some(TopicType::Fifo), false));
        assert_eq!(types.form("tx2", false), Form::Grouped);
        assert!(!types.ask_cluster("tx2"));
    }

    #[test]
    fn behind_a_proxy_an_unknown_type_is_learnt_from_the_send_it_accepts() {
        let types = TopicTypes::default();
        types.learn("t", facts(None, true));
        assert_eq!(types.next_try("t", &Form::Plain), Some(Form::Grouped));
        assert_eq!(types.next_try("t", &Form::Grouped), Some(Form::Timed));
        assert_eq!(types.next_try("t", &Form::Timed), None, "every form tried");
        types.learn_accepted("t", &Form::Grouped);
        assert_eq!(types.form("t", false), Form::Grouped);
        assert_eq!(types.next_try("t", &Form::Plain), None, "known now");
        assert!(types.behind_proxy("t"));
        types.learn("d", facts(None, true));
        types.learn_accepted("d", &Form::Timed);
        assert_eq!(types.form("d", false), Form::Timed);
        types.learn("straight", facts(None, false));
        assert_eq!(
            types.next_try("straight", &Form::Plain),
            None,
            "a broker's refusal is the message's"
        );
        assert!(matches!(
            types.refused_every_form("t"),
            SendError::Misconfigured(reason) if reason.contains("TRANSACTION topic")
                && reason.contains("message.type DELAY")
        ));
    }
}
