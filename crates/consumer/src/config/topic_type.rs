//! RocketMQ 5's topic message types (a topic's `message.type` attribute), as the relay's
//! configuration names them (`rocketmq.topic_types`).

use serde::{Deserialize, Serialize};

/// What kind of messages a topic takes. A RocketMQ 5 proxy refuses a message of another kind;
/// a broker reached straight stores it, but a FIFO consumer group orders only messages that
/// carry a message group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TopicType {
    /// Plain messages (also a topic created without a type).
    Normal,
    /// Messages with a message group, delivered in order per group by a FIFO consumer group.
    Fifo,
    /// Scheduled messages (a delivery time).
    Delay,
    /// Transactional (half) messages.
    Transaction,
    /// Any of them.
    Mixed,
}

impl TopicType {
    /// The type a broker's topic config names (`message.type`: `NORMAL`, `FIFO`, ...); `None` for
    /// one the relay does not know. A topic without the attribute (or `UNSPECIFIED`) is NORMAL.
    pub fn from_broker(name: &str) -> Option<Self> {
        match name.to_ascii_uppercase().as_str() {
            "" | "UNSPECIFIED" | "NORMAL" => Some(TopicType::Normal),
            "FIFO" => Some(TopicType::Fifo),
            "DELAY" => Some(TopicType::Delay),
            "TRANSACTION" => Some(TopicType::Transaction),
            "MIXED" => Some(TopicType::Mixed),
            _ => None,
        }
    }

    /// How RocketMQ spells it.
    pub fn name(self) -> &'static str {
        match self {
            TopicType::Normal => "NORMAL",
            TopicType::Fifo => "FIFO",
            TopicType::Delay => "DELAY",
            TopicType::Transaction => "TRANSACTION",
            TopicType::Mixed => "MIXED",
        }
    }
}
