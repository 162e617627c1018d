//! The broker messages of outbox events, and what a send result means.
//!
//! Every message carries KEYS = `event_id biz_key`, the user properties `event_id` and
//! `biz_key`, its tags and its headers; on a topic that orders by message group (RocketMQ 5's
//! FIFO and MIXED topics, see [`super::message_type`]) also its `biz_key` as its message group
//! (`__SHARDINGKEY`); a scheduled event, and every event of a DELAY topic, is a timer message due
//! at its `deliver_at` (`TIMER_DELIVER_MS`; at once without one), sent in a request of its own.

use super::SendError;
use crate::outbox::message::now_ms;
use crate::outbox::OutboundMessage;
use rocketmq_client_rust::{SendResult, SendStatus};
use rocketmq_model::common::message::message_batch::MessageBatch;
use rocketmq_model::common::message::message_client_id_setter::MessageClientIDSetter;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_model::common::message::{MessageConst, MessageTrait};

/// The most bytes of properties a broker stores with a message (Apache RocketMQ refuses more as
/// `MESSAGE_ILLEGAL`), less room for the ones the client adds (`UNIQ_KEY`, ...).
const MAX_PROPERTY_BYTES: usize = i16::MAX as usize - 512;

/// How the messages of one send are built (see [`super::message_type::Form`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shape {
    /// With the event's `biz_key` as message group.
    pub grouped: bool,
    /// Every event a timer message (a DELAY topic), due at its `deliver_at` or at once.
    pub timed: bool,
}

impl Shape {
    /// Plain messages (a scheduled event is a timer message whatever the shape).
    pub const PLAIN: Shape = Shape {
        grouped: false,
        timed: false,
    };
    pub const GROUPED: Shape = Shape {
        grouped: true,
        timed: false,
    };
    pub const TIMED: Shape = Shape {
        grouped: false,
        timed: true,
    };
}

/// One send request and how many messages it carries.
pub(super) enum Request {
    One(Message),
    Batch(MessageBatch),
}

/// The requests of `messages` (consecutive events of one topic and queue, `topic` as the broker
/// names it), in order: one for all of them, or, where events carry a message group
/// (`shape.grouped`), one per run of events of one key; a timer message always alone (a broker
/// schedules single messages, not batches). A batch's own properties are what a proxy checks
/// against the topic's type, and both brokers append them to every message of the batch they
/// store, so a batch carries one group.
pub(super) fn requests(
    messages: &[&OutboundMessage],
    topic: &str,
    shape: Shape,
) -> Result<Vec<(Request, usize)>, SendError> {
    let timed = |m: &OutboundMessage| shape.timed || m.deliver_at_ms.is_some();
    let mut runs: Vec<Vec<&OutboundMessage>> = Vec::new();
    for m in messages {
        match runs.last_mut() {
            Some(run)
                if !timed(m)
                    && !timed(run[0])
                    && (!shape.grouped || run[0].biz_key == m.biz_key) =>
            {
                run.push(m)
            }
            _ => runs.push(vec![m]),
        }
    }
    let mut requests = Vec::with_capacity(runs.len());
    for run in runs {
        let count = run.len();
        let mut built = (run.iter())
            .map(|m| build_message(m, topic, shape))
            .collect::<Result<Vec<_>, _>>()?;
        let request = if count == 1 {
            Request::One(built.pop().expect("one"))
        } else {
            let group = shape.grouped.then(|| run[0].biz_key.as_str());
            Request::Batch(batch_of(built, group)?)
        };
        requests.push((request, count));
    }
    Ok(requests)
}

/// The broker message for `m` to `topic` (`m`'s topic as the broker names it: in the configured
/// namespace), with its `biz_key` as message group if `shape.grouped`, and a timer message if it
/// is scheduled or `shape.timed`.
pub(super) fn build_message(
    m: &OutboundMessage,
    topic: &str,
    shape: Shape,
) -> Result<Message, SendError> {
    let mut builder = Message::builder()
        .topic(topic)
        .body(m.payload.clone().into_bytes())
        .keys(vec![m.event_id.clone(), m.biz_key.clone()]);
    if let Some(tags) = &m.tags {
        builder = builder.tags(tags.as_str());
    }
    let mut message = builder
        .build()
        .map_err(|e| SendError::Rejected(format!("malformed message: {e}")))?;
    let properties = [
        ("event_id", m.event_id.as_str()),
        ("biz_key", m.biz_key.as_str()),
    ]
    .into_iter()
    .chain(m.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let mut bytes = 0;
    for (name, value) in properties {
        bytes += name.len() + value.len() + 2;
        message
            .put_user_property(name.to_string().into(), value.to_string().into())
            .map_err(|e| SendError::Rejected(format!("property {name:?} refused: {e}")))?;
    }
    if bytes > MAX_PROPERTY_BYTES {
        return Err(SendError::Rejected(format!(
            "the event's headers, event_id and biz_key make {bytes} bytes of message properties; \
             RocketMQ stores at most {MAX_PROPERTY_BYTES}: put large values in the payload"
        )));
    }
    if shape.grouped {
        message.put_property(
            MessageConst::PROPERTY_SHARDING_KEY.into(),
            m.biz_key.as_str().into(),
        );
    }
    let due = m.deliver_at_ms.or_else(|| shape.timed.then(now_ms));
    if let Some(due) = due {
        message.put_property(
            MessageConst::PROPERTY_TIMER_DELIVER_MS.into(),
            due.to_string().into(),
        );
    }
    Ok(message)
}

/// One batch request for `messages`, each with its own id (`UNIQ_KEY`) and **no id of the batch
/// itself**. The client's own `send_batch*` also stamps the batch with an id, and both Apache
/// RocketMQ 5.3 and rocketmq-rust append the batch's properties to every message they store:
/// each stored message then carries the batch's id, which is what consumers and `mqadmin
/// queryMsgById` see, not the per-message id the send result reports (measured by
/// `tests/message_ids.rs`). Without a batch id, what the send result reports is what is stored.
/// With `group`, the batch carries that message group (every message of it has it too).
fn batch_of(messages: Vec<Message>, group: Option<&str>) -> Result<MessageBatch, SendError> {
    let mut batch = MessageBatch::generate_from_messages(messages)
        .map_err(|e| SendError::Rejected(format!("malformed batch: {e}")))?;
    for message in &mut batch.messages {
        MessageClientIDSetter::set_uniq_id(message);
    }
    batch.set_body(
        rocketmq_protocol::common::message::message_decoder::encode_messages(&batch.messages),
    );
    if let Some(group) = group {
        batch.put_property(MessageConst::PROPERTY_SHARDING_KEY.into(), group.into());
    }
    Ok(batch)
}
/// `SEND_OK` → one id per message; any other status → retryable.
pub(super) fn accept(result: SendResult, count: usize) -> Result<Vec<String>, SendError> {
    if result.send_status != SendStatus::SendOk {
        return Err(SendError::Retryable(format!(
            "broker answered {:?}, not SEND_OK",
            result.send_status
        )));
    }
    let ids: Vec<String> = result
        .msg_id
        .map(|ids| ids.as_str().split(',').map(str::to_string).collect())
        .unwrap_or_default();
    if ids.len() == count {
        return Ok(ids);
    }
    // No per-message ids (should not happen): fall back to the broker's offset id, suffixed.
    let base = result.offset_msg_id.unwrap_or_else(|| "unknown".into());
    Ok((0..count)
        .map(|i| {
            if count == 1 {
                base.clone()
            } else {
                format!("{base}#{i}")
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::sample_message;
    use rocketmq_client_rust::{SendResult, SendStatus};

    fn group_of(message: &impl MessageTrait) -> Option<String> {
        let name = MessageConst::PROPERTY_SHARDING_KEY.into();
        message.property(&name).map(|g| g.to_string())
    }

    /// The message groups of `requests`: per request, the batch's own and each message's.
    fn groups(requests: &[(Request, usize)]) -> Vec<(Option<String>, Vec<Option<String>>)> {
        (requests.iter())
            .map(|(request, _)| match request {
                Request::One(m) => (group_of(m), vec![group_of(m)]),
                Request::Batch(b) => (group_of(b), b.messages.iter().map(group_of).collect()),
            })
            .collect()
    }

    #[test]
    fn grouped_events_go_in_one_request_per_run_of_one_key_each_carrying_its_key() {
        // Keys key-0, key-0, key-1, key-1, key-1, key-0 (sample_message cycles three keys).
        let events: Vec<OutboundMessage> = [0, 3, 1, 4, 7, 6]
            .into_iter()
            .map(|i| sample_message("t", i))
            .collect();
        let refs: Vec<&OutboundMessage> = events.iter().collect();
        let grouped = requests(&refs, "t", Shape::GROUPED).unwrap();
        let counts: Vec<usize> = grouped.iter().map(|(_, n)| *n).collect();
        assert_eq!(counts, [2, 3, 1], "runs of one key, in order");
        let key = |k: &str| Some(k.to_string());
        assert_eq!(
            groups(&grouped),
            [
                (key("key-0"), vec![key("key-0"); 2]),
                (key("key-1"), vec![key("key-1"); 3]),
                (key("key-0"), vec![key("key-0")]),
            ]
        );
        let plain = requests(&refs, "t", Shape::PLAIN).unwrap();
        assert_eq!(plain.len(), 1, "one batch without groups");
        assert_eq!(groups(&plain), [(None, vec![None; 6])]);
    }

    fn due(message: &impl MessageTrait) -> Option<u64> {
        let name = MessageConst::PROPERTY_TIMER_DELIVER_MS.into();
        message.property(&name).map(|ms| ms.parse().unwrap())
    }

    #[test]
    fn scheduled_events_are_timer_messages_each_in_a_request_of_its_own() {
        let mut events: Vec<OutboundMessage> = (0..4).map(|i| sample_message("t", i * 3)).collect(); // one key
        events[1].deliver_at_ms = Some(1_900_000_000_000);
        let refs: Vec<&OutboundMessage> = events.iter().collect();
        let plain = requests(&refs, "t", Shape::PLAIN).unwrap();
        let counts: Vec<usize> = plain.iter().map(|(_, n)| *n).collect();
        assert_eq!(counts, [1, 1, 2], "the scheduled one alone, order kept");
        let Request::One(scheduled) = &plain[1].0 else {
            panic!("a single message");
        };
        assert_eq!(due(scheduled), Some(1_900_000_000_000));
        let Request::Batch(batch) = &plain[2].0 else {
            panic!("a batch");
        };
        assert!(batch.messages.iter().all(|m| due(m).is_none()));

        // On a DELAY topic every event is a timer message, due at once without a deliver_at.
        let before = now_ms();
        let all = requests(&refs, "t", Shape::TIMED).unwrap();
        assert_eq!(all.len(), 4);
        for (i, (request, _)) in all.iter().enumerate() {
            let Request::One(m) = request else {
                panic!("single messages");
            };
            let at = due(m).expect("a timer message");
            match i {
                1 => assert_eq!(at, 1_900_000_000_000),
                _ => assert!(at >= before && at <= now_ms(), "due at once: {at}"),
            }
        }
    }

    #[test]
    fn properties_beyond_what_a_broker_stores_are_the_events_fault() {
        let mut event = sample_message("t", 0);
        event.headers = vec![("big".into(), "x".repeat(40_000))];
        match build_message(&event, "t", Shape::PLAIN) {
            Err(SendError::Rejected(reason)) => assert!(reason.contains("payload"), "{reason}"),
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    fn result(status: SendStatus, msg_id: Option<&str>) -> SendResult {
        SendResult {
            send_status: status,
            msg_id: msg_id.map(Into::into),
            offset_msg_id: Some("OFFSET".into()),
            ..SendResult::default()
        }
    }

    #[test]
    fn only_send_ok_is_success() {
        for status in [
            SendStatus::FlushDiskTimeout,
            SendStatus::FlushSlaveTimeout,
            SendStatus::SlaveNotAvailable,
        ] {
            let answer = accept(result(status, Some("A")), 1);
            assert!(
                matches!(answer, Err(SendError::Retryable(_))),
                "{status:?}: {answer:?}"
            );
        }
        assert_eq!(
            accept(result(SendStatus::SendOk, Some("A")), 1),
            Ok(vec!["A".to_string()])
        );
    }

    #[test]
    fn a_batch_result_gives_one_message_id_per_message() {
        let ids = accept(result(SendStatus::SendOk, Some("A,B,C")), 3).unwrap();
        assert_eq!(ids, vec!["A", "B", "C"]);
        // No per-message ids: each SENT row still gets a distinct, non-empty msg_id.
        let ids = accept(result(SendStatus::SendOk, None), 2).unwrap();
        assert_eq!(ids, vec!["OFFSET#0", "OFFSET#1"]);
    }
}
