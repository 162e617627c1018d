//! Operations commands against a real MariaDB or MySQL (`OUTBOX_TEST_DB`): cleanup, audited
//! compensation, reconcile, and the binary's `retry` / `mark-failed` / `cleanup` / `reconcile`
//! end to end.

use crate::common;
#[path = "operate/cli.rs"]
mod cli;
#[path = "operate/rows.rs"]
mod rows;

use common::TestDb;
use mysql_async::prelude::*;
use rocketmq_outbox::operate::{Action, Cleanup, Compensation, Reconcile, RowOutcome, Selection};
use rocketmq_outbox::outbox::Status;
use rows::*;
use serde_json::Value as Json;
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// cleanup

#[tokio::test]
async fn cleanup_deletes_only_old_sent_rows_in_batches() {
    let db = TestDb::migrated("op_cleanup").await;
    insert_rows(&db, "old", 2500, SENT, "t").await;
    insert_rows(&db, "new", 10, SENT, "t").await;
    insert_rows(&db, "oldpending", 5, PENDING, "t").await;
    insert_rows(&db, "oldsending", 5, SENDING, "t").await;
    insert_rows(&db, "oldfailed", 5, FAILED, "t").await;
    for prefix in ["old", "oldpending", "oldsending", "oldfailed"] {
        age_rows(&db, prefix, "8 DAY").await;
    }
    // 6 days old: younger than the retention.
    insert_rows(&db, "recent", 7, SENT, "t").await;
    age_rows(&db, "recent", "6 DAY").await;

    let cleanup = Cleanup {
        pause: Duration::from_millis(10),
        ..Cleanup::default()
    };
    let dry = Cleanup {
        dry_run: true,
        ..cleanup.clone()
    }
    .run_once(&db.pool, &outbox_tables(), |_| {
        panic!("a dry run deletes nothing")
    })
    .await
    .unwrap();
    assert_eq!((dry.deleted(), dry.batches()), (2500, 0));
    assert_eq!(db.count("outbox_event").await, 2532);

    let mut progress = Vec::new();
    let summary = cleanup
        .run_once(&db.pool, &outbox_tables(), |p| {
            progress.push((p.batch, p.deleted, p.table_total))
        })
        .await
        .unwrap();
    assert_eq!(
        progress,
        vec![(1, 1000, 1000), (2, 1000, 2000), (3, 500, 2500)]
    );
    assert_eq!((summary.deleted(), summary.batches()), (2500, 3));
    assert_eq!(count_where(&db, "event_id LIKE 'old-%'").await, 0);
    assert_eq!(
        count_where(&db, &format!("status = {PENDING}")).await,
        5,
        "PENDING kept"
    );
    assert_eq!(
        count_where(&db, &format!("status = {SENDING}")).await,
        5,
        "SENDING kept"
    );
    assert_eq!(
        count_where(&db, &format!("status = {FAILED}")).await,
        5,
        "FAILED kept"
    );
    assert_eq!(
        count_where(&db, &format!("status = {SENT}")).await,
        17,
        "new SENT kept"
    );

    let again = cleanup
        .run_once(&db.pool, &outbox_tables(), |_| panic!("nothing left"))
        .await
        .unwrap();
    assert_eq!((again.deleted(), again.batches()), (0, 0));
}

#[tokio::test]
async fn cleanup_of_an_exact_multiple_of_the_batch_stops_after_the_last_full_batch() {
    let db = TestDb::migrated("op_cleanup_exact").await;
    insert_rows(&db, "old", 20, SENT, "t").await;
    age_rows(&db, "old", "8 DAY").await;
    let mut batches = 0;
    let summary = Cleanup {
        batch_size: 10,
        pause: Duration::ZERO,
        ..Cleanup::default()
    }
    .run_once(&db.pool, &outbox_tables(), |_| batches += 1)
    .await
    .unwrap();
    assert_eq!((summary.deleted(), summary.batches(), batches), (20, 2, 2));
    assert_eq!(db.count("outbox_event").await, 0);
}

// ---------------------------------------------------------------------------------------------
// compensation

fn compensation(action: Action, selection: Selection) -> Compensation {
    Compensation {
        action,
        operator: "ann".into(),
        reason: "INC-7: topic created".into(),
        selection,
    }
}

fn ids(ids: Vec<i64>) -> Selection {
    Selection {
        ids,
        ..Selection::default()
    }
}

async fn audit_rows(db: &TestDb) -> Vec<(String, String, String, String, Json, Json, String)> {
    let rows: Vec<(String, String, String, String, String, String, String)> = db
        .conn()
        .await
        .query(
            "SELECT operator, reason, action, event_id, before_state, after_state, result \
             FROM outbox_audit ORDER BY id",
        )
        .await
        .unwrap();
    rows.into_iter()
        .map(|(o, r, a, e, before, after, result)| {
            (
                o,
                r,
                a,
                e,
                serde_json::from_str(&before).unwrap(),
                serde_json::from_str(&after).unwrap(),
                result,
            )
        })
        .collect()
}

#[tokio::test]
async fn compensation_audits_each_effective_change_once_and_repeats_change_nothing() {
    let db = TestDb::migrated("op_compensate").await;
    insert_rows(&db, "failed", 2, FAILED, "orders").await;
    insert_rows(&db, "sent", 1, SENT, "orders").await;
    insert_rows(&db, "pending", 1, PENDING, "orders").await;
    let (f0, f1, s0, p0) = (
        id_of(&db, "failed-0").await,
        id_of(&db, "failed-1").await,
        id_of(&db, "sent-0").await,
        id_of(&db, "pending-0").await,
    );

    // retry: the two FAILED rows change; the SENT row is guarded (skipped, no audit).
    let retry = compensation(Action::Retry, ids(vec![f0, f1, s0, 999_999]));
    let report = retry.run(&db.pool, &outbox_tables()).await.unwrap();
    assert_eq!(report.count(RowOutcome::Changed), 2, "{report:?}");
    assert_eq!(report.count(RowOutcome::Skipped), 1);
    assert_eq!(report.not_found, vec!["id 999999".to_string()]);
    let audit = audit_rows(&db).await;
    assert_eq!(audit.len(), 2);
    let (operator, reason, action, event_id, before, after, result) = &audit[0];
    assert_eq!(
        (operator.as_str(), reason.as_str(), action.as_str()),
        ("ann", "INC-7: topic created", "retry")
    );
    assert_eq!(event_id, "failed-0");
    assert_eq!(before["status"], "FAILED");
    assert_eq!(before["last_error"], "no route for topic");
    assert_eq!(before["retry_count"], 2);
    assert_eq!(after["status"], "PENDING");
    assert_eq!(after["last_error"], Json::Null);
    assert_eq!(after["retry_count"], 0);
    assert_eq!(result, "changed: FAILED -> PENDING");
    assert_eq!(
        count_where(&db, &format!("status = {PENDING} AND retry_count = 0 AND last_error IS NULL AND event_id LIKE 'failed-%'")
        )
        .await,
        2
    );
    assert_eq!(
        count_where(&db, &format!("event_id = 'sent-0' AND status = {SENT}")).await,
        1
    );

    // The same command again: nothing changes, no audit row.
    let report = retry.run(&db.pool, &outbox_tables()).await.unwrap();
    assert_eq!(report.count(RowOutcome::Changed), 0);
    assert_eq!(report.count(RowOutcome::AlreadyInTarget), 2);
    assert_eq!(report.count(RowOutcome::Skipped), 1);
    assert!(report
        .summary_line()
        .starts_with("retry: 0 changed, 2 already in target state"));
    assert_eq!(audit_rows(&db).await.len(), 2);

    // resend by event_id: SENT -> PENDING, msg_id cleared (kept in the audit row); twice.
    let resend = compensation(
        Action::Resend,
        Selection {
            event_ids: vec!["sent-0".into()],
            ..Selection::default()
        },
    );
    for expected_changes in [1, 0] {
        let report = resend.run(&db.pool, &outbox_tables()).await.unwrap();
        assert_eq!(report.count(RowOutcome::Changed), expected_changes);
    }
    let audit = audit_rows(&db).await;
    assert_eq!(audit.len(), 3);
    assert_eq!(audit[2].4["msg_id"], "msg-sent-0");
    assert_eq!(audit[2].5["msg_id"], "", "resend clears msg_id");
    assert_eq!(
        count_where(
            &db,
            &format!(
                "event_id = 'sent-0' AND status = {PENDING} AND msg_id = '' \
                 AND sent_at = DEFAULT(sent_at)"
            )
        )
        .await,
        1
    );

    // mark-failed: PENDING -> FAILED with who and why; twice.
    let mark = compensation(Action::MarkFailed, ids(vec![p0]));
    for expected_changes in [1, 0] {
        let report = mark.run(&db.pool, &outbox_tables()).await.unwrap();
        assert_eq!(report.count(RowOutcome::Changed), expected_changes);
    }
    let error: Option<String> = db
        .conn()
        .await
        .exec_first("SELECT last_error FROM outbox_event WHERE id = ?", (p0,))
        .await
        .unwrap();
    assert_eq!(
        error.as_deref(),
        Some("marked failed by ann: INC-7: topic created")
    );
    let audit = audit_rows(&db).await;
    assert_eq!(audit.len(), 4);
    assert_eq!(audit[3].2, "mark-failed");
    assert_eq!(audit[3].4["status"], "PENDING");
    assert_eq!(audit[3].5["status"], "FAILED");
}

#[tokio::test]
async fn compensation_by_filter_takes_only_source_status_rows_up_to_the_limit() {
    let db = TestDb::migrated("op_compensate_filter").await;
    insert_rows(&db, "a", 5, FAILED, "orders").await;
    insert_rows(&db, "b", 3, FAILED, "payments").await;
    insert_rows(&db, "c", 4, SENT, "orders").await;
    let retry = compensation(
        Action::Retry,
        Selection {
            topic: Some("orders".into()),
            error_like: Some("%no route%".into()),
            limit: 3,
            ..Selection::default()
        },
    );
    let first = retry.run(&db.pool, &outbox_tables()).await.unwrap();
    assert_eq!(first.count(RowOutcome::Changed), 3);
    assert!(first.limit_reached);
    let second = retry.run(&db.pool, &outbox_tables()).await.unwrap();
    assert_eq!(second.count(RowOutcome::Changed), 2);
    assert!(!second.limit_reached);
    let third = retry.run(&db.pool, &outbox_tables()).await.unwrap();
    assert!(third.rows.is_empty());
    assert_eq!(db.count("outbox_audit").await, 5);
    assert_eq!(
        count_where(&db, &format!("topic = 'payments' AND status = {FAILED}")).await,
        3
    );
    assert_eq!(
        count_where(&db, &format!("topic = 'orders' AND status = {SENT}")).await,
        4
    );

    // created-before excludes newer rows.
    db.conn()
        .await
        .query_drop(
            "UPDATE outbox_event SET created_at = NOW(3) - INTERVAL 2 DAY WHERE event_id = 'b-0'",
        )
        .await
        .unwrap();
    let old_only = compensation(
        Action::Retry,
        Selection {
            created_before: Some("1d".parse().unwrap()),
            ..Selection::default()
        },
    );
    let report = old_only.run(&db.pool, &outbox_tables()).await.unwrap();
    assert_eq!(report.count(RowOutcome::Changed), 1);
    assert_eq!(report.rows[0].event_id, "b-0");
}

#[tokio::test]
async fn retry_of_a_sent_row_changes_nothing() {
    let db = TestDb::migrated("op_compensate_race").await;
    insert_rows(&db, "x", 1, SENT, "orders").await;
    let report = compensation(Action::Retry, ids(vec![id_of(&db, "x-0").await]))
        .run(&db.pool, &outbox_tables())
        .await
        .unwrap();
    assert_eq!(report.rows[0].outcome, RowOutcome::Skipped);
    assert_eq!(report.rows[0].before, Some(Status::Sent));
    assert_eq!(
        count_where(&db, &format!("status = {SENT} AND msg_id = 'msg-x-0'")).await,
        1
    );
    assert_eq!(db.count("outbox_audit").await, 0);
}

#[tokio::test]
async fn mark_failed_waits_for_a_concurrent_relay_mark_and_leaves_it() {
    let db = TestDb::migrated("op_compensate_race").await;
    insert_rows(&db, "x", 1, PENDING, "orders").await;
    let id = id_of(&db, "x-0").await;
    // The relay's marker (rule for the CDC stream) records SENT; its transaction is still open.
    let mut relay = db.conn().await;
    relay.query_drop("START TRANSACTION").await.unwrap();
    relay
        .exec_drop(
            format!(
                "UPDATE outbox_event SET status = {SENT}, msg_id = 'relay-msg', sent_at = NOW(3) \
             WHERE id = ? AND status IN ({PENDING}, {SENDING})"
            ),
            (id,),
        )
        .await
        .unwrap();
    let pool = db.pool.clone();
    let operator = tokio::spawn(async move {
        compensation(Action::MarkFailed, ids(vec![id]))
            .run(&pool, &outbox_tables())
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !operator.is_finished(),
        "mark-failed waits for the row lock"
    );
    relay.query_drop("COMMIT").await.unwrap();
    let report = operator.await.unwrap().unwrap();
    assert_eq!(report.rows[0].outcome, RowOutcome::Skipped);
    assert_eq!(report.rows[0].before, Some(Status::Sent));
    assert_eq!(
        count_where(&db, &format!("status = {SENT} AND msg_id = 'relay-msg'")).await,
        1
    );
    assert_eq!(db.count("outbox_audit").await, 0);
}

// ---------------------------------------------------------------------------------------------
// reconcile

async fn insert_dedup(consumer: &TestDb, group: &str, event_ids: &[String], status: &str) {
    let mut conn = consumer.conn().await;
    for event_id in event_ids {
        conn.exec_drop(
            "INSERT INTO event_dedup (consumer_group, event_id, status, topic) VALUES (?, ?, ?, 't')",
            (group, event_id, status),
        )
        .await
        .unwrap();
    }
}

async fn open_diff(db: &TestDb, group: &str) -> Vec<String> {
    db.conn()
        .await
        .exec(
            "SELECT event_id FROM outbox_reconcile_diff \
             WHERE consumer_group = ? AND resolved_at IS NULL ORDER BY event_id",
            (group,),
        )
        .await
        .unwrap()
}

#[tokio::test]
async fn reconcile_finds_exactly_the_withheld_events() {
    let producer = TestDb::migrated("op_reconcile_p").await;
    // The consumer's database is another database (own pool), as with --consumer-url.
    let consumer = TestDb::migrated("op_reconcile_c").await;
    insert_rows(&producer, "h3", 20, SENT, "orders").await;
    age_rows(&producer, "h3", "3 HOUR").await;
    insert_rows(&producer, "h1", 25, SENT, "payments").await;
    age_rows(&producer, "h1", "1 HOUR").await;
    // Sent a moment ago: within the grace period, not expected downstream yet.
    insert_rows(&producer, "fresh", 4, SENT, "orders").await;
    // Not SENT: not expected downstream at all.
    insert_rows(&producer, "pending", 3, PENDING, "orders").await;
    age_rows(&producer, "pending", "1 HOUR").await;
    // Older than the window.
    insert_rows(&producer, "ancient", 2, SENT, "orders").await;
    age_rows(&producer, "ancient", "3 DAY").await;

    let withheld = ["h3-4", "h3-17", "h1-0", "h1-24"];
    let mut processed = Vec::new();
    let mut rejected = Vec::new();
    for (prefix, n) in [("h3", 20), ("h1", 25)] {
        for i in 0..n {
            let event_id = format!("{prefix}-{i}");
            if withheld.contains(&event_id.as_str()) {
                continue;
            }
            if i % 5 == 0 {
                rejected.push(event_id);
            } else {
                processed.push(event_id);
            }
        }
    }
    insert_dedup(&consumer, "settlement", &processed, "PROCESSED").await;
    insert_dedup(&consumer, "settlement", &rejected, "REJECTED").await;
    // Another group saw the withheld events: that does not count for `settlement`.
    let withheld_ids: Vec<String> = withheld.iter().map(|s| s.to_string()).collect();
    insert_dedup(&consumer, "audit-log", &withheld_ids, "PROCESSED").await;

    let reconcile = Reconcile {
        chunk_size: 7, // several pages and lookups
        ..Reconcile::new("settlement")
    };
    let report = reconcile
        .run(&producer.pool, &consumer.pool, &outbox_tables())
        .await
        .unwrap();
    let mut expected: Vec<String> = withheld_ids.clone();
    expected.sort();
    assert_eq!(open_diff(&producer, "settlement").await, expected);
    assert_eq!(
        (report.sent(), report.seen(), report.missing()),
        (45, 41, 4)
    );
    assert_eq!(report.newly_missing, 4);
    assert_eq!(report.in_grace, 4);
    assert_eq!(report.rows.len(), 2, "{:?}", report.rows);
    let by_topic = |topic: &str| report.rows.iter().find(|r| r.topic == topic).unwrap();
    assert_eq!(
        (by_topic("orders").sent, by_topic("orders").missing),
        (20, 2)
    );
    assert_eq!(
        (by_topic("payments").sent, by_topic("payments").missing),
        (25, 2)
    );
    assert_ne!(by_topic("orders").hour, by_topic("payments").hour);
    // Reconcile wrote nothing else.
    assert_eq!(
        count_where(&producer, &format!("status = {SENT}")).await,
        51
    );
    assert_eq!(consumer.count("event_dedup").await, 45);

    // Again: the same rows, no duplicates.
    let again = reconcile
        .run(&producer.pool, &consumer.pool, &outbox_tables())
        .await
        .unwrap();
    assert_eq!(again.missing(), 4);
    assert_eq!(again.newly_missing, 0);
    assert_eq!(producer.count("outbox_reconcile_diff").await, 4);
    let last_runs: Vec<String> = producer
        .conn()
        .await
        .query("SELECT DISTINCT last_run_id FROM outbox_reconcile_diff")
        .await
        .unwrap();
    assert_eq!(last_runs, vec![again.run_id.clone()]);

    // One withheld event arrives downstream: the next run resolves its row.
    insert_dedup(&consumer, "settlement", &["h1-0".to_string()], "PROCESSED").await;
    let third = reconcile
        .run(&producer.pool, &consumer.pool, &outbox_tables())
        .await
        .unwrap();
    assert_eq!((third.missing(), third.resolved), (3, 1));
    assert_eq!(open_diff(&producer, "settlement").await.len(), 3);
    assert_eq!(producer.count("outbox_reconcile_diff").await, 4);

    // A topic filter and a dry run.
    let dry = Reconcile {
        topics: vec!["orders".into()],
        record: false,
        ..Reconcile::new("nobody")
    };
    let report = dry
        .run(&producer.pool, &consumer.pool, &outbox_tables())
        .await
        .unwrap();
    assert_eq!((report.sent(), report.missing()), (20, 20));
    assert!(open_diff(&producer, "nobody").await.is_empty());
}

#[tokio::test]
async fn reconcile_without_the_dedup_table_says_where_to_point_it() {
    let producer = TestDb::migrated("op_reconcile_nodedup").await;
    let consumer = TestDb::empty("op_reconcile_empty").await;
    let err = Reconcile::new("g")
        .run(&producer.pool, &consumer.pool, &outbox_tables())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("--consumer-url"), "{err}");
}
