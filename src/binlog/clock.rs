//! [`StreamClock`]: how far the stream has read, in server time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How far the binlog stream has read: the commit time (server clock, whole seconds) of the
/// newest transaction read, or the time of the last heartbeat once the server said it has
/// nothing more to send. A sweeper beside the stream leaves alone the rows younger than that
/// time minus `sweeper.min_age`: the stream has not read them yet (it may be catching up on a
/// backlog), so sweeping them would send them twice.
///
/// A heartbeat counts only once the clock is [armed](StreamClock::arm), i.e. once the stream has
/// read past the server's end of binlog at its start: MySQL also sends heartbeats at the start
/// of a dump, while it skips the transactions the relay already has, and those say nothing about
/// the backlog still to come.
///
/// Shared by clones; written by the reader, read by the sweeper's gate and the checkpointer.
#[derive(Debug, Clone, Default)]
pub struct StreamClock(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    /// Unix seconds read up to; 0 until the stream read anything.
    read_up_to: AtomicU64,
    /// Whether the last thing the server sent was a heartbeat (nothing left to read).
    caught_up: std::sync::atomic::AtomicBool,
    /// Whether heartbeats count (the stream read past the server's end at its start).
    armed: std::sync::atomic::AtomicBool,
    /// Set while the dispatcher reads back what the broker stored, before it hands a batch on:
    /// the reader reads on meanwhile, so the time read up to says nothing of that batch's rows.
    sweeps_held: std::sync::atomic::AtomicBool,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl StreamClock {
    /// A transaction written at `unix_secs` (a commit event's header) was read.
    pub fn read_commit(&self, unix_secs: u64) {
        if unix_secs > 0 {
            self.0.read_up_to.fetch_max(unix_secs, Ordering::Relaxed);
            self.0.caught_up.store(false, Ordering::Relaxed);
        }
    }

    /// The stream read past the server's end of binlog at its start: from now on a heartbeat
    /// means it has read everything.
    pub fn arm(&self) {
        self.0.armed.store(true, Ordering::Relaxed);
    }

    /// The server sent a heartbeat: once armed, everything written so far was read.
    pub fn heartbeat(&self) {
        if !self.0.armed.load(Ordering::Relaxed) {
            return;
        }
        self.0.read_up_to.fetch_max(unix_now(), Ordering::Relaxed);
        self.0.caught_up.store(true, Ordering::Relaxed);
    }

    /// Holds the sweeper beside the stream off (`true`) or lets it go on (`false`): while the
    /// dispatcher holds a batch it has not handed on (reading back a topic's tail, see
    /// `pipeline::dispatch::CatchUp`), sweeping by the time read could take that batch's rows
    /// and send them twice.
    pub fn hold_sweeps(&self, held: bool) {
        self.0.sweeps_held.store(held, Ordering::SeqCst);
    }

    /// Whether the sweeper beside the stream is held off ([`Self::hold_sweeps`]).
    pub fn sweeps_held(&self) -> bool {
        self.0.sweeps_held.load(Ordering::SeqCst)
    }

    /// Unix seconds the stream has read up to, `None` before it read anything.
    pub fn read_up_to(&self) -> Option<u64> {
        match self.0.read_up_to.load(Ordering::Relaxed) {
            0 => None,
            secs => Some(secs),
        }
    }

    /// How long ago (our clock) `unix_secs` (server clock) was; zero for a time ahead of ours.
    pub fn since(unix_secs: u64) -> Duration {
        Duration::from_secs(unix_now().saturating_sub(unix_secs))
    }

    /// How far behind now the stream is (zero once caught up); `None` before it read anything.
    pub fn behind(&self) -> Option<Duration> {
        if self.0.caught_up.load(Ordering::Relaxed) {
            return Some(Duration::ZERO);
        }
        let read = self.read_up_to()?;
        Some(Duration::from_secs(unix_now().saturating_sub(read)))
    }

    /// Whether the last thing the server sent was a heartbeat.
    #[cfg(any(test, feature = "test-utils"))]
    pub fn caught_up(&self) -> bool {
        self.0.caught_up.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_follows_commits_and_a_heartbeat_catches_it_up() {
        let clock = StreamClock::default();
        assert_eq!(clock.behind(), None, "nothing read yet");
        clock.read_commit(unix_now() - 100);
        let behind = clock.behind().unwrap();
        assert!(behind >= Duration::from_secs(99), "{behind:?}");
        clock.read_commit(unix_now() - 200);
        assert!(
            clock.behind().unwrap() < Duration::from_secs(150),
            "never goes back"
        );
        clock.heartbeat();
        assert!(
            !clock.caught_up(),
            "a heartbeat before the start's end says nothing"
        );
        clock.arm();
        clock.heartbeat();
        assert_eq!(clock.behind(), Some(Duration::ZERO));
        assert!(clock.caught_up());
        clock.read_commit(unix_now());
        assert!(!clock.caught_up(), "reading again");
    }
}
