//! Switching over from the reference article's polling relay (`../shared/seed/`, "最小上手"): its
//! exact `outbox_event` table with rows in every state, its relay (a stand-in in a process of its
//! own that claims with the article's SQL and publishes as the article does) killed mid-stream,
//! then `outbox-relay migrate` and `outbox-relay run`, as a team switching over would, while
//! business code that writes only the article's columns goes on. Judged by what the broker
//! stored.

use crate::common;

use common::process::{write_config_file, RelayProcess};
use common::relay::{
    assert_key_order, assert_msg_ids_stored, count_where, outbox_rows, sweeping_config, OutboxRow,
};
use common::rocketmq::{new_topic, rocketmq, ContractMessage, TestProducer};
use common::TestDb;
use mysql_async::prelude::*;
use outbox_devenv::topic_reader::{ReceivedMessage, TopicReader};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The article's DDL, verbatim (other modules' tests of adoption use it too).
pub const ARTICLE_TABLE: &str = "CREATE TABLE outbox_event (
  id            BIGINT PRIMARY KEY AUTO_INCREMENT,
  event_id      VARCHAR(64)  NOT NULL,
  biz_key       VARCHAR(64)  NOT NULL,
  topic         VARCHAR(128) NOT NULL,
  payload       JSON         NOT NULL,
  status        TINYINT      NOT NULL DEFAULT 0,
  retry_count   INT          NOT NULL DEFAULT 0,
  next_retry_at DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  lease_until   DATETIME(3)  NULL,
  created_at    DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  UNIQUE KEY uk_event_id (event_id),
  KEY idx_pending (status, next_retry_at)
) ENGINE=InnoDB";

const KEYS: usize = 8;
/// The stand-in's claim batch and lease (the article claims 100 for 30 s; smaller and shorter
/// here so the test sees a claim in flight and its lease expire within seconds).
const CLAIM_BATCH: usize = 5;
const STAND_IN_LEASE_SECS: u64 = 3;

/// Environment of the stand-in process.
const STAND_IN_URL: &str = "ARTICLE_RELAY_URL";
const STAND_IN_NAMESRV: &str = "ARTICLE_RELAY_NAMESRV";

/// Business code as the article writes it: only the article's columns. The payload carries the
/// event's id and key, so every stored message can be traced to its row whoever sent it.
async fn write_article_row(conn: &mut mysql_async::Conn, topic: &str, n: usize, status: u8) {
    let (event_id, key) = (format!("ev-{n:05}"), format!("order-{}", n % KEYS));
    let payload = serde_json::json!({ "event_id": event_id, "key": key, "n": n }).to_string();
    conn.exec_drop(
        "INSERT INTO outbox_event (event_id, biz_key, topic, payload, status) VALUES (?, ?, ?, ?, ?)",
        (event_id, key, topic, payload, status),
    )
    .await
    .unwrap();
}

/// The article's polling relay, in a process of its own (started by [`StandIn::spawn`], which
/// runs this ignored test in a copy of the test binary): claims `WHERE status = 0 ORDER BY id
/// LIMIT n FOR UPDATE SKIP LOCKED`, sets `status = 1, lease_until = now + lease`, commits, then
/// sends each row as `new Message(topic, bizKey, payload)` (the key as the tag, a queue chosen
/// round-robin) and marks it `status = 2`. It runs until it is killed.
#[tokio::test]
#[ignore = "the article's relay, run as a process by switch_over's tests"]
async fn article_polling_relay() {
    let (Ok(url), Ok(namesrv)) = (std::env::var(STAND_IN_URL), std::env::var(STAND_IN_NAMESRV))
    else {
        return;
    };
    let pool = mysql_async::Pool::new(url.as_str());
    let producer = TestProducer::start_on(&namesrv).await;
    loop {
        let mut tx = pool.start_transaction(Default::default()).await.unwrap();
        let batch: Vec<(u64, String, String, String)> = tx
            .exec(
                "SELECT id, topic, biz_key, payload FROM outbox_event WHERE status = 0 \
                 ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED",
                (CLAIM_BATCH,),
            )
            .await
            .unwrap();
        if batch.is_empty() {
            tx.commit().await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let ids: Vec<String> = batch.iter().map(|row| row.0.to_string()).collect();
        tx.exec_drop(
            format!(
                "UPDATE outbox_event SET status = 1, lease_until = NOW(3) + INTERVAL ? SECOND \
                 WHERE id IN ({})",
                ids.join(", ")
            ),
            (STAND_IN_LEASE_SECS,),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        for (id, topic, key, payload) in batch {
            let message = ContractMessage {
                topic,
                tags: Some(key),
                payload: payload.into_bytes(),
                ..ContractMessage::default()
            };
            producer.send(&message, None).await;
            // The article's relay sends one row at a time; slow enough to be caught mid-batch.
            tokio::time::sleep(Duration::from_millis(40)).await;
            pool.get_conn()
                .await
                .unwrap()
                .exec_drop("UPDATE outbox_event SET status = 2 WHERE id = ?", (id,))
                .await
                .unwrap();
        }
    }
}

/// The stand-in process; killed if the test ends first.
struct StandIn(std::process::Child);

impl StandIn {
    fn spawn(db: &TestDb) -> Self {
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "switch_over::article_polling_relay",
                "--exact",
                "--ignored",
                "--test-threads=1",
            ])
            .env(STAND_IN_URL, &db.url)
            .env(STAND_IN_NAMESRV, rocketmq().namesrv_addr())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the stand-in relay");
        StandIn(child)
    }

    fn kill(mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Rows by state: `status -> event_ids`.
async fn rows_by_status(db: &TestDb) -> BTreeMap<u8, BTreeSet<String>> {
    let rows: Vec<(u8, String)> = db
        .conn()
        .await
        .query("SELECT status, event_id FROM outbox_event")
        .await
        .unwrap();
    let mut by_status: BTreeMap<u8, BTreeSet<String>> = BTreeMap::new();
    for (status, event_id) in rows {
        by_status.entry(status).or_default().insert(event_id);
    }
    by_status
}

/// Waits until no row is PENDING or SENDING (every row SENT but the FAILED ones).
async fn wait_until_nothing_waits(db: &TestDb) {
    common::relay::wait_for(
        "every row SENT but the FAILED ones",
        Duration::from_secs(90),
        || {
            let db = db.clone_handle();
            async move { count_where(&db, "status IN (0, 1)").await == 0 }
        },
    )
    .await;
}

/// `outbox-relay --mysql-url URL migrate ARGS`: (success, stdout).
fn migrate_command(db: &TestDb, args: &[&str]) -> (bool, String) {
    let out = Command::new(outbox_devenv::workspace_binary("outbox-relay"))
        .args(["--mysql-url", &db.url, "migrate"])
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() || args.is_empty(), "{stderr}");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &stderr,
    )
}

/// `SHOW CREATE TABLE outbox_event`, without the `AUTO_INCREMENT=` counter (business code
/// writes on).
async fn table_definition(db: &TestDb) -> String {
    let row: (String, String) = db
        .conn()
        .await
        .query_first("SHOW CREATE TABLE outbox_event")
        .await
        .unwrap()
        .unwrap();
    row.1
        .split(' ')
        .filter(|word| !word.starts_with("AUTO_INCREMENT="))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The article's table with rows in every state: per key, old rows SENT, then FAILED ones, then
/// SENDING ones a crashed relay left under a long-expired lease, then PENDING ones.
async fn article_table_in_every_state(db: &TestDb, topic: &str) -> usize {
    let mut conn = db.conn().await;
    conn.query_drop(ARTICLE_TABLE).await.unwrap();
    let states = [(10, 2), (2, 3), (5, 1), (40, 0)];
    let mut n = 0;
    for (rows, status) in states {
        for _ in 0..rows {
            write_article_row(&mut conn, topic, n, status).await;
            n += 1;
        }
    }
    conn.query_drop(
        "UPDATE outbox_event SET lease_until = NOW(3) - INTERVAL 1 HOUR WHERE status = 1",
    )
    .await
    .unwrap();
    conn.query_drop("UPDATE outbox_event SET retry_count = 8 WHERE status = 3")
        .await
        .unwrap();
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_from_the_articles_polling_relay_delivers_every_waiting_row_once() {
    let db = TestDb::empty("switch_over").await;
    let topic = new_topic("switch_over");
    let seeded = article_table_in_every_state(&db, &topic).await;
    let (config, dir) = sweeping_config(&db);
    let config_file = write_config_file(&config, dir.path());

    // `run` before `migrate`: stops at once, naming what is missing.
    let log = dir.path().join("unmigrated.log");
    let started = Instant::now();
    let mut early = RelayProcess::spawn_serving(&config_file, "", &log, &[]);
    let status = loop {
        if let Some(status) = early.exit_status() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "run kept running on the article's table"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "{said}");
    assert!(
        said.contains(
            "lacks the column(s) tags, headers, owner, msg_id, sent_at, last_error, deliver_at."
        ) && said.contains("outbox-relay migrate"),
        "run names the missing columns and the command: {said}"
    );
    drop(early);

    // The article's relay at work, with business code writing beside it; killed mid-batch.
    let writer_stop = tokio_util::sync::CancellationToken::new();
    let writer = tokio::spawn({
        let (pool, topic, stop) = (db.pool.clone(), topic.clone(), writer_stop.clone());
        async move {
            let mut conn = pool.get_conn().await.unwrap();
            let mut n = seeded;
            while !stop.is_cancelled() {
                write_article_row(&mut conn, &topic, n, 0).await;
                n += 1;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            n
        }
    });
    let stand_in = StandIn::spawn(&db);
    common::relay::wait_for(
        "the article's relay sent 10 rows and holds a claim",
        Duration::from_secs(60),
        || {
            let db = db.clone_handle();
            async move {
                count_where(&db, "status = 2").await >= 20
                    && count_where(&db, "status = 1 AND lease_until > NOW(3)").await > 0
            }
        },
    )
    .await;
    stand_in.kill();
    let at_kill = rows_by_status(&db).await;
    let in_flight = count_where(&db, "status = 1 AND lease_until > NOW(3)").await;
    println!(
        "at the kill: {} SENT, {} FAILED, {} SENDING ({in_flight} under a live lease), {} PENDING",
        at_kill[&2].len(),
        at_kill[&3].len(),
        at_kill[&1].len(),
        at_kill.get(&0).map_or(0, BTreeSet::len)
    );

    // migrate adopts the table; a second run changes nothing.
    let (_, first) = migrate_command(&db, &[]);
    assert!(
        first.contains("adopted outbox table outbox_event"),
        "{first}"
    );
    let adopted = table_definition(&db).await;
    let (_, second) = migrate_command(&db, &[]);
    assert!(
        second.contains("0 applied now") && !second.contains("adopted"),
        "{second}"
    );
    assert_eq!(
        table_definition(&db).await,
        adopted,
        "the second migrate changed the table"
    );
    let (_, plan) = migrate_command(&db, &["--plan"]);
    assert!(plan.contains("nothing to do"), "{plan}");
    let (_, status) = migrate_command(&db, &["--status"]);
    assert!(
        status.contains("adopted outbox_event at ") && status.contains("ADD COLUMN `owner`"),
        "{status}"
    );

    // outbox-relay takes over while business code goes on writing.
    let relay_log = dir.path().join("relay.log");
    let relay = RelayProcess::spawn_serving(&config_file, "", &relay_log, &[]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    writer_stop.cancel();
    let written = writer.await.unwrap();
    wait_until_nothing_waits(&db).await;
    relay.stop();

    // What the broker stored: the relay's messages carry the `event_id` property, the
    // article's relay's do not (its payload names the event).
    let after = rows_by_status(&db).await;
    let done_before: BTreeSet<&String> = at_kill[&2].iter().chain(&at_kill[&3]).collect();
    let expected: BTreeSet<String> = (0..written)
        .map(|n| format!("ev-{n:05}"))
        .filter(|e| !done_before.contains(e))
        .collect();
    assert_eq!(after[&3], at_kill[&3], "FAILED rows stay FAILED");
    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), &topic)
        .await
        .unwrap();
    let stand_in_sent = at_kill[&2].len() - 10;
    reader
        .read_at_least(expected.len() + stand_in_sent, Duration::from_secs(120))
        .await
        .unwrap();
    // Then whatever else arrives: a resend, or a row the article's relay sent but never marked.
    let messages = reader.read_all_for(Duration::from_secs(2)).await.unwrap();
    reader.close().await;
    let relayed: Vec<&ReceivedMessage> = messages
        .iter()
        .filter(|m| m.properties.contains_key("event_id"))
        .collect();
    let mut per_event: HashMap<&str, usize> = HashMap::new();
    for m in &relayed {
        *per_event
            .entry(m.properties["event_id"].as_str())
            .or_default() += 1;
    }
    let resent: Vec<&&String> = done_before
        .iter()
        .filter(|e| per_event.contains_key(e.as_str()))
        .collect();
    assert!(
        resent.is_empty(),
        "SENT or FAILED rows were sent again: {resent:?}"
    );
    let missing: Vec<&String> = expected
        .iter()
        .filter(|e| !per_event.contains_key(e.as_str()))
        .collect();
    assert!(missing.is_empty(), "waiting rows never stored: {missing:?}");
    let twice: Vec<(&&str, &usize)> = per_event.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "stored more than once by the relay: {twice:?}"
    );
    // Each relayed row SENT with the id of its stored message, its key on one queue in id order.
    let rows: Vec<OutboxRow> = outbox_rows(&db)
        .await
        .into_iter()
        .filter(|r| expected.contains(&r.1))
        .collect();
    let relayed: Vec<ReceivedMessage> = relayed.into_iter().cloned().collect();
    assert_msg_ids_stored(&rows, &relayed);
    assert_key_order(&rows, &relayed);
    println!(
        "switch-over: {} rows waited at the kill or were written after it, each stored once by \
         the relay; {} messages in all ({} from the article's relay)",
        expected.len(),
        messages.len(),
        messages.len() - relayed.len()
    );
}

/// Both relays at once (outbox-relay started before the polling relay is stopped): nothing is
/// lost, but rows are sent twice and a key's events reach several queues (the article's relay
/// lets the producer pick a queue per message), so a consumer may see a key's events out of
/// order for as long as both run. The documented switch-over stops the polling relay first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_relays_at_once_lose_nothing_but_spread_keys_over_queues() {
    let db = TestDb::empty("switch_both").await;
    let topic = new_topic("switch_both");
    let seeded = article_table_in_every_state(&db, &topic).await;
    let (config, dir) = sweeping_config(&db);
    let config_file = write_config_file(&config, dir.path());
    let (migrated, said) = migrate_command(&db, &[]);
    assert!(migrated, "migrate adopts the article's table: {said}");
    let stand_in = StandIn::spawn(&db);
    let relay = RelayProcess::spawn_serving(&config_file, "", &dir.path().join("relay.log"), &[]);
    let mut conn = db.conn().await;
    let (mut written, until) = (seeded, Instant::now() + Duration::from_secs(4));
    while Instant::now() < until {
        write_article_row(&mut conn, &topic, written, 0).await;
        written += 1;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    wait_until_nothing_waits(&db).await;
    stand_in.kill();
    relay.stop();

    // Every row not SENT or FAILED before either relay started: the first 12 were.
    let expected: BTreeSet<String> = (12..written).map(|n| format!("ev-{n:05}")).collect();
    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), &topic)
        .await
        .unwrap();
    reader
        .read_at_least(expected.len(), Duration::from_secs(120))
        .await
        .unwrap();
    let messages = reader.read_all_for(Duration::from_secs(2)).await.unwrap();
    reader.close().await;
    let mut copies: HashMap<String, usize> = HashMap::new();
    let mut queues_of_key: HashMap<String, BTreeSet<i32>> = HashMap::new();
    for m in &messages {
        let body: serde_json::Value = serde_json::from_slice(&m.body).unwrap();
        let (event_id, key) = (
            body["event_id"].as_str().unwrap(),
            body["key"].as_str().unwrap(),
        );
        *copies.entry(event_id.to_string()).or_default() += 1;
        queues_of_key
            .entry(key.to_string())
            .or_default()
            .insert(m.queue_id);
    }
    let missing: Vec<&String> = expected
        .iter()
        .filter(|e| !copies.contains_key(*e))
        .collect();
    assert!(
        missing.is_empty(),
        "lost with both relays running: {missing:?}"
    );
    // outbox-relay published some of them itself: the rows it marked carry a msg_id (the
    // polling relay records none), each stored on the broker.
    let by_relay: Vec<String> = db
        .conn()
        .await
        .query("SELECT msg_id FROM outbox_event WHERE status = 2 AND msg_id <> ''")
        .await
        .unwrap();
    let stored: BTreeSet<&str> = messages.iter().map(|m| m.msg_id.as_str()).collect();
    assert!(!by_relay.is_empty(), "outbox-relay published nothing");
    let unproven: Vec<&String> = by_relay
        .iter()
        .filter(|id| !stored.contains(id.as_str()))
        .collect();
    assert!(
        unproven.is_empty(),
        "SENT by outbox-relay but not stored: {unproven:?}"
    );
    let duplicates: usize = copies.values().map(|n| n - 1).sum();
    let spread = queues_of_key.values().filter(|q| q.len() > 1).count();
    assert!(
        spread > 0,
        "with both relays running a key's events reach several queues"
    );
    println!(
        "both relays at once: {} events, {} messages ({duplicates} duplicates, {} by \
         outbox-relay), {spread} of {} keys on more than one queue",
        expected.len(),
        messages.len(),
        by_relay.len(),
        queues_of_key.len()
    );
}
