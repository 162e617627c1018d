//! The sweeper beside the CDC stream, on a real MariaDB and a real broker that (like production)
//! refuses topics nobody created: rows the stream never saw are published, a row put back to
//! PENDING by hand is sent again (a duplicate the consumer can see by `event_id`), and a row for
//! a topic the broker rejects ends FAILED with the broker's reason while other keys flow.

use crate::common;

use common::relay::{
    assert_every_event_arrived_in_key_order, assert_key_order, commit_events, count_status,
    current_position, deliveries, outbox_rows, seed_checkpoint, stored_messages, sweeping_config,
    wait_for, wait_until_sent, write_events, RunningRelay,
};
use common::rocketmq::{new_topic, rocketmq};
use common::TestDb;
use mysql_async::prelude::*;
use mysql_async::TxOpts;
use outbox_devenv::ReceivedMessage;
use rocketmq_outbox::outbox::status::codes::{FAILED, PENDING, SENT};
use rocketmq_outbox::producer::{NewEvent, Outbox};
use serde_json::json;
use std::time::Duration;
use tokio::task::JoinHandle;

/// Commits `count` events for `topic` in one transaction that is not written to the binlog.
async fn write_unlogged(db: &TestDb, topic: &str, count: usize) -> Vec<String> {
    let mut conn = db.conn().await;
    conn.query_drop("SET SESSION sql_log_bin = 0")
        .await
        .unwrap();
    let events = (0..count)
        .map(|i| NewEvent::new(topic, format!("hidden-{i}"), json!({ "hidden": i })))
        .collect();
    commit_events(&mut conn, events).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_the_stream_never_saw_and_rows_put_back_by_hand_are_swept() {
    let db = TestDb::migrated("sweep_missed").await;
    let topic = new_topic("sweep_missed");
    let (config, _dir) = sweeping_config(&db);
    seed_checkpoint(&config, &current_position(&db).await);
    let swept_before = rocketmq_outbox::metrics::relay().rows_swept.get();
    let relay = RunningRelay::start(&config).await;

    write_events(&db, &topic, 2, 50, 10).await;
    let hidden = write_unlogged(&db, &topic, 5).await;
    wait_until_sent(&db, 105, Duration::from_secs(60)).await;
    let swept = rocketmq_outbox::metrics::relay().rows_swept.get() - swept_before;
    assert!(
        swept >= 5,
        "the sweeper claimed the 5 unlogged rows ({swept})"
    );

    // Resending by hand: an operator sets a SENT row back to PENDING; it is sent again.
    let mut conn = db.conn().await;
    let (id, event_id, first_msg): (u64, String, String) = conn
        .query_first(
            format!("SELECT id, event_id, NULLIF(msg_id, '') FROM outbox_event WHERE status = {SENT} ORDER BY id LIMIT 1"),
        )
        .await
        .unwrap()
        .unwrap();
    conn.exec_drop(
        format!("UPDATE outbox_event SET status = {PENDING}, msg_id = DEFAULT, sent_at = DEFAULT WHERE id = ?"),
        (id,),
    )
    .await
    .unwrap();
    wait_until_sent(&db, 105, Duration::from_secs(30)).await;
    let second_msg: String = conn
        .exec_first(
            "SELECT NULLIF(msg_id, '') FROM outbox_event WHERE id = ?",
            (id,),
        )
        .await
        .unwrap()
        .unwrap();
    assert_ne!(first_msg, second_msg, "a second publication, a new message");
    relay.stop().await;

    let per_event = deliveries(&rocketmq().namesrv_addr(), &topic, 106).await;
    assert_eq!(per_event.len(), 105, "every event arrived");
    for event in &hidden {
        assert_eq!(
            per_event.get(event),
            Some(&1),
            "unlogged {event} swept once"
        );
    }
    // What a consumer's check on event_id sees: the re-sent event twice, nothing else twice.
    let twice: Vec<&String> = per_event
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(e, _)| e)
        .collect();
    assert_eq!(
        twice,
        vec![&event_id],
        "only the re-pended event is a duplicate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_the_broker_rejects_is_failed_with_its_reason_while_other_keys_flow() {
    let db = TestDb::migrated("sweep_reject").await;
    let topic = new_topic("sweep_reject");
    let missing = format!("never_created_{}", std::process::id());
    let (mut config, _dir) = sweeping_config(&db);
    config.retry.max_retry = 2;
    config.retry.initial_backoff = Duration::from_millis(100);
    config.retry.max_backoff = Duration::from_millis(200);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;

    let outbox = Outbox::default();
    let mut tx = db.pool.start_transaction(TxOpts::default()).await.unwrap();
    let rejected = outbox
        .enqueue(&mut tx, NewEvent::new(&missing, "key-0", json!({"n": 0})))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    write_events(&db, &topic, 2, 100, 20).await;

    wait_for(
        "the rejected row FAILED",
        Duration::from_secs(60),
        || async { count_status(&db, rocketmq_outbox::outbox::Status::Failed).await == 1 },
    )
    .await;
    wait_until_sent(&db, 200, Duration::from_secs(60)).await;
    let (event_id, last_error): (String, String) = db
        .conn()
        .await
        .query_first(format!(
            "SELECT event_id, last_error FROM outbox_event WHERE status = {FAILED}"
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(event_id, rejected.to_string());
    println!("rejected topic: last_error = {last_error}");
    assert!(
        last_error.contains(&missing),
        "the reason names the topic: {last_error}"
    );
    let failed_total = rocketmq_outbox::metrics::relay().events_failed.get();
    assert!(failed_total >= 1, "FAILED rows are counted for alerting");
    relay.stop().await;
    let per_event = deliveries(&rocketmq().namesrv_addr(), &topic, 200).await;
    assert_eq!(per_event.len(), 200, "the other keys kept flowing");
}

/// A relay streaming into a new topic `name`, with a sweeper that would take a row only after a
/// minute: a row the stream did not read goes out in time only when the key-order guard asks
/// the sweeper for it.
async fn relay_sweeping_on_request(
    db: &TestDb,
    name: &str,
) -> (RunningRelay, String, tempfile::TempDir) {
    let topic = new_topic(name);
    let (mut config, dir) = sweeping_config(db);
    config.sweeper.min_age = Duration::from_secs(60);
    seed_checkpoint(&config, &current_position(db).await);
    (RunningRelay::start(&config).await, topic, dir)
}

/// Per-key order across the stream and the sweeper (contract 4): a row the stream cannot see
/// (written with `sql_log_bin = 0`) holds its key's streamed events back until it is sent, and
/// the sweeper is asked for it at once instead of after `min_age`. Other keys flow meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_the_stream_never_saw_is_published_before_the_later_streamed_events_of_its_key() {
    let db = TestDb::migrated("sweep_key_order").await;
    let (relay, topic, _dir) = relay_sweeping_on_request(&db, "sweep_key_order").await;

    // Keys hidden-0..4 each get an unlogged row, then three streamed ones; other keys flow.
    let hidden = write_unlogged(&db, &topic, 5).await;
    let mut conn = db.conn().await;
    for round in 0..3 {
        let events = (0..5)
            .map(|i| NewEvent::new(&topic, format!("hidden-{i}"), json!({ "round": round })))
            .collect();
        commit_events(&mut conn, events).await;
    }
    write_events(&db, &topic, 2, 50, 10).await;
    let started = std::time::Instant::now();
    wait_until_sent(&db, 120, Duration::from_secs(20)).await;
    let took = started.elapsed();
    relay.stop().await;

    let per_event = deliveries(&rocketmq().namesrv_addr(), &topic, 120).await;
    for event in &hidden {
        assert_eq!(per_event.get(event), Some(&1), "unlogged {event} sent once");
    }
    assert_every_event_arrived_in_key_order(&db, &topic, 120).await;
    println!(
        "5 unlogged rows held their keys back; all 120 events SENT in {took:.1?}, in key order"
    );
}

/// The rows this session's statements have read so far (`Handler_read_*`, summed).
async fn handler_reads(conn: &mut mysql_async::Conn) -> u64 {
    let rows: Vec<(String, String)> = conn
        .query("SHOW SESSION STATUS LIKE 'Handler_read%'")
        .await
        .unwrap();
    rows.iter().filter_map(|(_, v)| v.parse::<u64>().ok()).sum()
}

/// The key-order question reads, per key asked, that key's rows still waiting below its bound:
/// neither its SENT history nor the waiting backlog of other keys (a parked topic), on each
/// server (one range of `idx_waiting_key` per key; as an OR, MySQL once scanned the whole index).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_order_question_reads_only_the_asked_keys_waiting_rows() {
    use rocketmq_outbox::outbox::TableName;
    use rocketmq_outbox::sweep::waiting::{
        pending_topics, waiting_ids_of_topics, waiting_rows_between, waiting_rows_of_keys, OrderKey,
    };
    let db = TestDb::migrated("waiting_reads").await;
    let mut conn = db.conn().await;
    // Key a of `orders`: 2,000 SENT rows of history, then one PENDING row, then its newest.
    // Topic `stuck`: 2,000 PENDING rows of one key (a parked backlog). Key b: one SENDING row.
    let rows = |n: usize, row: &dyn Fn(usize) -> String| (0..n).map(row).collect::<Vec<_>>();
    let history = rows(2000, &|i| {
        format!("('a-sent-{i}', 'a', 'orders', '{{}}', {SENT})")
    });
    let parked = rows(2000, &|i| {
        format!("('p-{i}', 'p', 'stuck', '{{}}', {PENDING})")
    });
    let asked = [
        "('a-waits', 'a', 'orders', '{}', 0)",
        "('b-sending', 'b', 'orders', '{}', 1)",
        "('a-newest', 'a', 'orders', '{}', 0)",
        "('b-newest', 'b', 'orders', '{}', 0)",
    ]
    .map(String::from);
    for values in [history, parked, asked.to_vec()] {
        conn.query_drop(format!(
            "INSERT INTO outbox_event (event_id, biz_key, topic, payload, status) VALUES {}",
            values.join(", ")
        ))
        .await
        .unwrap();
    }
    conn.query_drop("ANALYZE TABLE outbox_event").await.unwrap();
    let mut ids = Vec::new();
    for event in ["a-waits", "b-sending", "a-newest", "b-newest"] {
        let id: Option<u64> = conn
            .exec_first("SELECT id FROM outbox_event WHERE event_id = ?", (event,))
            .await
            .unwrap();
        ids.push(id.unwrap());
    }
    let (a, b) = (OrderKey::new("orders", "a"), OrderKey::new("orders", "b"));
    let table = TableName::parse("outbox_event").unwrap();
    let before = handler_reads(&mut conn).await;
    let waiting = waiting_rows_of_keys(&mut conn, &table, &[(&a, ids[2]), (&b, ids[3])])
        .await
        .unwrap();
    let read = handler_reads(&mut conn).await - before;
    let found: Vec<(u64, &str, bool)> = waiting
        .iter()
        .map(|r| (r.id, r.key.biz_key.as_str(), r.sending))
        .collect();
    assert_eq!(found, vec![(ids[0], "a", false), (ids[1], "b", true)]);
    // Two keys' ranges: a handful of index entries, not a's 2,000 SENT rows nor the 2,000
    // parked ones (the counter query itself reads none of the outbox).
    println!("the key-order question read {read} rows (handler reads)");
    assert!(
        read < 50,
        "the question read {read} rows: a key's history or the parked backlog"
    );

    // The look (a topic's waiting ids up to the highest read, at most as many as the stream
    // carries plus one) reads index entries of that topic's waiting rows only, never the SENT
    // history the range spans nor another topic's parked backlog; the gap question (the waiting
    // rows of a range of ids) reads that range by primary key.
    let orders = ["orders".to_string()];
    let before = handler_reads(&mut conn).await;
    let look = waiting_ids_of_topics(&mut conn, &table, &orders, ids[3], 3)
        .await
        .unwrap();
    let look_read = handler_reads(&mut conn).await - before;
    assert_eq!(look.len(), 3, "the limit holds");
    let all = waiting_ids_of_topics(&mut conn, &table, &orders, ids[3], 100)
        .await
        .unwrap();
    let mut all: Vec<u64> = all.into_iter().map(|(_, id)| id).collect();
    all.sort_unstable();
    assert_eq!(
        all, ids,
        "the topic's four waiting rows, none of the parked topic's"
    );
    let before = handler_reads(&mut conn).await;
    let gap = waiting_rows_between(&mut conn, &table, (ids[0], ids[1]), 10)
        .await
        .unwrap();
    let gap_read = handler_reads(&mut conn).await - before;
    let gap: Vec<u64> = gap.iter().map(|row| row.id).collect();
    assert_eq!(gap, vec![ids[0], ids[1]], "a PENDING and a SENDING row");
    // The topics with PENDING rows, for the claims: one dive per topic, not the 2,000 parked
    // rows; the oldest PENDING row's topic first.
    let before = handler_reads(&mut conn).await;
    let topics = pending_topics(&mut conn, &table).await.unwrap();
    let topics_read = handler_reads(&mut conn).await - before;
    assert_eq!(topics, vec!["stuck".to_string(), "orders".to_string()]);
    println!(
        "a look read {look_read} rows, a gap question {gap_read}, the pending topics \
         {topics_read} (handler reads)"
    );
    assert!(
        topics_read < 20,
        "the pending topics read {topics_read} rows: the parked backlog"
    );
    assert!(
        look_read < 20 && gap_read < 20,
        "a look read {look_read}, a gap question {gap_read}: the SENT history or the backlog"
    );
}

/// Commits one event of topic `topic` (keys `filler-0..3`) every 10 ms until `stop`; returns how
/// many.
fn fill(db: &TestDb, topic: &str, stop: tokio_util::sync::CancellationToken) -> JoinHandle<u64> {
    let (pool, topic) = (db.pool.clone(), topic.to_string());
    tokio::spawn(async move {
        let mut conn = pool.get_conn().await.unwrap();
        let mut n = 0;
        while !stop.is_cancelled() {
            let event = NewEvent::new(&topic, format!("filler-{}", n % 4), json!({ "n": n }));
            commit_events(&mut conn, vec![event]).await;
            n += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        n
    })
}

/// Per-key order at no cost where nothing can break it: while every waiting row the stream has
/// read past is its own (a look off its path confirms it), single-event transactions are handed
/// on without a question. Rows it cannot see still hold their keys: ids it skipped (rows written
/// with the binlog off) are asked about as a range, and a row put back to PENDING by hand is
/// found by the next look. With `min_age` at a minute, only the guard's request to the sweeper
/// sends those rows in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_table_is_asked_nothing_and_rows_the_stream_cannot_see_still_hold_their_keys() {
    let db = TestDb::migrated("sweep_clean").await;
    let (relay, topic, _dir) = relay_sweeping_on_request(&db, "sweep_clean").await;
    let stop = tokio_util::sync::CancellationToken::new();
    let filler = fill(&db, &topic, stop.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Ids the stream skips: each round, a row of a new key with the binlog off, then two
    // streamed rows of that key, while the filler keeps the table known clean.
    let mut conn = db.conn().await;
    let mut hidden = Vec::new();
    for round in 0..5 {
        let key = format!("hidden-{round}");
        let mut unlogged = db.conn().await;
        unlogged
            .query_drop("SET SESSION sql_log_bin = 0")
            .await
            .unwrap();
        let event = NewEvent::new(&topic, &key, json!({ "hidden": round }));
        hidden.extend(commit_events(&mut unlogged, vec![event]).await);
        for n in 0..2 {
            let event = NewEvent::new(&topic, &key, json!({ "streamed": n }));
            commit_events(&mut conn, vec![event]).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // A row put back to PENDING by hand: the next look finds it; its key's later events wait.
    let (put_back, event_id): (u64, String) = conn
        .query_first(
            "SELECT id, event_id FROM outbox_event WHERE biz_key = 'filler-0' ORDER BY id LIMIT 1",
        )
        .await
        .unwrap()
        .unwrap();
    wait_for(
        "the first filler row SENT",
        Duration::from_secs(20),
        || async { count_status(&db, rocketmq_outbox::outbox::Status::Sent).await > 0 },
    )
    .await;
    conn.exec_drop(
        format!("UPDATE outbox_event SET status = {PENDING}, msg_id = DEFAULT, sent_at = DEFAULT WHERE id = ? AND status = {SENT}"),
        (put_back,),
    )
    .await
    .unwrap();
    // Written from here on, a second later (the looks come every 100 ms), filler-0's events
    // must follow it.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let boundary: u64 = conn
        .query_first("SELECT MAX(id) FROM outbox_event")
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    let filled = filler.await.unwrap();
    let total = filled + 15;
    wait_until_sent(&db, total, Duration::from_secs(20)).await;
    let checks = relay.stop().await.key_order_checks;
    println!("{filled} filler events; batches asked: {checks:?}");

    let messages = stored_messages(&topic, total as usize + 1).await;
    let rows = outbox_rows(&db).await;
    assert_key_order(&rows, &messages);
    for event in &hidden {
        let copies = messages
            .iter()
            .filter(|m| m.properties["event_id"] == *event);
        assert_eq!(copies.count(), 1, "unlogged {event} sent once");
    }
    // In the key's queue, by offset: the put-back row's second copy, then every filler-0 event
    // written after the boundary.
    let id_of: std::collections::HashMap<&str, u64> =
        rows.iter().map(|r| (r.1.as_str(), r.0)).collect();
    let mut key_queue: Vec<&ReceivedMessage> = (messages.iter())
        .filter(|m| m.properties["biz_key"] == "filler-0")
        .collect();
    key_queue.sort_by_key(|m| m.queue_offset);
    let again = (key_queue.iter())
        .rposition(|m| m.properties["event_id"] == event_id)
        .expect("the put-back row");
    assert!(again > 0, "the put-back row was sent a second time");
    let after_boundary =
        |m: &&&ReceivedMessage| id_of[m.properties["event_id"].as_str()] > boundary;
    let ahead: Vec<_> = key_queue[..again].iter().filter(after_boundary).collect();
    assert!(
        ahead.is_empty(),
        "filler-0 events written after the boundary went ahead of the put-back row: {}",
        ahead.len()
    );
    let behind = key_queue[again..].iter().filter(after_boundary).count();
    assert!(
        behind > 0,
        "filler-0 events were written after the boundary"
    );
    assert!(
        checks.none > checks.keys,
        "most batches asked nothing: {checks:?}"
    );
    assert!(
        checks.gap >= 1,
        "the ids written with the binlog off were asked about: {checks:?}"
    );
}
