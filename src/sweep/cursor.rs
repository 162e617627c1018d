//! Where a claim starts reading the PENDING rows.
//!
//! A drain claims the lowest PENDING ids, batch after batch. A claim that starts from the first
//! PENDING id first walks, in `idx_pending`, the entries of the rows claimed just before, which
//! InnoDB has marked deleted but not yet purged: with 100-row batches that walk cost about a third
//! of the database's CPU per event (86 → 55 µs per claimed and marked row on a scratch MariaDB,
//! 100k rows of 1 KiB). So while batches come back full, a claim starts past the highest id the
//! previous one read; a batch that is not full, or [`RESCAN_AFTER`] since the last claim from
//! the start, sends the next claim back to the start.
//!
//! Guarantee: no PENDING row waits for long behind the cursor. Rows below it (returned by lease
//! recovery, due for a retry, passed over by SKIP LOCKED, held back for key order) are read by
//! the next claim from the start, at most [`RESCAN_AFTER`] later; meanwhile the claim's key-order
//! check still sees them waiting, so their keys' later rows are not claimed before them. While
//! topics are stalled, the claims also step over the runs of their parked rows
//! (`sweep::parked_runs`, which says how long a row that becomes PENDING inside one may wait).

use super::parked_runs::ParkedRuns;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Longest a claimer reads past its cursor before starting from the first PENDING row again.
pub const RESCAN_AFTER: Duration = Duration::from_secs(1);

/// One claimer's position among the PENDING rows (shared by its clones).
#[derive(Debug)]
pub struct ClaimCursor {
    rescan_after: Duration,
    state: Mutex<State>,
}

impl Default for ClaimCursor {
    fn default() -> Self {
        Self::with_rescan(RESCAN_AFTER)
    }
}

#[derive(Debug, Default)]
struct State {
    /// The highest id the last full batch read (0: start from the first row).
    after: u64,
    /// When a claim last started from the first row.
    last_from_start: Option<Instant>,
    /// Where the stalled topics' rows lie, as the last full pass learnt.
    parked: Option<ParkedRuns>,
}

impl ClaimCursor {
    /// A cursor that starts from the first row again at least every `rescan_after`.
    pub fn with_rescan(rescan_after: Duration) -> Self {
        ClaimCursor {
            rescan_after,
            state: Mutex::default(),
        }
    }

    /// The id the next claim reads past (0: from the first PENDING row).
    pub fn start(&self) -> u64 {
        self.start_at(Instant::now())
    }

    /// Records a claim that read past `from` and found `read` rows, the highest id `highest`,
    /// when it asked for `batch`.
    pub fn record(&self, from: u64, read: usize, highest: u64, batch: usize) {
        self.record_at(Instant::now(), from, read, highest, batch);
    }

    /// The runs of parked rows a claim steps over while the `stalled` topics (sorted) are
    /// stalled (see `sweep::parked_runs`); `None` when a full pass is due: the claim reads them
    /// all, then [`ClaimCursor::learn_parked`].
    pub(crate) fn parked_runs(&self, stalled: &[String]) -> Option<Vec<(u64, u64)>> {
        if stalled.is_empty() {
            return Some(Vec::new());
        }
        let state = self.state.lock().expect("not poisoned");
        let runs = state.parked.as_ref()?.runs_for(stalled, Instant::now())?;
        Some(runs.to_vec())
    }

    /// What a full pass learnt.
    pub(crate) fn learn_parked(&self, learnt: ParkedRuns) {
        self.state.lock().expect("not poisoned").parked = Some(learnt);
    }

    /// The highest PENDING id the runs were learnt to, if any are.
    pub(crate) fn parked_read_to(&self) -> Option<u64> {
        let state = self.state.lock().expect("not poisoned");
        state.parked.as_ref().map(ParkedRuns::read_to)
    }

    /// What a later claim learnt of the PENDING rows above [`ClaimCursor::parked_read_to`].
    pub(crate) fn learn_parked_on(&self, rows: &[(u64, bool)]) {
        let mut state = self.state.lock().expect("not poisoned");
        if let Some(parked) = &mut state.parked {
            parked.learn_on(rows);
        }
    }

    fn start_at(&self, now: Instant) -> u64 {
        let state = self.state.lock().expect("not poisoned");
        match state.last_from_start {
            Some(at) if now.saturating_duration_since(at) < self.rescan_after => state.after,
            _ => 0,
        }
    }

    fn record_at(&self, now: Instant, from: u64, read: usize, highest: u64, batch: usize) {
        let mut state = self.state.lock().expect("not poisoned");
        if from == 0 {
            state.last_from_start = Some(now);
        }
        state.after = if read >= batch.max(1) { highest } else { 0 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_batches_move_the_cursor_and_anything_else_returns_it_to_the_start() {
        let cursor = ClaimCursor::default();
        let t0 = Instant::now();
        assert_eq!(
            cursor.start_at(t0),
            0,
            "the first claim starts at the start"
        );
        cursor.record_at(t0, 0, 100, 250, 100);
        assert_eq!(
            cursor.start_at(t0),
            250,
            "a full batch: past its highest id"
        );
        cursor.record_at(t0, 250, 100, 400, 100);
        assert_eq!(cursor.start_at(t0), 400);
        cursor.record_at(t0, 400, 40, 460, 100);
        assert_eq!(
            cursor.start_at(t0),
            0,
            "a batch that was not full: from the start"
        );
    }

    #[test]
    fn the_start_is_read_again_at_least_every_rescan_period() {
        let cursor = ClaimCursor::default();
        let t0 = Instant::now();
        cursor.record_at(t0, 0, 100, 250, 100);
        let later = t0 + RESCAN_AFTER / 2;
        cursor.record_at(later, 250, 100, 400, 100);
        assert_eq!(cursor.start_at(later), 400);
        let due = t0 + RESCAN_AFTER;
        assert_eq!(
            cursor.start_at(due),
            0,
            "a second after the last claim from the start"
        );
        cursor.record_at(due, 0, 100, 150, 100);
        assert_eq!(cursor.start_at(due), 150, "the period starts again");
    }
}
