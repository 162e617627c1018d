//! The relay's own UPDATEs (SENT marks) are logged with `binlog_row_image = MINIMAL` on a real
//! MariaDB or MySQL whose global setting is FULL (the setting the stream needs for producers' INSERTs):
//! each mark carries the key and the changed columns, not the 1 KiB row twice. With
//! `relay.minimal_row_image = false` the server's FULL images are kept. And one undecodable
//! row image fails alone: its neighbours in the same rows event stream.

use crate::common;

#[allow(dead_code)]
use crate::common::rows;

use common::process::{write_config_file, RelayProcess};
use common::relay::{
    commit_events, current_position, deliveries, relay_fixture, seed_checkpoint, wait_until_sent,
    write_events, RunningRelay,
};
use common::rocketmq::{new_topic, rocketmq};
use common::{database, TestDb};
use futures_util::StreamExt;
use mysql_async::binlog::events::{EventData, RowsEventData};
use mysql_async::prelude::*;
use mysql_async::BinlogStreamRequest;
use outbox_devenv::DatabaseKind;
use rocketmq_outbox::binlog::reader::server_position;
use rocketmq_outbox::binlog::BinlogPosition;
use rocketmq_outbox::producer::NewEvent;
use serde_json::json;
use std::time::Duration;

/// Per UPDATE row of `outbox_event` in this test's database written after `from` (a file and
/// offset; on MariaDB its GTID position): how many columns its before image and its after
/// image carry.
async fn update_images(db: &TestDb, from: &BinlogPosition, server_id: u32) -> Vec<(usize, usize)> {
    let schema = db.name();
    let mut conn = mysql_async::Conn::new(mysql_async::Opts::from_url(&db.url).unwrap())
        .await
        .unwrap();
    let file = from.file.clone().unwrap_or_default();
    let mut request = BinlogStreamRequest::new(server_id).with_non_blocking();
    match database().kind() {
        DatabaseKind::MariaDb => {
            conn.query_drop("SET @mariadb_slave_capability = 4")
                .await
                .unwrap();
            let gtid = from.mariadb_gtid.as_ref().unwrap().to_string();
            conn.exec_drop("SET @slave_connect_state = ?", (gtid,))
                .await
                .unwrap();
        }
        DatabaseKind::MySql => {
            assert!(!file.is_empty(), "the server's binlog file");
            request = request.with_filename(file.as_bytes()).with_pos(from.pos);
        }
    }
    let mut stream = conn.get_binlog_stream(request).await.unwrap();
    let mut images = Vec::new();
    while let Some(event) = stream.next().await {
        let event = event.unwrap();
        let Ok(Some(EventData::RowsEvent(rows))) = event.read_data() else {
            continue;
        };
        // MariaDB writes version-1 rows events.
        let (before, after) = match &rows {
            RowsEventData::UpdateRowsEvent(u) => {
                (u.columns_before_image(), u.columns_after_image())
            }
            RowsEventData::UpdateRowsEventV1(u) => {
                (u.columns_before_image(), u.columns_after_image())
            }
            _ => continue,
        };
        let (before, after) = (before.count_ones(), after.count_ones());
        let tme = stream.get_tme(rows.table_id()).unwrap();
        if tme.database_name() != schema || tme.table_name() != "outbox_event" {
            continue;
        }
        for row in rows.rows(tme) {
            row.unwrap();
            images.push((before, after));
        }
    }
    images
}

/// The SENT marks' images of 20 events relayed with `relay.minimal_row_image = minimal`, and how
/// many columns the table has.
async fn marks_logged_with(minimal: bool) -> (Vec<(usize, usize)>, usize) {
    let db = TestDb::migrated(if minimal { "image_min" } else { "image_full" }).await;
    let topic = new_topic("row_image");
    let (mut config, _dir) = relay_fixture(&db).stream_only().build();
    config.relay.minimal_row_image = minimal;
    let opts = rocketmq_outbox::db::opts(&db.config).unwrap();
    let start = server_position(&opts).await.unwrap().current;
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;
    write_events(&db, &topic, 2, 10, 5).await;
    wait_until_sent(&db, 20, Duration::from_secs(60)).await;
    relay.stop().await;
    let columns: usize = db
        .conn()
        .await
        .query_first(
            "SELECT COUNT(*) FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_event'",
        )
        .await
        .unwrap()
        .unwrap();
    let images = update_images(&db, &start, config.mysql.server_id + 7).await;
    (images, columns)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserts_logged_with_minimal_images_are_relayed() {
    // A producer session with binlog_row_image=MINIMAL logs only the columns its INSERT set:
    // `status`, `tags` and `headers` are absent from the image (their defaults apply). Values
    // are read by table position, so nothing shifts, and an absent status is PENDING.
    let db = TestDb::migrated("image_insert").await;
    let topic = new_topic("image_insert");
    let (config, _dir) = relay_fixture(&db).stream_only().at_current_end().await;
    let relay = RunningRelay::start(&config).await;
    let mut conn = db.conn().await;
    conn.query_drop("SET SESSION binlog_row_image = 'MINIMAL'")
        .await
        .unwrap();
    let events = (0..10)
        .map(|i| NewEvent::new(&topic, format!("k-{i}"), json!({ "i": i })))
        .collect();
    let ids = commit_events(&mut conn, events).await;
    wait_until_sent(&db, 10, Duration::from_secs(60)).await;
    let summary = relay.stop().await;
    assert_eq!((summary.marked.failed, summary.unidentifiable), (0, 0));
    let got = deliveries(&rocketmq().namesrv_addr(), &topic, 10).await;
    assert!(ids.iter().all(|id| got.get(id) == Some(&1)), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_pool_keeps_its_session_settings_across_reuse() {
    // Found here: mysql_async resets pooled connections on return, which silently dropped the
    // READ COMMITTED of claim/mark sessions after their first use.
    let db = TestDb::migrated("writer_pool").await;
    let pool = rocketmq_outbox::db::writer_pool(&db.config).await.unwrap();
    for _ in 0..3 {
        let mut conn = pool.get_conn().await.unwrap();
        // MariaDB 10.11 has no `transaction_isolation`, MySQL 8+ no `tx_isolation`.
        let isolation = match database().kind() {
            DatabaseKind::MariaDb => "tx_isolation",
            DatabaseKind::MySql => "transaction_isolation",
        };
        let (isolation, image): (String, String) = conn
            .query_first(format!(
                "SELECT @@SESSION.{isolation}, @@SESSION.binlog_row_image"
            ))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(isolation, "READ-COMMITTED");
        assert_eq!(image, "MINIMAL");
        conn.query_drop("SELECT 1").await.unwrap();
    }
    pool.disconnect().await.unwrap();
}

/// `@@SESSION.binlog_row_image` of a writer-pool session for `config`.
async fn writer_row_image(config: &rocketmq_outbox::Config) -> String {
    let pool = rocketmq_outbox::db::writer_pool(config).await.unwrap();
    let image: String = pool
        .get_conn()
        .await
        .unwrap()
        .query_first("SELECT @@SESSION.binlog_row_image")
        .await
        .unwrap()
        .unwrap();
    pool.disconnect().await.unwrap();
    image
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_that_may_not_set_the_row_image_keeps_the_servers() {
    // MariaDB wants BINLOG ADMIN (or SUPER) for a session's binlog_row_image, MySQL
    // SESSION_VARIABLES_ADMIN: without it the relay keeps FULL images (and warns), it does not fail.
    let db = TestDb::migrated("image_grants").await;
    let schema = db.name();
    let user = format!("img_{}", std::process::id());
    let account = format!("'{user}'@'127.0.0.1'");
    let mut root = db.conn().await;
    for statement in [
        format!("CREATE USER {account} IDENTIFIED BY 'img-pw'"),
        format!("GRANT SELECT, UPDATE ON `{schema}`.* TO {account}"),
    ] {
        root.query_drop(statement).await.unwrap();
    }
    let mut config = db.config.clone();
    config.mysql.url = Some(db.url.replacen("root@", &format!("{user}:img-pw@"), 1));
    assert_eq!(writer_row_image(&config).await, "FULL");
    let privilege = match database().kind() {
        DatabaseKind::MariaDb => "BINLOG ADMIN",
        DatabaseKind::MySql => "SESSION_VARIABLES_ADMIN",
    };
    root.query_drop(format!("GRANT {privilege} ON *.* TO {account}"))
        .await
        .unwrap();
    assert_eq!(writer_row_image(&config).await, "MINIMAL");
    config.relay.minimal_row_image = false;
    assert_eq!(writer_row_image(&config).await, "FULL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sent_marks_are_logged_as_the_key_and_the_changed_columns() {
    let (images, columns) = marks_logged_with(true).await;
    assert_eq!(images.len(), 20, "one UPDATE row per SENT mark: {images:?}");
    for (before, after) in &images {
        assert_eq!(*before, 1, "before image: the primary key only");
        assert!(
            *after < columns / 2,
            "after image: the changed columns only, never the payload ({after} columns)"
        );
    }

    let (full, _) = marks_logged_with(false).await;
    assert_eq!(full.len(), 20, "{full:?}");
    assert!(
        full.iter().all(|&(b, a)| b == columns && a == columns),
        "with minimal_row_image = false the server's FULL images stay: {full:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_row_fails_alone_and_its_neighbours_stream() {
    // Found by reading the decoder: the rows after an undecodable one in the same rows event were
    // not even counted; only the sweeper found them, late and out of order. The relay runs with
    // the fault hook that reads a value holding `failpoint:undecodable` as undecodable (what a
    // corrupt image or a type newer than the decoder would give), and with no sweeper: only the
    // stream can send the neighbours.
    let db = TestDb::migrated("image_bad").await;
    let topic = new_topic("image_bad");
    let (config, dir) = relay_fixture(&db).stream_only().at_current_end().await;
    let file = write_config_file(&config, dir.path());
    let log = dir.path().join("relay.log");
    let on = rocketmq_outbox::failpoint::arm(rocketmq_outbox::failpoint::UNDECODABLE_BINLOG_VALUE);
    let hook = [("FAILPOINTS", on.as_str())];
    let relay = RelayProcess::spawn_serving(&file, "", &log, &hook);

    // One INSERT, one rows event: good, bad, good, good.
    let keys = ["k-1", "failpoint:undecodable", "k-3", "k-4"];
    let values = vec!["(?, ?, ?, '{}')"; keys.len()].join(", ");
    let mut params: Vec<mysql_async::Value> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        params.extend([format!("bad-image-{i}"), key.to_string(), topic.clone()].map(Into::into));
    }
    let mut conn = db.conn().await;
    conn.exec_drop(
        format!("INSERT INTO outbox_event (event_id, biz_key, topic, payload) VALUES {values}"),
        params,
    )
    .await
    .unwrap();
    let written = std::time::Instant::now();
    let ids: Vec<u64> = conn
        .query("SELECT id FROM outbox_event ORDER BY id")
        .await
        .unwrap();
    assert_eq!(ids.len(), 4);
    let expected: Vec<(u64, i8)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (*id, if i == 1 { rows::FAILED } else { rows::SENT }))
        .collect();
    rows::wait_statuses(&db, "outbox_event", &expected, Duration::from_secs(30)).await;
    println!("all four settled {:?} after the commit", written.elapsed());
    rows::assert_failed(&db, "outbox_event", ids[1], "undecodable value, `biz_key`").await;
    relay.stop();

    // The broker has the three good events, once each, and not the bad one.
    let stored = rows::messages_by_event(&topic, 3).await;
    let mut stored: Vec<&str> = stored.keys().map(String::as_str).collect();
    stored.sort();
    assert_eq!(stored, ["bad-image-0", "bad-image-2", "bad-image-3"]);
}
