//! The stream's acknowledgements: the only way into the watermark.
//!
//! The dispatcher opens a transaction for each one it reads ([`Acknowledgements::begin`]), takes
//! an [`Ack`] for each event it hands on ([`Acknowledgements::event`]), and closes the
//! transaction at its end. The ack travels with the event through the ordered sender into its
//! completion; the marker acknowledges it once the outcome is recorded. The checkpointer reads
//! the position it may save; the key-order guard asks whether a transaction is done; the sweep
//! gate asks how far the stream is done ([`Acknowledgements::progress`]). Nobody else holds the
//! watermark, and nothing sends a sequence number on a round trip.
//!
//! Guarantee: the watermark's (see its module documentation), with each event acknowledged at
//! most once ([`Ack`] is consumed by acknowledging).

use super::watermark::{TxSeq, Watermark};
use crate::binlog::{BinlogPosition, TxEnd};
use crate::event::{Ack, Acknowledge};
use std::sync::{Arc, Mutex, MutexGuard};

/// See the module documentation. Clones share one watermark.
#[derive(Clone)]
pub struct Acknowledgements(Arc<Shared>);

struct Shared(Mutex<Watermark>);

impl Acknowledge for Shared {
    fn acknowledge(&self, token: u64) {
        self.0.lock().expect("not poisoned").complete(token);
    }
}

/// A look at the stream's progress, for the sweep gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Events handed on and not completed yet.
    pub events_outstanding: u64,
    /// Moves whenever an event completes or a transaction is passed (see `Watermark::progress`).
    pub count: u64,
    /// The commit time of the oldest transaction with events not yet completed
    /// (see `Watermark::oldest_unfinished_commit`).
    pub oldest_unfinished_commit: Option<u64>,
}

impl Acknowledgements {
    /// Starts at `position` (the checkpoint the reader resumes from).
    pub fn new(position: BinlogPosition) -> Self {
        Acknowledgements(Arc::new(Shared(Mutex::new(Watermark::new(position)))))
    }

    fn watermark(&self) -> MutexGuard<'_, Watermark> {
        self.0 .0.lock().expect("not poisoned")
    }

    /// Opens the next transaction in binlog order.
    pub fn begin(&self) -> TxSeq {
        self.watermark().begin()
    }

    /// One more event of `seq`: the watermark will not pass `seq` until the returned
    /// acknowledgement is acknowledged.
    pub fn event(&self, seq: TxSeq) -> Ack {
        self.watermark().add_event(seq);
        let to: Arc<dyn Acknowledge> = self.0.clone();
        Ack::new(to, seq)
    }

    /// Closes `seq` at `end`: no more events will be added to it.
    pub fn end(&self, seq: TxSeq, end: TxEnd) {
        self.watermark().end(seq, end);
    }

    /// Closes `seq` without a position (the reader will read it again); its events already
    /// handed on still complete.
    pub fn abandon(&self, seq: TxSeq) {
        self.watermark().abandon(seq);
    }

    /// Whether every event of `seq` is acknowledged and no more will be added.
    pub fn is_done(&self, seq: TxSeq) -> bool {
        self.watermark().is_done(seq)
    }

    /// The position the checkpoint may be saved at.
    pub fn position(&self) -> BinlogPosition {
        self.watermark().position().clone()
    }

    /// Transactions read but not yet passed.
    pub fn in_flight(&self) -> usize {
        self.watermark().in_flight()
    }

    /// How far the stream is done, in server time (see `Watermark::done_up_to`).
    pub fn done_up_to(&self, read_up_to: Option<u64>) -> Option<u64> {
        self.watermark().done_up_to(read_up_to)
    }

    /// The stream's progress, read at once.
    pub fn progress(&self) -> Progress {
        let w = self.watermark();
        Progress {
            events_outstanding: w.events_outstanding(),
            count: w.progress(),
            oldest_unfinished_commit: w.oldest_unfinished_commit(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binlog::{MariaDbGtid, TxGtid};

    fn end(seq: u64) -> TxEnd {
        TxEnd {
            gtid: Some(TxGtid::MariaDb(MariaDbGtid {
                domain: 0,
                server: 1,
                seq: seq + 1,
            })),
            file: "binlog.000001".into(),
            end_pos: 100 * (seq + 1),
            timestamp: 0,
        }
    }

    #[test]
    fn the_position_passes_a_transaction_once_each_of_its_acks_is_acknowledged() {
        let acks = Acknowledgements::new(BinlogPosition::default());
        let first = acks.begin();
        let (a, b) = (acks.event(first), acks.event(first));
        acks.end(first, end(first));
        let second = acks.begin();
        acks.end(second, end(second));
        assert_eq!(acks.in_flight(), 2);
        b.acknowledge();
        assert_eq!(
            acks.position().pos,
            0,
            "one event of the first is still out"
        );
        assert!(!acks.is_done(first));
        drop(a); // dropped, never acknowledged: the position stays
        assert_eq!(acks.position().pos, 0);
        let again = acks.begin();
        let c = acks.event(again);
        acks.end(again, end(again));
        c.acknowledge();
        assert!(acks.is_done(again));
        assert_eq!(acks.position().pos, 0, "held behind the first");
        assert_eq!(acks.in_flight(), 3, "transactions from the oldest unfinished one");
        assert_eq!(acks.progress().events_outstanding, 1, "a: dropped, never acknowledged");
    }
}
