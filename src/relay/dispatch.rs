//! The dispatcher: numbers transactions for the watermark and routes each event to its shard.
//!
//! While catching up after a restart or a takeover (reading binlog that a previous run may have
//! already handled, up to the server's end of binlog at start-up), it first asks the outbox which
//! of the events are already recorded SENT or FAILED and skips those: a takeover then resends only
//! what the old leader published but had not yet recorded, instead of everything after the last
//! mirrored checkpoint.
//!
//! When the reader loses its connection inside a transaction it reads that transaction again
//! from its start; the rows already handed on are not handed on twice ([`HandedOn`]).

use crate::binlog::{BinlogItem, BinlogPosition, DecodedRow};
use crate::checkpoint::{TxSeq, Watermark};
use crate::config::TableName;
use crate::route::Router;
use crate::send::{Completion, ShardEvent};
use mysql_async::prelude::*;
use mysql_async::Pool;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Most items taken from the reader at once (one status query per table per batch).
const MAX_BATCH: usize = 1000;

/// What the dispatcher saw.
#[derive(Debug, Default)]
pub struct Dispatched {
    pub unidentifiable: u64,
    /// Events skipped while catching up because their rows were already SENT or FAILED.
    pub already_recorded: u64,
    /// Rows of a transaction read again after a lost connection that had been handed on the
    /// first time (not sent twice).
    pub read_again: u64,
}

/// Skipping of already-recorded events while the stream is behind `until`.
pub struct CatchUp {
    pub pool: Pool,
    /// The server's end of binlog when the run started.
    pub until: BinlogPosition,
    /// Where the stream starts; moved along by each transaction end.
    pub read: BinlogPosition,
    /// When catching up began: it ends after [`CATCH_UP_LIMIT`] at the latest.
    pub since: std::time::Instant,
}

/// The rows of the transaction being read that were handed on, and those of a transaction the
/// reader lost mid-way and is reading again. Skipping those is safe: they are still in flight
/// under the abandoned transaction's sequence number, which holds the watermark back until they
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

/// Longest catch-up (checking costs one query per batch; past this the stream is live anyway).
const CATCH_UP_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

impl CatchUp {
    /// Starts catching up from `start` to the server's end `until`; `None` when there is nothing
    /// to catch up.
    pub fn new(pool: Pool, start: &BinlogPosition, until: &BinlogPosition) -> Option<Self> {
        (!start.covers(until)).then(|| CatchUp {
            pool,
            until: until.clone(),
            read: start.clone(),
            since: std::time::Instant::now(),
        })
    }

    fn done(&self) -> bool {
        self.read.covers(&self.until) || self.since.elapsed() > CATCH_UP_LIMIT
    }

    /// `(table, id)` of the events in `batch` whose rows are already SENT or FAILED. On a database
    /// error nothing is skipped (the events are sent again: at least once).
    async fn recorded(&self, batch: &[BinlogItem]) -> HashSet<(Arc<TableName>, u64)> {
        let mut by_table: BTreeMap<Arc<TableName>, Vec<u64>> = BTreeMap::new();
        for item in batch {
            if let BinlogItem::Row(DecodedRow::Event(row)) = item {
                by_table
                    .entry(Arc::clone(&row.table))
                    .or_default()
                    .push(row.id);
            }
        }
        let mut recorded = HashSet::new();
        for (table, ids) in by_table {
            let sql = format!(
                "SELECT id FROM {} WHERE id IN ({}) AND status IN (2, 3)",
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
}

/// Consumes reader items until the reader's channel closes. Every event is counted in the
/// watermark before it is handed on, so it can never be passed before it completes.
pub async fn run(
    mut items: mpsc::Receiver<BinlogItem>,
    router: Router,
    shards: Vec<mpsc::Sender<ShardEvent>>,
    problems: mpsc::Sender<Completion>,
    watermark: Arc<Mutex<Watermark>>,
    mut catch_up: Option<CatchUp>,
) -> Dispatched {
    let mut stats = Dispatched::default();
    let mut current: Option<TxSeq> = None;
    let mut handed_on = HandedOn::default();
    let begin = |watermark: &Mutex<Watermark>| watermark.lock().expect("not poisoned").begin();
    while let Some(first) = items.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match items.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let recorded = match &catch_up {
            Some(catch_up) => catch_up.recorded(&batch).await,
            None => HashSet::new(),
        };
        for item in batch {
            match item {
                BinlogItem::TxBegin => current = Some(begin(&watermark)),
                BinlogItem::Row(row) => {
                    let seq = *current.get_or_insert_with(|| begin(&watermark));
                    match row {
                        DecodedRow::Event(row)
                            if recorded.contains(&(Arc::clone(&row.table), row.id)) =>
                        {
                            stats.already_recorded += 1;
                        }
                        DecodedRow::Event(row) if handed_on.already(&row.table, row.id) => {
                            stats.read_again += 1;
                        }
                        DecodedRow::Problem(problem)
                            if handed_on.already(&problem.table, problem.id) =>
                        {
                            stats.read_again += 1;
                        }
                        DecodedRow::Event(row) => {
                            watermark.lock().expect("not poisoned").add_event(seq);
                            let event = ShardEvent::new(seq, row);
                            let shard = router.shard(event.key_hash);
                            if shards[shard].send(event).await.is_err() {
                                return stats; // shutting down
                            }
                        }
                        DecodedRow::Problem(problem) => {
                            watermark.lock().expect("not poisoned").add_event(seq);
                            let completion = Completion::bad_row(Some(seq), problem);
                            if problems.send(completion).await.is_err() {
                                return stats;
                            }
                        }
                        DecodedRow::NotPending => {}
                        DecodedRow::Unidentifiable(reason) => {
                            stats.unidentifiable += 1;
                            tracing::error!(%reason, "outbox row skipped: it cannot be identified or marked");
                        }
                    }
                }
                BinlogItem::TxEnd(end) => {
                    handed_on.end();
                    if let Some(catch_up) = &mut catch_up {
                        catch_up.read.advance(&end);
                    }
                    let seq = current.take().unwrap_or_else(|| begin(&watermark));
                    watermark.lock().expect("not poisoned").end(seq, end);
                }
                BinlogItem::Restart => {
                    handed_on.restart();
                    if let Some(seq) = current.take() {
                        watermark.lock().expect("not poisoned").abandon(seq);
                    }
                }
            }
        }
        if catch_up.as_ref().is_some_and(CatchUp::done) {
            tracing::info!(
                skipped = stats.already_recorded,
                "caught up with the binlog: events already recorded SENT or FAILED were not sent again"
            );
            catch_up = None;
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binlog::{OutboxRow, TxEnd};
    use crate::event::OutboundMessage;

    fn row(id: u64) -> BinlogItem {
        BinlogItem::Row(DecodedRow::Event(OutboxRow {
            table: Arc::new(TableName::parse("outbox_event").unwrap()),
            id,
            message: OutboundMessage {
                event_id: format!("e{id}"),
                biz_key: "k".into(),
                topic: "t".into(),
                tags: None,
                headers: vec![],
                payload: "{}".into(),
            },
        }))
    }

    fn end(pos: u64) -> BinlogItem {
        BinlogItem::TxEnd(TxEnd {
            gtid: None,
            file: "binlog.000001".into(),
            end_pos: pos,
            timestamp: 0,
        })
    }

    #[tokio::test]
    async fn a_transaction_read_again_after_a_lost_connection_is_handed_on_once() {
        let (items_tx, items) = mpsc::channel(100);
        let (shard, mut handed) = mpsc::channel(100);
        let (problems, _) = mpsc::channel(100);
        let watermark = Arc::new(Mutex::new(Watermark::new(BinlogPosition::default())));
        // The connection is lost after two rows of the first transaction, which is read again
        // whole; then a second transaction.
        let script = [
            BinlogItem::TxBegin,
            row(1),
            row(2),
            BinlogItem::Restart,
            BinlogItem::TxBegin,
            row(1),
            row(2),
            row(3),
            end(100),
            BinlogItem::TxBegin,
            row(4),
            end(200),
        ];
        for item in script {
            items_tx.send(item).await.unwrap();
        }
        drop(items_tx);
        let stats = run(
            items,
            Router::new(1),
            vec![shard],
            problems,
            Arc::clone(&watermark),
            None,
        )
        .await;
        assert_eq!(stats.read_again, 2);
        let mut events = Vec::new();
        while let Ok(event) = handed.try_recv() {
            events.push(event);
        }
        let ids: Vec<u64> = events.iter().map(|e| e.row.id).collect();
        assert_eq!(ids, [1, 2, 3, 4], "each row once, in order");

        // The checkpoint passes the first transaction only when the rows handed on before the
        // lost connection are done too.
        let position = |w: &Mutex<Watermark>| w.lock().unwrap().position().pos;
        let seq = |i: usize| events[i].seq.expect("a binlog transaction");
        watermark.lock().unwrap().complete(seq(2));
        watermark.lock().unwrap().complete(seq(3));
        assert_eq!(position(&watermark), 0, "rows 1 and 2 are still in flight");
        watermark.lock().unwrap().complete(seq(0));
        watermark.lock().unwrap().complete(seq(1));
        assert_eq!(position(&watermark), 200);
    }
}
