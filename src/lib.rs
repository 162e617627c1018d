//! # outbox-relay
//!
//! Reliable event delivery with the transactional outbox: business code writes its change and an
//! `outbox_event` row in one MySQL transaction ([`producer`]); the relay publishes each row to
//! Apache RocketMQ, at least once and in order per `biz_key`; consumers de-duplicate by
//! `event_id`.
//!
//! [`outbox`] is the ground floor: the table's name, its status codes and the message a row
//! becomes. Modules follow the pipeline: [`config`] and [`schema`] set it up, [`producer`] is the
//! business-side API, [`db`] holds MySQL connection helpers, and [`devenv`] starts real local
//! servers for development, tests and benchmarks.

#![recursion_limit = "256"]

pub mod binlog;
pub mod checkpoint;
pub mod config;
pub mod consumer;
pub mod db;
pub mod devenv;
pub mod failpoint;
pub mod leader;
pub mod mark;
pub mod metrics;
pub mod operate;
pub mod outbox;
pub mod producer;
pub mod relay;
pub mod retry;
pub mod route;
pub mod schema;
pub mod send;
pub mod sweep;

pub use config::Config;
pub use producer::{EnqueueError, EventId, NewEvent, Outbox, Payload};
