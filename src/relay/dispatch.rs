//! The dispatcher: numbers transactions for the watermark and routes each event to its shard.

use crate::binlog::{BinlogItem, DecodedRow};
use crate::checkpoint::{TxSeq, Watermark};
use crate::route::Router;
use crate::send::{Completion, ShardEvent};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// What the dispatcher saw.
#[derive(Debug, Default)]
pub struct Dispatched {
    pub unidentifiable: u64,
}

/// Consumes reader items until the reader's channel closes. Every event is counted in the
/// watermark before it is handed on, so it can never be passed before it completes.
pub async fn run(
    mut items: mpsc::Receiver<BinlogItem>,
    router: Router,
    shards: Vec<mpsc::Sender<ShardEvent>>,
    problems: mpsc::Sender<Completion>,
    watermark: Arc<Mutex<Watermark>>,
) -> Dispatched {
    let mut stats = Dispatched::default();
    let mut current: Option<TxSeq> = None;
    let begin = |watermark: &Mutex<Watermark>| watermark.lock().expect("not poisoned").begin();
    while let Some(item) = items.recv().await {
        match item {
            BinlogItem::TxBegin => current = Some(begin(&watermark)),
            BinlogItem::Row(row) => {
                let seq = *current.get_or_insert_with(|| begin(&watermark));
                match row {
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
                let seq = current.take().unwrap_or_else(|| begin(&watermark));
                watermark.lock().expect("not poisoned").end(seq, end);
            }
            BinlogItem::Restart => {
                if let Some(seq) = current.take() {
                    watermark.lock().expect("not poisoned").abandon(seq);
                }
            }
        }
    }
    stats
}
