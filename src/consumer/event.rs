//! [`ConsumedEvent`]: one delivered message, decoded per the relay's message contract, and the
//! dedup key that identifies its event.
//!
//! The contract (what the relay publishes): user property `event_id`, user property `biz_key`,
//! `KEYS` = event_id and biz_key, tags from the outbox row, each row header as a user property,
//! body = the JSON payload. The dedup key is `event_id` if present, else `biz_key` + the event
//! type (user property `event_type`, else the payload's JSON field `type`). A message with
//! neither cannot be de-duplicated, so it is rejected (quarantined), never processed.

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// User property carrying the event id.
pub const EVENT_ID_PROPERTY: &str = "event_id";
/// User property carrying the business key.
pub const BIZ_KEY_PROPERTY: &str = "biz_key";
/// User property carrying the event type (optional).
pub const EVENT_TYPE_PROPERTY: &str = "event_type";
/// Longest dedup key stored as is (`event_dedup.event_id` is `VARCHAR(191)`).
pub const MAX_DEDUP_KEY_LEN: usize = 191;

/// One delivered message, as a [`super::Handler`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumedEvent {
    /// The user property `event_id`, if the message has one.
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

    /// Sets `event_id`, `biz_key` and `event_type` from the user properties and the payload.
    pub(crate) fn fill_from_properties(&mut self) {
        let property = |name: &str| self.properties.get(name).filter(|v| !v.is_empty()).cloned();
        self.event_id = property(EVENT_ID_PROPERTY);
        self.biz_key = property(BIZ_KEY_PROPERTY);
        self.event_type = property(EVENT_TYPE_PROPERTY).or_else(|| self.payload_type_field());
    }

    fn payload_type_field(&self) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct TypeField {
            #[serde(rename = "type")]
            kind: Option<serde_json::Value>,
        }
        let parsed: TypeField = serde_json::from_slice(&self.payload).ok()?;
        match parsed.kind? {
            serde_json::Value::String(s) if !s.is_empty() => Some(s),
            _ => None,
        }
    }

    /// The payload parsed as JSON into `T` (e.g. `serde_json::Value` or a struct of the event).
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.payload)
    }

    /// The payload as UTF-8 text, or `None` if it is not valid UTF-8.
    pub fn payload_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.payload).ok()
    }

    /// The key this event is de-duplicated by, or why it has none.
    pub fn dedup_key(&self) -> Result<String, String> {
        if let Some(id) = &self.event_id {
            return Ok(fit_key(id.clone()));
        }
        match (&self.biz_key, &self.event_type) {
            (Some(biz_key), Some(kind)) => Ok(fit_key(format!("{biz_key}#{kind}"))),
            (None, _) => Err(
                "no event_id property and no biz_key property: the message cannot be de-duplicated"
                    .to_string(),
            ),
            (Some(_), None) => Err(
                "no event_id property, and no event type (property event_type or JSON field \
                 `type` of the payload) to pair with biz_key: the message cannot be de-duplicated"
                    .to_string(),
            ),
        }
    }
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
    fn falls_back_to_biz_key_and_event_type() {
        let from_payload = ConsumedEvent::new("t", br#"{"type":"OrderPaid","n":1}"#.to_vec())
            .with_property("biz_key", "order-1");
        assert_eq!(from_payload.dedup_key().unwrap(), "order-1#OrderPaid");
        let from_property = from_payload
            .clone()
            .with_property("event_type", "OrderRefunded");
        assert_eq!(from_property.dedup_key().unwrap(), "order-1#OrderRefunded");
    }

    #[test]
    fn no_key_is_an_error_that_says_why() {
        let no_type = ConsumedEvent::new("t", b"not json".to_vec()).with_property("biz_key", "b");
        assert!(no_type.dedup_key().unwrap_err().contains("event type"));
        let nothing = ConsumedEvent::new("t", br#"{"type":"X"}"#.to_vec());
        assert!(nothing.dedup_key().unwrap_err().contains("biz_key"));
        let empty_id = ConsumedEvent::new("t", b"{}".to_vec()).with_property("event_id", "");
        assert!(empty_id.dedup_key().is_err());
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
