//! Leader election on a real server: one leader at a time, a standby takes over when the
//! leader's lock connection dies, a leader whose connection was cut keeps leading only if
//! nobody took over meanwhile; by lease, a candidate claims only once the old leader's fence has
//! run out; by either method, a leader that finds a newer epoch stops within its renewal period.

use crate::common;

use common::TestDb;
use mysql_async::prelude::*;
use rocketmq_outbox::leader::{lease, Election, CHECK_EVERY};
use rocketmq_outbox::metrics::LeadershipEnd;
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
    kill_holder(&db, a.lock_name().expect("elected by lock")).await;
    let next = tokio::time::timeout(Duration::from_secs(5), standby)
        .await
        .expect("b takes over within seconds")
        .unwrap()
        .expect("not cancelled");
    println!("takeover after KILL: {:?}", killed.elapsed());
    assert_eq!(next.epoch(), 2);
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
    kill_holder(&db, a.lock_name().expect("elected by lock")).await;
    // The leader checks every second: it takes the lock again on a new connection.
    common::relay::wait_for("the lock held again", Duration::from_secs(10), || async {
        let mut conn = db.conn().await;
        let holder: Option<Option<u64>> = conn
            .exec_first(
                "SELECT IS_USED_LOCK(?)",
                (a.lock_name().expect("elected by lock"),),
            )
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
    assert_eq!(leading.epoch(), 1);
    assert_eq!(recorded_leader(&db).await, (Some("a".into()), 1));
    leading.resign(&a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_lease_a_candidate_claims_only_after_the_old_leaders_fence_ran_out() {
    let db = TestDb::migrated("leader_lease").await;
    let (a, b) = (election(&db, "a").by_lease(), election(&db, "b").by_lease());
    let leading = a.try_lead().await.unwrap().expect("nobody leads yet");
    assert!(b.try_lead().await.unwrap().is_none(), "a already leads");
    assert_eq!(recorded_leader(&db).await, (Some("a".into()), 1));
    let a_fence = leading.fence();

    let cancel = CancellationToken::new();
    let standby = {
        let (b, cancel) = (b.clone(), cancel.clone());
        tokio::spawn(async move { b.lead(&cancel).await })
    };
    // A leader that renews keeps its lease however long the candidate watches.
    tokio::time::sleep(lease::LEASE + Duration::from_secs(2)).await;
    assert!(!standby.is_finished(), "b waits while a renews");
    assert!(a_fence.holds());

    // a dies without resigning: its renewals stop.
    let died = Instant::now();
    drop(leading);
    let next = tokio::time::timeout(lease::LEASE + Duration::from_secs(5), standby)
        .await
        .expect("b takes over once the lease ran out")
        .unwrap()
        .expect("not cancelled");
    let takeover = died.elapsed();
    println!("takeover after the leader died: {takeover:?}");
    assert!(
        !a_fence.holds(),
        "the old leader's fence ran out before b could claim"
    );
    assert!(takeover >= lease::LEASE - CHECK_EVERY, "{takeover:?}");
    assert_eq!(next.epoch(), 2);
    assert_eq!(recorded_leader(&db).await, (Some("b".into()), 2));

    // A leader that resigns leaves a row any candidate claims at once.
    next.resign(&b).await;
    let again = a
        .try_lead()
        .await
        .unwrap()
        .expect("a resigned lease is free");
    assert_eq!(again.epoch(), 3);
    again.resign(&a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_finds_a_newer_epoch_stops_within_its_renewal_period() {
    let db = TestDb::migrated("leader_fenced").await;
    let superseded = || {
        rocketmq_outbox::metrics::relay()
            .leadership_ended
            .get_or_create(&LeadershipEnd {
                reason: LeadershipEnd::SUPERSEDED,
            })
            .get()
    };
    for election in [election(&db, "a"), election(&db, "a").by_lease()] {
        let counted = superseded();
        let leading = election.try_lead().await.unwrap().expect("nobody leads");
        let fence = leading.fence();
        // Another instance leads now, as seen by the server this leader's renewals reach (after
        // a failover that moved the address, say), while this one still holds its lock.
        let mut conn = db.conn().await;
        conn.query_drop(
            "UPDATE outbox_relay_state SET leader = 'elsewhere', leader_epoch = leader_epoch + 1 \
             WHERE name = 'orders'",
        )
        .await
        .unwrap();
        let bumped = Instant::now();
        tokio::time::timeout(CHECK_EVERY * 3, fence.ended().cancelled())
            .await
            .unwrap_or_else(|_| panic!("{} leader stops", election.method()));
        println!(
            "{}: stopped {:?} after a newer epoch",
            election.method(),
            bumped.elapsed()
        );
        assert!(!fence.holds());
        assert!(
            superseded() > counted,
            "counted in outbox_leadership_ended_total: {}",
            rocketmq_outbox::metrics::relay().render()
        );
        let epoch = leading.epoch();
        leading.resign(&election).await;
        assert_eq!(
            recorded_leader(&db).await,
            (Some("elsewhere".into()), epoch + 1),
            "resigning leaves the newer leadership alone"
        );
        conn.query_drop("UPDATE outbox_relay_state SET leader = NULL WHERE name = 'orders'")
            .await
            .unwrap();
    }
}
