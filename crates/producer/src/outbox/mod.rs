//! The outbox itself, the ground floor every stage stands on: the table's name, the `status`
//! column's codes, the message a row becomes, the rules it must meet and the one check of a
//! row's columns against them (the stream's decoder and the sweeper's claim both use it), and
//! the defaults the producer and the relay share.
//!
//! Guarantee: this module depends on no other module of the crate. Each rule about the table is
//! written here once, so the producer that writes rows, the stream and the sweeper that read them,
//! and the operator commands that repair them cannot disagree on it.

pub mod message;
pub mod rules;
pub mod status;
pub mod table;

pub use message::OutboundMessage;
pub use rules::RuleViolation;
pub use status::Status;
pub use table::TableName;

/// The table every configured outbox table is shaped like (and the default `outbox.tables`).
pub const DEFAULT_TABLE: &str = "outbox_event";

/// Largest payload accepted by default: RocketMQ's default maximum message size (4 MiB).
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 4 * 1024 * 1024;
/// How far ahead a scheduled event may be by default: Apache RocketMQ 5's `timerMaxDelaySec`
/// default (259,200 s).
pub const DEFAULT_MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(259_200);
