//! The watermark's tests: hand-written cases, a property test against a reference model that
//! keeps every transaction, and the memory bound behind one unfinished transaction.

use super::*;
use crate::binlog::{MariaDbGtid, MySqlSource, TxGtid};
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

/// The watermark as specified, with no concern for memory: every transaction read is kept, and
/// the position is the start advanced over the longest prefix of done transactions.
#[derive(Default)]
struct Model {
    start: BinlogPosition,
    txs: Vec<(bool, u64, Option<TxEnd>)>,
    completed: u64,
}

impl Model {
    fn done(tx: &(bool, u64, Option<TxEnd>)) -> bool {
        !tx.0 && tx.1 == 0
    }
    fn passed(&self) -> usize {
        self.txs.iter().take_while(|tx| Self::done(tx)).count()
    }
    fn position(&self) -> BinlogPosition {
        let mut position = self.start.clone();
        for end in self.txs[..self.passed()]
            .iter()
            .filter_map(|tx| tx.2.as_ref())
        {
            position.advance(end);
        }
        position
    }
    fn advanced(&self) -> u64 {
        self.txs[..self.passed()]
            .iter()
            .filter(|tx| tx.2.is_some())
            .count() as u64
    }
    fn oldest_unfinished_commit(&self) -> Option<u64> {
        self.txs
            .iter()
            .find(|tx| tx.1 > 0 && tx.2.is_some())
            .map(|tx| u64::from(tx.2.as_ref().expect("found with an end").timestamp))
    }
}

/// Ends in binlog order, of a mixed flavour: MariaDB GTIDs in two domains, MySQL GTIDs of two
/// sources, some without a GTID; the file rotates every 7 transactions.
fn mixed_end(seq: u64) -> TxEnd {
    let gtid = match seq % 5 {
        0 | 1 => Some(TxGtid::MariaDb(MariaDbGtid {
            domain: (seq % 2) as u32,
            server: 1,
            seq: seq + 1,
        })),
        2 | 3 => Some(TxGtid::MySql(
            MySqlSource {
                uuid: format!("3e11fa47-71ca-11e1-9e33-c80aa9429562{}", seq % 2)[..36].into(),
                tag: (seq % 2 == 1).then(|| "orders".into()),
            },
            seq / 2 + 1,
        )),
        _ => None,
    };
    TxEnd {
        gtid,
        file: format!("binlog.{:06}", seq / 7 + 1),
        end_pos: 100 * (seq % 7 + 1),
        timestamp: 1_000 + seq as u32,
    }
}

/// The watermark and the model driven side by side.
struct Twins {
    w: Watermark,
    m: Model,
    open: Vec<u64>,
    pending: Vec<u64>,
}

impl Twins {
    fn new(start: BinlogPosition) -> Self {
        Twins {
            w: Watermark::new(start.clone()),
            m: Model {
                start,
                ..Model::default()
            },
            open: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// 0: begin (up to three open), 1: an event of an open transaction, 2: end one, 3: abandon
    /// one, 4 and 5: complete a pending event; `pick` chooses which.
    fn step(&mut self, op: u8, pick: usize) {
        let (w, m) = (&mut self.w, &mut self.m);
        match op {
            0 if self.open.len() < 3 => {
                let seq = w.begin();
                assert_eq!(seq, m.txs.len() as u64);
                m.txs.push((true, 0, None));
                self.open.push(seq);
            }
            1 if !self.open.is_empty() => {
                let seq = self.open[pick % self.open.len()];
                w.add_event(seq);
                m.txs[seq as usize].1 += 1;
                self.pending.push(seq);
            }
            2 | 3 if !self.open.is_empty() => {
                let seq = self.open.swap_remove(pick % self.open.len());
                let tx = &mut m.txs[seq as usize];
                tx.0 = false;
                if op == 2 {
                    w.end(seq, mixed_end(seq));
                    tx.2 = Some(mixed_end(seq));
                } else {
                    w.abandon(seq);
                }
            }
            4 | 5 if !self.pending.is_empty() => {
                let seq = self.pending.swap_remove(pick % self.pending.len());
                w.complete(seq);
                m.txs[seq as usize].1 -= 1;
                m.completed += 1;
            }
            _ => {}
        }
    }

    fn agree(&self) -> Result<(), TestCaseError> {
        let (w, m) = (&self.w, &self.m);
        prop_assert_eq!(w.position(), &m.position());
        prop_assert_eq!(w.in_flight(), m.txs.len() - m.passed());
        prop_assert_eq!(w.advanced(), m.advanced());
        prop_assert_eq!(w.progress(), m.advanced() + m.completed);
        let held = m.oldest_unfinished_commit();
        prop_assert_eq!(w.oldest_unfinished_commit(), held);
        prop_assert_eq!(
            w.done_up_to(Some(1_010)),
            Some(held.map_or(1_010, |t| t.min(1_010)))
        );
        let unfinished = m.txs.iter().filter(|tx| !Model::done(tx)).count();
        prop_assert_eq!(
            w.unfinished(),
            unfinished,
            "one entry per unfinished transaction"
        );
        for seq in 0..=m.txs.len() as u64 {
            let expected = m.txs.get(seq as usize).is_some_and(Model::done);
            prop_assert_eq!(w.is_done(seq), expected, "is_done({})", seq);
        }
        Ok(())
    }
}

proptest! {
    /// Random interleavings of begin, add_event, end, abandon and complete (up to three
    /// transactions open at once, events completed in any order): after every step the
    /// watermark answers every question exactly as the reference model does, and holds an
    /// entry only for the unfinished transactions.
    #[test]
    fn agrees_with_a_model_that_keeps_every_transaction(
        ops in proptest::collection::vec((0u8..6, any::<u16>()), 1..120),
        from_mid_stream in any::<bool>(),
    ) {
        let mut start = BinlogPosition::default();
        if from_mid_stream {
            start.advance(&mixed_end(1_000));
        }
        let mut t = Twins::new(start);
        for (op, pick) in ops {
            t.step(op, usize::from(pick));
            t.agree()?;
        }
        // Close and complete everything: both end at the same, final position.
        while !t.open.is_empty() || !t.pending.is_empty() {
            t.step(if t.open.is_empty() { 4 } else { 2 }, 0);
            t.agree()?;
        }
        prop_assert_eq!(t.w.in_flight(), 0);
        prop_assert_eq!(t.w.unfinished(), 0);
    }
}

/// The memory bound: a million transactions done behind one that stays unfinished (a prepared
/// XA branch, a held key) leave one entry, and its run stays a single GTID interval and one
/// file/offset; once the held one completes, the position passes all of them at once.
#[test]
fn a_million_done_transactions_behind_an_unfinished_one_cost_no_entries() {
    let source = MySqlSource {
        uuid: "3e11fa47-71ca-11e1-9e33-c80aa9429562".into(),
        tag: None,
    };
    let end = |seq: u64| TxEnd {
        gtid: Some(TxGtid::MySql(source.clone(), seq + 1)),
        file: "binlog.000001".into(),
        end_pos: 100 * (seq + 1),
        timestamp: 0,
    };
    let mut w = Watermark::new(BinlogPosition::default());
    let held = w.begin();
    w.add_event(held);
    w.end(held, end(held));
    const DONE: u64 = 1_000_000;
    for _ in 0..DONE {
        let seq = w.begin();
        w.add_event(seq);
        w.end(seq, end(seq));
        w.complete(seq);
        assert!(w.is_done(seq));
    }
    assert_eq!(w.unfinished(), 1, "only the held transaction has an entry");
    assert_eq!(
        w.run_parts(),
        2,
        "its run: one GTID interval and one file/offset"
    );
    assert_eq!(w.in_flight(), DONE as usize + 1, "none passed yet");
    assert_eq!(w.position(), &BinlogPosition::default());
    assert!(!w.is_done(held));
    assert_eq!(w.progress(), DONE, "completions still count as progress");

    w.complete(held);
    assert_eq!((w.unfinished(), w.in_flight(), w.run_parts()), (0, 0, 0));
    assert_eq!(w.advanced(), DONE + 1);
    let mut expected = BinlogPosition::default();
    expected
        .mysql_gtid_set
        .get_or_insert_with(Default::default)
        .add_interval(source.clone(), 1, DONE + 2);
    expected.file = Some("binlog.000001".into());
    expected.pos = 100 * (DONE + 1);
    assert_eq!(w.position(), &expected);
}
