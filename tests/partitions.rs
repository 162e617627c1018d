//! Daily partitions on the real servers (MariaDB, or MySQL with `OUTBOX_TEST_DB=mysql`) and a
//! real broker, judged by what the broker stored: events written across a day boundary and into
//! the catch-all arrive in key order; a past day holding a FAILED row (or a row an operator is
//! putting back to PENDING while maintenance runs) is never dropped, a clean one is, with one
//! audit row per drop; the relay streams on while partitions are added and dropped over and
//! over; `convert` keeps every PENDING and SENT row; the `[cleanup] partitions` round inside
//! `run` creates the days ahead and exports `outbox_partitions_ahead`.

use crate::common;
#[path = "partitions/helpers.rs"]
mod helpers;

use common::relay::{
    assert_every_event_arrived_in_key_order, commit_events, count_status, current_position,
    seed_checkpoint, sweeping_config, wait_for, wait_until_sent, RunningRelay,
};
use common::rocketmq::{new_topic, rocketmq};
use common::TestDb;
use helpers::*;
use mysql_async::prelude::*;
use outbox_devenv::TopicReader;
use rocketmq_outbox::operate::partitions::{self, Convert, ConvertOutcome};
use rocketmq_outbox::operate::{Action, Compensation, Selection};
use rocketmq_outbox::outbox::status::codes::PENDING;
use rocketmq_outbox::outbox::TableName;
use rocketmq_outbox::producer::NewEvent;
use serde_json::json;
use std::collections::HashMap;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_across_a_day_boundary_and_into_the_catch_all_arrive_in_key_order() {
    let db = TestDb::migrated("part_boundary").await;
    let topic = new_topic("part_boundary");
    let done = convert(2).run(&db.pool, &outbox(), |_| {}).await.unwrap();
    assert_eq!(done[0].outcome, ConvertOutcome::Converted);
    assert_eq!(done[0].partitions, 4, "today, 2 days ahead, p_future");
    let (config, _dir) = sweeping_config(&db);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;

    // 8 keys, 30 rounds straddling tomorrow's midnight (10 ms apart), then 5 rounds 30 days
    // ahead, beyond the last day partition: they land in p_future.
    let mut conn = db.conn().await;
    let tomorrow_ms = (midnight(&mut conn).await + DAY) * 1000;
    for round in 0..35i64 {
        let at_ms = if round < 30 {
            tomorrow_ms - 150 + round * 10
        } else {
            tomorrow_ms + 30 * DAY * 1000 + round
        };
        let at = at_ms as f64 / 1000.0;
        let events = (0..8)
            .map(|k| NewEvent::new(&topic, format!("key-{k}"), json!({ "round": round })))
            .collect();
        commit_at(&mut conn, at, events).await;
    }
    let (today, next) = (day_name(&mut conn, 0).await, day_name(&mut conn, 1).await);
    let split = (
        rows_in(&mut conn, &today).await,
        rows_in(&mut conn, &next).await,
        rows_in(&mut conn, "p_future").await,
    );
    println!("rows in {today}, {next}, p_future: {split:?}");
    assert_eq!(split, (15 * 8, 15 * 8, 5 * 8));
    wait_until_sent(&db, 280, Duration::from_secs(60)).await;
    relay.stop().await;
    assert_every_event_arrived_in_key_order(&db, &topic, 280).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_past_day_with_an_unfinished_row_is_kept_and_each_clean_day_dropped_is_audited() {
    let db = TestDb::migrated("part_drop").await;
    let topic = new_topic("part_drop");
    let mut conn = db.conn().await;
    sent_rows_on(&mut conn, &topic, 12, 5).await;
    let failed = sent_rows_on(&mut conn, &topic, 11, 5).await;
    set_status(&mut conn, &failed[..1], "3, last_error = 'rejected'").await;
    sent_rows_on(&mut conn, &topic, 10, 5).await;
    let racing = sent_rows_on(&mut conn, &topic, 9, 5).await;
    sent_rows_on(&mut conn, &topic, 0, 5).await;
    let done = convert(3).run(&db.pool, &outbox(), |_| {}).await.unwrap();
    assert_eq!(
        done[0].partitions,
        13 + 3 + 1,
        "days -12 ..= +3 and p_future"
    );
    assert_eq!(
        done[0].key_changes,
        vec![
            "DROP PRIMARY KEY, ADD PRIMARY KEY (`id`, `created_at`)",
            "DROP INDEX `uk_event_id`, ADD INDEX `idx_event_id` (`event_id`)"
        ]
    );
    let (d12, d11, d10, d9) = (
        day_name(&mut conn, -12).await,
        day_name(&mut conn, -11).await,
        day_name(&mut conn, -10).await,
        day_name(&mut conn, -9).await,
    );

    // The race: an operator's resend of a day -9 row is in flight (its transaction holds the
    // row) while maintenance with a 8-day retention starts. Maintenance waits for the table
    // lock, then sees the row PENDING and keeps the day.
    let resend = Compensation {
        action: Action::Resend,
        operator: "alice".into(),
        reason: "INC-1: consumer restore".into(),
        selection: Selection {
            event_ids: racing[..1].to_vec(),
            ..Selection::default()
        },
    };
    let mut tx = db
        .pool
        .start_transaction(mysql_async::TxOpts::default())
        .await
        .unwrap();
    tx.exec_drop(
        "SELECT id FROM outbox_event WHERE event_id = ? FOR UPDATE",
        (&racing[0],),
    )
    .await
    .unwrap();
    let maintenance = {
        let db = db.clone_handle();
        tokio::spawn(async move {
            let started = Instant::now();
            let done = maintain_once(&db, &maintain(3, 8)).await;
            (done, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The operator's change commits while maintenance waits (here: the held row is resent).
    tx.exec_drop(
        format!("UPDATE outbox_event SET status = {PENDING}, msg_id = DEFAULT, sent_at = DEFAULT WHERE event_id = ?"),
        (&racing[0],),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    tx.commit().await.unwrap();
    let (first, waited) = maintenance.await.unwrap();
    println!("maintain (retention 8d) took {waited:?}, waiting for the operator: {first:?}");
    assert!(
        waited >= Duration::from_millis(500),
        "maintenance waited for the operator's transaction ({waited:?})"
    );
    assert_eq!(names(&first), vec![d12.clone(), d10.clone()]);
    let kept: Vec<(String, u64)> = first
        .kept
        .iter()
        .map(|k| (k.partition.clone(), k.unfinished))
        .collect();
    assert_eq!(kept, vec![(d11.clone(), 1), (d9.clone(), 1)]);
    assert!(first.created.is_empty(), "3 days ahead exist already");
    assert_eq!(first.days_ahead, 3);
    assert_eq!(
        rows_in(&mut conn, &d11).await,
        5,
        "the FAILED row's day is whole"
    );
    assert_eq!(
        rows_in(&mut conn, &d9).await,
        5,
        "the resent row's day is whole"
    );
    assert_eq!(db.count("outbox_event").await, 15);
    assert_eq!(
        drop_audits(&mut conn).await,
        vec![(d12, "tester".to_string()), (d10, "tester".to_string())],
        "one audit row per drop"
    );

    // Running it again changes nothing; once the rows are finished their days go too.
    let again = maintain_once(&db, &maintain(3, 8)).await;
    assert!(again.created.is_empty() && again.dropped.is_empty());
    // The FAILED row is decided (SENT here), so day -11 goes; the day -9 row is resent
    // through the audited command (PENDING again), so day -9 stays.
    set_status(&mut conn, &failed[..1], "2").await;
    set_status(&mut conn, &racing[..1], "2").await;
    let resent = resend.run(&db.pool, &outbox()).await.unwrap();
    assert_eq!(resent.rows.len(), 1);
    let still = maintain_once(&db, &maintain(3, 8)).await;
    assert_eq!(
        names(&still),
        vec![d11.clone()],
        "day -9 now has a PENDING row"
    );
    assert_eq!(drop_audits(&mut conn).await.len(), 3);
    let audited: u64 = conn
        .query_first("SELECT COUNT(*) FROM outbox_audit WHERE action = 'resend'")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(audited, 1, "compensation still writes its audit row");

    // A table partitioned some other way is left alone by both commands.
    conn.query_drop("CREATE TABLE outbox_hashed LIKE outbox_event")
        .await
        .unwrap();
    conn.query_drop("ALTER TABLE outbox_hashed PARTITION BY HASH (id) PARTITIONS 2")
        .await
        .unwrap();
    let hashed = vec![TableName::parse("outbox_hashed").unwrap()];
    let done = maintain(3, 8).run(&db.pool, &hashed).await.unwrap();
    assert!(done[0].created.is_empty() && done[0].dropped.is_empty());
    let why = done[0].skipped.as_deref().unwrap_or_default();
    assert!(why.contains("HASH") && why.contains("left alone"), "{why}");
    let converted = convert(3).run(&db.pool, &hashed, |_| {}).await.unwrap();
    assert_eq!(converted[0].outcome, ConvertOutcome::AlreadyPartitioned);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_streams_on_while_partitions_are_added_and_dropped() {
    let db = TestDb::migrated("part_churn").await;
    let topic = new_topic("part_churn");
    let mut conn = db.conn().await;
    for days_ago in 11..=30 {
        sent_rows_on(&mut conn, &topic, days_ago, 3).await;
    }
    convert(1).run(&db.pool, &outbox(), |_| {}).await.unwrap();
    let (config, _dir) = sweeping_config(&db);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;

    // A writer commits one event every ~5 ms on 8 keys while maintenance, every 150 ms, adds
    // one day ahead and drops one past day (retention shrinking from 30 to 8 days).
    let writing = Duration::from_secs(8);
    let writer = {
        let db = db.clone_handle();
        let topic = topic.clone();
        tokio::spawn(async move {
            let mut conn = db.conn().await;
            let mut committed: HashMap<String, i64> = HashMap::new();
            let started = Instant::now();
            let mut n = 0;
            while started.elapsed() < writing {
                let event = NewEvent::new(&topic, format!("key-{}", n % 8), json!({ "n": n }));
                let id = commit_events(&mut conn, vec![event]).await.remove(0);
                committed.insert(id, unix_ms());
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            committed
        })
    };
    let (mut added, mut dropped, mut longest) = (0, 0, Duration::ZERO);
    let mut runs = Vec::new(); // (start, end) of each maintenance run, unix ms
    for i in 0..23u32 {
        let started = Instant::now();
        let from = unix_ms();
        let done = maintain_once(&db, &maintain(2 + i, u64::from(30 - i))).await;
        runs.push((from, unix_ms()));
        longest = longest.max(started.elapsed());
        added += done.created.len();
        dropped += done.dropped.len();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let committed = writer.await.unwrap();
    let total = committed.len();
    println!(
        "{total} events committed while maintenance added {added} and dropped {dropped} \
         partitions (longest maintenance run {longest:?})"
    );
    // One day ahead added per run; days -30 ..= -9 dropped as the retention shrinks.
    assert_eq!((added, dropped), (23, 22));
    assert_eq!(
        db.count("outbox_event").await,
        total as u64,
        "every seeded day dropped"
    );
    wait_until_sent(&db, total as u64, Duration::from_secs(60)).await;
    relay.stop().await;
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Failed).await,
        0
    );
    assert_every_event_arrived_in_key_order(&db, &topic, total).await;

    // Commit → stored on the broker, from the broker's store timestamps.
    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), &topic)
        .await
        .unwrap();
    let messages = reader
        .read_at_least(total, Duration::from_secs(60))
        .await
        .unwrap();
    reader.close().await;
    // (gap, commit time) of each event's first arrival.
    let mut gaps: Vec<(i64, i64)> = messages
        .iter()
        .filter_map(|m| {
            committed
                .get(&m.properties["event_id"])
                .map(|c| (m.store_timestamp - c, *c))
        })
        .collect();
    gaps.sort();
    let (p50, max) = (gaps[gaps.len() / 2].0, gaps[gaps.len() - 1].0);
    println!("commit -> stored during add/drop: p50 {p50} ms, max {max} ms");
    let overlapping = |(gap, at): (i64, i64)| {
        runs.iter()
            .filter(|(from, to)| *from < at + gap && *to > at)
            .map(|(from, to)| to - from)
            .collect::<Vec<_>>()
    };
    for worst in gaps.iter().rev().take(3) {
        println!(
            "  gap {} ms: maintenance runs overlapping it took {:?} ms",
            worst.0,
            overlapping(*worst)
        );
    }
    assert!(
        max < 2_000,
        "no pause while partitions change: max gap {max} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn convert_keeps_pending_and_sent_rows_and_the_relay_delivers_on() {
    let db = TestDb::migrated("part_convert").await;
    let topic = new_topic("part_convert");
    let (config, _dir) = sweeping_config(&db);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;
    let mut conn = db.conn().await;
    let today = midnight(&mut conn).await as f64;
    for (round, at) in [today - 3.0 * DAY as f64, today + 60.0].iter().enumerate() {
        let events = (0..25)
            .map(|k| NewEvent::new(&topic, format!("key-{}", k % 5), json!({ "r": round })))
            .collect();
        commit_at(&mut conn, *at, events).await;
    }
    wait_until_sent(&db, 50, Duration::from_secs(60)).await;
    relay.stop().await;
    // PENDING rows the relay has not seen yet (it is stopped), then convert.
    for _ in 0..6 {
        let events = (0..10)
            .map(|k| NewEvent::new(&topic, format!("key-{}", k % 5), json!({ "later": k })))
            .collect();
        commit_events(&mut conn, events).await;
    }
    let before: Vec<(i64, String, u8)> = conn
        .query("SELECT id, event_id, status FROM outbox_event ORDER BY id")
        .await
        .unwrap();
    let dry = Convert {
        dry_run: true,
        ..convert(2)
    };
    let planned = dry.run(&db.pool, &outbox(), |_| {}).await.unwrap();
    assert_eq!(planned[0].outcome, ConvertOutcome::WouldConvert);
    assert!(partitions::read_layout(&mut conn, &outbox()[0])
        .await
        .unwrap()
        .is_none());
    let done = convert(2).run(&db.pool, &outbox(), |_| {}).await.unwrap();
    println!("convert: {:?}", done[0]);
    assert_eq!(
        (done[0].outcome, done[0].rows, done[0].partitions),
        (ConvertOutcome::Converted, 110, 4 + 2 + 1)
    );
    let after: Vec<(i64, String, u8)> = conn
        .query("SELECT id, event_id, status FROM outbox_event ORDER BY id")
        .await
        .unwrap();
    assert_eq!(before, after, "every row kept, with its status");
    assert_eq!(
        (
            count_status(&db, rocketmq_outbox::outbox::Status::Pending).await,
            count_status(&db, rocketmq_outbox::outbox::Status::Sent).await
        ),
        (60, 50)
    );
    let again = convert(2).run(&db.pool, &outbox(), |_| {}).await.unwrap();
    assert_eq!(again[0].outcome, ConvertOutcome::AlreadyPartitioned);
    let audits: u64 = conn
        .query_first("SELECT COUNT(*) FROM outbox_audit WHERE action = 'partition-convert'")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(audits, 1, "one audit row, for the one conversion");
    // A converted table has what the relay needs (its idx_event_id is not unique): migrate
    // adopts nothing, and run has nothing to warn about.
    let tables = db.config.outbox_tables();
    let report = rocketmq_outbox::schema::migrate(&mut conn, &tables)
        .await
        .unwrap();
    assert!(report.adopted.is_empty(), "{report:?}");
    assert_eq!(
        rocketmq_outbox::schema::check_for_run(&mut conn, &tables)
            .await
            .unwrap(),
        Ok(Vec::new())
    );

    // The relay resumes from its checkpoint (before the ALTER) and delivers on.
    let relay = RunningRelay::start(&config).await;
    for _ in 0..4 {
        let events = (0..10)
            .map(|k| NewEvent::new(&topic, format!("key-{}", k % 5), json!({ "after": k })))
            .collect();
        commit_events(&mut conn, events).await;
    }
    wait_until_sent(&db, 150, Duration::from_secs(60)).await;
    relay.stop().await;
    assert_every_event_arrived_in_key_order(&db, &topic, 150).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cleanup_round_inside_run_creates_days_ahead_and_drops_clean_past_days() {
    let db = TestDb::migrated("part_run").await;
    let topic = new_topic("part_run");
    let mut conn = db.conn().await;
    sent_rows_on(&mut conn, &topic, 10, 4).await;
    convert(1).run(&db.pool, &outbox(), |_| {}).await.unwrap();
    let old_day = day_name(&mut conn, -10).await;
    let (mut config, _dir) = sweeping_config(&db);
    config.cleanup.enabled = true;
    config.cleanup.partitions = true;
    config.cleanup.partitions_ahead = 4;
    config.cleanup.retention = Duration::from_secs(7 * DAY as u64);
    config.metrics.refresh = Duration::from_millis(200);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;

    let table = rocketmq_outbox::db::Deployment::resolve(&config)
        .unwrap()
        .tables[0]
        .to_string();
    let label = rocketmq_outbox::metrics::TableLabel { table };
    wait_for("4 days ahead exported", Duration::from_secs(30), || async {
        rocketmq_outbox::metrics::relay()
            .partitions_ahead
            .get_or_create(&label)
            .get()
            == 4
    })
    .await;
    // The first round, at start-up: days -10, -9 and -8 are wholly older than 7 days and
    // clean (only day -10 had rows, all SENT).
    wait_for("3 past days dropped", Duration::from_secs(30), || async {
        drop_audits(&mut db.conn().await).await.len() == 3
    })
    .await;
    let status = partitions::status(&db.pool, &outbox()).await.unwrap();
    assert_eq!(status[0].days_ahead, 4);
    let mut expected = Vec::new();
    for d in [-10, -9, -8] {
        expected.push(day_name(&mut conn, d).await);
    }
    let audits = drop_audits(&mut conn).await;
    assert_eq!(
        audits.iter().map(|a| a.0.clone()).collect::<Vec<_>>(),
        expected
    );
    assert_eq!(expected[0], old_day);
    for (_, operator) in &audits {
        assert!(operator.starts_with("outbox-relay run ("), "{operator}");
    }
    assert_eq!(db.count("outbox_event").await, 0);

    let events = (0..20)
        .map(|k| NewEvent::new(&topic, format!("key-{}", k % 4), json!({ "k": k })))
        .collect();
    commit_events(&mut conn, events).await;
    wait_until_sent(&db, 20, Duration::from_secs(60)).await;
    relay.stop().await;
    assert_every_event_arrived_in_key_order(&db, &topic, 20).await;
}

#[tokio::test]
async fn the_commands_require_an_operator_convert_once_and_report_as_json() {
    let db = TestDb::migrated("part_cli").await;
    let mut conn = db.conn().await;
    sent_rows_on(&mut conn, "t", 2, 3).await;
    let url = db.url.as_str();
    let (ok, _, err) = outbox_relay(&["--mysql-url", url, "partitions", "convert"]);
    assert!(!ok && err.contains("--operator is required"), "{err}");
    let (ok, out, err) = outbox_relay(&["--mysql-url", url, "partitions", "status"]);
    assert!(
        ok && out.contains("outbox_event: not partitioned"),
        "{out}{err}"
    );
    let convert = [
        "--mysql-url",
        url,
        "partitions",
        "convert",
        "--ahead",
        "2",
        "--operator",
        "alice",
        "--reason",
        "CHG-7",
    ];
    let (ok, out, err) = outbox_relay(&convert);
    println!("{out}");
    assert!(ok, "{err}");
    assert!(
        out.contains("outbox_event: converted 3 rows into 6 partitions"),
        "{out}"
    );
    let (ok, out, _) = outbox_relay(&convert);
    assert!(
        ok && out.contains("already partitioned") && out.contains("nothing done"),
        "{out}"
    );
    let (ok, out, err) = outbox_relay(&["--mysql-url", url, "partitions", "status", "--json"]);
    assert!(ok, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status[0]["days_ahead"], 2);
    assert_eq!(status[0]["partitions"].as_array().unwrap().len(), 6);
    assert_eq!(status[0]["partitions"][5]["below"], "MAXVALUE");
    let maintain = [
        "--mysql-url",
        url,
        "partitions",
        "maintain",
        "--ahead",
        "3",
        "--retention",
        "1d",
        "--operator",
        "alice",
        "--reason",
        "daily",
        "--json",
    ];
    let (ok, out, err) = outbox_relay(&maintain);
    assert!(ok, "{err}");
    let done: serde_json::Value = serde_json::from_str(&out).unwrap();
    println!("{out}");
    assert_eq!(done[0]["created"].as_array().unwrap().len(), 1);
    assert_eq!(
        done[0]["dropped"].as_array().unwrap().len(),
        1,
        "day -2 (day -1 ends today)"
    );
    assert_eq!(done[0]["days_ahead"], 3);
}
