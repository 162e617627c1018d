//! When the sweeper beside the stream may claim, and how old a row must be: it catches what the
//! stream missed and must not race the stream for rows the stream is about to send (a race costs
//! duplicates: both send once the broker is back).
//!
//! - Poll mode: always, rows of any age.
//! - Beside this process's stream (the leader): rows older than `sweeper.min_age`, but only while
//!   the stream is idle or made progress (an event completed) within the last half `min_age`. A stream stalled
//!   on the broker holds its rows in memory and sends them when the broker returns; sweeping them
//!   meanwhile would send them twice (and fail the same way while the broker is down).
//! - A standby: rows older than `min_age` *before the leader's last mirrored checkpoint*
//!   (`checkpoint_at` in `outbox_relay_state`). While the leader progresses the mirror is at most
//!   a few seconds old; while it is stalled (broker down) the bound stays behind and the standby
//!   leaves the leader's rows alone. Rows the stream never saw are still swept: by the leader
//!   (when its stream is idle or moving) or, older than the bound, by a standby.

use crate::checkpoint::Watermark;
use mysql_async::prelude::*;
use mysql_async::Pool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The rule a sweeper applies before each claim round.
pub enum SweepGate {
    /// Poll mode.
    Always,
    /// Beside this process's stream.
    BesideStream {
        watermark: Arc<Mutex<Watermark>>,
        /// The watermark's `progress()` count, and when it was last seen to change.
        seen: Option<(u64, Instant)>,
    },
    /// A standby of deployment `relay_name`.
    BehindMirror { relay_name: String },
}

impl SweepGate {
    pub fn beside_stream(watermark: Arc<Mutex<Watermark>>) -> Self {
        SweepGate::BesideStream {
            watermark,
            seen: None,
        }
    }

    /// The minimum age of the rows to claim this round (`base` is `sweeper.min_age`, zero in
    /// poll mode), or `None` to skip the round.
    pub async fn min_age(&mut self, base: Duration, pool: &Pool) -> Option<Duration> {
        match self {
            SweepGate::Always => Some(base),
            SweepGate::BesideStream { watermark, seen } => {
                let (in_flight, progress) = {
                    let w = watermark.lock().expect("not poisoned");
                    (w.in_flight(), w.progress())
                };
                stream_allows(in_flight, progress, seen, base).then_some(base)
            }
            SweepGate::BehindMirror { relay_name } => {
                let behind: Option<Option<i64>> = match pool.get_conn().await {
                    Ok(mut conn) => conn
                        .exec_first(
                            "SELECT TIMESTAMPDIFF(MICROSECOND, checkpoint_at, NOW(3)) \
                             FROM outbox_relay_state WHERE name = ?",
                            (relay_name.as_str(),),
                        )
                        .await
                        .unwrap_or(None),
                    Err(_) => None,
                };
                let behind = behind.flatten().unwrap_or(0).max(0) as u64;
                Some(base + Duration::from_micros(behind))
            }
        }
    }
}

/// True when the stream is idle (nothing in flight) or made progress within `base / 2`;
/// `seen` remembers the last `progress` count and when it changed.
fn stream_allows(
    in_flight: usize,
    progress: u64,
    seen: &mut Option<(u64, Instant)>,
    base: Duration,
) -> bool {
    let now = Instant::now();
    match seen {
        Some((count, at)) if *count == progress => {
            in_flight == 0 || now.duration_since(*at) < base / 2
        }
        _ => {
            *seen = Some((progress, now));
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stalled_stream_closes_the_gate_an_idle_or_moving_one_does_not() {
        let base = Duration::from_millis(200);
        let mut seen = None;
        assert!(stream_allows(5, 10, &mut seen, base), "first look");
        assert!(stream_allows(5, 10, &mut seen, base), "within base/2");
        std::thread::sleep(Duration::from_millis(120));
        assert!(
            !stream_allows(5, 10, &mut seen, base),
            "stalled with events in flight"
        );
        assert!(
            stream_allows(0, 10, &mut seen, base),
            "idle: nothing in flight"
        );
        assert!(stream_allows(5, 11, &mut seen, base), "moving again");
    }
}
