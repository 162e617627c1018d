//! The bad-input campaign, part 1: rows the producer API would refuse, written with raw SQL
//! behind its back (invalid JSON, bad topics, payloads over the relay's or the broker's limit,
//! NULLs in a table that allows them). Each ends FAILED at once with its reason, is never
//! published, and an ordinary event written after it is SENT: nothing stalls.
//! Schema changes, look-alike tables and statement-format writes: `tests/bad_input_schema.rs`.

use crate::common;

#[allow(dead_code)]
use crate::common::rows;

use common::relay::relay_config;
use common::rocketmq::{new_topic, rocketmq};
use common::TestDb;
use mysql_async::prelude::*;
use mysql_async::{TxOpts, Value};
use rocketmq_outbox::producer::{EnqueueError, NewEvent, Outbox, Payload};
use rows::{
    assert_failed, assert_sent, enqueue, insert_row, messages_by_event, start_relay_from_now,
    wait_statuses, FAILED, SENT,
};
use serde_json::json;
use std::time::Duration;

/// `Outbox::enqueue` refuses `event` with an error `is_expected` accepts, and writes nothing.
async fn assert_refused(
    db: &TestDb,
    outbox: &Outbox,
    event: NewEvent,
    is_expected: fn(&EnqueueError) -> bool,
) {
    let before = db.count("outbox_event").await;
    let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
    let err = outbox.enqueue(&mut tx, event.clone()).await.unwrap_err();
    assert!(is_expected(&err), "{event:?} gave {err:?}");
    tx.commit().await.unwrap();
    assert_eq!(db.count("outbox_event").await, before, "{event:?} wrote");
}

fn v(text: &str) -> Value {
    Value::from(text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_json_payload_or_headers_fail_with_the_reason_and_later_events_flow() {
    let db = TestDb::migrated("bad_json").await;
    let topic = new_topic("bad_json");

    // 1. The producer API refuses each with a typed error before any SQL runs.
    let outbox = Outbox::default();
    assert_refused(
        &db,
        &outbox,
        NewEvent::new(&topic, "k", Payload::raw("{oops")),
        |e| matches!(e, EnqueueError::InvalidJson(_)),
    )
    .await;
    assert_refused(
        &db,
        &outbox,
        NewEvent::new(&topic, "k", Payload::raw("")),
        |e| matches!(e, EnqueueError::InvalidJson(_)),
    )
    .await;
    for (name, value) in [("event_id", "spoofed"), ("KEYS", "x"), ("trace", "a\u{1}b")] {
        assert_refused(
            &db,
            &outbox,
            NewEvent::new(&topic, "k", json!({})).with_header(name, value),
            |e| {
                matches!(
                    e,
                    EnqueueError::Invalid(
                        rocketmq_outbox::outbox::RuleViolation::InvalidHeader { .. }
                    )
                )
            },
        )
        .await;
    }

    // 2. The migrated schema's JSON columns refuse invalid JSON at write time (MariaDB: a
    //    json_valid CHECK; MySQL: the JSON type): such a row never exists.
    let mut conn = db.conn().await;
    let refused = conn
        .exec_drop(
            "INSERT INTO outbox_event (event_id, biz_key, topic, payload) VALUES ('x', 'k', ?, '{oops')",
            (&topic,),
        )
        .await
        .unwrap_err();
    println!("the outbox_event schema refuses invalid JSON: {refused}");

    // 3. A hand-made (or legacy) schema with text columns lets it in; the relay must cope.
    conn.query_drop(
        "ALTER TABLE outbox_event MODIFY payload LONGTEXT NOT NULL, MODIFY headers LONGTEXT NULL",
    )
    .await
    .unwrap();
    let (config, _dir) = relay_config(&db);
    let relay = start_relay_from_now(&db, &config).await;
    let t = "outbox_event";
    let row = |event_id: &str, payload: &str, headers: Option<&str>| {
        vec![
            ("event_id", v(event_id)),
            ("biz_key", v("same-key")),
            ("topic", v(&topic)),
            ("payload", v(payload)),
            ("headers", headers.map(v).unwrap_or(Value::NULL)),
        ]
    };
    let (first, _) = enqueue(&db, t, NewEvent::new(&topic, "same-key", json!({"n": 1}))).await;
    let cases = [
        (
            row("bad-payload", "{oops", None),
            "payload is not valid JSON",
        ),
        (row("empty-payload", "", None), "payload is not valid JSON"),
        (row("trailing", "{} x", None), "payload is not valid JSON"),
        (
            row("bad-headers", "{}", Some("{\"trace\": ")),
            "headers are not valid JSON",
        ),
        (
            row("array-headers", "{}", Some("[1, 2]")),
            "headers must be a JSON object",
        ),
        (
            row("reserved-header", "{}", Some("{\"KEYS\": \"spoofed\"}")),
            "reserved",
        ),
        (
            row("control-header", "{}", Some("{\"trace\": \"a\\u0001b\"}")),
            "control characters",
        ),
    ];
    let mut bad = Vec::new();
    for (columns, reason) in &cases {
        bad.push((insert_row(&db, t, columns).await, *reason));
    }
    // Null JSON headers and nested values are fine: they are not bad input.
    let odd_but_valid = insert_row(
        &db,
        t,
        &row("null-headers", "[1, {\"a\": null}]", Some("null")),
    )
    .await;
    let (last, last_event) =
        enqueue(&db, t, NewEvent::new(&topic, "same-key", json!({"n": 2}))).await;

    let mut expected: Vec<(u64, i8)> = bad.iter().map(|(id, _)| (*id, FAILED)).collect();
    expected.extend([(first, SENT), (odd_but_valid, SENT), (last, SENT)]);
    wait_statuses(&db, t, &expected, Duration::from_secs(30)).await;
    for (id, reason) in &bad {
        assert_failed(&db, t, *id, reason).await;
    }
    assert_sent(&db, t, last).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.failed, bad.len() as u64);

    let arrived = messages_by_event(&topic, 3).await;
    assert_eq!(
        arrived.len(),
        3,
        "only the good events: {:?}",
        arrived.keys()
    );
    assert!(arrived.contains_key(&last_event));
    assert_eq!(arrived["null-headers"].body_str(), "[1, {\"a\": null}]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_overlong_and_illegal_topics_fail_with_the_reason_and_later_events_flow() {
    let db = TestDb::migrated("bad_topic").await;
    let topic = new_topic("bad_topic");
    // The longest legal topic (127 characters), created on the broker: it is sent.
    let longest = format!("{topic}_{}", "L".repeat(126 - topic.len()));
    assert_eq!(longest.len(), 127);
    rocketmq()
        .create_topic(&longest, 2)
        .expect("create a 127-character topic");
    // Legal and 127 characters long, but the broker has no such topic: the broker's reason.
    let unknown = format!("no_such_{}", "U".repeat(119));
    assert_eq!(unknown.len(), 127);
    let too_long = "T".repeat(128);

    // The producer API refuses every illegal topic with a typed error.
    let outbox = Outbox::default();
    let illegal = [
        "",
        "has space",
        "percent%topic",
        "pipe|topic",
        "%RETRY%group",
        "TBW102",
        "rmq_sys_trace",
        "t\u{e9}ma",
        "tab\ttopic",
        too_long.as_str(),
    ];
    for bad in illegal {
        assert_refused(&db, &outbox, NewEvent::new(bad, "k", json!({})), |e| {
            matches!(
                e,
                EnqueueError::Invalid(rocketmq_outbox::outbox::RuleViolation::InvalidTopic { .. })
            )
        })
        .await;
    }
    // A topic over 127 characters cannot even be stored (VARCHAR(127), strict mode).
    let mut conn = db.conn().await;
    let err = conn
        .exec_drop(
            "INSERT INTO outbox_event (event_id, biz_key, topic, payload) VALUES ('long', 'k', ?, '{}')",
            (&too_long,),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("too long"), "{err}");

    let (config, _dir) = relay_config(&db);
    let relay = start_relay_from_now(&db, &config).await;
    let t = "outbox_event";
    let mut bad = Vec::new();
    for (i, name) in illegal[..illegal.len() - 1].iter().enumerate() {
        let columns = [
            ("event_id", v(&format!("bad-topic-{i}"))),
            ("biz_key", v("k")),
            ("topic", v(name)),
            ("payload", v("{}")),
        ];
        bad.push((insert_row(&db, t, &columns).await, "invalid topic"));
    }
    // Tags with RocketMQ's separator are refused the same way.
    let columns = [
        ("event_id", v("bad-tags")),
        ("biz_key", v("k")),
        ("topic", v(&topic)),
        ("tags", v("a||b")),
        ("payload", v("{}")),
    ];
    bad.push((insert_row(&db, t, &columns).await, "invalid tags"));
    let (missing, _) = enqueue(&db, t, NewEvent::new(&unknown, "k", json!({}))).await;
    let (long_ok, long_event) = enqueue(&db, t, NewEvent::new(&longest, "k", json!({}))).await;
    let (last, last_event) = enqueue(&db, t, NewEvent::new(&topic, "k", json!({}))).await;

    let mut expected: Vec<(u64, i8)> = bad.iter().map(|(id, _)| (*id, FAILED)).collect();
    expected.extend([(missing, FAILED), (long_ok, SENT), (last, SENT)]);
    wait_statuses(&db, t, &expected, Duration::from_secs(60)).await;
    for (id, reason) in &bad {
        assert_failed(&db, t, *id, reason).await;
    }
    let missing_state = assert_failed(&db, t, missing, &unknown).await;
    println!("unknown topic: {:?}", missing_state.last_error);
    relay.stop().await;

    assert!(messages_by_event(&longest, 1)
        .await
        .contains_key(&long_event));
    let arrived = messages_by_event(&topic, 1).await;
    assert_eq!(arrived.len(), 1, "{:?}", arrived.keys());
    assert!(arrived.contains_key(&last_event));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_over_the_relay_or_broker_limit_fail_at_once_and_later_events_flow() {
    const MIB: usize = 1024 * 1024;
    let db = TestDb::migrated("bad_size").await;
    let topic = new_topic("bad_size");
    let (mut config, _dir) = relay_config(&db);
    // Above the broker's 4 MiB, so the broker's own limit can be reached too. The default retry
    // policy (1 s doubling, 8 retries) stays: a retried row would take minutes to fail.
    config.outbox.max_payload_bytes = 4 * MIB + MIB / 2;
    let relay = start_relay_from_now(&db, &config).await;
    let t = "outbox_event";
    // A JSON string of exactly `size` bytes.
    let payload = |size: usize| Payload::raw(format!("\"{}\"", "x".repeat(size - 2)));

    let (first, _) = enqueue(&db, t, NewEvent::new(&topic, "k", json!({"n": 1}))).await;
    let (over_relay, _) = enqueue(&db, t, NewEvent::new(&topic, "k", payload(5 * MIB))).await;
    let (over_broker, _) = enqueue(
        &db,
        t,
        NewEvent::new(&topic, "k", payload(4 * MIB + MIB / 4)),
    )
    .await;
    let (under, under_event) = enqueue(&db, t, NewEvent::new(&topic, "k", payload(3 * MIB))).await;
    let (last, last_event) = enqueue(&db, t, NewEvent::new(&topic, "k", json!({"n": 2}))).await;

    wait_statuses(
        &db,
        t,
        &[
            (first, SENT),
            (over_relay, FAILED),
            (over_broker, FAILED),
            (under, SENT),
            (last, SENT),
        ],
        Duration::from_secs(30),
    )
    .await;
    assert_failed(&db, t, over_relay, "outbox.max_payload_bytes").await;
    assert_failed(&db, t, over_broker, "too large").await;
    relay.stop().await;

    let arrived = messages_by_event(&topic, 3).await;
    assert_eq!(arrived.len(), 3, "{:?}", arrived.keys());
    assert_eq!(arrived[&under_event].body.len(), 3 * MIB);
    assert!(arrived.contains_key(&last_event));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nulls_in_columns_the_contract_says_are_not_null_fail_with_the_column_named() {
    let db = TestDb::migrated("bad_null").await;
    let topic = new_topic("bad_null");
    // A hand-made outbox table where every column but the key may be NULL.
    let t = "outbox_loose";
    db.conn()
        .await
        .query_drop(
            "CREATE TABLE outbox_loose (
               id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
               event_id VARCHAR(64) NULL, biz_key VARCHAR(64) NULL, topic VARCHAR(127) NULL,
               tags VARCHAR(128) NULL, headers LONGTEXT NULL, payload LONGTEXT NULL,
               status TINYINT NULL DEFAULT 0, retry_count INT NULL DEFAULT 0,
               next_retry_at DATETIME(3) NULL DEFAULT CURRENT_TIMESTAMP(3),
               lease_until DATETIME(3) NULL, owner VARCHAR(128) NULL, msg_id VARCHAR(128) NULL,
               sent_at DATETIME(3) NULL, last_error VARCHAR(1024) NULL,
               created_at DATETIME(3) NULL DEFAULT CURRENT_TIMESTAMP(3),
               deliver_at TIMESTAMP(3) NULL
             ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4",
        )
        .await
        .unwrap();
    let (mut config, _dir) = relay_config(&db);
    config.outbox.tables = vec![t.to_string()];
    let relay = start_relay_from_now(&db, &config).await;

    let row = |event_id: Value, biz_key: Value, topic_: Value, payload: Value| {
        vec![
            ("event_id", event_id),
            ("biz_key", biz_key),
            ("topic", topic_),
            ("payload", payload),
        ]
    };
    let (k, p, tp) = (v("k"), v("{}"), v(&topic));
    let cases = [
        (
            row(Value::NULL, k.clone(), tp.clone(), p.clone()),
            "`event_id` is NULL",
        ),
        (
            row(v("null-key"), Value::NULL, tp.clone(), p.clone()),
            "`biz_key` is NULL",
        ),
        (
            row(v("null-topic"), k.clone(), Value::NULL, p.clone()),
            "`topic` is NULL",
        ),
        (
            row(v("null-payload"), k.clone(), tp.clone(), Value::NULL),
            "`payload` is NULL",
        ),
    ];
    let mut bad = Vec::new();
    for (columns, reason) in &cases {
        bad.push((insert_row(&db, t, columns).await, *reason));
    }
    let mut null_status = row(v("null-status"), k.clone(), tp.clone(), p.clone());
    null_status.push(("status", Value::NULL));
    let null_status = insert_row(&db, t, &null_status).await;
    // NULL tags and headers are allowed: the event is sent.
    let mut optional = row(v("null-optional"), k.clone(), tp.clone(), p.clone());
    optional.extend([("tags", Value::NULL), ("headers", Value::NULL)]);
    let optional = insert_row(&db, t, &optional).await;
    let (last, last_event) = enqueue(&db, t, NewEvent::new(&topic, "k", json!({"n": 1}))).await;

    let mut expected: Vec<(u64, i8)> = bad.iter().map(|(id, _)| (*id, FAILED)).collect();
    expected.extend([(null_status, FAILED), (optional, SENT), (last, SENT)]);
    wait_statuses(&db, t, &expected, Duration::from_secs(30)).await;
    for (id, reason) in &bad {
        assert_failed(&db, t, *id, reason).await;
    }
    assert_failed(&db, t, null_status, "`status` is NULL").await;
    relay.stop().await;

    let arrived = messages_by_event(&topic, 2).await;
    assert_eq!(arrived.len(), 2, "{:?}", arrived.keys());
    assert!(arrived.contains_key("null-optional") && arrived.contains_key(&last_event));
}
