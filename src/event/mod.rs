//! The event as it travels through the pipeline, from the row it was read from to its outcome:
//! the row and its message ([`OutboxRow`]), a row that cannot become one ([`RowProblem`]), when
//! it passed each stage ([`Stamps`]), and where it came from with the acknowledgement a
//! streamed event carries to the checkpoint ([`Origin`], [`Ack`]).
//!
//! Guarantee: this module depends only on [`crate::outbox`]. Every stage (read, route, send,
//! mark) passes these values on without knowing the stages before or after it.

pub mod ack;
pub mod stamps;

pub use ack::{Ack, Acknowledge, Origin};
pub use stamps::{now_us, Stamps};

use crate::outbox::{OutboundMessage, TableName};
use std::sync::Arc;

/// An outbox INSERT, ready to publish: where it lives and the message it becomes.
///
/// Two rows are equal when they are the same row with the same message, whenever they were read
/// (the stamps are not compared).
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub table: Arc<TableName>,
    pub id: u64,
    pub message: OutboundMessage,
    /// When it passed each stage of the relay (read when it was decoded or claimed).
    pub stamps: Stamps,
}

impl PartialEq for OutboxRow {
    fn eq(&self, other: &Self) -> bool {
        self.table == other.table && self.id == other.id && self.message == other.message
    }
}

#[cfg(any(test, feature = "test-utils"))]
impl OutboxRow {
    /// A small event row `id` of table `outbox_event` (key `k`, topic `t`), for tests.
    pub fn sample(id: u64) -> OutboxRow {
        OutboxRow {
            table: Arc::new(TableName::parse("outbox_event").expect("a valid name")),
            id,
            message: OutboundMessage {
                event_id: format!("e{id}"),
                biz_key: "k".into(),
                topic: "t".into(),
                tags: None,
                headers: vec![],
                payload: "{}".into(),
                deliver_at_ms: None,
            },
            stamps: Stamps::default(),
        }
    }
}

/// A row that cannot become a message; the relay marks it FAILED with `reason`.
#[derive(Debug, Clone, PartialEq)]
pub struct RowProblem {
    pub table: Arc<TableName>,
    pub id: u64,
    pub event_id: Option<String>,
    pub reason: String,
}
