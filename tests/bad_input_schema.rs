//! The bad-input campaign, part 2: the outbox table is not quite what the relay expects. Extra
//! columns, columns added, reordered and dropped while the relay streams, a table of the same
//! name in another database, and a session that writes its outbox row in STATEMENT format (the
//! stream cannot decode it; the sweeper publishes it).

use crate::common;

#[allow(dead_code)]
use crate::common::rows;

use common::relay::{relay_config, sweeping_config};
use common::rocketmq::new_topic;
use common::{database, TestDb};
use mysql_async::prelude::*;
use mysql_async::{TxOpts, Value};
use outbox_devenv::SqlServer;
use rocketmq_outbox::producer::{NewEvent, Outbox};
use rows::{
    assert_sent, enqueue, insert_row, messages_by_event, start_relay_from_now, state,
    wait_statuses, PENDING, SENT,
};
use serde_json::json;
use std::time::Duration;

/// What one event was written with, to compare with what arrived.
struct Written {
    id: u64,
    event_id: String,
    biz_key: String,
    payload: serde_json::Value,
}

/// Enqueues `n` events `label-i` with the producer API.
async fn write(db: &TestDb, topic: &str, label: &str, n: usize) -> Vec<Written> {
    let mut written = Vec::new();
    for i in 0..n {
        let biz_key = format!("{label}-key-{}", i % 3);
        let payload = json!({"label": label, "i": i});
        let (id, event_id) = enqueue(
            db,
            "outbox_event",
            NewEvent::new(topic, &biz_key, payload.clone())
                .with_tags(label)
                .with_header("label", label),
        )
        .await;
        written.push(Written {
            id,
            event_id,
            biz_key,
            payload,
        });
    }
    written
}

/// Every written event is SENT and arrived once, with its own key, tags, header and payload
/// (a decoder reading a column by a stale position would mix them up).
async fn assert_arrived_intact(db: &TestDb, topic: &str, written: &[Written]) {
    let expected: Vec<(u64, i8)> = written.iter().map(|w| (w.id, SENT)).collect();
    wait_statuses(db, "outbox_event", &expected, Duration::from_secs(60)).await;
    let arrived = messages_by_event(topic, written.len()).await;
    assert_eq!(arrived.len(), written.len());
    for w in written {
        let m = &arrived[&w.event_id];
        assert_eq!(m.properties["biz_key"], w.biz_key);
        let label = w.payload["label"].as_str().unwrap();
        assert_eq!(m.tags.as_deref(), Some(label));
        assert_eq!(m.properties["label"], label);
        let body: serde_json::Value = serde_json::from_slice(&m.body).unwrap();
        assert_eq!(body, w.payload, "{}", w.event_id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_extra_columns_are_ignored_and_events_flow() {
    let db = TestDb::migrated("bad_extra").await;
    let topic = new_topic("bad_extra");
    db.conn()
        .await
        .query_drop(
            "ALTER TABLE outbox_event
               ADD COLUMN tenant VARCHAR(16) NOT NULL DEFAULT 't1' AFTER id,
               ADD COLUMN trace JSON NULL AFTER payload,
               ADD COLUMN note BLOB NULL FIRST,
               ADD COLUMN amount DECIMAL(12, 2) NULL",
        )
        .await
        .unwrap();
    let (config, _dir) = relay_config(&db);
    let relay = start_relay_from_now(&db, &config).await;
    let mut written = write(&db, &topic, "extra", 5).await;
    // Business code that fills the extra columns itself.
    let id = insert_row(
        &db,
        "outbox_event",
        &[
            ("note", Value::Bytes(vec![0, 159, 146, 150])),
            ("tenant", Value::from("t2")),
            ("event_id", Value::from("extra-raw")),
            ("biz_key", Value::from("extra-key-0")),
            ("topic", Value::from(topic.as_str())),
            ("tags", Value::from("extra")),
            ("headers", Value::from("{\"label\": \"extra\"}")),
            ("payload", Value::from("{\"label\": \"extra\", \"i\": 99}")),
            ("trace", Value::from("{\"span\": 1}")),
            ("amount", Value::from("12.50")),
        ],
    )
    .await;
    written.push(Written {
        id,
        event_id: "extra-raw".into(),
        biz_key: "extra-key-0".into(),
        payload: json!({"label": "extra", "i": 99}),
    });
    assert_arrived_intact(&db, &topic, &written).await;
    let summary = relay.stop().await;
    assert_eq!((summary.marked.failed, summary.unidentifiable), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn columns_added_reordered_and_dropped_while_streaming_are_decoded_by_name() {
    let db = TestDb::migrated("bad_alter").await;
    let topic = new_topic("bad_alter");
    let (config, _dir) = relay_config(&db);
    let relay = start_relay_from_now(&db, &config).await;
    let mut conn = db.conn().await;
    let mut written = write(&db, &topic, "before", 5).await;
    conn.query_drop("ALTER TABLE outbox_event ADD COLUMN region VARCHAR(8) NULL AFTER event_id")
        .await
        .unwrap();
    written.extend(write(&db, &topic, "added", 5).await);
    // Reordered: the columns the relay needs move; a decoder keeping old positions would read
    // the topic as the event_id, the payload as the key...
    conn.query_drop(
        "ALTER TABLE outbox_event
           MODIFY COLUMN topic VARCHAR(127) NOT NULL AFTER id,
           MODIFY COLUMN event_id VARCHAR(64) NOT NULL AFTER created_at,
           MODIFY COLUMN biz_key VARCHAR(64) NOT NULL AFTER payload,
           MODIFY COLUMN status TINYINT NOT NULL DEFAULT 0 FIRST",
    )
    .await
    .unwrap();
    written.extend(write(&db, &topic, "reordered", 5).await);
    conn.query_drop("ALTER TABLE outbox_event DROP COLUMN region")
        .await
        .unwrap();
    written.extend(write(&db, &topic, "dropped", 5).await);
    assert_arrived_intact(&db, &topic, &written).await;
    let summary = relay.stop().await;
    assert_eq!((summary.marked.failed, summary.unidentifiable), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_event_table_in_another_database_is_ignored() {
    let db = TestDb::migrated("bad_shadow").await;
    let topic = new_topic("bad_shadow");
    let ours = db.name();
    // Another application's database with a table of the same name: one an exact copy of the
    // outbox, the other a different table that merely shares the name.
    let copy_db = database().create_database("bad_shadow_copy").unwrap();
    let copy_db = copy_db.rsplit('/').next().unwrap().to_string();
    let other_db = database().create_database("bad_shadow_other").unwrap();
    let other_db = other_db.rsplit('/').next().unwrap().to_string();
    let mut conn = db.conn().await;
    conn.query_drop(format!(
        "CREATE TABLE `{copy_db}`.outbox_event LIKE `{ours}`.outbox_event"
    ))
    .await
    .unwrap();
    conn.query_drop(format!(
        "CREATE TABLE `{other_db}`.outbox_event (id BIGINT PRIMARY KEY, status TEXT, note TEXT)"
    ))
    .await
    .unwrap();

    let (config, _dir) = relay_config(&db);
    let relay = start_relay_from_now(&db, &config).await;
    let (first, _) = enqueue(
        &db,
        "outbox_event",
        NewEvent::new(&topic, "k", json!({"n": 1})),
    )
    .await;
    // Same ids as our rows, same topic: a relay matching on the table name alone would send
    // them and mark *our* rows with their outcome.
    let mut tx = conn.start_transaction(TxOpts::default()).await.unwrap();
    tx.exec_drop(
        format!(
            "INSERT INTO `{copy_db}`.outbox_event (id, event_id, biz_key, topic, payload) \
             VALUES (?, 'copy-1', 'k', ?, '{{}}'), (?, 'copy-2', 'k', ?, '{{}}')"
        ),
        (first, &topic, first + 1, &topic),
    )
    .await
    .unwrap();
    tx.exec_drop(
        format!("INSERT INTO `{other_db}`.outbox_event VALUES (?, 'x', 'y'), (?, NULL, NULL)"),
        (first, first + 1),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let (second, second_event) = enqueue(
        &db,
        "outbox_event",
        NewEvent::new(&topic, "k", json!({"n": 2})),
    )
    .await;
    assert_eq!(second, first + 1);

    wait_statuses(
        &db,
        "outbox_event",
        &[(first, SENT), (second, SENT)],
        Duration::from_secs(30),
    )
    .await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.sent, 2, "only our two rows were handled");
    assert_eq!((summary.marked.failed, summary.unidentifiable), (0, 0));
    assert_eq!(
        state(&db, "outbox_event", second).await.event_id.as_deref(),
        Some(second_event.as_str())
    );
    for id in [first, first + 1] {
        let copy = state(&db, &format!("`{copy_db}`.outbox_event"), id).await;
        assert_eq!(
            (copy.status, copy.msg_id.clone()),
            (Some(PENDING), None),
            "{copy:?}"
        );
    }
    let untouched: Vec<(u64, Option<String>)> = conn
        .query(format!(
            "SELECT id, status FROM `{other_db}`.outbox_event ORDER BY id"
        ))
        .await
        .unwrap();
    assert_eq!(
        untouched,
        vec![(first, Some("x".into())), (first + 1, None)]
    );
    let arrived = messages_by_event(&topic, 2).await;
    assert_eq!(arrived.len(), 2, "no copy-* event: {:?}", arrived.keys());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_row_written_in_statement_format_is_swept_not_lost() {
    let db = TestDb::migrated("bad_stmt").await;
    let topic = new_topic("bad_stmt");
    let (config, _dir) = sweeping_config(&db);
    let swept_before = rocketmq_outbox::metrics::relay().rows_swept.get();
    let relay = start_relay_from_now(&db, &config).await;

    let (before, _) = enqueue(
        &db,
        "outbox_event",
        NewEvent::new(&topic, "k", json!({"n": 0})),
    )
    .await;
    // One session switches to statement-based logging: its INSERT reaches the binlog as SQL
    // text, which the stream cannot decode into a row.
    let mut conn = db.conn().await;
    conn.query_drop("SET SESSION binlog_format = 'STATEMENT'")
        .await
        .unwrap();
    let mut tx = conn.start_transaction(TxOpts::default()).await.unwrap();
    let hidden = Outbox::default()
        .enqueue(
            &mut tx,
            NewEvent::new(&topic, "stmt-key", json!({"statement": true})),
        )
        .await
        .unwrap()
        .to_string();
    tx.commit().await.unwrap();
    let format: String = conn
        .query_first("SELECT @@SESSION.binlog_format")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(format, "STATEMENT");
    drop(conn);
    let hidden_id: u64 = db
        .conn()
        .await
        .exec_first("SELECT id FROM outbox_event WHERE event_id = ?", (&hidden,))
        .await
        .unwrap()
        .unwrap();
    let (after, after_event) = enqueue(
        &db,
        "outbox_event",
        NewEvent::new(&topic, "k", json!({"n": 1})),
    )
    .await;

    // The stream sends the row-format events at once; the statement one only the sweeper can
    // see, after `sweeper.min_age`.
    wait_statuses(
        &db,
        "outbox_event",
        &[(before, SENT), (after, SENT)],
        Duration::from_secs(30),
    )
    .await;
    wait_statuses(
        &db,
        "outbox_event",
        &[(hidden_id, SENT)],
        Duration::from_secs(30),
    )
    .await;
    assert_sent(&db, "outbox_event", hidden_id).await;
    let swept = rocketmq_outbox::metrics::relay().rows_swept.get() - swept_before;
    assert!(swept >= 1, "the sweeper published the statement-format row");
    let summary = relay.stop().await;
    assert_eq!((summary.marked.failed, summary.unidentifiable), (0, 0));

    let arrived = messages_by_event(&topic, 3).await;
    assert_eq!(arrived.len(), 3);
    assert!(arrived.contains_key(&hidden) && arrived.contains_key(&after_event));
}
