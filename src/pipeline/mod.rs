//! The pipeline, put together: read → route → send → mark → checkpoint, with claim/sweep beside
//! it. [`run_cdc`] streams the binlog (the binlog reader, the dispatcher with its key-order
//! guard, the shard senders, the marker, the checkpointer, and the sweeper beside the stream);
//! [`run_sweeper_alone`] claims from the table instead (poll mode, and a standby's sweeping);
//! [`run_instance`] is one CDC instance among several: it stands by until elected, then streams.
//! Every one of them is assembled by the [`PipelineBuilder`]; the process around them (sink,
//! checkpoint store, signals, dry run) is [`crate::relay`].
//!
//! Guarantees (the product's contract): every committed outbox INSERT after the start position
//! is published with `SEND_OK` and marked SENT, or marked FAILED with a reason; events of one
//! `biz_key` are sent in commit order, and never before an older row of the key that the stream
//! did not read (see `key_order`); the persisted checkpoint never passes an event that is not
//! recorded as SENT or FAILED, so a crash at any moment loses nothing (it may resend).

mod builder;
mod cdc;
mod dispatch;
mod instance;
mod key_order;
#[cfg(test)]
mod pipeline_tests;
mod poll;

pub use builder::{Marked, PipelineBuilder, SendStage};
pub use cdc::run_cdc;
pub use instance::run_instance;
pub use key_order::KeyOrderChecks;
pub use poll::{run_poll, run_sweeper_alone};

use crate::binlog::BinlogPosition;
use crate::checkpoint::CheckpointSettings;
use crate::mark::MarkStats;
use std::time::Duration;

/// What a finished run did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunSummary {
    pub marked: MarkStats,
    /// The last persisted checkpoint.
    pub checkpoint: BinlogPosition,
    /// Rows that could not even be identified (no primary key): logged, not marked.
    pub unidentifiable: u64,
    /// What the stream's key-order guard asked the database before its batches.
    pub key_order_checks: KeyOrderChecks,
}

impl RunSummary {
    /// Adds a later run's counts; its checkpoint (if any) becomes the last one.
    pub fn absorb(&mut self, later: RunSummary) {
        self.marked.sent += later.marked.sent;
        self.marked.failed += later.marked.failed;
        self.unidentifiable += later.unidentifiable;
        self.key_order_checks.add(later.key_order_checks);
        if !later.checkpoint.is_unknown() {
            self.checkpoint = later.checkpoint;
        }
    }
}

/// Options beyond the config file.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// After cancellation, how long in-flight events may take to finish.
    pub drain_timeout: Duration,
    pub checkpoint: CheckpointSettings,
    /// Poll mode and the sweeper: how rows are claimed; `None` detects it from the server's
    /// version.
    pub claim_strategy: Option<crate::sweep::ClaimStrategy>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            drain_timeout: Duration::from_secs(10),
            checkpoint: CheckpointSettings::default(),
            claim_strategy: None,
        }
    }
}
