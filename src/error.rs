//! One error type for the relay's pipeline, [`PipelineError`], and the one place that decides
//! what the relay does with each kind of it, [`PipelineError::class`].
//!
//! Every stage that returns into the pipeline's run loop returns its own typed error (the binlog
//! reader [`ReaderError`], the start-up checks [`StartupError`], the checkpoint store
//! [`StoreError`] and the checkpointer [`CheckpointError`], the marker [`MarkError`], the
//! election, the pipeline's own MySQL statements [`DbError`], its tasks); [`PipelineError`] has
//! one variant per stage, carrying that error. A foreign error (`mysql_async::Error`, a task's
//! `JoinError`) is wrapped where it enters, in a variant that says which stage met it, so its
//! class is decided there and never by a default.
//!
//! Guarantee: [`PipelineError::class`] is one exhaustive `match` over every kind of every stage's
//! error, with no wildcard arm. A new variant, in [`PipelineError`] or in any stage error it
//! carries, does not compile until it is given its [`ErrorClass`] there. One policy acts on the
//! class: the instance supervisor (`pipeline::run_instance`) retries a round that failed
//! with a retryable error (with backoff) and stops on a permanent one, with the error's message
//! saying what to fix.
//!
//! The send stage returns no error into the run: a failed send is an event's outcome (retried
//! per `[retry]`, then FAILED with its reason; see the `send` module), never a failed round.

pub use crate::binlog::reader::{ReaderError, StartupError};
pub use crate::checkpoint::store::StoreError;
pub use crate::checkpoint::CheckpointError;
pub use crate::mark::MarkError;

use crate::db::PermanentFault;
use std::borrow::Cow;
use std::fmt;

/// What the relay does when a round of the pipeline fails with an error of this class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// It may pass (a lost connection, a restarting server, a lock wait, a fenced mirror write,
    /// a purged binlog position): the instance retries the round with backoff (100 ms doubling
    /// to 10 s, jittered, for ever), logging a WARN per failure. Nothing is acknowledged that
    /// was not recorded, so a retried round resends at most (at-least-once).
    Retryable,
    /// Only the user can fix it (a misconfigured server, a missing grant, a refused or
    /// unsupported binlog, a broken checkpoint store, an outcome that cannot be recorded): the
    /// instance stops and returns the error, whose message says what to fix. The checkpoint
    /// stays before every unrecorded event, so a restart after the fix resends them.
    Permanent,
    /// The server cannot be reached: permanent before the instance ever ran a round (a wrong URL
    /// or a server that is not up is seen at once), retryable afterwards (a server restarting).
    Unreachable,
    /// The relay did not foresee it (a task of the pipeline panicked): retried like
    /// [`ErrorClass::Retryable`], but never unseen: logged at ERROR and counted in
    /// `outbox_unclassified_errors_total` (alert `OutboxUnclassifiedErrors`), to be reported.
    Unexpected,
}

impl ErrorClass {
    /// Whether the instance stops on it; `started`: it ran a round before.
    pub fn stops(self, started: bool) -> bool {
        match self {
            ErrorClass::Retryable | ErrorClass::Unexpected => false,
            ErrorClass::Permanent => true,
            ErrorClass::Unreachable => !started,
        }
    }

    /// Whether a retried error of this class is logged at ERROR and counted as one the relay
    /// cannot explain (rather than a WARN for an expected fault).
    pub fn reported(self) -> bool {
        match self {
            ErrorClass::Unexpected => true,
            ErrorClass::Retryable | ErrorClass::Permanent | ErrorClass::Unreachable => false,
        }
    }
}

/// Why a round of the pipeline (a CDC run, a leadership, a standby's or poll mode's sweeping)
/// ended early. Each variant is one stage; [`PipelineError::class`] decides what the relay does.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The server or the relay's account failed a start-up check (also when a leadership or a
    /// fall-back asks the server for its binlog positions).
    #[error(transparent)]
    Startup(#[from] StartupError),
    /// The binlog reader stopped for good.
    #[error(transparent)]
    Reader(#[from] ReaderError),
    /// The checkpoint store (local or the MySQL mirror) failed, read at start or written after
    /// a fall-back.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The checkpointer stopped: saves kept failing, or the final save failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The marker met an error retrying cannot fix.
    #[error(transparent)]
    Mark(#[from] MarkError),
    /// The leader election could not be entered (its statements failed).
    #[error("cannot enter the leader election in MySQL (has `outbox-relay migrate` run?)")]
    Election(#[source] mysql_async::Error),
    /// A MySQL connection or statement of the pipeline's own (the start position, the sweeper's
    /// table check, a fall-back's mirror write) failed.
    #[error(transparent)]
    Database(#[from] DbError),
    /// A task of the pipeline panicked (or was cancelled).
    #[error("the {task} task failed")]
    Task {
        task: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl PipelineError {
    /// What the relay does with this error (see [`ErrorClass`]). One exhaustive match over every
    /// kind of every stage's error, and no wildcard: a new kind fails to compile until it is
    /// classified here.
    pub fn class(&self) -> ErrorClass {
        use ErrorClass::*;
        match self {
            PipelineError::Startup(startup) => match startup {
                StartupError::Misconfigured(_) | StartupError::Privilege(_) => Permanent,
                StartupError::Connect(_) => Unreachable,
                StartupError::Database(_) => Retryable,
            },
            PipelineError::Reader(reader) => match reader {
                ReaderError::NotAllowed(_) | ReaderError::Unsupported(_) => Permanent,
                // The instance falls back to the oldest position the server has (see
                // `pipeline::instance`), a few times, then retries the round.
                ReaderError::PositionGone { .. } => Retryable,
            },
            PipelineError::Store(store)
            | PipelineError::Checkpoint(CheckpointError::NotSaved { source: store, .. }) => {
                match store {
                    StoreError::Sled { .. } | StoreError::Corrupt(_) => Permanent,
                    StoreError::Mysql(_) | StoreError::Fenced(_) => Retryable,
                }
            }
            PipelineError::Checkpoint(CheckpointError::Panicked(_)) => Unexpected,
            PipelineError::Mark(mark) => match mark.fault {
                PermanentFault::Privilege | PermanentFault::Schema | PermanentFault::Data => {
                    Permanent
                }
            },
            PipelineError::Election(_) | PipelineError::Database(_) => Retryable,
            PipelineError::Task { .. } => Unexpected,
        }
    }

    /// The error of `task` that ended with `error` (a panic).
    pub fn task(task: &'static str) -> impl FnOnce(tokio::task::JoinError) -> PipelineError {
        move |source| PipelineError::Task { task, source }
    }

    /// The message with its causes, `a: b: c` (as `anyhow`'s `{:#}` prints an error).
    pub fn report(&self) -> Report<'_> {
        Report(self)
    }
}

/// A MySQL connection or statement of the pipeline's own failed: what it was doing, and the
/// client's error. Retryable (a lost connection, a restarting server).
#[derive(Debug, thiserror::Error)]
#[error("{doing}")]
pub struct DbError {
    doing: Cow<'static, str>,
    #[source]
    source: mysql_async::Error,
}

impl DbError {
    /// Wraps a client error met while `doing` something.
    pub fn new(doing: impl Into<Cow<'static, str>>, source: mysql_async::Error) -> Self {
        DbError {
            doing: doing.into(),
            source,
        }
    }

    /// For `map_err`: the error met while `doing` something.
    pub fn when(doing: impl Into<Cow<'static, str>>) -> impl FnOnce(mysql_async::Error) -> Self {
        let doing = doing.into();
        move |source| DbError::new(doing, source)
    }
}

/// An error and its causes, `a: b: c` ([`PipelineError::report`]).
pub struct Report<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            write!(f, ": {error}")?;
            cause = error.source();
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;
