//! # rocketmq-outbox: the outbox relay
//!
//! Reliable event delivery with the transactional outbox: business code writes its change and an
//! `outbox_event` row in one MySQL transaction ([`producer`], the crate
//! `rocketmq-outbox-producer`); the relay publishes each row to Apache RocketMQ, at least once and
//! in order per `biz_key`; consumers de-duplicate by `event_id` ([`consumer`], the crate
//! `rocketmq-outbox-consumer`).
//!
//! This crate is the relay as a library; the `outbox-relay` binary (crates/outbox-relay) is its
//! command line. What a program names:
//!
//! - [`RelayHandle`]: a relay built from a [`Config`], a [`Sink`] ([`RocketMqSink`]) and, in CDC
//!   mode, a [`CheckpointStore`] ([`SledStore`]), run until cancelled; it ends with a
//!   [`RunSummary`] or an error ([`error`]). [`dry_run`] prints what it would send.
//! - [`operate`]: the operations behind the operator commands (status, replay, cleanup,
//!   reconcile, compensate, partitions) and the [`operate::Watchers`] that run beside a relay.
//! - [`config`], [`db`] (connection helpers), [`logging`], [`serve_metrics`] (`/metrics`).
//! - The libraries it stands on: [`outbox`] (the table, its status codes, the message a row
//!   becomes), [`producer`], [`schema`] (migrations), [`consumer`].
//!
//! Inside, one module per stage of the pipeline: `binlog` reads, `route` and `send` publish,
//! `mark` records SENT, `checkpoint` remembers how far, `sweep` catches what the stream missed,
//! `leader` elects one instance, `pipeline` joins them, `relay` runs them. They are public only
//! with the `test-utils` feature, for the integration tests and the bench.

#![recursion_limit = "256"]

// The libraries the relay stands on, under the names the relay's modules use.
pub use rocketmq_outbox_consumer as consumer;
pub use rocketmq_outbox_consumer::rocketmq_client;
pub use rocketmq_outbox_producer::{outbox, producer, schema};

// The relay's face: what a program embedding the relay (the `outbox-relay` binary, `outbox-dev`)
// names. Each stage of the pipeline below is internal: public only with the `test-utils`
// feature, for the integration tests and the bench, which test the stages one by one on real
// servers.
pub mod config;
pub mod db;
pub mod error;
pub mod logging;
pub mod operate;

/// Declares the pipeline's stages: crate-internal, or public with the `test-utils` feature.
macro_rules! stages {
    ($($(#[$attr:meta])* $name:ident;)*) => {$(
        $(#[$attr])*
        #[cfg(feature = "test-utils")]
        pub mod $name;
        $(#[$attr])*
        #[cfg(not(feature = "test-utils"))]
        pub(crate) mod $name;
    )*};
}

stages! {
    binlog;
    checkpoint;
    event;
    failpoint;
    leader;
    mark;
    metrics;
    pipeline;
    relay;
    retry;
    route;
    send;
    sweep;
}

// Fixtures for tests of the pipeline: a broker in memory, sample events (feature `test-utils`).
#[cfg(any(test, feature = "test-utils"))]
pub mod test_utils;

// The layout rule the compiler does not check: no circles between modules.
#[cfg(test)]
mod layout_tests;
// The user docs checked against the code (configuration keys, schema, metrics, links).
#[cfg(test)]
mod docs_tests;

// A relay built from a configuration, a sink and a checkpoint store, run until cancelled.
pub use binlog::reader::{server_position, ServerInfo};
pub use binlog::BinlogPosition;
pub use checkpoint::{CheckpointStore, SledStore};
pub use config::Config;
pub use leader::Fence;
pub use metrics::server::{bind as bind_metrics, serve as serve_metrics};
pub use pipeline::{RunOptions, RunSummary};
pub use relay::{dry_run, RelayHandle};
pub use send::{RocketMqSink, SendError, SendFailure, Sink, StoredTail, TailBound};
// What business code writes (the producer crate).
pub use producer::{EnqueueError, EventId, NewEvent, Outbox, Payload};
