//! The acknowledgement an event carries: where it came from, and for a streamed event the one
//! way to tell the checkpoint it is done.
//!
//! An event read from the binlog leaves the dispatcher with an [`Ack`] made by the checkpoint's
//! watermark; the ordered sender moves it, untouched, into the event's completion, and the marker
//! calls [`Ack::acknowledge`] once the outcome is recorded in MySQL. No stage in between knows
//! what the token means, so the sending stage knows nothing of binlog transactions or
//! checkpoints.
//!
//! Guarantee: an `Ack` acknowledges at most once (it is consumed, and cannot be cloned). One
//! dropped without being acknowledged (its outcome was never recorded: a shutdown, a stopped
//! marker) leaves its transaction unfinished, so the checkpoint never passes it and a restart
//! reads it again: forgetting an event can hold the checkpoint back, never lose the event.

use std::fmt;
use std::sync::Arc;

/// What an [`Ack`] reports to: the checkpoint's watermark, or a test's recorder.
pub trait Acknowledge: Send + Sync + 'static {
    /// The event that `token` was handed out for is done (its outcome is recorded).
    fn acknowledge(&self, token: u64);
}

/// A streamed event's acknowledgement (see the module documentation).
pub struct Ack {
    to: Arc<dyn Acknowledge>,
    token: u64,
}

impl Ack {
    /// An acknowledgement reporting `token` to `to`.
    pub fn new(to: Arc<dyn Acknowledge>, token: u64) -> Self {
        Ack { to, token }
    }

    /// The event's outcome is recorded: tells whoever made this acknowledgement.
    pub fn acknowledge(self) {
        self.to.acknowledge(self.token);
    }
}

impl fmt::Debug for Ack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ack({})", self.token)
    }
}

/// Two acknowledgements are equal when they report the same token to the same place.
impl PartialEq for Ack {
    fn eq(&self, other: &Self) -> bool {
        self.token == other.token && Arc::ptr_eq(&self.to, &other.to)
    }
}

/// Where an event came from, which decides how its row is marked (see `mark`) and whether
/// anything waits for its acknowledgement.
#[derive(Debug, PartialEq)]
pub enum Origin {
    /// Read from the binlog: the checkpoint waits for its acknowledgement.
    Stream(Ack),
    /// Claimed from the table under a lease (poll mode, a sweeper, replay): nothing to
    /// acknowledge; the row's status is its record.
    Claimed,
    /// Read from the binlog, then *released*: its topic stalled for longer than
    /// `relay.park_after`, so its acknowledgement was given back ([`Origin::release`]) and the
    /// checkpoint passed it. Its row is still PENDING, as a parked event's is; if it is sent
    /// after all, it is marked as a streamed event is, with nothing to acknowledge.
    Released,
}

impl Origin {
    /// Whether the event was read from the binlog (released or not).
    #[cfg(any(test, feature = "test-utils"))]
    pub fn is_stream(&self) -> bool {
        matches!(self, Origin::Stream(_) | Origin::Released)
    }

    /// Whether the checkpoint waits for this event (read from the binlog, not released).
    pub fn holds_checkpoint(&self) -> bool {
        matches!(self, Origin::Stream(_))
    }

    /// Gives a streamed event's acknowledgement back without an outcome: its row stays PENDING
    /// (the sweeper's to send, like a parked event's) and the checkpoint may pass it. The origin
    /// becomes [`Origin::Released`]; a claimed or released one is left as it is. True if there
    /// was an acknowledgement to give back.
    pub fn release(&mut self) -> bool {
        match std::mem::replace(self, Origin::Released) {
            Origin::Stream(ack) => {
                ack.acknowledge();
                true
            }
            other => {
                *self = other;
                false
            }
        }
    }

    /// The event's outcome is recorded: acknowledges a streamed event (nothing for a claimed one).
    pub fn acknowledge(self) {
        if let Origin::Stream(ack) = self {
            ack.acknowledge();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<u64>>);

    impl Acknowledge for Recorder {
        fn acknowledge(&self, token: u64) {
            self.0.lock().unwrap().push(token);
        }
    }

    #[test]
    fn a_streamed_origin_reports_its_token_once_and_a_claimed_one_nothing() {
        let recorder = Arc::new(Recorder::default());
        let to: Arc<dyn Acknowledge> = recorder.clone();
        let dropped = Origin::Stream(Ack::new(Arc::clone(&to), 1));
        Origin::Stream(Ack::new(Arc::clone(&to), 2)).acknowledge();
        Origin::Claimed.acknowledge();
        drop(dropped);
        assert_eq!(*recorder.0.lock().unwrap(), vec![2]);
    }

    #[test]
    fn releasing_gives_the_acknowledgement_back_once_and_keeps_the_event_streamed() {
        let recorder = Arc::new(Recorder::default());
        let to: Arc<dyn Acknowledge> = recorder.clone();
        let mut origin = Origin::Stream(Ack::new(to, 7));
        assert!(origin.holds_checkpoint());
        assert!(origin.release());
        assert!(!origin.release(), "nothing left to give back");
        assert_eq!(origin, Origin::Released);
        assert!(origin.is_stream() && !origin.holds_checkpoint());
        origin.acknowledge();
        let mut claimed = Origin::Claimed;
        assert!(!claimed.release());
        assert_eq!(claimed, Origin::Claimed);
        assert_eq!(*recorder.0.lock().unwrap(), vec![7]);
    }
}
