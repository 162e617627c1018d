//! The RocketMQ client as the relay's sender and the consumer library both use it: a private
//! client runtime ([`ClientHost`]) and the account and TLS settings every client is built with
//! ([`ClientSecurity`]).
//!
//! Guarantee: a producer and a consumer made from one [`ClientSecurity`] sign, encrypt and name
//! the cluster the same way, so a setting that works for the relay works for its consumers.

mod host;
mod security;

/// Namespaced names: defined with the `rocketmq.namespace` setting, used by every client.
pub use crate::config::namespace;

pub use host::ClientHost;
pub use security::ClientSecurity;

use rocketmq_client_rust::{ClientError, MQClientException};

/// TOPIC_NOT_EXIST (17), or the client's "Can not find Message Queue for this topic" (-1):
/// either the topic is missing or no broker serving it is registered right now.
pub fn is_missing_topic(error: &ClientError) -> bool {
    matches!(
        error
            .source_ref::<MQClientException>()
            .map(MQClientException::response_code),
        Some(17) | Some(-1)
    ) || error.broker_response_code() == Some(17)
}

/// Two rustls crypto providers are compiled in (ours and a dependency's): picks one for the
/// process before any TLS config is built (MySQL's or RocketMQ's); later calls do nothing.
pub fn choose_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
