//! The message an outbox row becomes: what the decoder produces and the sink publishes, and the
//! one check that turns a row's columns into it ([`message_from_text`]), shared by the binlog
//! decoder and the claim of poll mode and the sweeper.

use super::rules;

/// One event to publish, decoded from an outbox row and checked against the producer's rules.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboundMessage {
    pub event_id: String,
    pub biz_key: String,
    pub topic: String,
    pub tags: Option<String>,
    pub headers: Vec<(String, String)>,
    /// JSON text.
    pub payload: String,
}

/// Limits a row must meet.
#[derive(Debug, Clone, Copy)]
pub struct RowLimits {
    pub max_payload_bytes: usize,
}

/// The columns of an outbox row as text, however they were read (binlog row image or SELECT).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowText {
    pub event_id: String,
    pub biz_key: Option<String>,
    pub topic: Option<String>,
    pub tags: Option<String>,
    /// JSON text.
    pub headers: Option<String>,
    /// JSON text.
    pub payload: Option<String>,
}

/// Checks a row's columns against the producer's rules and `limits` and builds its message: the
/// one validation shared by the binlog decoder and the claim of poll mode / the sweeper. The
/// error is the reason the row is marked FAILED.
pub fn message_from_text(row: RowText, limits: RowLimits) -> Result<OutboundMessage, String> {
    let RowText {
        event_id,
        biz_key,
        topic,
        tags,
        headers,
        payload,
    } = row;
    let biz_key = biz_key.ok_or("`biz_key` is NULL")?;
    let topic = topic.ok_or("`topic` is NULL")?;
    let payload = payload.ok_or("`payload` is NULL")?;
    rules::event_id(&event_id).map_err(|e| e.to_string())?;
    rules::topic(&topic).map_err(|e| e.to_string())?;
    rules::biz_key(&biz_key).map_err(|e| e.to_string())?;
    if let Some(t) = &tags {
        rules::tags(t).map_err(|e| e.to_string())?;
    }
    serde_json::from_str::<serde::de::IgnoredAny>(&payload)
        .map_err(|e| format!("payload is not valid JSON: {e}"))?;
    if payload.len() > limits.max_payload_bytes {
        return Err(format!(
            "payload is {} bytes; the limit is {} (outbox.max_payload_bytes)",
            payload.len(),
            limits.max_payload_bytes
        ));
    }
    let headers = match headers {
        Some(text) => parse_headers(&text)?,
        None => Vec::new(),
    };
    let map: std::collections::BTreeMap<String, String> = headers.iter().cloned().collect();
    rules::headers(&map).map_err(|e| e.to_string())?;
    Ok(OutboundMessage {
        event_id,
        biz_key,
        topic,
        tags,
        headers,
        payload,
    })
}

fn parse_headers(text: &str) -> Result<Vec<(String, String)>, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("headers are not valid JSON: {e}"))?;
    match value {
        serde_json::Value::Null => Ok(Vec::new()),
        serde_json::Value::Object(map) => Ok(map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect()),
        _ => Err("headers must be a JSON object".into()),
    }
}
