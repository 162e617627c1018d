//! The stream's key-order guard: per-key order across the stream and the sweeper. A key is a
//! `biz_key` within one topic ([`OrderKey`]): the same `biz_key` in a topic that cannot take
//! its events never holds back another topic's.
//!
//! The stream publishes what it reads in the binlog. Some rows of a key it never reads, or not
//! in their place: rows committed before its start position (a purged binlog, a first start
//! without a checkpoint), rows written with `sql_log_bin = 0` or in STATEMENT format, rows put
//! back to PENDING by `retry`/`resend`, rows another instance holds under a lease. Those are
//! published by a sweeper, later; a newer event of the same key streamed meanwhile would
//! overtake them.
//!
//! Guarantee: the stream hands a key's event to its ordered sender only when no older row of
//! that key (smaller id) is waiting (PENDING or SENDING, [`crate::sweep::waiting`]) other than
//! the rows this stream itself carries (handed on earlier, in order, ahead of it), as far as the
//! stream can know: rows its binlog shows and rows committed when it asks; a row put back to
//! PENDING, or written below ids already read with the binlog off, from at most
//! [`known::FRESH`] after its commit. Otherwise the
//! key is *held*: its events wait here, in order, while the sweeper is asked ([`Nudge`]) to
//! claim the older PENDING rows at once; they go to the same ordered sender, and the held events
//! follow, in id order, as soon as no older row waits for them (each event only for the rows
//! older than itself, so a held event never blocks the claim of a row it must follow). Only that key
//! waits; other keys flow. A held event's acknowledgement is out, so the checkpoint never passes
//! it.
//!
//! Mostly nothing needs asking: while a topic is *clean* (every waiting row of it up to the
//! highest id read is the stream's own, see [`known`]) a batch's events of it whose ids follow on
//! from what was read are handed on at once. A batch whose ids skip some first reads on for them
//! (at most [`GAP_WAIT`]: mostly other writers' older ids, committed a moment later), then asks
//! which of the ids still skipped wait (those rows, by primary key); a waiting one holds only
//! its key's later events, until the stream reads it. A look off the stream's path (every
//! [`known::LOOK_EVERY`] while batches flow, one range of `idx_pending (status, topic)` per
//! topic) keeps each topic known clean. The keys of a topic not known clean (at start, while
//! catching up, after the stream parked one of its rows or a look found a row of it not its own)
//! are asked by key, once per dispatcher batch (at most 1,000 binlog items): one SELECT, a range
//! of `idx_waiting_key` per key, reading the key's rows still PENDING or SENDING below the
//! batch's newest id: normally the batch's own rows (dropped, they are this stream's) and those
//! of its events in flight ([`crate::sweep::waiting::waiting_rows_of_keys`]). So a stalled
//! topic's parked events make only its own keys asked about; the healthy topics go on without a
//! question.

use crate::binlog::DecodedRow;
use crate::checkpoint::{Acknowledgements, TxSeq};
use crate::outbox::TableName;
use crate::send::released::ReleaseLog;
use crate::send::{SendInputs, ShardEvent, StalledSet};
use crate::sweep::waiting::{
    newest_per_key, OrderKey,
};
use crate::sweep::{HeldForOrder, Nudge};
use mysql_async::Pool;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

mod asking;
mod checks;
mod known;
#[cfg(test)]
mod tests;
pub use checks::KeyOrderChecks;
use checks::Question;
use known::Known;

/// How often held keys are looked at again.
pub const RECHECK: Duration = Duration::from_millis(100);

/// Rows of other writers (or of the sweeper's) a look at the held keys reads at most, beyond the
/// stream's own: enough to send the sweeper a few claims' worth at each look.
const LOOK_ROWS: usize = 1024;

/// How long the dispatcher reads on, at most, for the ids a batch of a clean table skipped
/// before it asks about them ([`KeyOrder::skips`]). With concurrent writers commit order is not
/// id order: nearly every batch skips a few ids that the next binlog events bring a moment
/// later. Asking at once put a round trip on the stream's path, and the rows found made the next
/// batches ask by key (p99 "binlog read -> dispatched" at 5k events/s from 8 connections, MySQL
/// 9.7: 13.8 ms, against 2.4 ms when nothing was asked; docs/performance.md).
pub const GAP_WAIT: Duration = Duration::from_millis(2);

/// A gap question reading this many waiting rows or more asks by key instead.
const GAP_LIMIT: usize = 1_000;

/// A key is per table: ids, and so order, are.
type Key = (Arc<TableName>, OrderKey);

/// The rows of one table in a checked batch: every id, and each event's (id, topic,
/// `biz_key`).
type BatchOfTable<'a> = (HashSet<u64>, Vec<(u64, &'a str, &'a str)>);

/// Events of one held key, in the order the stream read them.
struct HeldKey {
    events: VecDeque<ShardEvent>,
    since: Instant,
    warned: bool,
}

/// See the module docs.
pub struct KeyOrder {
    pool: Pool,
    nudges: mpsc::Sender<Nudge>,
    /// Rows this stream handed on or holds, by transaction, until the transaction is done
    /// (its events recorded: then the rows no longer wait).
    carried: BTreeMap<TxSeq, Vec<(Arc<TableName>, u64)>>,
    carried_ids: HashSet<(Arc<TableName>, u64)>,
    held: HashMap<Key, HeldKey>,
    /// The oldest waiting row of each key of the batch being handed on (from its check).
    blockers: HashMap<Key, u64>,
    /// What the stream knows of each table without asking ([`known`]).
    known: HashMap<Arc<TableName>, Known>,
    /// What the batches were asked.
    pub checks: KeyOrderChecks,
    /// How long a key may be held before it is logged (the sweeper should have sent the older
    /// rows by then).
    warn_after: Duration,
    /// A suspect a key may be held for arrived: look at the held keys again at once.
    recheck_soon: bool,
    /// How many events `held` holds, for the sweeper's gate (kept as they come and go: the
    /// dispatcher must not count every held key at each event).
    held_events: HeldForOrder,
    /// The send stage's releases learnt of ([`KeyOrder::learn_released`]); every event handed
    /// on carries it.
    released_seen: u64,
}

impl KeyOrder {
    /// A guard querying through `pool` and asking the sweeper through `nudges`, telling it in
    /// `held_events` how many events it holds; a key held longer than `warn_after` is logged.
    pub fn new(
        pool: Pool,
        nudges: mpsc::Sender<Nudge>,
        held_events: HeldForOrder,
        warn_after: Duration,
    ) -> Self {
        KeyOrder {
            pool,
            nudges,
            carried: BTreeMap::new(),
            carried_ids: HashSet::new(),
            held: HashMap::new(),
            blockers: HashMap::new(),
            known: HashMap::new(),
            checks: KeyOrderChecks::default(),
            warn_after,
            held_events,
            recheck_soon: false,
            released_seen: 0,
        }
    }

    /// Whether some key is held (the dispatcher then calls [`KeyOrder::recheck`] every
    /// [`RECHECK`]).
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// Whether the held keys should be looked at again before [`RECHECK`] is up: the stream
    /// read a row some of them may have been held for.
    pub fn recheck_soon(&self) -> bool {
        self.recheck_soon
    }

    /// Learns of the events the send stage released since the last call (see
    /// [`crate::send::released`]): their rows wait, no longer the stream's, so their topics are
    /// asked by key again. The events handed on from now on carry what was learnt: a shard
    /// releases one checked before a release of its key.
    pub(crate) fn learn_released(&mut self, log: &ReleaseLog) {
        let (generation, rows) = log.take();
        self.released_seen = generation;
        for row in rows {
            self.carried_ids.remove(&(Arc::clone(&row.table), row.id));
            self.known_of(&row.table).spoil(&row.topic);
        }
    }

    /// Forgets what earlier checks learnt (a new dispatcher batch starts).
    pub fn new_batch(&mut self) {
        self.blockers.clear();
    }

    /// Whether a batch of `rows` would ask about ids the stream has not read yet, in a table
    /// known clean ([`Known::skips`]): the dispatcher then reads on for up to [`GAP_WAIT`].
    pub fn skips<'a>(&self, rows: impl Iterator<Item = &'a DecodedRow>) -> bool {
        // Most batches of a table with no topic known clean: nothing to group.
        if !self.known.values().any(Known::any_clean) {
            return false;
        }
        let mut by_table: HashMap<&Arc<TableName>, HashSet<u64>> = HashMap::new();
        for row in rows {
            let (table, id) = match row {
                DecodedRow::Event(row) => (&row.table, row.id),
                DecodedRow::Problem(problem) => (&problem.table, problem.id),
                _ => continue,
            };
            by_table.entry(table).or_default().insert(id);
        }
        (by_table.iter()).any(|(table, ids)| self.known.get(*table).is_some_and(|k| k.skips(ids)))
    }

    /// Before the events of `rows` are handed on: learns, for each of their keys, the oldest
    /// row that waits (not carried by this stream), and asks the sweeper for the PENDING ones.
    /// The keys of a topic known clean ([`known`]) are asked nothing, or only about the ids the
    /// stream skipped; the others are asked by key. `catching_up` (the stream re-reads what a
    /// previous run may have handled, and skips rows someone else claimed) keeps every key asked
    /// by key. On a database error every key of the table's rows waits until a recheck succeeds
    /// (order before latency).
    ///
    /// `rows` are every row the stream is about to hand on or park: its bad rows (going to
    /// FAILED) name no key to check but are the stream's own, never rows it waits for; the
    /// events `parking` holds back are read, not handed on, so their keys are not checked
    /// (their topic is not clean, [`KeyOrder::let_go`]) but their ids count as read: the
    /// healthy topics' batches do not skip them.
    pub async fn check<'a>(
        &mut self,
        rows: impl Iterator<Item = &'a DecodedRow>,
        parking: &StalledSet,
        acks: &Acknowledgements,
        catching_up: bool,
    ) {
        self.forget_done(acks);
        let mut by_table: BTreeMap<Arc<TableName>, BatchOfTable> = BTreeMap::new();
        for row in rows {
            match row {
                DecodedRow::Event(row) => {
                    let entry = by_table.entry(Arc::clone(&row.table)).or_default();
                    entry.0.insert(row.id);
                    let message = &row.message;
                    // Parked: not handed on, nothing to check (the check would read every
                    // parked row of its key, a stuck topic's whole backlog, on every batch).
                    if !parking.is_empty() && parking.contains(&message.topic, &message.biz_key)
                    {
                        continue;
                    }
                    (entry.1).push((row.id, message.topic.as_str(), message.biz_key.as_str()));
                }
                DecodedRow::Problem(problem) => {
                    let entry = by_table.entry(Arc::clone(&problem.table)).or_default();
                    entry.0.insert(problem.id);
                }
                _ => {}
            }
        }
        for (table, (batch, events)) in by_table {
            let topics = events.iter().map(|(_, topic, _)| *topic);
            let gap = self.question(&table, &batch, topics, (parking, catching_up));
            if events.is_empty() {
                // Nothing to check (all parked, or bad rows), but the skipped ids are asked
                // about all the same: the clean topics stay known.
                if let Some(range) = gap {
                    if self.ask_gap(&table, range, |id| batch.contains(&id)).await.is_err() {
                        self.known_of(&table).spoil_all();
                    }
                }
                continue;
            }
            // Each key with the newest id of its events in the batch.
            let newest = newest_per_key(events.into_iter().map(|(id, t, k)| (id, (t, k))));
            let keys: Vec<(OrderKey, u64)> = (newest.into_iter())
                .map(|((topic, biz_key), id)| (OrderKey::new(topic, biz_key), id))
                .collect();
            match self.answer(&table, gap, &keys, &batch).await {
                Ok(oldest) => {
                    for (key, id) in oldest {
                        let bound = self.blockers.entry((Arc::clone(&table), key)).or_insert(id);
                        *bound = (*bound).min(id);
                    }
                }
                Err(e) => {
                    tracing::warn!(%table, error = %e,
                        "cannot check for older rows of the streamed keys; holding them until the check succeeds");
                    self.known_of(&table).spoil_all();
                    for (key, _) in keys {
                        self.blockers.insert((Arc::clone(&table), key), 0);
                    }
                }
            }
        }
    }

    /// For each of `keys` (a batch of `table` with row ids `batch`) that an older row waits
    /// for, the oldest such row's id: the ids the stream skipped (`gap`) are asked about first;
    /// then the keys of clean topics are answered from the rows found there, the others asked by
    /// key. Counts what was asked.
    async fn answer(
        &mut self,
        table: &Arc<TableName>,
        gap: Option<(u64, u64)>,
        keys: &[(OrderKey, u64)],
        batch: &HashSet<u64>,
    ) -> Result<HashMap<OrderKey, u64>, mysql_async::Error> {
        let exclude = |id: u64| batch.contains(&id);
        if let Some(range) = gap {
            self.ask_gap(table, range, exclude).await?;
        }
        let known = self.known_of(table);
        // Each topic's state once (a batch has many keys, few topics); no key copied when every
        // topic of the batch is clean, the common case.
        let mut clean_topics: HashMap<&str, bool> = HashMap::new();
        for (key, _) in keys {
            (clean_topics.entry(key.topic.as_str())).or_insert_with(|| known.is_clean(&key.topic));
        }
        let (mut oldest, unclean) = if clean_topics.values().all(|clean| *clean) {
            (known.blocking(keys), Vec::new())
        } else {
            let (clean, unclean): (Vec<_>, Vec<_>) =
                (keys.iter().cloned()).partition(|(key, _)| clean_topics[key.topic.as_str()]);
            (known.blocking(&clean), unclean)
        };
        self.checks.count(&match (unclean.is_empty(), gap) {
            (false, _) => Question::Keys,
            (true, Some((from, to))) => Question::Gap(from, to),
            (true, None) => Question::None,
        });
        if !unclean.is_empty() {
            oldest.extend(
                (self.oldest_waiting(table, &unclean, batch.len(), exclude)).await?,
            );
        }
        Ok(oldest)
    }

    /// The ids the stream skipped in a batch of `table` (`batch` rows of it, not carried yet),
    /// to ask about now, while some topic is clean; takes a finished look's answer first and
    /// issues the next look when one is due.
    fn question<'a>(
        &mut self,
        table: &Arc<TableName>,
        batch: &HashSet<u64>,
        topics: impl Iterator<Item = &'a str>,
        (parking, catching_up): (&StalledSet, bool),
    ) -> Option<(u64, u64)> {
        let carried = &self.carried_ids;
        let known = self.known.entry(Arc::clone(table)).or_default();
        let mut foreign = known.take_look(|id| carried.contains(&(Arc::clone(table), id)));
        if !foreign.is_empty() {
            // Full: the sweeper is busy; the next look finds them again.
            foreign.truncate(LOOK_ROWS);
            let nudge = Nudge {
                table: (**table).clone(),
                ids: foreign,
            };
            let _ = self.nudges.try_send(nudge);
        }
        if catching_up {
            known.spoil_all();
        }
        let (gap, arrived) = known.question(batch.iter().copied(), topics);
        // A key held for a suspect may go on once the stream reads it: looked at again now, not
        // at the next RECHECK.
        self.recheck_soon |= arrived && !self.held.is_empty();
        if !catching_up {
            // The batch's rows are carried once handed on, right after this.
            let own = (carried.iter())
                .filter(|(t, _)| t == table)
                .map(|(_, id)| *id)
                .chain(batch.iter().copied());
            // A topic the stream parks is left out: a whole topic, or some of its queues (a look
            // cannot tell keys apart).
            let parked = |topic: &str| parking.topics_contain(topic);
            known.look_if_due(&self.pool, table, own, parked);
        }
        gap
    }

    fn known_of(&mut self, table: &Arc<TableName>) -> &mut Known {
        self.known.entry(Arc::clone(table)).or_default()
    }

    /// The stream leaves a row of `topic` in `table` waiting without carrying it (a parked
    /// event): that topic's keys are asked by key again until a look finds it clean. The
    /// table's other topics stay as they were: a stalled topic's parked events never make a
    /// healthy topic's keys asked about.
    pub fn let_go(&mut self, table: &Arc<TableName>, topic: &str) {
        self.known_of(table).spoil(topic);
    }

    /// The stream leaves rows of `topic` in any table waiting without carrying them (the
    /// shards released the events they held of a topic that parks now).
    pub fn let_go_topic(&mut self, topic: &str) {
        self.known.values_mut().for_each(|known| known.spoil(topic));
    }

    /// Rows of unknown tables and topics may wait that the stream does not carry (a parked or
    /// unknown XA transaction committed): every key is asked by key again until a look finds its
    /// topic clean.
    pub fn let_go_all(&mut self) {
        self.known.values_mut().for_each(Known::spoil_all);
    }

    /// Row `id` of `table`, of stream transaction `seq`, is handed on by the stream (an event, or
    /// a bad row going to FAILED): it is the stream's own until `seq` is done.
    pub fn carry(&mut self, seq: TxSeq, table: &Arc<TableName>, id: u64) {
        let row = (Arc::clone(table), id);
        self.carried.entry(seq).or_default().push(row.clone());
        self.carried_ids.insert(row);
    }

    /// Hands `event` (of stream transaction `seq`) to its shard, or queues it behind its held key; false once
    /// the shards are gone.
    pub async fn route(&mut self, seq: TxSeq, mut event: ShardEvent, inputs: &SendInputs) -> bool {
        event.released_seen = self.released_seen;
        self.carry(seq, &event.row.table, event.row.id);
        // The common case, nothing waits and nothing is held: no key to build (two Strings).
        if self.blockers.is_empty() && self.held.is_empty() {
            return inputs.send(event).await.is_ok();
        }
        let key = (
            Arc::clone(&event.row.table),
            OrderKey::new(
                event.row.message.topic.as_str(),
                event.row.message.biz_key.as_str(),
            ),
        );
        let blocked = self.blockers.get(&key).is_some_and(|&id| id < event.row.id);
        if blocked || self.held.contains_key(&key) {
            let held = self.held.entry(key).or_insert_with(|| HeldKey {
                events: VecDeque::new(),
                since: Instant::now(),
                warned: false,
            });
            held.events.push_back(event);
            self.held_events.add(1);
            self.publish();
            return true;
        }
        inputs.send(event).await.is_ok()
    }

    /// Lets go of the held keys whose topic (or queue) parks now (see [`crate::send::Stalls`]):
    /// the sweeper claims no row of a stalled topic, so they would wait for the topic with
    /// their acknowledgements out, holding the checkpoint back. Their acknowledgements are
    /// given back and their rows stay PENDING, for the sweeper once the topic accepts events
    /// again (in key order: behind the older rows they waited for); their tables are asked by
    /// key again.
    pub fn park_held(&mut self, parking: &StalledSet) {
        if self.held.is_empty() || parking.is_empty() {
            return;
        }
        let parked: Vec<Key> = (self.held.keys())
            .filter(|(_, key)| parking.contains(&key.topic, &key.biz_key))
            .cloned()
            .collect();
        for key in parked {
            let held = self.held.remove(&key).expect("present");
            self.held_events.remove(held.events.len());
            for mut event in held.events {
                event.origin.release();
                crate::send::stall::count_parked(&key.1.topic);
            }
            self.known_of(&key.0).spoil(&key.1.topic);
        }
        self.publish();
    }

    /// Looks at the held keys again: hands on, in order, each key's events that no older row
    /// waits for any more, and asks again for the rest. False once the shards are gone.
    pub async fn recheck(&mut self, acks: &Acknowledgements, inputs: &SendInputs) -> bool {
        self.recheck_soon = false;
        if self.held.is_empty() {
            return true;
        }
        self.learn_released(&inputs.stalls().released);
        self.forget_done(acks);
        let mut by_table: BTreeMap<Arc<TableName>, Vec<(OrderKey, u64)>> = BTreeMap::new();
        for ((table, key), held) in &self.held {
            let newest = held.events.iter().map(|e| e.row.id).max().unwrap_or(0);
            let entry = by_table.entry(Arc::clone(table)).or_default();
            entry.push((key.clone(), newest));
        }
        let mut bounds: Vec<(Key, u64)> = Vec::new();
        for (table, keys) in by_table {
            let Ok(oldest) = self.oldest_waiting(&table, &keys, 0, |_| false).await else {
                continue; // warned when they were held; asked again next time
            };
            bounds.extend(keys.into_iter().map(|(key, _)| {
                let bound = oldest.get(&key).copied().unwrap_or(u64::MAX);
                ((Arc::clone(&table), key), bound)
            }));
        }
        for (key, bound) in bounds {
            let Some(held) = self.held.get_mut(&key) else {
                continue;
            };
            // Every held event older than the oldest waiting row goes, in id order, wherever it
            // stands in the queue: one the stream read late (a smaller id committed later) must
            // not wait behind a newer one, or the claim of the waiting row (which waits for it)
            // and it would wait for each other.
            let (mut go, stay): (Vec<ShardEvent>, Vec<ShardEvent>) =
                held.events.drain(..).partition(|e| e.row.id < bound);
            held.events = stay.into();
            self.held_events.remove(go.len());
            go.sort_by_key(|e| e.row.id);
            for mut event in go {
                event.released_seen = self.released_seen;
                if inputs.send(event).await.is_err() {
                    return false;
                }
            }
            if held.events.is_empty() {
                tracing::debug!(table = %key.0, key = %key.1, waited = ?held.since.elapsed(),
                    "the older rows of a held key are sent: its streamed events followed");
                self.held.remove(&key);
            }
        }
        self.warn_long_held();
        self.publish();
        true
    }

    /// Forgets the carried rows of transactions whose events are all recorded. Called before a
    /// query only, so a row the query saw waiting was still carried when the answer is read.
    fn forget_done(&mut self, acks: &Acknowledgements) {
        let done: Vec<TxSeq> = self
            .carried
            .keys()
            .copied()
            .filter(|seq| acks.is_done(*seq))
            .collect();
        for seq in done {
            for row in self.carried.remove(&seq).unwrap_or_default() {
                self.carried_ids.remove(&row);
            }
        }
    }

    fn warn_long_held(&mut self) {
        for ((table, key), held) in self.held.iter_mut() {
            if !held.warned && held.since.elapsed() >= self.warn_after {
                held.warned = true;
                tracing::warn!(%table, key = %key.biz_key, topic = %key.topic, held_for = ?held.since.elapsed(), events = held.events.len(),
                    "a key's streamed events still wait for an older row of the key (SENDING under \
                     another instance's lease, or not claimable yet): per-key order holds them; \
                     other keys flow");
            }
        }
    }

    fn publish(&self) {
        crate::metrics::relay()
            .keys_held_for_order
            .set(self.held.len() as i64);
    }
}
