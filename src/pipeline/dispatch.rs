//! The dispatcher: opens each transaction in the stream's acknowledgements, gives each event its
//! acknowledgement, and routes it to its shard.
//!
//! While catching up after a restart or a takeover (reading binlog that a previous run may have
//! already handled, up to the server's end of binlog at start-up), it first asks which of the
//! events are done already ([`CatchUp`]): those recorded SENT or FAILED are skipped, and those the
//! broker stored but the previous run had not recorded are recorded SENT with the stored message
//! id, not sent again. A takeover then resends nothing the old leader stored, within the bound of
//! what is read back.
//!
//! When the reader loses its connection inside a transaction it reads that transaction again
//! from its start; the rows already handed on are not handed on twice ([`HandedOn`]).
//!
//! Streamed events go through the key-order guard ([`KeyOrder`]) when a sweeper runs beside
//! the stream: a key whose older row waits elsewhere is held until that row is sent.
//!
//! An event of a topic that has not accepted events for `relay.park_after` is *parked*: left
//! PENDING in the outbox for the sweeper, not held in memory (see [`crate::send::Stalls`]).
//!
//! A prepared XA transaction is held here ([`Held`]) until the reader brings its outcome: its
//! rows are handed on at `XA COMMIT` and dropped at `XA ROLLBACK`. Its transaction stays open
//! meanwhile, so the checkpoint stays below its prepare (a restart reads the prepare again),
//! while every later transaction flows and completes as usual.

use super::key_order::{self, KeyOrder};
use crate::binlog::{BinlogItem, DecodedRow, TxEnd, Xid};
use crate::checkpoint::{Acknowledgements, TxSeq};
use crate::event::Origin;
use crate::outbox::TableName;
use crate::send::{Completion, SendInputs, ShardEvent, StalledSet};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Most items taken from the reader at once (one status query per table per batch).
const MAX_BATCH: usize = 1000;

/// What the dispatcher saw.
#[derive(Debug, Default)]
pub struct Dispatched {
    pub unidentifiable: u64,
    /// Events skipped while catching up because their rows were already SENT or FAILED.
    pub already_recorded: u64,
    /// Events found stored on the broker while catching up, recorded SENT without a send.
    pub found_stored: u64,
    /// Rows of a transaction read again after a lost connection that had been handed on the
    /// first time (not sent twice).
    pub read_again: u64,
    /// Prepared XA transactions whose `XA COMMIT` handed their rows on, and those rolled back.
    pub xa_committed: u64,
    pub xa_rolled_back: u64,
    /// Events of a stalled topic left PENDING for the sweeper.
    pub parked: u64,
    /// What the key-order guard asked before each batch (all zero without a sweeper).
    pub key_order: key_order::KeyOrderChecks,
}

/// A prepared XA transaction waiting for its outcome.
struct Held {
    /// Its transaction, open until the outcome's rows complete.
    seq: TxSeq,
    rows: Vec<DecodedRow>,
    /// Where its prepare ends: the position passed once its rows complete.
    end: TxEnd,
    since: Instant,
}

/// A prepared XA transaction held longer than this is logged (then every such period).
const LONG_PREPARED: Duration = Duration::from_secs(60);

/// The rows of the transaction being read that were handed on, and those of a transaction the
/// reader lost mid-way and is reading again. Skipping those is safe: they are still in flight
/// under the abandoned transaction's sequence number, which holds the checkpoint back until they
/// complete, and they reached their shards before the rest of the transaction, in order.
#[derive(Default)]
struct HandedOn {
    current: Vec<(Arc<TableName>, u64)>,
    abandoned: HashSet<(Arc<TableName>, u64)>,
}

impl HandedOn {
    /// Whether the row `(table, id)` was handed on before the reader lost its transaction; if
    /// not, it is recorded as handed on now.
    fn already(&mut self, table: &Arc<TableName>, id: u64) -> bool {
        let key = (Arc::clone(table), id);
        if !self.abandoned.is_empty() && self.abandoned.contains(&key) {
            return true;
        }
        self.current.push(key);
        false
    }

    /// The reader lost the transaction: it will be read again from its start.
    fn restart(&mut self) {
        self.abandoned.extend(self.current.drain(..));
    }

    /// The transaction ended (read whole at last).
    fn end(&mut self) {
        self.current.clear();
        self.abandoned.clear();
    }
}

/// Where the dispatcher hands events on.
pub struct Outputs {
    pub inputs: SendInputs,
    /// Per-key order with the sweeper's rows (`None`: no sweeper, events go straight on).
    pub key_order: Option<KeyOrder>,
    /// A prepared XA transaction held this long is parked (`None`: never; there is no sweeper
    /// to send its rows at `XA COMMIT`).
    pub park_prepared_after: Option<Duration>,
}

/// Consumes reader items until the reader's channel closes. Every event leaves with its
/// acknowledgement, so the checkpoint can never pass it before its outcome is recorded.
pub async fn run(
    mut items: mpsc::Receiver<BinlogItem>,
    outputs: Outputs,
    acks: Acknowledgements,
    mut catch_up: Option<CatchUp>,
) -> Dispatched {
    let mut d = Dispatcher {
        inputs: outputs.inputs,
        key_order: outputs.key_order,
        acks,
        stats: Dispatched::default(),
        handed_on: HandedOn::default(),
        held: HashMap::new(),
        last_long_warning: Instant::now(),
        last_recheck: Instant::now(),
        parking: StalledSet::default(),
        park_prepared_after: outputs.park_prepared_after,
        parked_xa: HashMap::new(),
        catching_up: catch_up.is_some(),
    };
    let mut current: Option<TxSeq> = None;
    loop {
        let mut batch = match d.receive_batch(&mut items).await {
            Received::Batch(batch) => batch,
            Received::Closed => break,
            Received::TimerUp => {
                if !d.tend_held().await {
                    return d.finish();
                }
                continue;
            }
        };
        if catch_up.is_none() {
            d.read_on_for_skipped(&mut batch, &mut items).await;
        }
        let recorded = match &mut catch_up {
            Some(catch_up) => catch_up.recorded(&batch).await,
            None => Recorded::default(),
        };
        d.start_batch(&batch, &recorded, catch_up.is_some()).await;
        for item in batch {
            let handed = d
                .hand_on_item(item, &mut current, &recorded, &mut catch_up)
                .await;
            if !handed {
                return d.finish(); // shutting down
            }
        }
        if !d.tend_held().await {
            return d.finish();
        }
        if catch_up.as_ref().is_some_and(CatchUp::done) {
            if let Some(caught_up) = catch_up.take() {
                let read_back = caught_up.read_back();
                tracing::info!(
                    skipped = d.stats.already_recorded,
                    found_stored = d.stats.found_stored,
                    topics_read_back = read_back.topics,
                    queues_read_back = read_back.queues,
                    messages_read_back = read_back.messages,
                    read_back_took = ?read_back.took,
                    "caught up with the binlog: events already recorded SENT or FAILED (or claimed by a sweeper) were not sent again, nor those found stored on the broker"
                );
            }
        }
    }
    d.finish()
}

/// What the dispatcher's wait for the reader brought.
enum Received {
    /// The reader's next items, at most [`MAX_BATCH`], in the reader's order.
    Batch(Vec<BinlogItem>),
    /// The reader's channel is closed: the reader stopped.
    Closed,
    /// The timer for what is held ran out first.
    TimerUp,
}

impl Dispatcher {
    /// Waits for the reader's next item, then takes whatever else is already waiting, up to
    /// [`MAX_BATCH`].
    async fn receive_batch(&self, items: &mut mpsc::Receiver<BinlogItem>) -> Received {
        // A timer only while something is held (XA transactions, to log the long-prepared ones
        // on a quiet stream; keys, to hand their events on once their older rows are sent);
        // the common path just waits.
        let timer = match (self.held.is_empty(), self.holding_keys()) {
            (true, false) => None,
            (_, true) => Some(key_order::RECHECK),
            (false, false) => Some(self.prepared_timer()),
        };
        let next = match timer {
            None => Ok(items.recv().await),
            Some(timer) => tokio::time::timeout(timer, items.recv()).await,
        };
        let first = match next {
            Ok(Some(item)) => item,
            Ok(None) => return Received::Closed,
            Err(_) => return Received::TimerUp,
        };
        let mut batch = vec![first];
        take_ready(&mut batch, items);
        Received::Batch(batch)
    }

    /// While `batch` skips ids of a table known clean (mostly other writers' older ids,
    /// committed a moment later), reads on for up to [`key_order::GAP_WAIT`]: the ids that
    /// arrive need no question (see [`KeyOrder::skips`]).
    async fn read_on_for_skipped(
        &self,
        batch: &mut Vec<BinlogItem>,
        items: &mut mpsc::Receiver<BinlogItem>,
    ) {
        let Some(order) = &self.key_order else {
            return;
        };
        let none = Recorded::default();
        let deadline = Instant::now() + key_order::GAP_WAIT;
        while batch.len() < MAX_BATCH && order.skips(batch_rows(batch, &none)) {
            match tokio::time::timeout_at(deadline, items.recv()).await {
                Ok(Some(item)) => batch.push(item),
                // Closed (the next receive says so), or the wait is over: ask.
                Ok(None) | Err(_) => return,
            }
            take_ready(batch, items);
        }
    }

    /// Before `batch` is handed on: takes the parking for the whole batch and asks the
    /// key-order guard about the rows it will hand on (not those `recorded`, nor parked ones).
    async fn start_batch(
        &mut self,
        batch: &[BinlogItem],
        recorded: &Recorded,
        catching_up: bool,
    ) {
        if let Some(order) = &mut self.key_order {
            order.new_batch();
            order.learn_released(&self.inputs.stalls().released);
        }
        // Taken once per batch: the key-order guard's check of the batch below counts every
        // event the batch hands on as the stream's own, so all of one topic's are parked or
        // none (a later batch's check then sees the parked rows waiting).
        let parking = self.inputs.stalls().parking();
        // The shards release the streamed events they hold of what parks now: rows of those
        // topics the stream no longer carries.
        for topic in parking.grown_since(&self.parking) {
            if let Some(order) = &mut self.key_order {
                order.let_go_topic(&topic);
            }
        }
        self.catching_up = catching_up;
        self.parking = parking;
        self.check_key_order(batch_rows(batch, recorded)).await;
    }

    /// Hands on one item of the stream, in the stream's order: opens, ends or abandons the
    /// `current` transaction, hands on or holds its rows, and moves the catch-up's read
    /// position along. False once the shards are gone (shutting down).
    async fn hand_on_item(
        &mut self,
        item: BinlogItem,
        current: &mut Option<TxSeq>,
        recorded: &Recorded,
        catch_up: &mut Option<CatchUp>,
    ) -> bool {
        match item {
            BinlogItem::TxBegin => {
                *current = Some(self.begin());
                true
            }
            BinlogItem::Row(row) => {
                let seq = *current.get_or_insert_with(|| self.begin());
                self.hand_on(seq, row, recorded, true).await
            }
            BinlogItem::TxEnd(end) => {
                self.handed_on.end();
                if let Some(catch_up) = catch_up {
                    catch_up.passed(&end);
                }
                let seq = current.take().unwrap_or_else(|| self.begin());
                self.acks.end(seq, end);
                true
            }
            BinlogItem::Prepared(prepared) => {
                if let Some(catch_up) = catch_up {
                    catch_up.passed(&prepared.end);
                }
                self.hold(prepared, recorded);
                true
            }
            BinlogItem::XaOutcome { xid, committed } => self.resolve(&xid, committed).await,
            BinlogItem::Restart => {
                self.handed_on.restart();
                if let Some(seq) = current.take() {
                    self.acks.abandon(seq);
                }
                true
            }
        }
    }

    /// After a batch, or when the timer runs out: logs long-prepared XA transactions and lets
    /// held keys go whose older rows are sent; false once the shards are gone.
    async fn tend_held(&mut self) -> bool {
        self.look_at_prepared();
        self.recheck_keys().await
    }
}

/// Adds to `batch` the items the reader has ready, up to [`MAX_BATCH`] in all.
fn take_ready(batch: &mut Vec<BinlogItem>, items: &mut mpsc::Receiver<BinlogItem>) {
    while batch.len() < MAX_BATCH {
        match items.try_recv() {
            Ok(item) => batch.push(item),
            Err(_) => break,
        }
    }
}

/// The streamed rows of `batch` not already recorded in the outbox: handed on now (to a shard,
/// or to the marker: a bad row, an event found stored on the broker), or parked. The key-order
/// guard counts those as the stream's own: a row found stored is still PENDING until the marker
/// records it, and taken for a row waiting elsewhere the guard would have the sweeper send it
/// again.
fn batch_rows<'a>(
    batch: &'a [BinlogItem],
    recorded: &'a Recorded,
) -> impl Iterator<Item = &'a DecodedRow> + 'a {
    batch.iter().filter_map(move |item| match item {
        BinlogItem::Row(DecodedRow::Event(row)) if recorded.in_outbox(&row.table, row.id) => None,
        BinlogItem::Row(row) => Some(row),
        _ => None,
    })
}

/// The dispatcher's state between items.
struct Dispatcher {
    inputs: SendInputs,
    key_order: Option<KeyOrder>,
    last_recheck: Instant,
    acks: Acknowledgements,
    stats: Dispatched,
    handed_on: HandedOn,
    held: HashMap<Xid, Held>,
    last_long_warning: Instant,
    /// The topics whose events this batch parks (see [`crate::send::Stalls::parking`]).
    parking: StalledSet,
    park_prepared_after: Option<Duration>,
    /// Prepared XA transactions parked, and since when they were prepared.
    parked_xa: HashMap<Xid, Instant>,
    /// Reading binlog a previous run may have handled (see [`CatchUp`]).
    catching_up: bool,
}

impl Dispatcher {
    fn begin(&self) -> TxSeq {
        self.acks.begin()
    }

    /// What it saw, the key-order guard's questions included.
    fn finish(mut self) -> Dispatched {
        if let Some(order) = &self.key_order {
            self.stats.key_order = order.checks;
        }
        self.stats
    }

    fn holding_keys(&self) -> bool {
        self.key_order.as_ref().is_some_and(KeyOrder::holding)
    }

    /// Hands on row `row` of transaction `seq`, found stored on the broker as `msg_id` while
    /// catching up, as SENT: the marker records it and then acknowledges it. The stream carries
    /// it (as a bad row's FAILED): the key-order guard does not take it for a row waiting
    /// elsewhere meanwhile. False once the marker is gone.
    async fn record_stored(&mut self, seq: TxSeq, row: crate::event::OutboxRow, msg_id: String) -> bool {
        self.stats.found_stored += 1;
        crate::metrics::relay().catch_up_found_stored.inc();
        if let Some(order) = &mut self.key_order {
            order.carry(seq, &row.table, row.id);
        }
        let origin = Origin::Stream(self.acks.event(seq));
        let completion = Completion::stored(origin, row, msg_id);
        self.inputs.complete(completion).await.is_ok()
    }

    /// Asks the key-order guard about `rows` before they are handed on (or parked, as
    /// `self.parking` says).
    async fn check_key_order<'a>(&mut self, rows: impl Iterator<Item = &'a DecodedRow>) {
        if let Some(order) = &mut self.key_order {
            (order.check(rows, &self.parking, &self.acks, self.catching_up)).await;
        }
    }

    /// The stream leaves a row of `table` and topic (`None`: any) waiting without carrying it.
    fn let_go(&mut self, row: Option<(&Arc<TableName>, &str)>) {
        match (&mut self.key_order, row) {
            (Some(order), Some((table, topic))) => order.let_go(table, topic),
            (Some(order), None) => order.let_go_all(),
            (None, _) => {}
        }
    }

    /// Lets held keys go whose older rows are sent (at most every [`key_order::RECHECK`]);
    /// false once the shards are gone.
    async fn recheck_keys(&mut self) -> bool {
        if !self.holding_keys() {
            return true;
        }
        if self.inputs.stalls().any() {
            let parking = self.inputs.stalls().parking();
            let order = self.key_order.as_mut().expect("holding keys");
            order.park_held(&parking);
        }
        let order = self.key_order.as_mut().expect("holding keys");
        let due = self.last_recheck.elapsed() >= key_order::RECHECK || order.recheck_soon();
        if !order.holding() || !due {
            return true;
        }
        self.last_recheck = Instant::now();
        order.recheck(&self.acks, &self.inputs).await
    }

    /// Hands `row` of transaction `seq` on (to its shard, or as a problem); false once the
    /// receivers are gone. `read_again` applies the [`HandedOn`] check of re-read transactions.
    async fn hand_on(
        &mut self,
        seq: TxSeq,
        row: DecodedRow,
        recorded: &Recorded,
        read_again: bool,
    ) -> bool {
        let stored = match &row {
            DecodedRow::Event(row) => recorded.stored(&row.table, row.id).map(str::to_string),
            _ => None,
        };
        match row {
            DecodedRow::Event(row) if stored.is_some() => {
                let msg_id = stored.unwrap_or_default();
                return self.record_stored(seq, row, msg_id).await;
            }
            DecodedRow::Event(row) if recorded.in_outbox(&row.table, row.id) => {
                self.stats.already_recorded += 1;
            }
            DecodedRow::Event(row) if read_again && self.handed_on.already(&row.table, row.id) => {
                self.stats.read_again += 1;
            }
            // Its topic does not accept events: the row stays PENDING and no acknowledgement is
            // taken for it, so the checkpoint may pass it; the sweeper sends it once the topic
            // accepts events (in key order: a later event of its key waits for it, `KeyOrder`).
            DecodedRow::Event(row)
                if !self.parking.is_empty()
                    && self
                        .parking
                        .contains(&row.message.topic, &row.message.biz_key) =>
            {
                self.stats.parked += 1;
                crate::send::stall::count_parked(&row.message.topic);
                self.let_go(Some((&row.table, &row.message.topic)));
            }
            DecodedRow::Problem(problem)
                if read_again && self.handed_on.already(&problem.table, problem.id) =>
            {
                self.stats.read_again += 1;
            }
            DecodedRow::Event(row) => {
                let event = ShardEvent::streamed(self.acks.event(seq), row);
                if let Some(order) = &mut self.key_order {
                    return order.route(seq, event, &self.inputs).await;
                }
                return self.inputs.send(event).await.is_ok();
            }
            DecodedRow::Problem(problem) => {
                if let Some(order) = &mut self.key_order {
                    order.carry(seq, &problem.table, problem.id);
                }
                let origin = Origin::Stream(self.acks.event(seq));
                let completion = Completion::bad_row(origin, problem);
                return self.inputs.complete(completion).await.is_ok();
            }
            // Inserted with another status (SENDING would be waiting), or a row the stream
            // cannot locate (left PENDING for the sweeper): neither is carried by the stream.
            DecodedRow::NotPending => self.let_go(None),
            DecodedRow::Unidentifiable(reason) => {
                self.let_go(None);
                self.stats.unidentifiable += 1;
                tracing::error!(%reason, "outbox row skipped: it cannot be identified or marked");
            }
        }
        true
    }
}

mod catch_up;
mod prepared;

pub use catch_up::{BrokerTails, CatchUp};
use catch_up::Recorded;

#[cfg(test)]
mod tests;
