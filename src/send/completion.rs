//! What the send stage reports of each event: its final outcome, for the SENT/FAILED marker.

use crate::event::{Origin, OutboxRow, RowProblem, Stamps};
use crate::outbox::TableName;
use std::sync::Arc;

/// How an event ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// The broker answered `SEND_OK`; its message id.
    Sent { msg_id: String },
    /// Given up: the reason and how many attempts were counted (the first and each retry; an
    /// early attempt after a wake-up that failed too is not counted).
    Failed { reason: String, attempts: u32 },
}

/// The final outcome of one event, for the SENT/FAILED marker.
#[derive(Debug, PartialEq)]
pub struct Completion {
    /// Where the event came from (its acknowledgement, if streamed: the marker acknowledges it
    /// once the outcome is recorded).
    pub origin: Origin,
    pub table: Arc<TableName>,
    pub id: u64,
    pub event_id: String,
    pub outcome: SendOutcome,
    /// When the event passed each stage before its outcome (default for a row never sent).
    pub stamps: Stamps,
}

impl Completion {
    /// A row that cannot become a message: FAILED with its reason, without a send (logged).
    pub fn bad_row(origin: Origin, problem: RowProblem) -> Self {
        tracing::error!(table = %problem.table, id = problem.id, reason = %problem.reason,
            "outbox row cannot be published; marking it FAILED");
        Completion {
            origin,
            table: problem.table,
            id: problem.id,
            event_id: problem.event_id.unwrap_or_default(),
            outcome: SendOutcome::Failed {
                reason: problem.reason,
                attempts: 0,
            },
            stamps: Stamps::default(),
        }
    }

    /// An event a previous run stored on the broker as `msg_id` but did not record: SENT with
    /// that id, without a send (see `pipeline::dispatch::CatchUp`).
    pub fn stored(origin: Origin, row: OutboxRow, msg_id: String) -> Self {
        Completion {
            origin,
            table: row.table,
            id: row.id,
            event_id: row.message.event_id,
            outcome: SendOutcome::Sent { msg_id },
            stamps: Stamps::default(),
        }
    }
}
