//! Poll mode end to end (real MariaDB, real RocketMQ): arrival and per-key order like the CDC
//! relay, lease recovery of a crashed owner's rows, bad rows FAILED, the optimistic claim.

use crate::common;

use common::relay::{
    assert_every_event_arrived_in_key_order, commit_events, count_status, poll_config,
    sent_latencies_ms, wait_for, wait_until_sent, write_events, RunningRelay,
};
use common::rocketmq::new_topic;
use common::TestDb;
use mysql_async::prelude::*;
use mysql_async::TxOpts;
use rocketmq_outbox::outbox::message::RowLimits;
use rocketmq_outbox::outbox::status::codes::{FAILED, PENDING, SENDING, SENT};
use rocketmq_outbox::outbox::TableName;
use rocketmq_outbox::pipeline::RunOptions;
use rocketmq_outbox::producer::NewEvent;
use rocketmq_outbox::sweep::{ClaimStrategy, Claimed, Claimer};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_mode_delivers_every_event_in_key_order_and_marks_it_sent() {
    let db = TestDb::migrated("poll_e2e").await;
    let topic = new_topic("poll_e2e");
    let (mut config, _dir) = poll_config(&db, "poller-1", Duration::from_secs(30));
    config.poll.interval = Duration::from_millis(500); // the default
    let relay = RunningRelay::start(&config).await;

    const TOTAL: usize = 10_000;
    let started = Instant::now();
    write_events(&db, &topic, 4, TOTAL / 4, 500).await;
    wait_until_sent(&db, TOTAL as u64, Duration::from_secs(180)).await;
    let elapsed = started.elapsed();
    let summary = relay.stop().await;
    assert_eq!(summary.marked.sent, TOTAL as u64);
    assert_eq!(summary.marked.failed, 0);
    let latencies = sent_latencies_ms(&db).await;
    println!(
        "poll mode: {TOTAL} events written and SENT in {elapsed:?} ({:.0} events/s); \
         commit→SENT p50 {:.0} ms, p99 {:.0} ms",
        TOTAL as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99)
    );

    assert_every_event_arrived_in_key_order(&db, &topic, TOTAL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_leases_return_to_pending_and_are_published_live_ones_and_bad_rows_are_not() {
    let db = TestDb::migrated("poll_lease").await;
    let topic = new_topic("poll_lease");
    write_events(&db, &topic, 1, 20, 5).await;
    let mut conn = db.conn().await;
    // A crashed owner's rows (lease expired), another live owner's row (lease in the future).
    conn.query_drop(format!(
        "UPDATE outbox_event SET status = {SENDING}, owner = 'dead', \
         lease_until = NOW(3) - INTERVAL 1 SECOND WHERE id <= 19"
    ))
    .await
    .unwrap();
    conn.query_drop(format!(
        "UPDATE outbox_event SET status = {SENDING}, owner = 'alive', \
         lease_until = NOW(3) + INTERVAL 1 HOUR WHERE id = 20"
    ))
    .await
    .unwrap();
    // A row the producer would refuse (topic with a space): FAILED with its reason.
    conn.exec_drop(
        "INSERT INTO outbox_event (event_id, biz_key, topic, payload) VALUES ('bad-1', 'k', ?, '{}')",
        (format!("{topic} x"),),
    )
    .await
    .unwrap();

    let (config, _dir) = poll_config(&db, "poller-1", Duration::from_secs(2));
    let relay = RunningRelay::start(&config).await;
    wait_until_sent(&db, 19, Duration::from_secs(60)).await;
    wait_for("the bad row FAILED", Duration::from_secs(30), || async {
        count_status(&db, rocketmq_outbox::outbox::Status::Failed).await == 1
    })
    .await;
    let summary = relay.stop().await;
    assert_eq!((summary.marked.sent, summary.marked.failed), (19, 1));

    let live: (u8, Option<String>) = conn
        .query_first("SELECT status, owner FROM outbox_event WHERE id = 20")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        live,
        (1, Some("alive".into())),
        "a live lease is left alone"
    );
    let failed: (String, Option<String>, Option<String>) = conn
        .query_first(format!(
            "SELECT event_id, last_error, owner FROM outbox_event WHERE status = {FAILED}"
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(failed.0, "bad-1");
    assert!(
        failed.1.as_deref().is_some_and(|e| e.contains("topic")),
        "{failed:?}"
    );
    assert_eq!(failed.2, None, "FAILED rows keep no owner");
    let unclaimed: u64 = conn
        .query_first("SELECT COUNT(*) FROM outbox_event WHERE owner = 'poller-1'")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(unclaimed, 0, "nothing is left claimed by the stopped relay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optimistic_claim_without_skip_locked_delivers_everything_once() {
    let db = TestDb::migrated("poll_optimistic").await;
    let topic = new_topic("poll_optimistic");
    let (config, _dir) = poll_config(&db, "poller-1", Duration::from_secs(30));
    let options = RunOptions {
        claim_strategy: Some(ClaimStrategy::Optimistic),
        ..RunOptions::default()
    };
    let relay = RunningRelay::start_with(&config, options).await;
    write_events(&db, &topic, 2, 250, 20).await;
    wait_until_sent(&db, 500, Duration::from_secs(60)).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.sent, 500);
    assert_every_event_arrived_in_key_order(&db, &topic, 500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_without_the_pending_index_is_still_claimed() {
    // The claim names `idx_pending` (migration 0008) so the optimizer cannot walk the primary
    // key past every SENT row; a table migrated before 0008 is claimed without the hint.
    let db = TestDb::migrated("poll_no_index").await;
    db.conn()
        .await
        .query_drop("ALTER TABLE outbox_event DROP INDEX idx_pending")
        .await
        .unwrap();
    let topic = new_topic("poll_no_index");
    let (config, _dir) = poll_config(&db, "poller-1", Duration::from_secs(30));
    let relay = RunningRelay::start(&config).await;
    write_events(&db, &topic, 2, 50, 10).await;
    wait_until_sent(&db, 100, Duration::from_secs(60)).await;
    let summary = relay.stop().await;
    assert_eq!((summary.marked.sent, summary.marked.failed), (100, 0));
    assert_every_event_arrived_in_key_order(&db, &topic, 100).await;
}

/// 5,000 rows over 10 keys of which the first 4,900 are SENT, with statistics taken while all
/// were PENDING (what makes a primary-key walk look cheapest); a connection to their database,
/// the table.
async fn mostly_sent_outbox(name: &str) -> (TestDb, mysql_async::Conn, TableName) {
    let db = TestDb::migrated(name).await;
    write_events(&db, &new_topic(name), 1, 5000, 10).await;
    let mut conn = db.conn().await;
    conn.query_drop("ANALYZE TABLE outbox_event").await.unwrap();
    conn.query_drop(format!(
        "UPDATE outbox_event SET status = {SENT} WHERE id <= 4900"
    ))
    .await
    .unwrap();
    let table = TableName::parse(&format!("{}.outbox_event", db.name())).unwrap();
    (db, conn, table)
}

/// Rows and index entries this session has read since `FLUSH STATUS` (`Handler_read_next` +
/// `Handler_read_rnd_next`; `SHOW STATUS` itself counts in neither).
async fn rows_read(conn: &mut mysql_async::Conn) -> u64 {
    let rows: Vec<(String, u64)> = conn
        .query(
            "SHOW SESSION STATUS WHERE Variable_name IN \
             ('Handler_read_next', 'Handler_read_rnd_next')",
        )
        .await
        .unwrap();
    rows.iter().map(|(_, n)| n).sum()
}

/// A SKIP LOCKED claimer of up to 100 rows of `table` for the owner "reader".
fn claimer(table: TableName) -> Claimer {
    Claimer {
        table: Arc::new(table),
        owner: "reader".into(),
        lease: Duration::from_secs(30),
        batch_size: 100,
        min_age: Duration::ZERO,
        strategy: ClaimStrategy::SkipLocked,
        limits: RowLimits {
            max_payload_bytes: 1 << 20,
            max_delay: rocketmq_outbox::outbox::DEFAULT_MAX_DELAY,
        },
        cursor: Default::default(),
        held: Default::default(),
        stalls: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_reads_pending_rows_only_however_many_are_sent() {
    // The claim must walk PENDING rows, not the primary key past every SENT row (a poll drain
    // read 38k rows per 100-row claim that way); and its check that no older row of a claimed
    // key still waits must not read each key's SENT history (490 rows a key here).
    let (_db, mut conn, table) = mostly_sent_outbox("poll_claim_reads").await;
    conn.query_drop("FLUSH STATUS").await.unwrap();
    let claimed = claimer(table).claim(&mut conn).await.unwrap();
    let reads = rows_read(&mut conn).await;
    assert_eq!(claimed.len(), 100);
    assert!(
        reads < 1000,
        "the claim read {reads} rows for 100 PENDING ones behind 4,900 SENT ones"
    );
}

#[tokio::test]
async fn a_claim_never_takes_a_row_while_an_older_row_of_its_key_waits() {
    // Keys a, b, c take turns: ids 1, 4, 7, 10 are a's; 2, 5, 8, 11 b's; 3, 6, 9, 12 c's. Row 1
    // is locked by another transaction (SKIP LOCKED passes over it) and row 2 is SENDING under
    // the claimer's own owner name but not held by it (an earlier life of the same instance id
    // left it): none of a's or b's later rows may be claimed before them.
    let (db, mut conn, claimer) = claimable_outbox("poll_claim_key_order", 12, |i| {
        ["a", "b", "c"][i % 3].into()
    })
    .await;
    conn.query_drop(format!(
        "UPDATE outbox_event SET status = {SENDING}, owner = 'reader' WHERE id = 2"
    ))
    .await
    .unwrap();
    let mut holder = db.conn().await;
    let mut held = holder.start_transaction(TxOpts::default()).await.unwrap();
    held.query_drop("SELECT id FROM outbox_event WHERE id = 1 FOR UPDATE")
        .await
        .unwrap();
    let ids = claim_ids(&claimer, &mut conn).await;
    assert_eq!(ids, [3, 6, 9, 12], "only key c's rows");
    held.rollback().await.unwrap();
}

/// A stream held behind a long stall's parked rows asks the sweeper for all of them (over
/// 100,000 after 10 minutes at 200 events/s): a claim takes one batch of them, the oldest, never
/// a statement past the server's 65,535 placeholders (which failed at every ask, and nothing
/// was delivered again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_70_000_named_rows_takes_the_oldest_batch() {
    let db = TestDb::migrated("poll_claim_these").await;
    let mut conn = db.conn().await;
    let table = TableName::parse(&format!("{}.outbox_event", db.name())).unwrap();
    // 70,000 PENDING rows over 7 keys, by doubling.
    conn.exec_drop(
        "INSERT INTO outbox_event (event_id, biz_key, topic, payload) VALUES ('r0', 'k0', ?, '{}')",
        (new_topic("poll_claim_these"),),
    )
    .await
    .unwrap();
    let mut rows = 1;
    while rows < 70_000 {
        conn.query_drop(
            "INSERT INTO outbox_event (event_id, biz_key, topic, payload) \
             SELECT UUID(), CONCAT('k', id % 7), topic, payload FROM outbox_event LIMIT 35000",
        )
        .await
        .unwrap();
        rows = rows_now(&mut conn).await;
    }
    let mut ids: Vec<u64> = conn
        .query("SELECT id FROM outbox_event ORDER BY id DESC")
        .await
        .unwrap();
    let claimed = claimer(table.clone())
        .claim_these(&mut conn, &ids)
        .await
        .unwrap();
    ids.sort_unstable();
    let got: Vec<u64> = claimed.iter().map(Claimed::id).collect();
    assert_eq!(got, ids[..100], "the oldest 100, in id order");

    // The stream's look at keys held behind them reads a bounded part, and says so.
    use rocketmq_outbox::sweep::waiting::{waiting_rows_of_keys_at_most, OrderKey};
    let topic: String = conn
        .query_first("SELECT topic FROM outbox_event LIMIT 1")
        .await
        .unwrap()
        .unwrap();
    let keys: Vec<OrderKey> = (0..7)
        .map(|k| OrderKey::new(&topic, format!("k{k}")))
        .collect();
    let asked: Vec<(&OrderKey, u64)> = keys.iter().map(|k| (k, u64::MAX)).collect();
    let (rows, complete) = waiting_rows_of_keys_at_most(&mut conn, &table, &asked, 1024)
        .await
        .unwrap();
    assert!(rows.len() <= 1024 && !rows.is_empty() && !complete);
    let (rows, complete) = waiting_rows_of_keys_at_most(&mut conn, &table, &asked, 1_000_000)
        .await
        .unwrap();
    assert_eq!(
        (rows.len() as u64, complete),
        (rows_now(&mut conn).await, true)
    );
}

async fn rows_now(conn: &mut mysql_async::Conn) -> u64 {
    conn.query_first("SELECT COUNT(*) FROM outbox_event")
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn lease_upkeep_reads_sending_rows_only() {
    // Recovering expired leases, renewing and releasing them find the few SENDING rows through
    // `idx_pending (status)` (0010 dropped `idx_lease`), never by reading the SENT ones.
    use rocketmq_outbox::sweep::lease;

    let (_db, mut conn, table) = mostly_sent_outbox("poll_lease_reads").await;
    conn.query_drop(format!(
        "UPDATE outbox_event SET status = {SENDING}, owner = 'gone' WHERE id > 4950"
    ))
    .await
    .unwrap();
    conn.query_drop("FLUSH STATUS").await.unwrap();
    let held = lease::HeldRows::default();
    held.add(&table, 4951..=5000);
    let renewed = lease::renew(&mut conn, &table, "gone", &held, Duration::ZERO).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let recovered = lease::recover_expired(&mut conn, &table).await;
    let released = lease::release(&mut conn, &table, "gone").await;
    let read = rows_read(&mut conn).await;
    assert_eq!(
        (renewed.unwrap(), recovered.unwrap(), released.unwrap()),
        (50, 50, 0)
    );
    assert!(
        read < 1000,
        "lease upkeep read {read} rows for 50 SENDING among 5,000"
    );
}

#[tokio::test]
async fn only_the_rows_this_process_claimed_have_their_leases_renewed() {
    // Rows 1–3 are SENDING under the claimer's owner name from an earlier life (a restart after
    // kill -9 under the same instance id); the claim then takes 4–6. Renewal extends 4–6 only,
    // and forgets a held row once it is no longer SENDING under this owner.
    use rocketmq_outbox::sweep::lease;

    let (_db, mut conn, claimer) = claimable_outbox("poll_lease_own", 6, |i| format!("k{i}")).await;
    conn.query_drop(
        format!("UPDATE outbox_event SET status = {SENDING}, owner = 'reader', lease_until = NOW(3) WHERE id <= 3"),
    )
    .await
    .unwrap();
    assert_eq!(claim_ids(&claimer, &mut conn).await, [4, 5, 6]);
    conn.query_drop(format!(
        "UPDATE outbox_event SET status = {SENT} WHERE id = 6"
    ))
    .await
    .unwrap();
    let renewed = lease::renew(
        &mut conn,
        &claimer.table,
        "reader",
        &claimer.held,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert_eq!(renewed, 2, "rows 4 and 5");
    assert_eq!(
        claimer.held.of(&claimer.table),
        [4, 5],
        "row 6 is SENT: forgotten"
    );
    let expired: Vec<u64> = conn
        .query(format!("SELECT id FROM outbox_event WHERE status = {SENDING} AND lease_until < NOW(3) ORDER BY id"))
        .await
        .unwrap();
    assert_eq!(
        expired,
        [1, 2, 3],
        "the earlier life's rows are left to expire"
    );
}

#[tokio::test]
async fn a_row_put_back_behind_the_claim_cursor_is_claimed_once_a_batch_comes_back_short() {
    // While batches come back full, each claim reads past the last one (skipping the entries of
    // rows just claimed that InnoDB has not purged yet); a row returned to PENDING below that
    // point is read by the next claim from the start: after a short batch (here), or after the
    // rescan period (`sweep::cursor` unit tests; long here, so timing cannot decide the test).
    // Meanwhile its key's later rows are held back: row i has key k(i mod 100), so rows 105
    // and 205 share row 5's key.
    use rocketmq_outbox::sweep::cursor::ClaimCursor;

    let (db, mut conn, claimer) =
        claimable_outbox("poll_claim_cursor", 300, |i| format!("k{}", i % 100)).await;
    let claimer = Claimer {
        cursor: Arc::new(ClaimCursor::with_rescan(Duration::from_secs(3600))),
        ..claimer
    };
    let ids = |range: std::ops::RangeInclusive<u64>, but: u64| {
        range.filter(|&id| id != but).collect::<Vec<_>>()
    };
    assert_eq!(claim_ids(&claimer, &mut conn).await, ids(1..=100, 0));
    db.conn()
        .await
        .query_drop(format!(
            "UPDATE outbox_event SET status = {PENDING}, owner = NULL WHERE id = 5"
        ))
        .await
        .unwrap();
    let next = claim_ids(&claimer, &mut conn).await;
    assert_eq!(
        next,
        ids(101..=200, 105),
        "past the cursor; 105 waits for 5"
    );
    let next = claim_ids(&claimer, &mut conn).await;
    assert_eq!(next, ids(201..=300, 205), "205 waits for 5");
    let short = claim_ids(&claimer, &mut conn).await;
    assert!(short.is_empty(), "nothing past 300: {short:?}");
    let again = claim_ids(&claimer, &mut conn).await;
    assert_eq!(
        again,
        [5, 105, 205],
        "from the start again, the key in order"
    );
}

/// `count` PENDING rows, the `i`th (id `i + 1`) of key `key(i)`, in a new database; a connection
/// to it and a [`claimer`] of its outbox.
async fn claimable_outbox(
    name: &str,
    count: usize,
    key: impl Fn(usize) -> String,
) -> (TestDb, mysql_async::Conn, Claimer) {
    let db = TestDb::migrated(name).await;
    let topic = new_topic(name);
    let mut conn = db.conn().await;
    let events = (0..count)
        .map(|i| NewEvent::new(&topic, key(i), json!({ "i": i })))
        .collect();
    commit_events(&mut conn, events).await;
    let table = TableName::parse(&format!("{}.outbox_event", db.name())).unwrap();
    (db, conn, claimer(table))
}

/// The ids one claim takes.
async fn claim_ids(claimer: &Claimer, conn: &mut mysql_async::Conn) -> Vec<u64> {
    let claimed = claimer.claim(conn).await.unwrap();
    claimed.iter().map(Claimed::id).collect()
}
