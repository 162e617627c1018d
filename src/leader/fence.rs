//! The fence: what a leader's senders and marker ask before each batch, "does my leadership
//! still hold?".
//!
//! Guarantee: once [`Fence::holds`] has returned `false` it never returns `true` again, and it
//! returns `false` as soon as either the leadership was ended ([`Fence::end`]: a renewal found a
//! newer epoch, the checkpoint mirror refused this epoch, the lock was lost) or its validity ran
//! out: a leadership is valid for a fixed time after the start of its last successful renewal
//! (measured on the boot-time clock, which counts a suspended VM's time: [`BootInstant`]), so a
//! leader that was frozen (`SIGSTOP`, a paused or suspended VM) or cut off stops before its next
//! send, even if its watch task has not run yet.

use super::clock::BootInstant;
use crate::metrics::LeadershipEnd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A leadership's fence (cheap to clone; every clone sees the same state).
#[derive(Clone, Debug)]
pub struct Fence {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// `None` for an open fence (no election).
    epoch: Option<u64>,
    /// Set by the first [`Fence::end`]: what [`Fence::holds`] reads.
    ended: AtomicBool,
    /// Cancelled by the first [`Fence::end`], once it is counted: what waiters watch.
    over: CancellationToken,
    /// The instant validity is measured from.
    base: BootInstant,
    /// Milliseconds after `base` until which the leadership is valid (`u64::MAX`: no limit).
    valid_until_ms: AtomicU64,
}

impl Fence {
    /// The fence of a new leadership of `epoch`, valid for `valid_for` after `renewed_at` (when
    /// the write that made it leader was sent).
    pub fn new(epoch: u64, renewed_at: BootInstant, valid_for: Duration) -> Self {
        let fence = Fence {
            inner: Arc::new(Inner {
                epoch: Some(epoch),
                ended: AtomicBool::new(false),
                over: CancellationToken::new(),
                base: renewed_at,
                valid_until_ms: AtomicU64::new(0),
            }),
        };
        fence.renewed(renewed_at, valid_for);
        fence
    }

    /// A fence that holds until [`Fence::end`] (a run without an election).
    pub fn open() -> Self {
        Fence {
            inner: Arc::new(Inner {
                epoch: None,
                ended: AtomicBool::new(false),
                over: CancellationToken::new(),
                base: BootInstant::now(),
                valid_until_ms: AtomicU64::new(u64::MAX),
            }),
        }
    }

    /// The leadership's epoch; `None` for an open fence (no election).
    pub fn epoch(&self) -> Option<u64> {
        self.inner.epoch
    }

    /// True while this leadership may send and mark. Ends the fence (and says why, once) when
    /// its validity has run out.
    pub fn holds(&self) -> bool {
        if self.inner.ended.load(Ordering::Acquire) {
            return false;
        }
        let valid_until = self.inner.valid_until_ms.load(Ordering::Acquire);
        if self.elapsed_ms(BootInstant::now()) >= valid_until {
            self.end(
                LeadershipEnd::EXPIRED,
                format_args!(
                    "no successful renewal of leadership epoch {:?} within its validity",
                    self.inner.epoch
                ),
            );
            return false;
        }
        true
    }

    /// Extends validity to `valid_for` after `at` (the start of a renewal that succeeded).
    /// Validity never moves back, and an ended fence stays ended.
    pub fn renewed(&self, at: BootInstant, valid_for: Duration) {
        let until = self
            .elapsed_ms(at)
            .saturating_add(valid_for.as_millis() as u64);
        self.inner.valid_until_ms.fetch_max(until, Ordering::AcqRel);
    }

    /// How long this leadership stays valid from now, if it still holds.
    pub fn remaining(&self) -> Option<Duration> {
        if !self.holds() {
            return None;
        }
        let until = self.inner.valid_until_ms.load(Ordering::Acquire);
        let now = self.elapsed_ms(BootInstant::now());
        Some(Duration::from_millis(until.saturating_sub(now)))
    }

    /// Ends the leadership for `reason` (a `LeadershipEnd` constant): the senders and the
    /// marker stop before their next batch. The first call counts it and logs `why` at ERROR,
    /// then fires [`Fence::ended`] (so whoever it wakes sees the count); later calls do nothing.
    pub fn end(&self, reason: &'static str, why: impl std::fmt::Display) {
        if self.inner.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        crate::metrics::relay()
            .leadership_ended
            .get_or_create(&LeadershipEnd { reason })
            .inc();
        tracing::error!(epoch = ?self.inner.epoch, reason, %why,
            "leadership is over: this instance stops sending and marking, and stands by");
        self.inner.over.cancel();
    }

    /// Fires when the fence is ended (validity running out is noticed by [`Fence::holds`] or the
    /// leader's watch, which then ends it).
    pub fn ended(&self) -> CancellationToken {
        self.inner.over.clone()
    }

    fn elapsed_ms(&self, at: BootInstant) -> u64 {
        at.saturating_duration_since(self.inner.base).as_millis() as u64
    }
}

impl Default for Fence {
    fn default() -> Self {
        Fence::open()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_fence_holds_until_ended() {
        let fence = Fence::open();
        assert!(fence.holds());
        let clone = fence.clone();
        clone.end(LeadershipEnd::LOCK_LOST, "test");
        assert!(!fence.holds());
        assert!(fence.ended().is_cancelled());
    }

    #[test]
    fn a_leadership_ends_when_its_validity_runs_out_and_never_comes_back() {
        let start = BootInstant::now();
        let fence = Fence::new(7, start, Duration::from_millis(50));
        assert!(fence.holds());
        assert_eq!(fence.epoch(), Some(7));
        std::thread::sleep(Duration::from_millis(80));
        assert!(!fence.holds(), "validity ran out");
        assert!(fence.ended().is_cancelled());
        fence.renewed(BootInstant::now(), Duration::from_secs(60));
        assert!(!fence.holds(), "an ended fence stays ended");
    }

    #[test]
    fn a_renewal_extends_validity_and_an_older_one_does_not_shorten_it() {
        let start = BootInstant::now();
        let fence = Fence::new(1, start, Duration::from_millis(60));
        std::thread::sleep(Duration::from_millis(30));
        fence.renewed(BootInstant::now(), Duration::from_millis(200));
        fence.renewed(start, Duration::from_millis(60)); // a late answer to an older renewal
        std::thread::sleep(Duration::from_millis(60));
        assert!(fence.holds());
        assert!(fence.remaining().unwrap() > Duration::from_millis(50));
    }
}
