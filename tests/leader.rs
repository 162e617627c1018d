//! Leader election on a real MariaDB: one leader at a time, a standby takes over when the
//! leader's lock connection dies, and a leader whose connection was cut keeps leading only if
//! nobody took over meanwhile.

use crate::common;

use common::TestDb;
use mysql_async::prelude::*;
use rocketmq_outbox::leader::Election;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

fn election(db: &TestDb, instance: &str) -> Election {
    let opts = rocketmq_outbox::db::opts(&db.config).unwrap();
    Election::new(opts, "orders", instance)
}

/// Kills the connection holding `lock` (as a DBA's `KILL` or a network cut would end it).
async fn kill_holder(db: &TestDb, lock: &str) {
    let mut conn = db.conn().await;
    let holder: Option<u64> = conn
        .exec_first("SELECT IS_USED_LOCK(?)", (lock,))
        .await
        .unwrap()
        .flatten();
    conn.query_drop(format!("KILL {}", holder.expect("the lock is held")))
        .await
        .unwrap();
}

async fn recorded_leader(db: &TestDb) -> (Option<String>, u64) {
    db.conn()
        .await
        .query_first("SELECT leader, leader_epoch FROM outbox_relay_state WHERE name = 'orders'")
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_and_a_standby_takes_over_when_its_connection_dies() {
    let db = TestDb::migrated("leader_takeover").await;
    let (a, b) = (election(&db, "a"), election(&db, "b"));
    let leading = a.try_lead().await.unwrap().expect("nobody leads yet");
    assert!(b.try_lead().await.unwrap().is_none(), "a already leads");
    assert_eq!(recorded_leader(&db).await, (Some("a".into()), 1));

    let cancel = CancellationToken::new();
    let standby = {
        let (b, cancel) = (b.clone(), cancel.clone());
        tokio::spawn(async move { b.lead(&cancel).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!standby.is_finished(), "b waits while a leads");

    let killed = Instant::now();
    kill_holder(&db, a.lock_name()).await;
    let next = tokio::time::timeout(Duration::from_secs(5), standby)
        .await
        .expect("b takes over within seconds")
        .unwrap()
        .expect("not cancelled");
    println!("takeover after KILL: {:?}", killed.elapsed());
    assert_eq!(next.epoch, 2);
    assert_eq!(recorded_leader(&db).await, (Some("b".into()), 2));
    // a notices that someone else leads now and steps down.
    tokio::time::timeout(Duration::from_secs(10), leading.lost().cancelled())
        .await
        .expect("the deposed leader learns it lost");
    leading.resign(&a).await;
    next.resign(&b).await;
    assert_eq!(
        recorded_leader(&db).await,
        (None, 2),
        "resigning clears the leader"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_connection_was_cut_keeps_leading_when_nobody_took_over() {
    let db = TestDb::migrated("leader_regain").await;
    let a = election(&db, "a");
    let leading = a.try_lead().await.unwrap().expect("nobody leads yet");
    kill_holder(&db, a.lock_name()).await;
    // The leader checks every second: it takes the lock again on a new connection.
    common::relay::wait_for("the lock held again", Duration::from_secs(10), || async {
        let mut conn = db.conn().await;
        let holder: Option<Option<u64>> = conn
            .exec_first("SELECT IS_USED_LOCK(?)", (a.lock_name(),))
            .await
            .unwrap();
        holder.flatten().is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !leading.lost().is_cancelled(),
        "still the leader, same epoch"
    );
    assert_eq!(leading.epoch, 1);
    assert_eq!(recorded_leader(&db).await, (Some("a".into()), 1));
    leading.resign(&a).await;
}
