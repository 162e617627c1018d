//! The dispatcher's unit tests: re-read transactions and held XA transactions.

use super::*;
use crate::binlog::BinlogPosition;
use crate::event::OutboxRow;

fn row(id: u64) -> BinlogItem {
    BinlogItem::Row(DecodedRow::Event(OutboxRow::sample(id)))
}

/// The dispatcher's channels and acknowledgements: (items in, items out, handed-on events in,
/// handed-on events out, completions, acknowledgements). The completions' receiver is dropped.
#[allow(clippy::type_complexity)]
fn wiring() -> (
    mpsc::Sender<BinlogItem>,
    mpsc::Receiver<BinlogItem>,
    mpsc::Sender<ShardEvent>,
    mpsc::Receiver<ShardEvent>,
    mpsc::Sender<Completion>,
    Acknowledgements,
) {
    let (items_tx, items) = mpsc::channel(100);
    let (shard, handed) = mpsc::channel(100);
    let (completions, _) = mpsc::channel(100);
    let acks = Acknowledgements::new(BinlogPosition::default());
    (items_tx, items, shard, handed, completions, acks)
}

/// One shard, no key-order guard.
fn outputs(shard: mpsc::Sender<ShardEvent>, completions: mpsc::Sender<Completion>) -> Outputs {
    Outputs {
        inputs: SendInputs::from_channels(vec![shard], completions),
        key_order: None,
        park_prepared_after: None,
    }
}

fn end(pos: u64) -> BinlogItem {
    BinlogItem::TxEnd(TxEnd::sample(pos, 0))
}

#[tokio::test]
async fn a_transaction_read_again_after_a_lost_connection_is_handed_on_once() {
    let (items_tx, items, shard, mut handed, completions, acks) = wiring();
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
    let stats = run(items, outputs(shard, completions), acks.clone(), None).await;
    assert_eq!(stats.read_again, 2);
    let mut events = Vec::new();
    while let Ok(event) = handed.try_recv() {
        events.push(event);
    }
    let ids: Vec<u64> = events.iter().map(|e| e.row.id).collect();
    assert_eq!(ids, [1, 2, 3, 4], "each row once, in order");

    // The checkpoint passes the first transaction only when the rows handed on before the
    // lost connection are done too.
    let mut origins: Vec<_> = events.into_iter().map(|e| Some(e.origin)).collect();
    let mut acknowledge = |i: usize| origins[i].take().expect("once").acknowledge();
    acknowledge(2);
    acknowledge(3);
    assert_eq!(acks.position().pos, 0, "rows 1 and 2 are still in flight");
    acknowledge(0);
    acknowledge(1);
    assert_eq!(acks.position().pos, 200);
}

#[tokio::test]
async fn a_prepared_xa_transaction_holds_the_checkpoint_not_the_stream() {
    use crate::binlog::PreparedTx;
    let (items_tx, items, shard, mut handed, completions, acks) = wiring();
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
    let dispatcher = tokio::spawn(run(items, outputs(shard, completions), acks.clone(), None));
    let later = handed.recv().await.unwrap();
    assert_eq!(
        later.row.id, 3,
        "the later transaction flows while 61 is prepared"
    );
    later.origin.acknowledge();
    assert_eq!(
        acks.position().pos,
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
    assert_eq!(acks.position().pos, 0, "until its event completes");
    committed.origin.acknowledge();
    assert_eq!(acks.position().pos, 300);
    drop(items_tx);
    let stats = dispatcher.await.unwrap();
    assert_eq!((stats.xa_committed, stats.xa_rolled_back), (1, 1));
    assert!(
        handed.try_recv().is_err(),
        "the rolled-back row 2 is never handed on"
    );
}

#[tokio::test(start_paused = true)]
async fn a_prepared_xa_transaction_held_past_the_limit_is_parked_and_the_checkpoint_passes_it() {
    use crate::binlog::PreparedTx;
    let (items_tx, items, shard, mut handed, completions, acks) = wiring();
    let xid = Xid::parse_statement_id("X'61',X'',1").unwrap();
    let end_at = |pos| match end(pos) {
        BinlogItem::TxEnd(end) => end,
        _ => unreachable!(),
    };
    let script = [
        BinlogItem::Prepared(PreparedTx {
            xid: xid.clone(),
            rows: vec![DecodedRow::Event(OutboxRow::sample(1))],
            end: end_at(100),
        }),
        BinlogItem::TxBegin,
        row(2),
        end(200),
    ];
    for item in script {
        items_tx.send(item).await.unwrap();
    }
    let outputs = Outputs {
        park_prepared_after: Some(Duration::from_secs(30)),
        ..outputs(shard, completions)
    };
    let dispatcher = tokio::spawn(run(items, outputs, acks.clone(), None));
    handed.recv().await.unwrap().origin.acknowledge();
    assert_eq!(acks.position().pos, 0, "held below the prepare at first");
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(
        acks.position().pos,
        200,
        "parked: the checkpoint passes the prepare and what followed it"
    );
    assert_eq!(acks.in_flight(), 0, "nothing of it is held any more");
    // Its XA COMMIT hands nothing on: its rows are PENDING for the sweeper.
    for item in [
        BinlogItem::TxBegin,
        BinlogItem::XaOutcome {
            xid,
            committed: true,
        },
        end(300),
    ] {
        items_tx.send(item).await.unwrap();
    }
    drop(items_tx);
    dispatcher.await.unwrap();
    assert!(
        handed.try_recv().is_err(),
        "the sweeper sends the parked rows"
    );
    assert_eq!(acks.position().pos, 300);
}
