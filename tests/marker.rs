//! The marker against a real server: which rows each kind of mark may touch. A streamed FAILED
//! mark never overwrites a row a sweeper holds under a live lease (it would leave FAILED a row the
//! sweeper delivered, and an operator's `retry` would publish it twice); the sweeper's own
//! outcome is the one recorded.

use crate::common;

#[allow(dead_code)]
use crate::common::rows;

use common::TestDb;
use mysql_async::prelude::*;
use rocketmq_outbox::binlog::BinlogPosition;
use rocketmq_outbox::checkpoint::Acknowledgements;
use rocketmq_outbox::event::Origin;
use rocketmq_outbox::mark::{run_marker, MarkStats, MarkerContext};
use rocketmq_outbox::outbox::status::codes::SENDING;
use rocketmq_outbox::outbox::TableName;
use rocketmq_outbox::send::{Completion, SendOutcome};
use rows::{insert_row, state, FAILED, PENDING, SENT};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Records `completions` with the relay's marker as instance `owner`; returns its counts.
async fn mark(db: &TestDb, owner: &str, completions: Vec<Completion>) -> MarkStats {
    let pool = rocketmq_outbox::db::writer_pool(&db.config).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let rule = MarkerContext::new(owner);
    let marker = tokio::spawn(run_marker(pool.clone(), rx, rule, CancellationToken::new()));
    for completion in completions {
        tx.send(completion).await.unwrap();
    }
    drop(tx);
    let stats = marker.await.unwrap().expect("marked");
    pool.disconnect().await.unwrap();
    stats
}

/// The completion of row `id`: streamed (`Some`: with an acknowledgement of one transaction of
/// `acks`) or claimed (`None`).
fn completion(id: u64, streamed: Option<&Acknowledgements>, outcome: SendOutcome) -> Completion {
    Completion {
        origin: match streamed {
            Some(acks) => {
                let transaction = acks.begin();
                let ack = acks.event(transaction);
                acks.abandon(transaction); // closed: done once its one event is acknowledged
                Origin::Stream(ack)
            }
            None => Origin::Claimed,
        },
        table: Arc::new(TableName::parse("outbox_event").unwrap()),
        id,
        event_id: format!("mk-{id}"),
        outcome,
        stamps: Default::default(),
    }
}

fn failed() -> SendOutcome {
    SendOutcome::Failed {
        reason: "retries used up".into(),
        attempts: 9,
    }
}

async fn row(db: &TestDb, event_id: &str) -> u64 {
    insert_row(
        db,
        "outbox_event",
        &[
            ("event_id", event_id.into()),
            ("biz_key", "k".into()),
            ("topic", "t".into()),
            ("payload", "{}".into()),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_failure_never_overwrites_a_row_a_sweeper_is_delivering() {
    let db = TestDb::migrated("mark_lease").await;
    let (live, expired, pending) = (
        row(&db, "mk-a").await,
        row(&db, "mk-b").await,
        row(&db, "mk-c").await,
    );
    // Claimed as a sweeper claims (status 1, its owner, a lease on the database clock): one
    // lease still running, one already past.
    let mut conn = db.conn().await;
    for (id, lease) in [
        (live, "+ INTERVAL 60 SECOND"),
        (expired, "- INTERVAL 1 SECOND"),
    ] {
        conn.exec_drop(
            format!(
                "UPDATE outbox_event SET status = {SENDING}, owner = 'sweeper-b', \
                 lease_until = NOW(3) {lease} WHERE id = ?"
            ),
            (id,),
        )
        .await
        .unwrap();
    }
    assert_eq!(
        state(&db, "outbox_event", pending).await.status,
        Some(PENDING)
    );

    // The stream gives up on all three (e.g. its retries ran out while the broker was away).
    let acks = Acknowledgements::new(BinlogPosition::default());
    let streamed = [live, expired, pending].map(|id| completion(id, Some(&acks), failed()));
    mark(&db, "stream-a", streamed.into()).await;
    assert_eq!(
        acks.in_flight(),
        0,
        "each streamed event is acknowledged once its outcome is recorded (or left alone)"
    );
    let held = state(&db, "outbox_event", live).await;
    assert_eq!(
        held.status,
        Some(SENDING),
        "the sweeper's row is left alone: {held:?}"
    );
    assert_eq!(held.last_error, None);
    let owner: Option<String> = conn
        .exec_first("SELECT owner FROM outbox_event WHERE id = ?", (live,))
        .await
        .unwrap()
        .flatten();
    assert_eq!(owner.as_deref(), Some("sweeper-b"));
    for id in [expired, pending] {
        let s = state(&db, "outbox_event", id).await;
        assert_eq!(s.status, Some(FAILED), "nobody holds row {id}: {s:?}");
        assert_eq!(s.last_error.as_deref(), Some("retries used up"));
    }

    // The sweeper delivered it: its SENT mark lands, with its msg_id.
    let sent = SendOutcome::Sent {
        msg_id: "7F00000100002A9F0000000000000001".into(),
    };
    let stats = mark(&db, "sweeper-b", vec![completion(live, None, sent)]).await;
    assert_eq!(stats.sent, 1);
    let s = state(&db, "outbox_event", live).await;
    assert_eq!(
        (s.status, s.last_error.as_deref()),
        (Some(SENT), None),
        "{s:?}"
    );
    assert_eq!(
        s.msg_id.as_deref(),
        Some("7F00000100002A9F0000000000000001")
    );
}

/// A superseded leader's marks touch nothing: every SENT or FAILED mark carries its epoch, as the
/// checkpoint mirror does. The marker finds the newer epoch, ends the leadership
/// (`mark_refused`) and leaves the batch unacknowledged, for the new leader to send again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_leaders_marks_touch_nothing_and_end_its_leadership() {
    use rocketmq_outbox::leader::{BootInstant, Fence};
    let db = TestDb::migrated("mark_fenced").await;
    let (sent, failing) = (row(&db, "mk-s").await, row(&db, "mk-f").await);
    // Epoch 5 leads now; the marker belongs to epoch 4 (its fence still valid by its own clock).
    db.conn()
        .await
        .query_drop(
            "INSERT INTO outbox_relay_state (name, leader, leader_epoch) VALUES ('fenced', 'b', 5)",
        )
        .await
        .unwrap();
    let fence = Fence::new(4, BootInstant::now(), std::time::Duration::from_secs(60));
    let rule = MarkerContext {
        fence: fence.clone(),
        relay_name: Some("fenced".into()),
        ..MarkerContext::new("a")
    };
    let refused = rocketmq_outbox::metrics::relay()
        .leadership_ended
        .get_or_create(&rocketmq_outbox::metrics::LeadershipEnd {
            reason: rocketmq_outbox::metrics::LeadershipEnd::MARK_REFUSED,
        })
        .clone();
    let before = refused.get();
    let acks = Acknowledgements::new(BinlogPosition::default());
    let sent_outcome = SendOutcome::Sent {
        msg_id: "AC1100010000".into(),
    };
    let pool = rocketmq_outbox::db::writer_pool(&db.config).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let marker = tokio::spawn(run_marker(pool.clone(), rx, rule, CancellationToken::new()));
    tx.send(completion(sent, Some(&acks), sent_outcome))
        .await
        .unwrap();
    tx.send(completion(failing, Some(&acks), failed()))
        .await
        .unwrap();
    drop(tx);
    let stats = marker
        .await
        .unwrap()
        .expect("the marker stops without an error");
    pool.disconnect().await.unwrap();
    assert_eq!(stats, MarkStats::default(), "nothing recorded");
    for id in [sent, failing] {
        let s = state(&db, "outbox_event", id).await;
        assert_eq!(s.status, Some(PENDING), "row {id} untouched: {s:?}");
    }
    assert!(!fence.holds(), "the leadership ended");
    assert_eq!(refused.get(), before + 1, "counted as mark_refused");
    assert_eq!(
        acks.in_flight(),
        2,
        "nothing acknowledged: the checkpoint stays before them"
    );

    // The leader of epoch 5 marks the same rows.
    let leader = MarkerContext {
        fence: Fence::new(5, BootInstant::now(), std::time::Duration::from_secs(60)),
        relay_name: Some("fenced".into()),
        ..MarkerContext::new("b")
    };
    let pool = rocketmq_outbox::db::writer_pool(&db.config).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let marker = tokio::spawn(run_marker(
        pool.clone(),
        rx,
        leader,
        CancellationToken::new(),
    ));
    let sent_outcome = SendOutcome::Sent {
        msg_id: "AC1100010001".into(),
    };
    let acks = Acknowledgements::new(BinlogPosition::default());
    tx.send(completion(sent, Some(&acks), sent_outcome))
        .await
        .unwrap();
    drop(tx);
    let stats = marker.await.unwrap().expect("marked");
    pool.disconnect().await.unwrap();
    assert_eq!(stats.sent, 1);
    assert_eq!(state(&db, "outbox_event", sent).await.status, Some(SENT));
    assert_eq!(acks.in_flight(), 0, "acknowledged once recorded");
}
