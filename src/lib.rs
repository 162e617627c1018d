//! # rocketmq-outbox: the outbox relay
//!
//! Reliable event delivery with the transactional outbox: business code writes its change and an
//! `outbox_event` row in one MySQL transaction (crate `rocketmq-outbox-producer`); the relay
//! publishes each row to Apache RocketMQ, at least once and in order per `biz_key`; consumers
//! de-duplicate by `event_id` (crate `rocketmq-outbox-consumer`).
//!
//! This crate is the relay. [`outbox`] (re-exported from the producer crate) is the ground floor:
//! the table's name, its status codes and the message a row becomes; the relay's [`event`] (a
//! row on its way, with the acknowledgement it carries) stands on it. Modules follow the
//! pipeline: [`config`] and [`schema`] set it up, [`binlog`] reads, [`route`] and [`send`]
//! publish, [`mark`] records SENT, [`checkpoint`] remembers how far, [`sweep`] catches what the
//! stream missed; [`db`] holds MySQL connection helpers.

#![recursion_limit = "256"]

// The libraries the relay stands on, under the names the relay's modules use.
pub use rocketmq_outbox_consumer as consumer;
pub use rocketmq_outbox_consumer::rocketmq_client;
pub use rocketmq_outbox_producer::{outbox, producer, schema};

pub mod binlog;
pub mod checkpoint;
pub mod config;
pub mod db;
pub mod error;
pub mod event;
pub mod failpoint;
pub mod leader;
pub mod logging;
pub mod mark;
pub mod metrics;
pub mod operate;
pub mod pipeline;
pub mod relay;
pub mod retry;
pub mod route;
pub mod send;
pub mod sweep;

// Fixtures for tests of the pipeline: a broker in memory, sample events (feature `test-utils`).
#[cfg(any(test, feature = "test-utils"))]
pub mod test_utils;

// The layout rule the compiler does not check: no circles between modules.
#[cfg(test)]
mod layout_tests;
// The user docs checked against the code (configuration keys, schema, metrics, links).
#[cfg(test)]
mod docs_tests;

pub use config::Config;
pub use producer::{EnqueueError, EventId, NewEvent, Outbox, Payload};
