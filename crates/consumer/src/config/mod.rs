//! The RocketMQ settings (`[rocketmq]` of the relay's configuration) that the relay and the
//! consumer library share, so that a consumer connects, signs and names topics exactly as the
//! relay does; and [`InvalidSetting`], the error each of these settings reports.
//!
//! Guarantee: a setting is validated where it is defined, and its error names the key and what
//! to change.

pub mod namespace;
mod rocketmq;
mod secret;
mod topic_type;

pub use rocketmq::RocketMqConfig;
pub use secret::{Credentials, Secret};
pub use topic_type::TopicType;

/// A `[rocketmq]` setting that cannot work, phrased so the user knows what to change (the
/// relay reports it as its own configuration error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct InvalidSetting(pub String);
