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
    /// A scheduled event's delivery time (Unix ms; `deliver_at`): sent at once as a RocketMQ 5
    /// timer message, which the broker delivers to consumers from then on. `None`: at once.
    pub deliver_at_ms: Option<u64>,
}

/// Limits a row must meet.
#[derive(Debug, Clone, Copy)]
pub struct RowLimits {
    pub max_payload_bytes: usize,
    /// How far ahead of now `deliver_at` may be (`outbox.max_delay`).
    pub max_delay: std::time::Duration,
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
    /// `deliver_at` as Unix seconds with their fraction (`1767225600.250`): how the binlog
    /// carries a TIMESTAMP and what `UNIX_TIMESTAMP()` returns, whatever the time zones.
    pub deliver_at: Option<String>,
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
        deliver_at,
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
    let deliver_at_ms = match deliver_at {
        Some(text) => Some(delivery_time(&text, limits.max_delay, now_ms())?),
        None => None,
    };
    Ok(OutboundMessage {
        event_id,
        biz_key,
        topic,
        tags,
        headers,
        payload,
        deliver_at_ms,
    })
}

/// Milliseconds since the Unix epoch, now (system clock): what `deliver_at` and a timer message's
/// `TIMER_DELIVER_MS` count in.
pub fn now_ms() -> u64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since_epoch.map_or(0, |d| d.as_millis() as u64)
}

/// `deliver_at` (Unix seconds and fraction, as text) in Unix ms, if it is at most `max_delay`
/// after `now_ms`. A time in the past is kept: the broker delivers such a message at once.
fn delivery_time(text: &str, max_delay: std::time::Duration, now_ms: u64) -> Result<u64, String> {
    let bad = || format!("`deliver_at` is not a time: {text:?}");
    let (seconds, fraction) = text.split_once('.').unwrap_or((text, ""));
    let seconds: u64 = seconds.parse().map_err(|_| bad())?;
    let digits: String = fraction.chars().chain("000".chars()).take(3).collect();
    let millis: u64 = digits.parse().map_err(|_| bad())?;
    let at = seconds * 1000 + millis;
    let ahead = std::time::Duration::from_millis(at.saturating_sub(now_ms));
    if ahead > max_delay {
        return Err(format!(
            "`deliver_at` is {:.1} hours ahead; the broker keeps a scheduled message at most \
             {:.1} hours (its timerMaxDelaySec; outbox.max_delay)",
            ahead.as_secs_f64() / 3600.0,
            max_delay.as_secs_f64() / 3600.0
        ));
    }
    Ok(at)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn deliver_at_is_read_in_milliseconds_and_checked_against_the_brokers_limit() {
        let now = 1_767_225_600_000; // 2026-01-01T00:00:00Z
        assert_eq!(delivery_time("1767225600.25", DAY, now), Ok(now + 250));
        assert_eq!(delivery_time("1767225600.123456", DAY, now), Ok(now + 123));
        assert_eq!(delivery_time("1767229200", DAY, now), Ok(now + 3_600_000));
        assert_eq!(
            delivery_time("1767225000.000", DAY, now),
            Ok(now - 600_000),
            "in the past: kept, the broker delivers it at once"
        );
        let too_far = delivery_time("1767571200", DAY, now).unwrap_err();
        assert!(
            too_far.contains("96.0 hours ahead") && too_far.contains("outbox.max_delay"),
            "{too_far}"
        );
        assert!(delivery_time("tomorrow", DAY, now).is_err());
    }

    #[test]
    fn a_rows_deliver_at_becomes_the_messages() {
        let row = |deliver_at: Option<&str>| RowText {
            event_id: "e1".into(),
            biz_key: Some("k".into()),
            topic: Some("t".into()),
            payload: Some("{}".into()),
            deliver_at: deliver_at.map(String::from),
            ..RowText::default()
        };
        let limits = RowLimits {
            max_payload_bytes: 1024,
            max_delay: crate::outbox::DEFAULT_MAX_DELAY,
        };
        let soon = format!("{}.500", now_ms() / 1000 + 60);
        let m = message_from_text(row(Some(&soon)), limits).unwrap();
        assert_eq!(m.deliver_at_ms, Some((now_ms() / 1000 + 60) * 1000 + 500));
        assert_eq!(
            message_from_text(row(None), limits).unwrap().deliver_at_ms,
            None
        );
        let far = format!("{}", now_ms() / 1000 + 4 * 86_400);
        assert!(message_from_text(row(Some(&far)), limits).is_err());
    }
}
