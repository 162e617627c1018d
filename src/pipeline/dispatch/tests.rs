//! The dispatcher's unit tests: re-read transactions and held XA transactions.

use super::*;
use crate::binlog::OutboxRow;

fn row(id: u64) -> BinlogItem {
    BinlogItem::Row(DecodedRow::Event(OutboxRow::sample(id)))
}

/// The dispatcher's channels and watermark: (items in, items out, handed-on events in,
/// handed-on events out, completions, watermark). The completions' receiver is dropped.
#[allow(clippy::type_complexity)]
fn wiring() -> (
    mpsc::Sender<BinlogItem>,
    mpsc::Receiver<BinlogItem>,
    mpsc::Sender<ShardEvent>,
    mpsc::Receiver<ShardEvent>,
    mpsc::Sender<Completion>,
    Arc<Mutex<Watermark>>,
) {
    let (items_tx, items) = mpsc::channel(100);
    let (shard, handed) = mpsc::channel(100);
    let (completions, _) = mpsc::channel(100);
    let watermark = Arc::new(Mutex::new(Watermark::new(BinlogPosition::default())));
    (items_tx, items, shard, handed, completions, watermark)
}

/// One shard, no key-order guard.
fn outputs(shard: mpsc::Sender<ShardEvent>, completions: mpsc::Sender<Completion>) -> Outputs {
    Outputs {
        inputs: SendInputs::from_channels(vec![shard], completions),
        key_order: None,
    }
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
    let (items_tx, items, shard, mut handed, completions, watermark) = wiring();
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
        outputs(shard, completions),
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

#[tokio::test]
async fn a_prepared_xa_transaction_holds_the_checkpoint_not_the_stream() {
    use crate::binlog::PreparedTx;
    let (items_tx, items, shard, mut handed, completions, watermark) = wiring();
    let xid = |name: &str| Xid::parse_statement_id(&format!("X'{name}',X'',1")).unwrap();
    let end_at = |pos| match end(pos) {
        BinlogItem::TxEnd(end) => end,
        _ => unreachable!(),
    };
    let script = [
        BinlogItem::Prepared(PreparedTx {
            xid: xid("61"),
            rows: vec![DecodedRow::Event(OutboxRow::sample(1))],
            end: end_at(100),
        }),
        BinlogItem::Prepared(PreparedTx {
            xid: xid("62"),
            rows: vec![DecodedRow::Event(OutboxRow::sample(2))],
            end: end_at(150),
        }),
        BinlogItem::TxBegin,
        row(3),
        end(200),
        BinlogItem::TxBegin,
        BinlogItem::XaOutcome {
            xid: xid("62"),
            committed: false,
        },
        end(250),
    ];
    for item in script {
        items_tx.send(item).await.unwrap();
    }
    let dispatcher = tokio::spawn(run(
        items,
        outputs(shard, completions),
        Arc::clone(&watermark),
        None,
    ));
    let position = |w: &Mutex<Watermark>| w.lock().unwrap().position().pos;
    let later = handed.recv().await.unwrap();
    assert_eq!(
        later.row.id, 3,
        "the later transaction flows while 61 is prepared"
    );
    watermark.lock().unwrap().complete(later.seq.unwrap());
    assert_eq!(
        position(&watermark),
        0,
        "the checkpoint stays below the prepare"
    );

    for item in [
        BinlogItem::TxBegin,
        BinlogItem::XaOutcome {
            xid: xid("61"),
            committed: true,
        },
        end(300),
    ] {
        items_tx.send(item).await.unwrap();
    }
    let committed = handed.recv().await.unwrap();
    assert_eq!(committed.row.id, 1, "published at XA COMMIT");
    assert_eq!(position(&watermark), 0, "until its event completes");
    watermark.lock().unwrap().complete(committed.seq.unwrap());
    assert_eq!(position(&watermark), 300);
    drop(items_tx);
    let stats = dispatcher.await.unwrap();
    assert_eq!((stats.xa_committed, stats.xa_rolled_back), (1, 1));
    assert!(
        handed.try_recv().is_err(),
        "the rolled-back row 2 is never handed on"
    );
}
