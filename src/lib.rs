//! # outbox-relay
//!
//! Reliable event delivery with the transactional outbox: business code writes its change and an
//! `outbox_event` row in one MySQL transaction ([`producer`]); the relay publishes each row to
//! Apache RocketMQ, at least once and in order per `biz_key`; consumers de-duplicate by
//! `event_id`.
//!
//! Three products, chosen by cargo features: the producer API alone (`default-features =
//! false`: [`outbox`], [`producer`], [`schema`]), the consumer library (`consumer`), and the
//! relay (`relay`, the default, everything).
//!
//! [`outbox`] is the ground floor: the table's name, its status codes and the message a row
//! becomes; the relay's [`event`] (a row on its way, with the acknowledgement it carries) stands
//! on it. Modules follow the pipeline: [`config`] and [`schema`] set it up, [`producer`] is the
//! business-side API, [`db`] holds MySQL connection helpers, and [`devenv`] starts real local
//! servers for development, tests and benchmarks.

#![recursion_limit = "256"]

// The producer API, always compiled (`default-features = false` gives only this).
pub mod outbox;
pub mod producer;
pub mod schema;

// The relay's settings and MySQL connection options (feature `config`).
#[cfg(feature = "config")]
pub mod config;
#[cfg(feature = "config")]
pub mod db;

// The consumer library (feature `consumer`).
#[cfg(feature = "consumer")]
pub mod consumer;
#[cfg(feature = "consumer")]
pub mod rocketmq_client;

// The relay (feature `relay`, the default): the pipeline's stages, leadership, operations,
// metrics and the dev servers.
#[cfg(feature = "relay")]
pub mod binlog;
#[cfg(feature = "relay")]
pub mod checkpoint;
#[cfg(feature = "relay")]
pub mod devenv;
#[cfg(feature = "relay")]
pub mod error;
#[cfg(feature = "relay")]
pub mod event;
#[cfg(feature = "relay")]
pub mod failpoint;
#[cfg(feature = "relay")]
pub mod leader;
#[cfg(feature = "relay")]
pub mod mark;
#[cfg(feature = "relay")]
pub mod metrics;
#[cfg(feature = "relay")]
pub mod operate;
#[cfg(feature = "relay")]
pub mod pipeline;
#[cfg(feature = "relay")]
pub mod relay;
#[cfg(feature = "relay")]
pub mod retry;
#[cfg(feature = "relay")]
pub mod route;
#[cfg(feature = "relay")]
pub mod send;
#[cfg(feature = "relay")]
pub mod sweep;

// Fixtures for tests of the pipeline: a broker in memory, sample events (feature `test-utils`).
#[cfg(all(feature = "relay", any(test, feature = "test-utils")))]
pub mod test_utils;

#[cfg(feature = "config")]
pub use config::Config;
pub use producer::{EnqueueError, EventId, NewEvent, Outbox, Payload};
