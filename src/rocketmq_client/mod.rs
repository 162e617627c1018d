//! The RocketMQ client as the relay's sender and the consumer library both use it: a private
//! client runtime ([`ClientHost`]) and the account and TLS settings every client is built with
//! ([`ClientSecurity`]).
//!
//! Guarantee: a producer and a consumer made from one [`ClientSecurity`] sign, encrypt and name
//! the cluster the same way, so a setting that works for the relay works for its consumers.

mod host;
mod security;

pub use host::ClientHost;
pub use security::ClientSecurity;
