//! The clock a leadership's validity is measured on.
//!
//! Guarantee: [`BootInstant`] counts the time the machine was suspended (`CLOCK_BOOTTIME`),
//! where `std::time::Instant` (`CLOCK_MONOTONIC` on Linux) stops while a VM is paused or a host
//! sleeps. A leader resumed after its leadership ran out on the wall clock sees it as run out
//! too, before its next send; the other instances took over meanwhile.

use std::time::Duration;

/// A point on the boot-time clock (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BootInstant(Duration);

impl BootInstant {
    /// Now.
    pub fn now() -> Self {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists on every Linux since
        // 2.6.39 and clock_gettime only writes the struct it is given.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME) failed");
        BootInstant(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    /// How long after `earlier` this is (zero if it is not after it).
    pub fn saturating_duration_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// How long ago this was.
    pub fn elapsed(self) -> Duration {
        BootInstant::now().saturating_duration_since(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_time_moves_forward_with_the_monotonic_clock() {
        let (boot, mono) = (BootInstant::now(), std::time::Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (b, m) = (boot.elapsed(), mono.elapsed());
        assert!(b >= Duration::from_millis(20), "{b:?}");
        // Without a suspension in between the two clocks agree (to scheduling noise).
        assert!(
            b.abs_diff(m) < Duration::from_millis(5),
            "{b:?} against {m:?}"
        );
        assert!(BootInstant::now() > boot);
    }
}
