//! Catching up after a restart or a takeover: the binlog a previous run may have handled, read up
//! to the server's end of binlog at start-up. Before a batch of it is handed on, the dispatcher
//! asks which of its events are done already:
//!
//! - **recorded in the outbox**: SENT or FAILED (or SENDING under a sweeper's claim, with a
//!   sweeper): skipped;
//! - **stored on the broker but not recorded**: the previous leader sent them and died (or lost
//!   its leadership) before its marker wrote SENT. Each topic's tail is read back once, from the
//!   commit time of the first such event (less [`CLOCK_MARGIN`]), at most
//!   `relay.takeover_read_limit` messages per queue ([`crate::send::tail`]); an event whose id and
//!   key a stored message carries is recorded SENT with that message's id, not sent again.
//!
//! Guarantee: only an event proven done is skipped. A failed look-up (the database's or the
//! broker's) or a read cut short by its bound skips less: those events are sent again (at least
//! once), never lost.

use crate::binlog::{BinlogItem, BinlogPosition, DecodedRow, StreamClock, TxEnd};
use crate::outbox::{Status, TableName};
use crate::send::{SendError, StoredTail, TailBound};
use futures_util::future::BoxFuture;
use mysql_async::prelude::*;
use mysql_async::Pool;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How much earlier than the first unrecorded event's commit a topic's tail is read: the binlog
/// stamps commits in whole seconds (up to 1 s early already), the database's and the broker's
/// clocks may differ, and a commit may be stamped a little out of binlog order. A clock further
/// off than this costs duplicates, never a loss. The read's cost grows with it: at 1,000 events/s
/// a second of margin is ~1,000 more messages to read before the stream goes on.
pub const CLOCK_MARGIN: Duration = Duration::from_secs(3);

/// The most time one catch-up spends reading back, all topics together (the sink bounds each
/// topic's read too). The stream, every topic's, and the sweeper beside it wait while a read
/// runs, so a broker group that does not answer must not cost that wait once per topic: once
/// this is spent, the topics not yet read are not read (their stored events are sent again).
const READ_BACK_BUDGET: Duration = Duration::from_secs(10);

/// Reads what the broker stored of a topic within a bound (the sink's
/// [`crate::send::Sink::stored_tail`], boxed so the dispatcher needs no sink type).
pub type ReadTail = Arc<
    dyn Fn(String, TailBound) -> BoxFuture<'static, Result<Option<StoredTail>, SendError>>
        + Send
        + Sync,
>;

/// Reading back the broker's tails: how, and at most how many messages per queue.
#[derive(Clone)]
pub struct BrokerTails {
    pub read: ReadTail,
    pub per_queue: u64,
}

/// Skipping of already-handled events while the stream is behind `until`.
pub struct CatchUp {
    pub pool: Pool,
    /// The server's end of binlog when the run started.
    pub until: BinlogPosition,
    /// Where the stream starts; moved along by each transaction end.
    pub read: BinlogPosition,
    /// Also skip rows SENDING under someone's lease (their owner sends them, or lease recovery
    /// returns them to PENDING for a sweeper): only with a sweeper, which does that recovery.
    pub skip_claimed: bool,
    /// Armed once caught up.
    pub clock: StreamClock,
    /// Reads back what the broker stored (`None`: nothing is read back).
    tails: Option<BrokerTails>,
    /// Each topic's tail once read (`None`: it could not be read; not asked again).
    read_tails: HashMap<String, Option<StoredTail>>,
    /// The commit stamp (seconds) of the last transaction passed.
    last_commit: Option<u32>,
    /// Time spent reading back so far, failed reads included (see [`READ_BACK_BUDGET`]).
    spent: Duration,
}

/// What reading back the broker's tails read, for the log line at the end of a catch-up.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadBack {
    pub topics: usize,
    pub queues: usize,
    pub messages: u64,
    pub took: Duration,
}

/// The events of a batch that are done already.
#[derive(Debug, Default)]
pub struct Recorded {
    /// SENT or FAILED (or claimed) in the outbox.
    in_outbox: HashSet<(Arc<TableName>, u64)>,
    /// Stored on the broker, not recorded: the stored message id.
    on_broker: HashMap<(Arc<TableName>, u64), String>,
}

impl Recorded {
    /// Whether row `id` of `table` is recorded SENT or FAILED (or claimed) in the outbox: skipped,
    /// and no longer the stream's. (A row found [`Self::stored`] is still the stream's until the
    /// marker records it.)
    pub fn in_outbox(&self, table: &Arc<TableName>, id: u64) -> bool {
        if self.in_outbox.is_empty() {
            return false;
        }
        self.in_outbox.contains(&(Arc::clone(table), id))
    }

    /// The message id the broker stored row `id` of `table` under, if it is stored but not
    /// recorded.
    pub fn stored(&self, table: &Arc<TableName>, id: u64) -> Option<&str> {
        if self.on_broker.is_empty() {
            return None;
        }
        let key = (Arc::clone(table), id);
        self.on_broker.get(&key).map(String::as_str)
    }
}

impl CatchUp {
    /// Starts catching up from `start` to the server's end `until`; `None` when there is nothing
    /// to catch up.
    pub fn new(
        pool: Pool,
        start: &BinlogPosition,
        until: &BinlogPosition,
        skip_claimed: bool,
        clock: StreamClock,
    ) -> Option<Self> {
        (!start.covers(until)).then(|| CatchUp {
            pool,
            until: until.clone(),
            read: start.clone(),
            skip_claimed,
            clock,
            tails: None,
            read_tails: HashMap::new(),
            last_commit: None,
            spent: Duration::ZERO,
        })
    }

    /// The same, reading back the broker's tails through `tails` (unless its bound is 0).
    pub fn reading_tails(mut self, tails: BrokerTails) -> Self {
        self.tails = (tails.per_queue > 0).then_some(tails);
        self
    }

    /// What the reads back read so far.
    pub fn read_back(&self) -> ReadBack {
        let tails = self.read_tails.values().flatten();
        ReadBack {
            topics: tails.clone().count(),
            queues: tails.clone().map(|t| t.queues).sum(),
            messages: tails.map(|t| t.messages).sum(),
            took: self.spent,
        }
    }

    /// The stream passed the transaction ending at `end`.
    pub fn passed(&mut self, end: &TxEnd) {
        self.read.advance(end);
        if end.timestamp > 0 {
            self.last_commit = Some(end.timestamp);
        }
    }

    /// Caught up: the stream read past the end it started behind, however long that takes
    /// (every batch read again meanwhile is checked). Then heartbeats mean "nothing more to
    /// read" ([`StreamClock::arm`]).
    pub fn done(&self) -> bool {
        let done = self.read.covers(&self.until);
        if done {
            self.clock.arm();
        }
        done
    }

    /// The events of `batch` that are done already (see the module documentation).
    pub async fn recorded(&mut self, batch: &[BinlogItem]) -> Recorded {
        let in_outbox = self.in_outbox(batch).await;
        let mut recorded = Recorded {
            in_outbox,
            on_broker: HashMap::new(),
        };
        if self.tails.is_some() {
            recorded.on_broker = self.on_broker(batch, &recorded.in_outbox).await;
        }
        recorded
    }

    /// `(table, id)` of the events in `batch` whose rows are already SENT or FAILED (or SENDING,
    /// with `skip_claimed`). On a database error nothing is skipped.
    async fn in_outbox(&self, batch: &[BinlogItem]) -> HashSet<(Arc<TableName>, u64)> {
        let mut by_table: BTreeMap<Arc<TableName>, Vec<u64>> = BTreeMap::new();
        let rows = batch.iter().flat_map(|item| match item {
            BinlogItem::Row(row) => std::slice::from_ref(row),
            BinlogItem::Prepared(prepared) => &prepared.rows[..],
            _ => &[],
        });
        for row in rows {
            if let DecodedRow::Event(row) = row {
                by_table
                    .entry(Arc::clone(&row.table))
                    .or_default()
                    .push(row.id);
            }
        }
        // Already recorded: SENT or FAILED, and SENDING too when a sweeper's claim counts.
        let statuses = if self.skip_claimed {
            Status::sql_in(&[Status::Sending, Status::Sent, Status::Failed])
        } else {
            Status::sql_in(&[Status::Sent, Status::Failed])
        };
        let mut recorded = HashSet::new();
        for (table, ids) in by_table {
            let sql = format!(
                "SELECT id FROM {} WHERE id IN ({}) AND {statuses}",
                table.sql(),
                crate::db::id_list(ids)
            );
            let found: Result<Vec<u64>, _> = crate::db::bounded(async {
                let mut conn = self.pool.get_conn().await?;
                conn.query(sql).await
            })
            .await;
            match found {
                Ok(ids) => recorded.extend(ids.into_iter().map(|id| (Arc::clone(&table), id))),
                Err(e) => tracing::warn!(%table, error = %e,
                    "cannot check which caught-up events are already recorded; sending them again"),
            }
        }
        recorded
    }

    /// The streamed events of `batch` not `in_outbox` that the broker's tail of their topic
    /// holds, with the stored message ids. Reads each topic's tail the first time one of its
    /// events is not recorded, from the commit before that event (see [`since`]).
    async fn on_broker(
        &mut self,
        batch: &[BinlogItem],
        in_outbox: &HashSet<(Arc<TableName>, u64)>,
    ) -> HashMap<(Arc<TableName>, u64), String> {
        let first_end = batch.iter().find_map(commit_stamp);
        let mut commit = self.last_commit;
        let mut unrecorded = Vec::new();
        let mut to_read: Vec<(&str, SystemTime)> = Vec::new();
        for item in batch {
            match item {
                BinlogItem::Row(DecodedRow::Event(row))
                    if !in_outbox.contains(&(Arc::clone(&row.table), row.id)) =>
                {
                    let topic = row.message.topic.as_str();
                    if !self.read_tails.contains_key(topic)
                        && !to_read.iter().any(|(t, _)| *t == topic)
                    {
                        to_read.push((topic, since(commit.or(first_end))));
                    }
                    unrecorded.push(row);
                }
                item => commit = commit_stamp(item).or(commit),
            }
        }
        // The sweeper beside the stream waits meanwhile: the reader reads on, and this batch's
        // rows are not yet on their way (see `StreamClock::hold_sweeps`).
        self.clock.hold_sweeps(!to_read.is_empty());
        for (topic, since) in to_read {
            let tail = self.read_tail(topic, since).await;
            self.read_tails.insert(topic.to_string(), tail);
        }
        self.clock.hold_sweeps(false);
        let mut found = HashMap::new();
        for row in unrecorded {
            let tail = self.read_tails.get(&row.message.topic).and_then(Option::as_ref);
            if let Some(msg_id) =
                tail.and_then(|t| t.msg_id(&row.message.event_id, &row.message.biz_key))
            {
                found.insert((Arc::clone(&row.table), row.id), msg_id.to_string());
            }
        }
        found
    }

    /// Reads `topic`'s tail since `since`; `None` if the sink cannot, failed, or the catch-up's
    /// budget is spent (logged).
    async fn read_tail(&mut self, topic: &str, since: SystemTime) -> Option<StoredTail> {
        let tails = self.tails.as_ref()?;
        if self.spent >= READ_BACK_BUDGET {
            tracing::warn!(%topic, spent = ?self.spent,
                "not read back: this catch-up spent its time for reading back already; events a \
                 previous run stored on this topic but did not record are sent again");
            return None;
        }
        let bound = TailBound {
            since,
            per_queue: tails.per_queue,
        };
        let started = tokio::time::Instant::now();
        let read = (tails.read)(topic.to_string(), bound).await;
        let took = started.elapsed();
        self.spent += took;
        crate::metrics::relay().catch_up_tail_read_seconds.inc_by(took.as_secs_f64());
        match read {
            Ok(Some(tail)) => {
                tracing::info!(%topic, queues = tail.queues, messages = tail.messages,
                    relay_messages = tail.len(), capped_queues = tail.capped, ?took,
                    "read back what the topic's queues stored since the first event to catch up with");
                if tail.capped > 0 {
                    tracing::warn!(%topic, capped_queues = tail.capped, limit = tails.per_queue,
                        "more was stored since then than `relay.takeover_read_limit` lets the relay \
                         read back: events stored before the newest messages read are sent again");
                }
                Some(tail)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(%topic, error = %e,
                    "cannot read back what the broker stored: events a previous run stored but \
                     did not record are sent again");
                None
            }
        }
    }
}

/// The commit stamp (seconds) of a transaction's end, if `item` is one.
fn commit_stamp(item: &BinlogItem) -> Option<u32> {
    let end = match item {
        BinlogItem::TxEnd(end) => end,
        BinlogItem::Prepared(prepared) => &prepared.end,
        _ => return None,
    };
    (end.timestamp > 0).then_some(end.timestamp)
}

/// The earliest time an event can have been sent by a previous run, given the commit stamp of
/// the transaction before it (or, unknown, the first after it): that commit less
/// [`CLOCK_MARGIN`]. Nothing known (a first transaction longer than a batch): the beginning of
/// time, so that only the count bounds the read.
fn since(commit: Option<u32>) -> SystemTime {
    match commit {
        Some(seconds) => (UNIX_EPOCH + Duration::from_secs(u64::from(seconds)))
            .checked_sub(CLOCK_MARGIN)
            .unwrap_or(UNIX_EPOCH),
        None => UNIX_EPOCH,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::OutboxRow;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    fn row(id: u64, topic: &str) -> BinlogItem {
        let mut row = OutboxRow::sample(id);
        row.message.topic = topic.into();
        BinlogItem::Row(DecodedRow::Event(row))
    }

    fn end(timestamp: u32) -> BinlogItem {
        BinlogItem::TxEnd(TxEnd::sample(0, timestamp))
    }

    /// A catch-up (no server is asked: the pool never connects) whose tails hold events `e1` and
    /// `e3` of topic `t` (key `k`), or fail for topic `down`; counts the reads.
    fn catching_up(reads: Arc<AtomicUsize>) -> CatchUp {
        let pool = Pool::new("mysql://nobody@127.0.0.1:1/none");
        let until = BinlogPosition {
            pos: 100,
            file: Some("b.000001".into()),
            ..BinlogPosition::default()
        };
        let read: ReadTail = Arc::new(move |topic: String, _bound| {
            reads.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                if topic == "down" {
                    return Err(SendError::Retryable("broker down".into()));
                }
                let mut tail = StoredTail::default();
                tail.record(Some("e1".into()), Some("k".into()), "m1".into());
                tail.record(Some("e3".into()), Some("k".into()), "m3".into());
                Ok(Some(tail))
            })
        });
        CatchUp::new(pool, &BinlogPosition::default(), &until, false, StreamClock::default())
            .expect("behind")
            .reading_tails(BrokerTails {
                read,
                per_queue: 100,
            })
    }

    #[tokio::test]
    async fn events_a_topics_tail_holds_are_found_with_their_message_ids_reading_it_once() {
        let reads = Arc::new(AtomicUsize::new(0));
        let mut catch_up = catching_up(reads.clone());
        let batch = vec![row(1, "t"), row(2, "t"), end(1_000), row(3, "t")];
        let recorded = HashSet::from([(Arc::clone(&OutboxRow::sample(3).table), 3)]);
        let found = catch_up.on_broker(&batch, &recorded).await;
        let table = OutboxRow::sample(1).table;
        assert_eq!(found.get(&(Arc::clone(&table), 1)).map(String::as_str), Some("m1"));
        assert!(!found.contains_key(&(Arc::clone(&table), 2)), "not stored");
        assert!(!found.contains_key(&(Arc::clone(&table), 3)), "recorded already");
        catch_up.on_broker(&[row(4, "t")], &HashSet::new()).await;
        assert_eq!(reads.load(Ordering::SeqCst), 1, "one read per topic");
        assert_eq!(catch_up.read_back().topics, 1);
    }

    #[tokio::test]
    async fn a_tail_that_cannot_be_read_finds_nothing_and_is_not_asked_again() {
        let reads = Arc::new(AtomicUsize::new(0));
        let mut catch_up = catching_up(reads.clone());
        let found = catch_up.on_broker(&[row(1, "down")], &HashSet::new()).await;
        assert!(found.is_empty(), "sent again: at least once");
        catch_up.on_broker(&[row(2, "down")], &HashSet::new()).await;
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_tail_is_read_from_the_commit_before_the_first_unrecorded_event_less_the_margin() {
        let bounds = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&bounds);
        let read: ReadTail = Arc::new(move |topic: String, bound: TailBound| {
            seen.lock().unwrap().push((topic, bound.since));
            Box::pin(async { Ok(None) })
        });
        let mut catch_up = catching_up(Arc::default());
        catch_up.tails.as_mut().unwrap().read = read;
        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s) - CLOCK_MARGIN;
        let recorded = HashSet::from([(Arc::clone(&OutboxRow::sample(1).table), 1)]);
        let batch = [row(1, "t"), end(900), row(2, "t"), end(1_000), row(3, "u")];
        catch_up.on_broker(&batch, &recorded).await;
        catch_up.on_broker(&[row(4, "v")], &HashSet::new()).await;
        let got = bounds.lock().unwrap().clone();
        assert_eq!(
            got,
            vec![
                ("t".to_string(), at(900)),
                ("u".to_string(), at(1_000)),
                ("v".to_string(), UNIX_EPOCH),
            ],
            "t from the commit before its first unrecorded event; v: nothing known"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn once_the_budget_is_spent_no_further_topic_is_read_back() {
        let reads = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&reads);
        let read: ReadTail = Arc::new(move |topic: String, _bound| {
            seen.lock().unwrap().push(topic);
            Box::pin(async {
                // A broker group that does not answer: the sink's own deadline ends the read.
                tokio::time::sleep(READ_BACK_BUDGET).await;
                Err(SendError::Retryable("no answer".into()))
            })
        });
        let mut catch_up = catching_up(Arc::default());
        catch_up.tails.as_mut().unwrap().read = read;
        catch_up.on_broker(&[row(1, "a")], &HashSet::new()).await;
        catch_up.on_broker(&[row(2, "b")], &HashSet::new()).await;
        assert_eq!(*reads.lock().unwrap(), vec!["a".to_string()], "b is not read");
        assert_eq!(catch_up.read_back().took, READ_BACK_BUDGET);
        assert!(!catch_up.clock.sweeps_held(), "the sweeper goes on");
    }
}
