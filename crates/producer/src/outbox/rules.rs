//! The rules an event must meet: checked by the producer before a row is written, and again by
//! the stream and the sweeper when a row becomes a message (a row written by hand, or by an older
//! producer, may break them). Each rule matches what RocketMQ or the outbox schema would otherwise
//! reject later, when the business transaction is long gone.

use std::collections::BTreeMap;

/// A rule an event breaks; the message says which and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleViolation {
    #[error("invalid topic {topic:?}: {reason}")]
    InvalidTopic { topic: String, reason: String },
    #[error("biz_key is {len} characters long; the limit is {max}")]
    BizKeyTooLong { len: usize, max: usize },
    #[error("invalid biz_key: {reason}")]
    InvalidBizKey { reason: String },
    #[error("invalid event_id {event_id:?}: use 1 to 64 printable ASCII characters, no spaces")]
    InvalidEventId { event_id: String },
    #[error("invalid tags {tags:?}: {reason}")]
    InvalidTags { tags: String, reason: String },
    #[error("invalid header {name:?}: {reason}")]
    InvalidHeader { name: String, reason: String },
    #[error("invalid deliver_at: {reason}")]
    InvalidDeliverAt { reason: String },
}

/// Longest topic RocketMQ accepts.
pub const MAX_TOPIC_LEN: usize = 127;
/// Longest `biz_key` (the column is `VARCHAR(64)`).
pub const MAX_BIZ_KEY_LEN: usize = 64;
/// Longest `event_id` (the column is `VARCHAR(64)`).
pub const MAX_EVENT_ID_LEN: usize = 64;
/// Longest tag (the column is `VARCHAR(128)`).
pub const MAX_TAGS_LEN: usize = 128;

/// Topics the broker owns; publishing to them is a mistake.
const RESERVED_TOPICS: &[&str] = &[
    "TBW102",
    "SCHEDULE_TOPIC_XXXX",
    "BenchmarkTest",
    "OFFSET_MOVED_EVENT",
    "SELF_TEST_TOPIC",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRACE_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
];
const RESERVED_TOPIC_PREFIXES: &[&str] = &["%RETRY%", "%DLQ%", "rmq_sys_", "RMQ_SYS_"];

/// Message properties the relay or RocketMQ sets itself; a header may not overwrite them.
const RESERVED_HEADERS: &[&str] = &[
    "KEYS",
    "TAGS",
    "UNIQ_KEY",
    "WAIT",
    "DELAY",
    "RETRY_TOPIC",
    "REAL_TOPIC",
    "REAL_QID",
    "TRAN_MSG",
    "PGROUP",
    "MIN_OFFSET",
    "MAX_OFFSET",
    "BUYER_ID",
    "ORIGIN_MESSAGE_ID",
    "TRANSFER_FLAG",
    "CORRECTION_FLAG",
    "MQ2_FLAG",
    "RECONSUME_TIME",
    "MSG_REGION",
    "TRACE_ON",
    "MAX_RECONSUME_TIMES",
    "CONSUME_START_TIME",
    "SHARDING_KEY",
    "event_id",
    "biz_key",
];

/// RocketMQ topic names: 1–127 of `[A-Za-z0-9_-]`, not a system topic.
pub fn topic(topic: &str) -> Result<(), RuleViolation> {
    let invalid = |reason: &str| {
        Err(RuleViolation::InvalidTopic {
            topic: topic.to_string(),
            reason: reason.to_string(),
        })
    };
    if topic.is_empty() {
        return invalid("it is empty");
    }
    if topic.len() > MAX_TOPIC_LEN {
        return invalid("it is longer than 127 characters");
    }
    if !topic
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return invalid("only letters, digits, '_' and '-' are allowed");
    }
    if RESERVED_TOPICS.contains(&topic)
        || RESERVED_TOPIC_PREFIXES.iter().any(|p| topic.starts_with(p))
    {
        return invalid("it is a RocketMQ system topic");
    }
    Ok(())
}

/// `biz_key`: 1–64 characters, no control characters.
pub fn biz_key(key: &str) -> Result<(), RuleViolation> {
    let len = key.chars().count();
    if len == 0 {
        return Err(RuleViolation::InvalidBizKey {
            reason: "it is empty".into(),
        });
    }
    if len > MAX_BIZ_KEY_LEN {
        return Err(RuleViolation::BizKeyTooLong {
            len,
            max: MAX_BIZ_KEY_LEN,
        });
    }
    if key.chars().any(char::is_control) {
        return Err(RuleViolation::InvalidBizKey {
            reason: "it contains control characters".into(),
        });
    }
    Ok(())
}

/// A caller-chosen `event_id`: 1–64 printable ASCII characters without spaces (it is a message
/// key and the consumers' de-duplication key).
pub fn event_id(id: &str) -> Result<(), RuleViolation> {
    let ok =
        !id.is_empty() && id.len() <= MAX_EVENT_ID_LEN && id.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err(RuleViolation::InvalidEventId {
            event_id: id.to_string(),
        })
    }
}

/// Tags: 1–128 characters, no `|` (RocketMQ's tag-expression separator), no control characters.
pub fn tags(tags: &str) -> Result<(), RuleViolation> {
    let reason = if tags.is_empty() {
        Some("it is empty (leave tags unset instead)")
    } else if tags.chars().count() > MAX_TAGS_LEN {
        Some("it is longer than 128 characters")
    } else if tags.contains('|') || tags.chars().any(char::is_control) {
        Some("'|' and control characters are not allowed")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(RuleViolation::InvalidTags {
            tags: tags.to_string(),
            reason: reason.to_string(),
        }),
        None => Ok(()),
    }
}

/// The latest `deliver_at` a `TIMESTAMP` column holds (2038-01-19 03:14:07 UTC).
const MAX_TIMESTAMP_SECS: u64 = i32::MAX as u64;

/// A scheduled event's delivery time as the `deliver_at` column takes it: Unix seconds with
/// their milliseconds, `"1767225600.250"`. From 1970 to 2038 (a TIMESTAMP's range); how far
/// ahead the broker keeps it (3 days by default) the relay checks when it sends.
pub fn deliver_at(at: std::time::SystemTime) -> Result<String, RuleViolation> {
    let invalid = |reason: &str| RuleViolation::InvalidDeliverAt {
        reason: reason.to_string(),
    };
    let since =
        (at.duration_since(std::time::UNIX_EPOCH)).map_err(|_| invalid("it is before 1970"))?;
    if since.as_secs() >= MAX_TIMESTAMP_SECS {
        return Err(invalid(
            "it is after 2038-01-19 (the TIMESTAMP column's range)",
        ));
    }
    Ok(format!("{}.{:03}", since.as_secs(), since.subsec_millis()))
}

/// Headers become message properties: names are non-empty, not reserved, and neither names
/// nor values contain control characters (RocketMQ separates properties with `\u{1}`/`\u{2}`).
pub fn headers(headers: &BTreeMap<String, String>) -> Result<(), RuleViolation> {
    for (name, value) in headers {
        let reason = if name.is_empty() {
            Some("the name is empty")
        } else if RESERVED_HEADERS.contains(&name.as_str()) {
            Some("the name is reserved by RocketMQ or the relay")
        } else if name.chars().chain(value.chars()).any(char::is_control) {
            Some("control characters are not allowed")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(RuleViolation::InvalidHeader {
                name: name.clone(),
                reason: reason.to_string(),
            });
        }
    }
    Ok(())
}
