//! # rocketmq-outbox-producer
//!
//! The business side of the transactional outbox: write your change **and** its event in one
//! MySQL/MariaDB transaction with [`Outbox::enqueue`]; the relay (`outbox-relay`, crate
//! `rocketmq-outbox`) publishes every committed event to Apache RocketMQ, at least once and in
//! order per `biz_key`.
//!
//! [`outbox`] holds the rules every row keeps (names, sizes, status codes, the message a row
//! becomes) — one home shared with the relay, so what the producer accepts the relay can send.
//! [`schema`] creates or adopts the outbox tables (`outbox-relay migrate` runs it).

pub mod outbox;
pub mod producer;
pub mod schema;

pub use producer::{EnqueueError, EventId, NewEvent, Outbox, Payload};
