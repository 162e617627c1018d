//! The acknowledged low-watermark over transactions in binlog order.
//!
//! Guarantee: [`Watermark::position`] is the end of the newest transaction such that it and every
//! transaction before it in binlog order is closed and has all its events completed (SENT or
//! terminally FAILED, and recorded). Transactions with no outbox events complete as soon as they
//! close. Completion order across shards does not matter.
//!
//! Memory is O(unfinished transactions), not O(transactions since the oldest unfinished one):
//! only a transaction still open or with events not completed has an entry. A transaction that
//! is done while an earlier one is unfinished is folded into the nearest earlier unfinished entry
//! as part of its [`Run`] (the GTIDs and the newest file/offset of the done transactions after
//! it), which costs no memory of its own. A prepared XA branch held for hours keeps one entry,
//! however many transactions commit behind it.

use crate::binlog::{BinlogPosition, MariaDbGtid, MySqlGtidSet, TxEnd, TxGtid};
use std::collections::BTreeMap;

/// Sequence number of a transaction in binlog order, as handed out by `Watermark::begin`.
pub type TxSeq = u64;

/// The done transactions that follow one unfinished entry, up to the next unfinished one,
/// folded: passing the run moves a position exactly as passing each of them in order would.
///
/// Its size is bounded by the number of replication domains and GTID sources (and the gaps the
/// unfinished transactions leave in a MySQL GTID set), not by how many transactions it holds.
#[derive(Debug, Default)]
struct Run {
    /// The newest GTID of each MariaDB domain (a MariaDB position keeps the last per domain).
    mariadb: BTreeMap<u32, MariaDbGtid>,
    /// Every MySQL GTID of the run (a MySQL position is the set of all of them).
    mysql: MySqlGtidSet,
    /// The newest file/offset (ends are monotone in binlog order).
    file_pos: Option<(String, u64)>,
    /// Transactions of the run with an end (abandoned ones have none and move nothing).
    ended: u64,
}

impl Run {
    /// Appends one transaction's end (`None`: abandoned), as [`BinlogPosition::advance`] would.
    fn push(&mut self, end: Option<&TxEnd>) {
        let Some(end) = end else { return };
        match &end.gtid {
            Some(TxGtid::MariaDb(gtid)) => {
                self.mariadb.insert(gtid.domain, *gtid);
            }
            Some(TxGtid::MySql(source, gno)) => self.mysql.add(source.clone(), *gno),
            None => {}
        }
        if !end.file.is_empty() && end.end_pos > 0 {
            match &mut self.file_pos {
                Some((file, pos)) => {
                    if *file != end.file {
                        file.clone_from(&end.file);
                    }
                    *pos = end.end_pos;
                }
                None => self.file_pos = Some((end.file.clone(), end.end_pos)),
            }
        }
        self.ended += 1;
    }

    /// Appends a later run.
    fn append(&mut self, later: Run) {
        self.mariadb.extend(later.mariadb);
        self.mysql.union(&later.mysql);
        if later.file_pos.is_some() {
            self.file_pos = later.file_pos;
        }
        self.ended += later.ended;
    }

    /// Moves `position` past every transaction of the run.
    fn apply_to(self, position: &mut BinlogPosition) {
        if !self.mariadb.is_empty() {
            let pos = position.mariadb_gtid.get_or_insert_with(Default::default);
            for gtid in self.mariadb.into_values() {
                pos.apply(gtid);
            }
        }
        if !self.mysql.is_empty() {
            position
                .mysql_gtid_set
                .get_or_insert_with(Default::default)
                .union(&self.mysql);
        }
        if let Some((file, pos)) = self.file_pos {
            position.file = Some(file);
            position.pos = pos;
        }
    }
}

/// A transaction still open or with events not completed.
#[derive(Debug)]
struct Entry {
    open: bool,
    remaining: u64,
    /// `None` while open, and for an abandoned transaction (its events complete, but it moves no
    /// position).
    end: Option<TxEnd>,
    /// The done transactions after this one, up to the next entry.
    after: Run,
}

impl Entry {
    fn is_done(&self) -> bool {
        !self.open && self.remaining == 0
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct Watermark {
    /// The unfinished transactions, by sequence number. Every transaction before the first one
    /// has been passed; every other transaction before [`Watermark::next`] is done and folded
    /// into the run of the nearest earlier entry.
    entries: BTreeMap<TxSeq, Entry>,
    /// The sequence number the next [`Watermark::begin`] hands out.
    next: TxSeq,
    position: BinlogPosition,
    /// Transactions with an end passed since the start (for metrics and batching decisions).
    advanced: u64,
    /// Events completed since the start.
    completed: u64,
    /// Events added and not completed yet.
    outstanding: u64,
}

impl Watermark {
    /// Starts at `position` (the checkpoint the reader resumes from).
    pub fn new(position: BinlogPosition) -> Self {
        Watermark {
            entries: BTreeMap::new(),
            next: 0,
            position,
            advanced: 0,
            completed: 0,
            outstanding: 0,
        }
    }

    /// Opens the next transaction in binlog order.
    pub fn begin(&mut self) -> TxSeq {
        let seq = self.next;
        self.next += 1;
        self.entries.insert(
            seq,
            Entry {
                open: true,
                remaining: 0,
                end: None,
                after: Run::default(),
            },
        );
        seq
    }

    fn entry(&mut self, seq: TxSeq) -> &mut Entry {
        self.entries
            .get_mut(&seq)
            .expect("transaction already done or passed by the watermark")
    }

    /// Counts one more event of `seq` that must complete before the watermark passes it.
    pub fn add_event(&mut self, seq: TxSeq) {
        self.entry(seq).remaining += 1;
        self.outstanding += 1;
    }

    /// Closes `seq` at `end`; no more events will be added to it.
    pub fn end(&mut self, seq: TxSeq, end: TxEnd) {
        let entry = self.entry(seq);
        entry.open = false;
        entry.end = Some(end);
        self.settle(seq);
    }

    /// Closes `seq` without a position: the reader lost its connection mid-transaction and will
    /// read the whole transaction again. Its events already dispatched still complete.
    pub fn abandon(&mut self, seq: TxSeq) {
        let entry = self.entry(seq);
        entry.open = false;
        entry.end = None;
        self.settle(seq);
    }

    /// One event of `seq` is done (SENT or FAILED and recorded).
    pub fn complete(&mut self, seq: TxSeq) {
        let entry = self
            .entries
            .get_mut(&seq)
            .expect("more completions than events");
        entry.remaining = entry
            .remaining
            .checked_sub(1)
            .expect("more completions than events");
        self.completed += 1;
        self.outstanding -= 1;
        self.settle(seq);
    }

    /// If `seq` is done, drops its entry: passed when it is the oldest unfinished one (with the
    /// run after it), else folded with its run into the run of the nearest earlier entry.
    fn settle(&mut self, seq: TxSeq) {
        if !self.entries.get(&seq).is_some_and(Entry::is_done) {
            return;
        }
        let entry = self.entries.remove(&seq).expect("checked above");
        match self.entries.range_mut(..seq).next_back() {
            Some((_, earlier)) => {
                earlier.after.push(entry.end.as_ref());
                earlier.after.append(entry.after);
            }
            None => {
                if let Some(end) = &entry.end {
                    self.position.advance(end);
                    self.advanced += 1;
                }
                self.advanced += entry.after.ended;
                entry.after.apply_to(&mut self.position);
            }
        }
    }

    /// Whether every event of `seq` completed and no more will be added: passed, or closed with
    /// nothing left (it may still wait behind an earlier transaction).
    pub fn is_done(&self, seq: TxSeq) -> bool {
        seq < self.next && !self.entries.contains_key(&seq)
    }

    /// The acknowledged position (see the module guarantee).
    pub fn position(&self) -> &BinlogPosition {
        &self.position
    }

    /// Transactions read but not yet passed: from the oldest unfinished one to the newest read.
    pub fn in_flight(&self) -> usize {
        let oldest = self.entries.keys().next().copied().unwrap_or(self.next);
        usize::try_from(self.next - oldest).unwrap_or(usize::MAX)
    }

    /// Events handed on and not completed yet (in the senders, or held back for key order).
    pub fn events_outstanding(&self) -> u64 {
        self.outstanding
    }

    /// Entries held: the transactions still open or with events not completed. This, not
    /// [`Watermark::in_flight`], is what the watermark's memory grows with.
    #[cfg(test)]
    pub fn unfinished(&self) -> usize {
        self.entries.len()
    }

    /// The parts all runs hold (MariaDB domains, MySQL GTID intervals, file/offsets): what the
    /// done transactions behind an unfinished one cost, in place of one entry each.
    #[cfg(test)]
    pub fn run_parts(&self) -> usize {
        self.entries
            .values()
            .map(|e| {
                e.after.mariadb.len()
                    + e.after.mysql.intervals().count()
                    + usize::from(e.after.file_pos.is_some())
            })
            .sum()
    }

    /// The commit time (the commit event's header: server clock, Unix seconds) of the oldest
    /// closed transaction with events not yet completed; `None` when there is none. The stream
    /// holds those events in memory (waiting for the broker, or queued behind their key), so a
    /// sweeper must leave alone the rows committed since: they are still on their way.
    pub fn oldest_unfinished_commit(&self) -> Option<u64> {
        self.entries
            .values()
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
#[path = "watermark_tests.rs"]
mod tests;
