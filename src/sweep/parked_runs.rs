//! The runs of a stalled topic's parked rows that claims step over.
//!
//! While a topic is stalled its rows stay PENDING, and a claim leaves them out by topic; but
//! `idx_pending (status)` cannot tell topics apart, so every claim from the first PENDING row
//! read each of them, every `sweeper.interval`: a 5-minute stall at 200 events/s left 63,000
//! parked rows, and the claims read them all every pass (about 12,000 rows a second, the most of
//! what the relay read then on Oracle MySQL 9.7, growing with the stall).
//!
//! So a claim that reads from the first row while topics are stalled also learns where their
//! rows lie among the PENDING ones ([`ParkedRuns::learn`]: one read of the PENDING ids, each with
//! whether its topic is stalled): the runs of consecutive PENDING rows all of stalled topics.
//! Until the next such *full pass*, claims step over those runs (`id NOT BETWEEN first AND
//! last`), reading only the rows between and after them, and each learns on from the highest id
//! read (the rows parked since). A full pass comes again after [`FULL_PASS_EVERY`] (longer for a
//! large backlog: [`READ_RATE`]), or at once when the stalled topics change (a topic that
//! recovers has its rows claimed at the next claim).
//!
//! Guarantee: a claim never steps over a row that was PENDING and of a topic not stalled when
//! the runs were learnt. A row that becomes PENDING inside a run afterwards (put back by
//! `retry`, returned by lease recovery, an old id committed late) is claimed at the next full
//! pass: within [`FULL_PASS_EVERY`], or two seconds per [`READ_RATE`] PENDING rows when longer.

use std::time::{Duration, Instant};

/// How long learnt runs are stepped over, at least, before a full pass reads them again.
pub const FULL_PASS_EVERY: Duration = Duration::from_secs(60);

/// Rows a second the full passes may read, averaged (each reads every PENDING row twice): with
/// more PENDING rows than `READ_RATE × FULL_PASS_EVERY / 2`, full passes come less often.
pub const READ_RATE: u64 = 1_000;

/// Shorter runs are read rather than stepped over (each is a range for the server to build).
const MIN_RUN: usize = 64;

/// Most runs stepped over (the longest). Each claim's learning adds one or two (another topic's
/// rows in flight end a run), so this holds about five minutes of claims every 5 s: the full
/// passes of a backlog up to 160,000 rows.
const MAX_RUNS: usize = 64;

/// What a full pass learnt, and the claims since.
#[derive(Debug)]
pub struct ParkedRuns {
    /// The stalled topics they are runs of, sorted.
    topics: Vec<String>,
    /// The runs found so far, the last one perhaps still open.
    found: Runs,
    /// The highest PENDING id read into them: later claims learn on from there.
    read_to: u64,
    /// First and last id of each run stepped over, in id order.
    runs: Vec<(u64, u64)>,
    /// When to read them all again.
    until: Instant,
}

impl ParkedRuns {
    /// Learnt at `now` from the PENDING rows `(id, whether its topic is one of the stalled
    /// `topics`)`, in id order, from the first.
    pub fn learn(topics: Vec<String>, rows: &[(u64, bool)], now: Instant) -> Self {
        // The full pass reads every PENDING row twice: its claim, then this.
        let again = Duration::from_secs(2 * rows.len() as u64 / READ_RATE).max(FULL_PASS_EVERY);
        let mut learnt = ParkedRuns {
            topics,
            found: Runs::default(),
            read_to: 0,
            runs: Vec::new(),
            until: now + again,
        };
        learnt.learn_on(rows);
        learnt
    }

    /// Learns on from the PENDING rows above [`ParkedRuns::read_to`], in id order: the rows
    /// parked since (a run goes on while no row of another topic is PENDING between).
    pub fn learn_on(&mut self, rows: &[(u64, bool)]) {
        for &(id, stalled) in rows {
            if id > self.read_to {
                self.found.push(id, stalled);
                self.read_to = id;
            }
        }
        self.runs = self.found.longest();
    }

    /// The highest PENDING id read so far.
    pub fn read_to(&self) -> u64 {
        self.read_to
    }

    /// The runs to step over while `topics` (sorted) are stalled, at `now`; `None` when a full
    /// pass is due (other topics stalled, or the runs are old).
    pub fn runs_for(&self, topics: &[String], now: Instant) -> Option<&[(u64, u64)]> {
        (self.topics == topics && now < self.until).then_some(&self.runs[..])
    }
}

/// Runs of consecutive stalled rows, `(length, first id, last id)`, as rows come in id order.
#[derive(Debug, Default)]
struct Runs {
    done: Vec<(usize, u64, u64)>,
    open: Option<(usize, u64, u64)>,
}

impl Runs {
    fn push(&mut self, id: u64, stalled: bool) {
        self.open = match (self.open, stalled) {
            (Some((length, first, _)), true) => Some((length + 1, first, id)),
            (None, true) => Some((1, id, id)),
            (open, false) => {
                self.done.extend(open.filter(|(length, _, _)| *length >= MIN_RUN));
                if self.done.len() > 2 * MAX_RUNS {
                    self.keep_longest();
                }
                None
            }
        };
    }

    /// Keeps the [`MAX_RUNS`] longest finished runs.
    fn keep_longest(&mut self) {
        self.done.sort_by_key(|run| std::cmp::Reverse(run.0));
        self.done.truncate(MAX_RUNS);
    }

    /// The longest [`MAX_RUNS`] runs of at least [`MIN_RUN`] rows (the open one included), in
    /// id order.
    fn longest(&mut self) -> Vec<(u64, u64)> {
        let mut all = self.done.clone();
        all.extend(self.open.filter(|(length, _, _)| *length >= MIN_RUN));
        all.sort_by_key(|run| std::cmp::Reverse(run.0));
        all.truncate(MAX_RUNS);
        let mut runs: Vec<(u64, u64)> = all.into_iter().map(|(_, f, l)| (f, l)).collect();
        runs.sort_unstable();
        runs
    }
}

/// The runs [`ParkedRuns`] steps over in `rows`, in id order.
#[cfg(test)]
fn runs_of(rows: &[(u64, bool)]) -> Vec<(u64, u64)> {
    let mut runs = Runs::default();
    for &(id, stalled) in rows {
        runs.push(id, stalled);
    }
    runs.longest()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `count` rows from `first`, every `step` ids, stalled or not.
    fn rows(first: u64, count: u64, step: u64, stalled: bool) -> Vec<(u64, bool)> {
        (0..count).map(|i| (first + i * step, stalled)).collect()
    }

    #[test]
    fn runs_stop_at_every_row_of_a_topic_not_stalled() {
        let mut pending = rows(10, 100, 2, true); // ids 10..=208
        pending.push((209, false)); // another topic's row the claims must read
        pending.extend(rows(210, 100, 2, true)); // 210..=408
        pending.push((450, false));
        pending.extend(rows(500, 10, 1, true)); // too short to step over
        assert_eq!(runs_of(&pending), vec![(10, 208), (210, 408)]);
        assert!(runs_of(&rows(1, 63, 1, true)).is_empty());
        assert!(runs_of(&rows(1, 500, 1, false)).is_empty());
    }

    #[test]
    fn only_the_longest_runs_are_kept() {
        let mut pending = Vec::new();
        for run in 0..(MAX_RUNS as u64 + 4) {
            let start = run * 1_000;
            pending.extend(rows(start, 64 + run, 1, true));
            pending.push((start + 999, false));
        }
        let runs = runs_of(&pending);
        assert_eq!(runs.len(), MAX_RUNS);
        assert_eq!(runs[0], (4_000, 4_000 + 64 + 4 - 1), "the 4 shortest are read");
    }

    #[test]
    fn later_claims_learn_on_from_the_highest_id_read() {
        let topics = vec!["stuck".to_string()];
        let mut learnt = ParkedRuns::learn(topics.clone(), &rows(1, 100, 1, true), Instant::now());
        learnt.learn_on(&rows(50, 100, 1, true)); // 50..=100 again, then 101..=149
        assert_eq!(learnt.read_to(), 149);
        assert_eq!(learnt.runs_for(&topics, Instant::now()), Some(&[(1, 149)][..]));
        learnt.learn_on(&[(150, false)]);
        learnt.learn_on(&rows(151, 64, 1, true));
        assert_eq!(
            learnt.runs_for(&topics, Instant::now()),
            Some(&[(1, 149), (151, 214)][..]),
            "another topic's PENDING row ends a run"
        );
    }

    #[test]
    fn runs_hold_for_the_same_stalled_topics_until_a_full_pass_is_due() {
        let now = Instant::now();
        let topics = vec!["stuck".to_string()];
        let learnt = ParkedRuns::learn(topics.clone(), &rows(1, 100, 1, true), now);
        assert_eq!(learnt.runs_for(&topics, now), Some(&[(1, 100)][..]));
        assert_eq!(learnt.runs_for(&["other".to_string()], now), None);
        assert_eq!(learnt.runs_for(&topics, now + FULL_PASS_EVERY), None);
        // A large backlog is read again less often.
        let big = ParkedRuns::learn(topics.clone(), &rows(1, 60_000, 1, true), now);
        assert!(big.runs_for(&topics, now + FULL_PASS_EVERY).is_some());
        assert_eq!(big.runs_for(&topics, now + Duration::from_secs(120)), None);
    }
}
