//! What kind of messages each topic takes (RocketMQ 5's `message.type`), and so what the relay
//! sends it: on a FIFO or MIXED topic every event carries its `biz_key` as its message group, so
//! a RocketMQ 5 proxy accepts it and a FIFO consumer group delivers each key in order; a NORMAL
//! topic's events carry none, as before RocketMQ 5; a DELAY topic's events are timer messages,
//! due at their `deliver_at` (at once without one). Scheduled events (`deliver_at` set) on a
//! NORMAL or FIFO topic, and any event on a TRANSACTION topic (the relay has no transaction to
//! give), are a configuration error.
//!
//! Where a topic's type comes from, first match wins: `rocketmq.topic_types`; the broker's topic
//! config, asked at the topic's first route (again at each route refresh while it cannot be
//! asked, or names a type the relay cannot send, so a fix is seen without a restart); through a
//! RocketMQ 5 proxy, which answers no topic-config request and whose refusals this client keeps
//! without their text, the proxy's answer to a send: a NORMAL message refused as malformed
//! (code 13, which the proxy answers for a message of the wrong type) is sent again as a FIFO
//! message, then as a timer message, and the topic is of the type of the form it accepts.
//!
//! Code 13 is also a refusal of one message for itself (a timer message due beyond the broker's
//! `timerMaxDelaySec`, a message over its size limit), so a refused form is told apart from a
//! refused event ([`TopicTypes::judge_illegal`]): a message refused in a form the topic is known
//! to take (configured, or taken by the topic before) is refused for itself, and FAILED with
//! what is known of why; a batch is split to find which.
//!
//! Guarantee: a topic's events are never FAILED for its type, and never called a configuration
//! error unless the relay knows the type refuses them. A type the relay cannot send is a
//! [`SendError::Misconfigured`]: the events wait, in order, until it is changed; so does an event
//! a proxy refused in every form while nothing tells the topic's type (the reason says that it
//! cannot tell).

use super::SendError;
use crate::config::TopicType;
use crate::outbox::message::now_ms;
use crate::outbox::OutboundMessage;
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
    /// The forms each topic has accepted a message in, in this process: proof that a later
    /// refusal of a message in that form is the message's, not the topic type's.
    accepted: Mutex<HashMap<String, Vec<Form>>>,
}

/// What a refusal as malformed (code 13) of a request says (see [`TopicTypes::judge_illegal`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Judgement {
    /// Send the request again in this form: a RocketMQ 5 proxy may have refused the form.
    TryForm(Form),
    /// A request of several messages: which is refused cannot be told, so they are sent one by
    /// one (the refusal is passed on as [`SendError::Rejected`], which makes the sender split).
    Split,
    /// The one message of the request is refused for itself: it ends FAILED with this reason.
    EventsFault(String),
    /// A proxy refused the one message in every form, and nothing tells the topic's type: the
    /// reason says so (it waits, never FAILED for this, and is judged again at each attempt).
    Undecided(String),
}

impl TopicTypes {
    pub(super) fn new(configured: BTreeMap<String, TopicType>) -> Self {
        TopicTypes {
            configured,
            learnt: Mutex::default(),
            accepted: Mutex::default(),
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

    /// What a refusal as malformed (code 13) of a request of `count` messages sent as `tried`
    /// says, `first` being its first message and `error` the client's error.
    ///
    /// Straight to a broker, the message is refused for itself (a broker checks no topic type).
    /// A RocketMQ 5 proxy also refuses a message of another type than the topic's, so unless
    /// `tried` is proven for the topic (its configured type's form, or a form the topic accepted
    /// a message in) the next form is tried: plain, with message groups (a FIFO topic), as timer
    /// messages (a DELAY topic). Then a request of several messages is split; one message is
    /// refused for itself where its form is proven, and undecided where no form is.
    pub(super) fn judge_illegal(
        &self,
        topic: &str,
        tried: &Form,
        count: usize,
        first: &OutboundMessage,
        error: &SendError,
    ) -> Judgement {
        let behind_proxy = self.behind_proxy(topic);
        // A scheduled event is a timer message whatever the form: only timer messages taken
        // prove its form.
        let scheduled = first.deliver_at_ms.is_some();
        let proof = self.proof(topic, if scheduled { &Form::Timed } else { tried });
        if behind_proxy && proof.is_none() {
            let next = match tried {
                Form::Plain => Some(Form::Grouped),
                Form::Grouped => Some(Form::Timed),
                Form::Timed | Form::Refused(_) => None,
            };
            if let Some(next) = next {
                return Judgement::TryForm(next);
            }
        }
        if count > 1 {
            return Judgement::Split;
        }
        let facts = event_facts(first);
        let error = error.reason();
        match (behind_proxy, proof) {
            (false, _) => Judgement::EventsFault(format!(
                "the broker refused this event as malformed (code 13, MESSAGE_ILLEGAL): {facts}; \
                 its answer: {error}"
            )),
            (true, Some(proof)) => Judgement::EventsFault(format!(
                "the RocketMQ 5 proxy refused this event as malformed (code 13, MESSAGE_ILLEGAL) \
                 although topic {topic} takes {form} messages ({proof}): the event itself is \
                 refused, not the topic's type; {facts}; its answer: {error}",
                form = form_name(tried),
            )),
            (true, None) => {
                let types = match scheduled {
                    true => {
                        "takes no timer messages (a NORMAL, FIFO or TRANSACTION topic: a \
                             scheduled event needs message.type DELAY or MIXED, `mqadmin \
                             updateTopic -t {topic} -a +message.type=DELAY`)"
                    }
                    false => {
                        "takes none of them (a TRANSACTION topic: give it message.type \
                              NORMAL, FIFO, DELAY or MIXED, `mqadmin updateTopic -t {topic} -a \
                              +message.type=FIFO`)"
                    }
                };
                let types = types.replace("{topic}", topic);
                Judgement::Undecided(format!(
                    "the RocketMQ 5 proxy refused this event as malformed (code 13, \
                     MESSAGE_ILLEGAL) as a NORMAL, a FIFO and a DELAY message, and topic {topic} \
                     has taken no event yet that would tell its type, so the relay cannot tell \
                     which is refused: either the topic's message.type {types}, or the event \
                     itself ({facts}). Name the topic's type in rocketmq.topic_types to decide at \
                     once; meanwhile the event waits, never FAILED for this, and is judged again \
                     at each attempt, as soon as another event of {topic} is taken"
                ))
            }
        }
    }

    /// The proxy took a message of `topic` in `form`: that form is proven for it, and the topic
    /// is of the type a grouped or timed form is for.
    pub(super) fn learn_accepted(&self, topic: &str, form: &Form) {
        {
            // Called after every accepted send: the common case (known already) allocates
            // nothing.
            let mut accepted = self.accepted.lock().expect("not poisoned");
            if accepted
                .get(topic)
                .is_some_and(|forms| forms.contains(form))
            {
                return;
            }
            accepted
                .entry(topic.to_string())
                .or_default()
                .push(form.clone());
        }
        let kind = match form {
            Form::Grouped => TopicType::Fifo,
            Form::Timed => TopicType::Delay,
            Form::Plain | Form::Refused(_) => return,
        };
        if self.known(topic).is_some() {
            return;
        }
        let mut facts = self.facts(topic);
        facts.of_cluster = Some(kind);
        self.learn(topic, facts);
    }

    /// Whether a refusal as malformed is the proxy's (of a type the relay was told), not the
    /// message's.
    pub(super) fn behind_proxy(&self, topic: &str) -> bool {
        self.facts(topic).behind_proxy
    }

    /// What proves that `topic` takes messages in `form`, if anything does (a MIXED topic takes
    /// every form).
    fn proof(&self, topic: &str, form: &Form) -> Option<&'static str> {
        let accepted = (self.accepted.lock().expect("not poisoned").get(topic))
            .is_some_and(|forms| forms.contains(form));
        if accepted {
            return Some("it took other events sent so");
        }
        let configured = self.configured.get(topic);
        let kind = configured.copied().or(self.facts(topic).of_cluster)?;
        let takes = match kind {
            TopicType::Normal => form == &Form::Plain,
            TopicType::Fifo => form == &Form::Grouped,
            TopicType::Delay => form == &Form::Timed,
            TopicType::Mixed => !matches!(form, Form::Refused(_)),
            _ => false,
        };
        takes.then_some(match configured {
            Some(_) => "rocketmq.topic_types says so",
            None => "its broker says so",
        })
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

/// How a form's messages are named in RocketMQ 5.
fn form_name(form: &Form) -> &'static str {
    match form {
        Form::Plain => "NORMAL",
        Form::Grouped => "FIFO",
        Form::Timed => "DELAY",
        Form::Refused(_) => "no",
    }
}

/// The broker's own limit for a timer message's delay, unless its config sets another
/// (`timerMaxDelaySec`), and for a message's size (`maxMessageSize`).
const DEFAULT_TIMER_MAX_DELAY_MS: u64 = 3 * 24 * 3600 * 1000;
const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// What about `m` a broker is known to refuse as malformed, as facts (never a guess of which
/// applied: the broker does not say, and its limits are its configuration's).
fn event_facts(m: &OutboundMessage) -> String {
    let mut facts = Vec::new();
    if let Some(due) = m.deliver_at_ms {
        let ahead = due.saturating_sub(now_ms());
        facts.push(format!(
            "its deliver_at is {} ahead{}; a broker refuses a timer message due beyond its \
             timerMaxDelaySec (3 days unless set otherwise)",
            // To the minute: "5days", not "4days 23h 59m 59s".
            humantime::format_duration(std::time::Duration::from_secs(
                (ahead + 30_000) / 60_000 * 60
            )),
            if ahead > DEFAULT_TIMER_MAX_DELAY_MS {
                ", beyond the default limit"
            } else {
                ""
            }
        ));
    }
    let bytes = m.payload.len();
    if bytes * 4 >= DEFAULT_MAX_MESSAGE_BYTES {
        facts.push(format!(
            "its payload is {bytes} bytes; a broker refuses a message over its maxMessageSize \
             (4 MiB unless set otherwise)"
        ));
    }
    if facts.is_empty() {
        return "neither its deliver_at nor its size is near a broker's default limits: the \
                broker's log says why it refused it"
            .to_string();
    }
    facts.join("; ")
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

    fn message(deliver_in_days: Option<u64>) -> OutboundMessage {
        OutboundMessage {
            event_id: "e".into(),
            biz_key: "k".into(),
            topic: "t".into(),
            tags: None,
            headers: vec![],
            payload: "{}".into(),
            deliver_at_ms: deliver_in_days.map(|d| now_ms() + d * 24 * 3600 * 1000),
        }
    }

    fn illegal() -> SendError {
        SendError::Rejected("message too large or malformed: code 13".into())
    }

    #[test]
    fn behind_a_proxy_an_unknown_type_is_learnt_from_the_send_it_accepts() {
        let types = TopicTypes::default();
        types.learn("t", facts(None, true));
        let m = message(None);
        let judge = |form: &Form, count| types.judge_illegal("t", form, count, &m, &illegal());
        assert_eq!(judge(&Form::Plain, 3), Judgement::TryForm(Form::Grouped));
        assert_eq!(judge(&Form::Grouped, 1), Judgement::TryForm(Form::Timed));
        assert_eq!(
            judge(&Form::Timed, 3),
            Judgement::Split,
            "a batch: which one?"
        );
        let Judgement::Undecided(reason) = judge(&Form::Timed, 1) else {
            panic!("nothing tells the type: undecided");
        };
        assert!(
            reason.contains("cannot") || reason.contains("either"),
            "{reason}"
        );
        assert!(!reason.contains("probably"), "no guess: {reason}");
        types.learn_accepted("t", &Form::Grouped);
        assert_eq!(types.form("t", false), Form::Grouped);
        assert!(types.behind_proxy("t"));
        types.learn("d", facts(None, true));
        types.learn_accepted("d", &Form::Timed);
        assert_eq!(types.form("d", false), Form::Timed);
    }

    #[test]
    fn a_message_refused_in_a_form_its_topic_takes_is_refused_for_itself() {
        let types = TopicTypes::new([("conf".to_string(), TopicType::Delay)].into());
        types.learn("d", facts(None, true));
        types.learn_accepted("d", &Form::Timed);
        types.learn("conf", facts(None, true));
        let far = message(Some(5));
        for topic in ["d", "conf"] {
            let Judgement::EventsFault(reason) =
                types.judge_illegal(topic, &Form::Timed, 1, &far, &illegal())
            else {
                panic!("{topic}: the event's own fault");
            };
            assert!(reason.contains("5days"), "{reason}");
            assert!(reason.contains("timerMaxDelaySec"), "{reason}");
            assert!(reason.contains("not the topic's type"), "{reason}");
        }
        // Plain taken proves nothing for a scheduled event (a timer message whatever the form).
        types.learn("p", facts(None, true));
        types.learn_accepted("p", &Form::Plain);
        assert!(matches!(
            types.judge_illegal("p", &Form::Plain, 1, &far, &illegal()),
            Judgement::TryForm(Form::Grouped)
        ));
        // A proven form refused for a batch: split to find the event.
        assert_eq!(
            types.judge_illegal("d", &Form::Timed, 4, &far, &illegal()),
            Judgement::Split
        );
        // Straight to a broker, code 13 is always the message's.
        types.learn("straight", facts(None, false));
        let Judgement::EventsFault(reason) =
            types.judge_illegal("straight", &Form::Plain, 1, &message(None), &illegal())
        else {
            panic!("a broker's refusal is the message's");
        };
        assert!(reason.contains("the broker's log says why"), "{reason}");
    }
}
