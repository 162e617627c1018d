//! The message an outbox row becomes: what the decoder produces and the sink publishes.

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
