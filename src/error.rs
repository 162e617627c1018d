//! One error taxonomy for the relay: each error type the pipeline raises says, beside its
//! definition, whether retrying can fix it ([`Classify`]). One policy acts on it: the instance
//! supervisor ([`crate::pipeline::run_instance`]) retries a round that failed with a retryable
//! error (with backoff) and stops on a permanent one, with the error's message saying what to fix.

/// Whether retrying can fix an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// It may pass: a lost connection, a restarting server, a lock wait, a fenced mirror write.
    Retryable,
    /// Only the user can fix it: a misconfigured server, a missing grant, a refused or
    /// unsupported binlog, a broken checkpoint store, an outcome that cannot be recorded.
    Permanent,
    /// The server cannot be reached: permanent before the instance ever ran (a wrong URL or a
    /// server that is not up must be seen at once), retryable afterwards (a server restarting).
    Unreachable,
}

impl ErrorClass {
    /// Whether the instance stops on it; `started`: it ran a round before.
    pub fn stops(self, started: bool) -> bool {
        match self {
            ErrorClass::Retryable => false,
            ErrorClass::Permanent => true,
            ErrorClass::Unreachable => !started,
        }
    }
}

/// An error that knows its [`ErrorClass`].
pub trait Classify {
    fn class(&self) -> ErrorClass;
}
