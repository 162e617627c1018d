//! The RocketMQ settings (`[rocketmq]` of the relay's configuration) that the relay and the
//! consumer library share, so that a consumer connects, signs and names topics exactly as the
//! relay does; and [`ConfigError`], the error every setting reports.
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

use std::path::PathBuf;

/// A configuration problem, phrased so the user knows what to change.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Invalid(String),
    #[error(
        "missing required setting `{key}`: set it in the config file, \
         with {env}, or with {flag}"
    )]
    Missing {
        key: &'static str,
        env: String,
        flag: &'static str,
    },
    #[error("config file {path} not found; pass an existing file with --config or omit it")]
    FileNotFound { path: PathBuf },
}
