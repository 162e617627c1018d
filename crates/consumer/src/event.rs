//! [`ConsumedEvent`]: one delivered message, decoded per the relay's message contract, and the
//! dedup key that identifies its event.
//!
//! The contract (what the relay publishes): user property `event_id`, user property `biz_key`,
//! `KEYS` = event_id and biz_key, tags from the outbox row, each row header as a user property,
//! body = the JSON payload.
//!
//! Guarantee: the dedup key is unique per event, never per business key. It is the user property
//! `event_id`, else the payload's top-level JSON field `event_id` (a string, or an integer), for
//! producers outside this project that cannot set user properties. `biz_key` + event type is
//! *not* a key: two different events of one key and type (an order updated twice) would be
//! "duplicates", and the second would be ACKed without being processed (the article's swallowed
//! message). A message without an event id is therefore quarantined with a reason saying what the
//! producer must send, and never processed: each such message is quarantined, none is swallowed.

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// User property carrying the event id.
pub const EVENT_ID_PROPERTY: &str = "event_id";
/// Top-level JSON field of the payload carrying the event id when the property is absent.
pub const EVENT_ID_FIELD: &str = "event_id";
/// User property carrying the business key.
pub const BIZ_KEY_PROPERTY: &str = "biz_key";
/// User property carrying the event type (optional).
pub const EVENT_TYPE_PROPERTY: &str = "event_type";
/// Longest dedup key stored as is (`event_dedup.event_id` is `VARCHAR(191)`).
pub const MAX_DEDUP_KEY_LEN: usize = 191;

/// One delivered message, as a [`super::Handler`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumedEvent {
    /// The event id: the user property `event_id`, else the payload's top-level JSON field
    /// `event_id` (a string, or an integer as text), if either is there and not empty.
    pub event_id: Option<String>,
    /// The user property `biz_key`, if the message has one.
    pub biz_key: Option<String>,
    /// The user property `event_type`, else the payload's JSON field `type`, if any.
    pub event_type: Option<String>,
    /// The original topic (also for redeliveries through the retry topic).
    pub topic: String,
    pub tags: Option<String>,
    /// `KEYS`, split on spaces.
    pub keys: Vec<String>,
    /// The producer-side unique id (`UNIQ_KEY`), else the broker's offset message id.
    pub msg_id: String,
    /// User properties (system properties such as `KEYS` or `TAGS` left out): headers too.
    pub properties: BTreeMap<String, String>,
    /// The body as published: JSON bytes per the contract, but it may be anything.
    pub payload: Vec<u8>,
    /// How many times the broker redelivered this message (0 on the first delivery).
    pub reconsume_times: i32,
    pub queue_id: i32,
    pub queue_offset: i64,
}

impl ConsumedEvent {
    /// A message with the contract's properties, e.g. for tests or a replay tool.
    pub fn new(topic: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        let mut event = Self {
            event_id: None,
            biz_key: None,
            event_type: None,
            topic: topic.into(),
            tags: None,
            keys: Vec::new(),
            msg_id: String::new(),
            properties: BTreeMap::new(),
            payload: payload.into(),
            reconsume_times: 0,
            queue_id: 0,
            queue_offset: 0,
        };
        event.fill_from_properties();
        event
    }

    /// Sets a user property (and the contract fields it carries).
    pub fn with_property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(name.into(), value.into());
        self.fill_from_properties();
        self
    }

    /// Sets `event_id`, `biz_key` and `event_type` from the user properties and the payload
    /// (a property wins over the payload's field).
    pub(crate) fn fill_from_properties(&mut self) {
        let property = |name: &str| self.properties.get(name).filter(|v| !v.is_empty()).cloned();
        let (event_id, biz_key, event_type) = (
            property(EVENT_ID_PROPERTY),
            property(BIZ_KEY_PROPERTY),
            property(EVENT_TYPE_PROPERTY),
        );
        let fields = match (&event_id, &event_type) {
            (Some(_), Some(_)) => PayloadFields::default(),
            _ => PayloadFields::of(&self.payload),
        };
        self.event_id = event_id.or(fields.event_id);
        self.biz_key = biz_key;
        self.event_type = event_type.or(fields.kind);
    }

    /// The payload parsed as JSON into `T` (e.g. `serde_json::Value` or a struct of the event).
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }

    /// The payload as UTF-8 text, or `None` if it is not valid UTF-8.
    pub fn payload_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.payload).ok()
    }

    /// The key this event is de-duplicated by (its event id), or why it has none: the reason a
    /// message without one is quarantined.
    pub fn dedup_key(&self) -> Result<String, String> {
        if let Some(id) = &self.event_id {
            return Ok(fit_key(id.clone()));
        }
        let named = match (&self.biz_key, &self.event_type) {
            (Some(key), Some(kind)) => format!(" (biz_key {key:?}, type {kind:?})"),
            (Some(key), None) => format!(" (biz_key {key:?})"),
            _ => String::new(),
        };
        Err(format!(
            "no event id: neither a user property `{EVENT_ID_PROPERTY}` nor a top-level \
             `{EVENT_ID_FIELD}` field in the JSON payload{named}. Without one the message \
             cannot be de-duplicated (biz_key + type would take another event of the same key \
             and type for a duplicate), so it is not processed: the producer must send a unique \
             event id per event"
        ))
    }
}

/// The payload's top-level fields that stand in for missing properties; absent when the payload
/// is not a JSON object.
#[derive(Debug, Default, serde::Deserialize)]
struct PayloadFields {
    #[serde(default, rename = "event_id", deserialize_with = "id_text")]
    event_id: Option<String>,
    #[serde(default, rename = "type", deserialize_with = "type_text")]
    kind: Option<String>,
}

impl PayloadFields {
    fn of(payload: &[u8]) -> Self {
        serde_json::from_slice(payload).unwrap_or_default()
    }
}

/// A non-empty string or an integer, as text; anything else is no id.
fn id_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    use serde::Deserialize;
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) if !s.is_empty() => Some(s),
        serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    })
}

/// A non-empty string; anything else is no type.
fn type_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    use serde::Deserialize;
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) if !s.is_empty() => Some(s),
        _ => None,
    })
}

/// Keys longer than the column are replaced by `sha256:<hex>` of the key (stable, unique enough).
fn fit_key(key: String) -> String {
    if key.chars().count() <= MAX_DEDUP_KEY_LEN {
        return key;
    }
    let hex: String = Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_id_is_the_key_when_present() {
        let event = ConsumedEvent::new("t", br#"{"type":"OrderPaid"}"#.to_vec())
            .with_property("event_id", "ev-1")
            .with_property("biz_key", "order-1");
        assert_eq!(event.dedup_key().unwrap(), "ev-1");
        assert_eq!(event.event_type.as_deref(), Some("OrderPaid"));
    }

    #[test]
    fn without_the_property_the_payloads_event_id_is_the_key() {
        let from_payload = ConsumedEvent::new("t", br#"{"type":"OrderPaid","event_id":"p-1"}"#)
            .with_property("biz_key", "order-1");
        assert_eq!(from_payload.dedup_key().unwrap(), "p-1");
        assert_eq!(from_payload.event_type.as_deref(), Some("OrderPaid"));
        let number = ConsumedEvent::new("t", br#"{"event_id":4711}"#.to_vec());
        assert_eq!(number.dedup_key().unwrap(), "4711");
        // The property wins over the payload's field.
        let both = from_payload.with_property("event_id", "ev-9");
        assert_eq!(both.dedup_key().unwrap(), "ev-9");
    }

    #[test]
    fn two_events_of_one_key_and_type_never_share_a_key() {
        // The article's "swallowed" failure: with biz_key + type as the key, the second update
        // of an order was a "duplicate" and was ACKed unprocessed.
        let update = |n: u32, id: Option<&str>| {
            let body = match id {
                Some(id) => format!(r#"{{"type":"OrderUpdated","n":{n},"event_id":"{id}"}}"#),
                None => format!(r#"{{"type":"OrderUpdated","n":{n}}}"#),
            };
            ConsumedEvent::new("t", body).with_property("biz_key", "order-1")
        };
        let (first, second) = (update(1, Some("u-1")), update(2, Some("u-2")));
        assert_ne!(first.dedup_key().unwrap(), second.dedup_key().unwrap());
        for unkeyed in [update(1, None), update(2, None)] {
            let reason = unkeyed.dedup_key().unwrap_err();
            assert!(reason.contains("no event id"), "{reason}");
            assert!(
                reason.contains(r#"biz_key "order-1", type "OrderUpdated""#),
                "{reason}"
            );
        }
    }

    #[test]
    fn no_key_is_an_error_that_says_why() {
        let not_json = ConsumedEvent::new("t", b"not json".to_vec()).with_property("biz_key", "b");
        assert!(not_json
            .dedup_key()
            .unwrap_err()
            .contains("user property `event_id`"));
        let nothing = ConsumedEvent::new("t", br#"{"type":"X"}"#.to_vec());
        assert!(nothing.dedup_key().is_err());
        let empty_id = ConsumedEvent::new("t", b"{}".to_vec()).with_property("event_id", "");
        assert!(empty_id.dedup_key().is_err());
        for not_an_id in [
            r#"{"event_id":""}"#,
            r#"{"event_id":1.5}"#,
            r#"{"event_id":{}}"#,
        ] {
            let event = ConsumedEvent::new("t", not_an_id);
            assert!(event.dedup_key().is_err(), "{not_an_id}");
        }
    }

    #[test]
    fn long_keys_are_hashed_to_fit_the_column() {
        let long = "k".repeat(300);
        let event = ConsumedEvent::new("t", b"{}".to_vec()).with_property("event_id", &long);
        let key = event.dedup_key().unwrap();
        assert!(key.starts_with("sha256:") && key.len() == 7 + 64, "{key}");
        assert_eq!(key, fit_key(long));
    }
}
