//! When an event passed each stage of the pipeline (read → dispatched → sent → SEND_OK), carried
//! with the event; `metrics::stages` records them once its outcome is marked.
//!
//! Stamps are taken with the system clock; a clock step makes one event's steps wrong, never
//! negative (differences saturate at 0).

use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch, now.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The moments (µs since the epoch; 0 = not reached) an event passed each stage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stamps {
    pub read: u64,
    pub dispatched: u64,
    pub sent: u64,
    pub ack: u64,
}

impl Stamps {
    /// Stamps of an event read (decoded from the binlog or claimed) now.
    pub fn read_now() -> Self {
        Stamps {
            read: now_us(),
            ..Stamps::default()
        }
    }

    /// The four steps' durations in µs (read → dispatched → sent → SEND_OK → `marked`), for an
    /// event marked at `marked`; `None` if a stage was not reached (a row that was never sent).
    pub fn steps(&self, marked: u64) -> Option<[u64; 4]> {
        let moments = [self.read, self.dispatched, self.sent, self.ack, marked];
        if moments.contains(&0) {
            return None;
        }
        Some(std::array::from_fn(|i| {
            moments[i + 1].saturating_sub(moments[i])
        }))
    }
}
