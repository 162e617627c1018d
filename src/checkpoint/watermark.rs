//! The acknowledged low-watermark over transactions in binlog order.
//!
//! Guarantee: [`Watermark::position`] is the end of the newest transaction such that it and every
//! transaction before it in binlog order is closed and has all its events completed (SENT or
//! terminally FAILED, and recorded). Transactions with no outbox events complete as soon as they
//! close. Completion order across shards does not matter.

use crate::binlog::{BinlogPosition, TxEnd};
use std::collections::VecDeque;

/// Sequence number of a transaction in binlog order, as handed out by [`Watermark::begin`].
pub type TxSeq = u64;

#[derive(Debug)]
struct Entry {
    open: bool,
    remaining: u64,
    /// `None` for an abandoned transaction (its events complete, but it moves no position).
    end: Option<TxEnd>,
}

/// See the module documentation.
#[derive(Debug)]
pub struct Watermark {
    /// Sequence number of `entries[0]`.
    front: TxSeq,
    entries: VecDeque<Entry>,
    position: BinlogPosition,
    /// Transactions passed since the start (for metrics and batching decisions).
    advanced: u64,
    /// Events completed since the start.
    completed: u64,
}

impl Watermark {
    /// Starts at `position` (the checkpoint the reader resumes from).
    pub fn new(position: BinlogPosition) -> Self {
        Watermark {
            front: 0,
            entries: VecDeque::new(),
            position,
            advanced: 0,
            completed: 0,
        }
    }

    /// Opens the next transaction in binlog order.
    pub fn begin(&mut self) -> TxSeq {
        self.entries.push_back(Entry {
            open: true,
            remaining: 0,
            end: None,
        });
        self.front + self.entries.len() as u64 - 1
    }

    fn entry(&mut self, seq: TxSeq) -> &mut Entry {
        let index = seq
            .checked_sub(self.front)
            .expect("transaction already passed by the watermark") as usize;
        &mut self.entries[index]
    }

    /// Counts one more event of `seq` that must complete before the watermark passes it.
    pub fn add_event(&mut self, seq: TxSeq) {
        self.entry(seq).remaining += 1;
    }

    /// Closes `seq` at `end`; no more events will be added to it.
    pub fn end(&mut self, seq: TxSeq, end: TxEnd) {
        let entry = self.entry(seq);
        entry.open = false;
        entry.end = Some(end);
        self.advance();
    }

    /// Closes `seq` without a position: the reader lost its connection mid-transaction and will
    /// read the whole transaction again. Its events already dispatched still complete.
    pub fn abandon(&mut self, seq: TxSeq) {
        let entry = self.entry(seq);
        entry.open = false;
        entry.end = None;
        self.advance();
    }

    /// One event of `seq` is done (SENT or FAILED and recorded).
    pub fn complete(&mut self, seq: TxSeq) {
        let entry = self.entry(seq);
        entry.remaining = entry
            .remaining
            .checked_sub(1)
            .expect("more completions than events");
        self.completed += 1;
        self.advance();
    }

    fn advance(&mut self) {
        while let Some(front) = self.entries.front() {
            if front.open || front.remaining > 0 {
                break;
            }
            let entry = self.entries.pop_front().expect("front exists");
            self.front += 1;
            if let Some(end) = entry.end {
                self.position.advance(&end);
                self.advanced += 1;
            }
        }
    }

    /// Whether every event of `seq` completed and no more will be added: passed, or closed with
    /// nothing left (it may still wait behind an earlier transaction).
    pub fn is_done(&self, seq: TxSeq) -> bool {
        match seq.checked_sub(self.front) {
            None => true,
            Some(index) => self
                .entries
                .get(index as usize)
                .is_some_and(|e| !e.open && e.remaining == 0),
        }
    }

    /// The acknowledged position (see the module guarantee).
    pub fn position(&self) -> &BinlogPosition {
        &self.position
    }

    /// Transactions read but not yet passed.
    pub fn in_flight(&self) -> usize {
        self.entries.len()
    }

    /// The commit time (the commit event's header: server clock, Unix seconds) of the oldest
    /// closed transaction with events not yet completed; `None` when there is none. The stream
    /// holds those events in memory (waiting for the broker, or queued behind their key), so a
    /// sweeper must leave alone the rows committed since: they are still on their way.
    pub fn oldest_unfinished_commit(&self) -> Option<u64> {
        self.entries
            .iter()
            .find(|e| e.remaining > 0 && e.end.is_some())
            .and_then(|e| e.end.as_ref())
            .map(|end| u64::from(end.timestamp))
    }

    /// How far the stream is done, in server time (Unix seconds): `read_up_to` (how far it has
    /// read, [`crate::binlog::StreamClock::read_up_to`]), or earlier if events committed before
    /// that are still unfinished ([`Watermark::oldest_unfinished_commit`]). Every row committed
    /// before it has been sent and marked by the stream, or was never seen by it; the sweepers'
    /// age bound counts from here.
    pub fn done_up_to(&self, read_up_to: Option<u64>) -> Option<u64> {
        match (read_up_to, self.oldest_unfinished_commit()) {
            (Some(read), Some(held)) => Some(read.min(held)),
            (read, None) => read,
            (None, Some(_)) => None,
        }
    }

    /// Transactions passed since the start.
    #[cfg(test)]
    pub fn advanced(&self) -> u64 {
        self.advanced
    }

    /// Moves whenever the stream makes progress: an event completes or a transaction is passed.
    /// It keeps moving while the position is held (by a prepared XA transaction, say) as long as
    /// later events complete; it stops when nothing completes (the broker is down).
    pub fn progress(&self) -> u64 {
        self.advanced + self.completed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binlog::TxGtid;
    use proptest::prelude::*;

    fn end(seq: u64) -> TxEnd {
        end_at(seq, 0)
    }

    fn end_at(seq: u64, timestamp: u32) -> TxEnd {
        TxEnd {
            gtid: Some(TxGtid::MariaDb(crate::binlog::MariaDbGtid {
                domain: 0,
                server: 1,
                seq: seq + 1,
            })),
            file: "binlog.000001".into(),
            end_pos: 100 * (seq + 1),
            timestamp,
        }
    }

    #[test]
    fn done_up_to_stops_at_the_oldest_transaction_with_events_in_flight() {
        let mut w = Watermark::new(BinlogPosition::default());
        assert_eq!(w.done_up_to(None), None, "nothing read");
        let a = w.begin();
        w.end(a, end_at(a, 100)); // no events: passes at once
        assert_eq!(w.done_up_to(Some(100)), Some(100));
        let b = w.begin();
        w.add_event(b);
        w.end(b, end_at(b, 105));
        let c = w.begin();
        w.add_event(c);
        w.end(c, end_at(c, 110));
        let d = w.begin();
        w.add_event(d); // open: its commit is not read yet
        assert_eq!(w.oldest_unfinished_commit(), Some(105));
        assert_eq!(
            w.done_up_to(Some(120)),
            Some(105),
            "read up to 120, but b (105) is still on its way"
        );
        w.complete(b);
        assert_eq!(w.done_up_to(Some(120)), Some(110), "c is next");
        w.complete(c);
        assert_eq!(
            w.done_up_to(Some(120)),
            Some(120),
            "only the open d is left"
        );
        w.complete(d);
        w.end(d, end_at(d, 121));
        assert_eq!(w.done_up_to(Some(121)), Some(121));
        assert_eq!(w.oldest_unfinished_commit(), None);
    }

    #[test]
    fn empty_transactions_pass_at_once_and_busy_ones_hold_the_line() {
        let mut w = Watermark::new(BinlogPosition::default());
        let a = w.begin();
        w.add_event(a);
        w.end(a, end(a));
        let b = w.begin();
        w.end(b, end(b)); // no events
        assert_eq!(w.position().pos, 0, "b may not pass a");
        w.complete(a);
        assert_eq!(w.position().pos, 200, "a done -> past b too");
        assert_eq!(w.in_flight(), 0);
    }

    #[test]
    fn a_transaction_is_done_when_closed_and_complete_even_behind_a_busy_one() {
        let mut w = Watermark::new(BinlogPosition::default());
        let a = w.begin();
        w.add_event(a);
        w.end(a, end(a));
        let b = w.begin();
        w.add_event(b);
        assert!(!w.is_done(b), "open");
        w.end(b, end(b));
        assert!(!w.is_done(b), "an event left");
        w.complete(b);
        assert!(w.is_done(b), "done, though a holds the position");
        assert!(!w.is_done(a));
        w.complete(a);
        assert!(w.is_done(a) && w.is_done(b), "passed");
        let c = w.begin();
        assert!(!w.is_done(c), "a new one is open");
    }

    #[test]
    fn an_abandoned_transaction_completes_without_moving_the_position() {
        let mut w = Watermark::new(BinlogPosition::default());
        let a = w.begin();
        w.add_event(a);
        w.abandon(a);
        let b = w.begin();
        w.end(b, end(b));
        w.complete(a);
        assert_eq!(w.position().pos, 200);
        assert_eq!(w.advanced(), 1);
    }

    proptest! {
        /// Random transaction sizes, random completion order: after every step the watermark
        /// is exactly the end of the longest fully completed prefix.
        #[test]
        fn never_passes_an_incomplete_transaction(
            sizes in proptest::collection::vec(0u64..4, 1..40),
            order_seed in any::<u64>(),
        ) {
            let mut w = Watermark::new(BinlogPosition::default());
            let mut pending: Vec<u64> = Vec::new();
            let mut remaining = vec![0u64; sizes.len()];
            for (i, &n) in sizes.iter().enumerate() {
                let seq = w.begin();
                prop_assert_eq!(seq, i as u64);
                for _ in 0..n { w.add_event(seq); pending.push(seq); }
                remaining[i] = n;
                w.end(seq, end(seq));
            }
            let mut rng = order_seed;
            while !pending.is_empty() {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let pick = (rng >> 33) as usize % pending.len();
                let seq = pending.swap_remove(pick);
                remaining[seq as usize] -= 1;
                w.complete(seq);
                let done_prefix = remaining.iter().take_while(|&&r| r == 0).count() as u64;
                let expected = if done_prefix == 0 { 0 } else { 100 * done_prefix };
                prop_assert_eq!(w.position().pos, expected);
            }
            prop_assert_eq!(w.position().pos, 100 * sizes.len() as u64);
        }
    }
}
