//! Schema migrations against a real MariaDB.

use crate::common;

use crate::switch_over::ARTICLE_TABLE;
use common::TestDb;
use mysql_async::prelude::*;
use rocketmq_outbox::schema::adopt::OnlineRule;
use rocketmq_outbox::schema::{self, MigrateError, MIGRATIONS};

#[tokio::test]
async fn migrate_creates_every_table_once_and_is_idempotent() {
    let db = TestDb::empty("migrate_idem").await;
    let mut conn = db.conn().await;
    let first = schema::migrate(&mut conn, &db.config.outbox_tables())
        .await
        .unwrap();
    assert_eq!(first.applied.len(), MIGRATIONS.len());
    assert_eq!(first.already_applied, 0);
    let second = schema::migrate(&mut conn, &db.config.outbox_tables())
        .await
        .unwrap();
    assert!(second.applied.is_empty());
    assert_eq!(second.already_applied, MIGRATIONS.len());

    let tables: Vec<String> = conn
        .query("SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() ORDER BY table_name")
        .await
        .unwrap();
    for expected in [
        "event_dedup",
        "outbox_audit",
        "outbox_event",
        "outbox_relay_state",
        "outbox_schema_history",
        "outbox_topic_queues",
    ] {
        assert!(
            tables.iter().any(|t| t == expected),
            "{expected} missing from {tables:?}"
        );
    }
    let indexes: Vec<String> = conn
        .query("SELECT DISTINCT index_name FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = 'outbox_event'")
        .await
        .unwrap();
    for expected in [
        "PRIMARY",
        "uk_event_id",
        "idx_pending",
        "idx_created",
        "idx_waiting_key",
    ] {
        assert!(
            indexes.iter().any(|i| i == expected),
            "{expected} missing from {indexes:?}"
        );
    }
    for dropped in [
        "idx_claim",
        "idx_lease",
        "idx_key_order",
        "idx_status_created",
    ] {
        assert!(
            !indexes.iter().any(|i| i == dropped),
            "0009, 0010, 0013 and 0015 drop {dropped}: {indexes:?}"
        );
    }
    let status = schema::status(&mut conn).await.unwrap();
    assert!(status.iter().all(|(_, _, applied)| *applied));
}

#[tokio::test]
async fn concurrent_migrations_apply_each_migration_once() {
    let db = TestDb::empty("migrate_race").await;
    let tables = db.config.outbox_tables();
    let runs = (0..4).map(|_| {
        let pool = db.pool.clone();
        let tables = tables.clone();
        tokio::spawn(async move {
            let mut conn = pool.get_conn().await.unwrap();
            schema::migrate(&mut conn, &tables).await.unwrap()
        })
    });
    let mut applied = 0;
    for run in runs {
        applied += run.await.unwrap().applied.len();
    }
    assert_eq!(applied, MIGRATIONS.len());
    assert_eq!(
        db.count("outbox_schema_history").await,
        MIGRATIONS.len() as u64
    );
}

#[tokio::test]
async fn an_edited_applied_migration_is_refused() {
    let db = TestDb::migrated("migrate_tamper").await;
    let mut conn = db.conn().await;
    conn.query_drop(
        "UPDATE outbox_schema_history SET checksum = REPEAT('0', 64) WHERE version = 2",
    )
    .await
    .unwrap();
    let err = schema::migrate(&mut conn, &db.config.outbox_tables())
        .await
        .unwrap_err();
    assert!(
        matches!(err, MigrateError::ChecksumMismatch { version: 2, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("0002_event_dedup"));
}

#[tokio::test]
async fn a_newer_schema_than_this_build_is_refused() {
    let db = TestDb::migrated("migrate_newer").await;
    let mut conn = db.conn().await;
    conn.query_drop("INSERT INTO outbox_schema_history (version, name, checksum) VALUES (999, '0999_future', REPEAT('0', 64))")
        .await
        .unwrap();
    let err = schema::migrate(&mut conn, &db.config.outbox_tables())
        .await
        .unwrap_err();
    assert!(
        matches!(err, MigrateError::UnknownVersion { version: 999, .. }),
        "{err}"
    );
}

/// The shape `run` checks and `migrate` adopts to (src/schema/shape.rs) is what the migrations
/// create: a freshly migrated table needs nothing, and the relay has nothing to warn about.
#[tokio::test]
async fn a_migrated_table_has_the_shape_the_relay_checks_for() {
    let db = TestDb::migrated("migrate_shape").await;
    let mut conn = db.conn().await;
    let tables = db.config.outbox_tables();
    let plans = schema::adoption_plans(&mut conn, &tables, OnlineRule::default())
        .await
        .unwrap();
    assert_eq!(plans.len(), 1);
    assert!(plans[0].is_empty(), "{:?}", plans[0]);
    assert!(plans[0].notes.is_empty(), "{:?}", plans[0].notes);
    let checked = schema::check_for_run(&mut conn, &tables).await.unwrap();
    assert_eq!(checked, Ok(Vec::new()));
    let plan = schema::plan(&mut conn, &tables, OnlineRule::default())
        .await
        .unwrap();
    assert_eq!(plan.trim(), "-- nothing to do: the schema is up to date");
}

/// A table migrate must not change by itself stops it before anything else runs, with the
/// statement to run; the table is left as it was.
#[tokio::test]
async fn an_incompatible_outbox_table_is_refused_and_left_unchanged() {
    let db = TestDb::empty("migrate_refuse").await;
    let mut conn = db.conn().await;
    conn.query_drop(
        "CREATE TABLE outbox_event (id BIGINT PRIMARY KEY AUTO_INCREMENT, \
         event_id VARCHAR(64) NOT NULL, biz_key VARCHAR(64) NOT NULL, topic VARCHAR(128) NOT NULL, \
         payload JSON NOT NULL, status VARCHAR(16) NOT NULL DEFAULT 'NEW')",
    )
    .await
    .unwrap();
    let err = schema::migrate(&mut conn, &db.config.outbox_tables())
        .await
        .unwrap_err();
    assert!(matches!(err, MigrateError::Refused { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("MODIFY COLUMN `status` TINYINT NOT NULL DEFAULT 0"),
        "{text}"
    );
    assert_eq!(
        db.count("outbox_schema_history").await,
        0,
        "no migration ran"
    );
    let columns: Vec<String> = conn
        .query(
            "SELECT column_name FROM information_schema.columns \
             WHERE table_schema = DATABASE() AND table_name = 'outbox_event'",
        )
        .await
        .unwrap();
    assert_eq!(columns.len(), 6, "nothing added: {columns:?}");
    let blocked = schema::check_for_run(&mut conn, &db.config.outbox_tables())
        .await
        .unwrap()
        .unwrap_err();
    assert!(blocked.contains("`status` is varchar(16)"), "{blocked}");
}

/// An outbox table whose rows the relay could never claim (an `id` the server does not number,
/// a `next_retry_at` that may be NULL): refused with the statements that fix it, left unchanged;
/// once they are run, adopted.
#[tokio::test]
async fn a_table_whose_rows_could_never_be_claimed_is_refused_with_the_fix() {
    let db = TestDb::empty("migrate_unclaimable").await;
    let mut conn = db.conn().await;
    conn.query_drop(
        "CREATE TABLE outbox_event (id BIGINT NOT NULL PRIMARY KEY, \
         event_id VARCHAR(64) NOT NULL, biz_key VARCHAR(64) NOT NULL, topic VARCHAR(128) NOT NULL, \
         payload JSON NOT NULL, status TINYINT NOT NULL DEFAULT 0, \
         retry_count INT NOT NULL DEFAULT 0, next_retry_at DATETIME(3) NULL, \
         lease_until DATETIME(3) NULL, \
         created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), \
         UNIQUE KEY uk_event_id (event_id), KEY idx_pending (status, next_retry_at))",
    )
    .await
    .unwrap();
    let err = schema::migrate(&mut conn, &db.config.outbox_tables())
        .await
        .unwrap_err();
    assert!(matches!(err, MigrateError::Refused { .. }), "{err}");
    let text = err.to_string();
    for expected in [
        "`id` has no AUTO_INCREMENT",
        "MODIFY COLUMN `id` BIGINT NOT NULL AUTO_INCREMENT",
        "`next_retry_at` is nullable without a default",
        "SET `next_retry_at` = COALESCE(created_at, NOW(3)) WHERE `next_retry_at` IS NULL",
        "MODIFY COLUMN `next_retry_at` DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)",
    ] {
        assert!(text.contains(expected), "{expected:?} in {text}");
    }
    assert_eq!(db.count("outbox_schema_history").await, 0, "nothing ran");
    // The operator runs what it printed; then the table is adopted.
    conn.query_drop("ALTER TABLE outbox_event MODIFY COLUMN `id` BIGINT NOT NULL AUTO_INCREMENT")
        .await
        .unwrap();
    conn.query_drop(
        "UPDATE outbox_event SET `next_retry_at` = COALESCE(created_at, NOW(3)) \
         WHERE `next_retry_at` IS NULL",
    )
    .await
    .unwrap();
    conn.query_drop(
        "ALTER TABLE outbox_event MODIFY COLUMN `next_retry_at` DATETIME(3) NOT NULL \
         DEFAULT CURRENT_TIMESTAMP(3)",
    )
    .await
    .unwrap();
    schema::migrate(&mut conn, &db.config.outbox_tables())
        .await
        .expect("adopted once fixed");
}

/// A configured outbox table of the article's shape beside a new `outbox_event`: created
/// tables are created, the existing one is adopted, and the step is recorded.
#[tokio::test]
async fn a_configured_table_of_the_articles_shape_is_adopted_and_recorded() {
    let db = TestDb::empty("migrate_adopt").await;
    let mut conn = db.conn().await;
    conn.query_drop(ARTICLE_TABLE.replace("outbox_event", "orders_outbox"))
        .await
        .unwrap();
    let mut config = db.config.clone();
    config.outbox.tables = vec!["outbox_event".into(), "orders_outbox".into()];
    let tables = config.outbox_tables();
    let report = schema::migrate(&mut conn, &tables).await.unwrap();
    assert_eq!(report.adopted.len(), 1, "{report:?}");
    assert_eq!(report.adopted[0].0, "orders_outbox");
    assert_eq!(report.adopted[0].1.len(), 2, "{:?}", report.adopted[0].1);
    // The new outbox_event, made by migration 0001, gets msg_id and sent_at at full size.
    assert_eq!(report.finished.len(), 1, "{report:?}");
    assert_eq!(report.finished[0].0, "outbox_event");
    let recorded: Vec<(String, String)> = conn
        .query("SELECT outbox_table, statements FROM outbox_schema_changes ORDER BY id")
        .await
        .unwrap();
    assert_eq!(recorded.len(), 2);
    assert!(
        recorded[0].1.contains("ADD COLUMN `owner`"),
        "{}",
        recorded[0].1
    );
    assert_eq!(
        schema::check_for_run(&mut conn, &tables).await.unwrap(),
        Ok(Vec::new())
    );
    let again = schema::migrate(&mut conn, &tables).await.unwrap();
    assert!(
        again.adopted.is_empty() && again.applied.is_empty() && again.finished.is_empty(),
        "{again:?}"
    );
}

/// `msg_id` and `sent_at` as migration 0001 made them (NULL until SENT) on `db`'s migrated
/// `outbox_event`, with a SENT row and `pending` PENDING rows.
async fn nullable_sent_columns(db: &TestDb, pending: usize) {
    let mut conn = db.conn().await;
    conn.query_drop(
        "ALTER TABLE outbox_event MODIFY COLUMN msg_id VARCHAR(128) NULL, \
         MODIFY COLUMN sent_at DATETIME(3) NULL",
    )
    .await
    .unwrap();
    conn.query_drop(
        "INSERT INTO outbox_event (event_id, biz_key, topic, payload, status, msg_id, sent_at) \
         VALUES ('sent', 'k', 't', '{}', 2, 'AC11000100002A9F0000000000000001', NOW(3))",
    )
    .await
    .unwrap();
    for n in 0..pending {
        conn.exec_drop(
            "INSERT INTO outbox_event (event_id, biz_key, topic, payload, msg_id, sent_at) \
             VALUES (?, 'k', 't', '{}', NULL, NULL)",
            (format!("p{n}"),),
        )
        .await
        .unwrap();
    }
    conn.query_drop("ANALYZE TABLE outbox_event").await.unwrap();
}

/// An outbox table whose `msg_id` and `sent_at` are NULL until SENT (every table migration
/// 0001 made) gets them stored at full size, so the SENT mark updates its rows in place: the
/// SENT row keeps its id and time, a PENDING row reads `''` and the epoch.
#[tokio::test]
async fn msg_id_and_sent_at_of_an_older_table_are_stored_at_full_size() {
    let db = TestDb::migrated("migrate_sent_cols").await;
    nullable_sent_columns(&db, 3).await;
    let mut conn = db.conn().await;
    let tables = db.config.outbox_tables();
    let warnings = schema::check_for_run(&mut conn, &tables)
        .await
        .unwrap()
        .unwrap();
    assert!(
        warnings.len() == 1 && warnings[0].contains("msg_id and sent_at"),
        "{warnings:?}"
    );
    let report = schema::migrate(&mut conn, &tables).await.unwrap();
    assert_eq!(report.adopted.len(), 1, "{report:?}");
    assert_eq!(report.adopted[0].1.len(), 3, "{:?}", report.adopted[0].1);
    let rows: Vec<(String, String, String)> = conn
        .query("SELECT event_id, msg_id, CAST(sent_at AS CHAR) FROM outbox_event ORDER BY id")
        .await
        .unwrap();
    assert_eq!(rows[0].1, "AC11000100002A9F0000000000000001");
    assert!(!rows[0].2.starts_with("1970"), "{rows:?}");
    for row in &rows[1..] {
        assert_eq!(
            (row.1.as_str(), row.2.as_str()),
            ("", "1970-01-01 00:00:00.000")
        );
    }
    let form: Vec<(String, String, String)> = conn
        .query(
            "SELECT column_name, LOWER(column_type), is_nullable FROM information_schema.columns \
             WHERE table_schema = DATABASE() AND table_name = 'outbox_event' \
             AND column_name IN ('msg_id', 'sent_at') ORDER BY column_name",
        )
        .await
        .unwrap();
    assert_eq!(
        form,
        [
            ("msg_id".into(), "char(64)".into(), "NO".into()),
            ("sent_at".into(), "datetime(3)".into(), "NO".into())
        ]
    );
    assert_eq!(
        schema::check_for_run(&mut conn, &tables).await.unwrap(),
        Ok(Vec::new())
    );
}

/// Storing them at full size copies the table, which blocks its writes: over a tenth of the
/// operator's row rule, migrate leaves them (the relay runs) and `--plan` says how.
#[tokio::test]
async fn a_table_over_the_copy_limit_keeps_its_sent_columns_and_says_how() {
    let db = TestDb::migrated("migrate_sent_big").await;
    nullable_sent_columns(&db, 30).await;
    let mut conn = db.conn().await;
    let tables = db.config.outbox_tables();
    let rule = OnlineRule {
        max_rows: Some(100),
    };
    let report = schema::migrate_with(&mut conn, &tables, rule)
        .await
        .unwrap();
    assert!(
        report.adopted.is_empty() && report.finished.is_empty(),
        "{report:?}"
    );
    let nullable: i64 = conn
        .query_first(
            "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() \
             AND table_name = 'outbox_event' AND column_name = 'msg_id' AND is_nullable = 'YES'",
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(nullable, 1, "left as it was");
    let plan = schema::plan(&mut conn, &tables, rule).await.unwrap();
    assert!(
        plan.contains("blocks writes") && plan.contains("MODIFY COLUMN `msg_id` CHAR(64)"),
        "{plan}"
    );
}

/// The article's `outbox_event` DDL with `extra` table options, and `rows` PENDING rows.
async fn article_table(db: &TestDb, extra: &str, rows: usize) {
    let mut conn = db.conn().await;
    conn.query_drop(format!("{ARTICLE_TABLE} {extra}"))
        .await
        .unwrap();
    for n in 0..rows {
        conn.exec_drop(
            "INSERT INTO outbox_event (event_id, biz_key, topic, payload) VALUES (?, ?, 't', '{}')",
            (format!("e{n}"), format!("k{}", n % 4)),
        )
        .await
        .unwrap();
    }
    // The row estimate the operator's rule reads.
    conn.query_drop("ANALYZE TABLE outbox_event").await.unwrap();
}

/// An index build on a table over the operator's row rule is left to the DBA: migrate changes
/// nothing and prints the statements; without the rule, the same table is adopted.
#[tokio::test]
async fn an_index_build_over_the_row_rule_is_left_to_the_operator() {
    let db = TestDb::empty("migrate_rows").await;
    article_table(&db, "", 60).await;
    let mut conn = db.conn().await;
    let tables = db.config.outbox_tables();
    let rule = OnlineRule { max_rows: Some(10) };
    let err = schema::migrate_with(&mut conn, &tables, rule)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("over the limit of 10"), "{text}");
    assert!(text.contains("ADD INDEX `idx_waiting_key`"), "{text}");
    assert_eq!(
        db.count("outbox_schema_history").await,
        0,
        "no migration ran"
    );
    assert_eq!(
        db.count("outbox_schema_changes").await,
        0,
        "nothing adopted"
    );
    let report = schema::migrate_with(&mut conn, &tables, OnlineRule { max_rows: None })
        .await
        .unwrap();
    assert_eq!(report.adopted.len(), 1);
}

/// A table the server cannot add columns to instantly (ROW_FORMAT=COMPRESSED, on MariaDB and
/// MySQL) gets them online instead, and the statement recorded is the one that ran.
#[tokio::test]
async fn columns_are_added_online_where_the_server_cannot_add_them_instantly() {
    let db = TestDb::empty("migrate_compressed").await;
    article_table(&db, "ROW_FORMAT=COMPRESSED", 5).await;
    let mut conn = db.conn().await;
    let report = schema::migrate(&mut conn, &db.config.outbox_tables())
        .await
        .unwrap();
    let statements = &report.adopted[0].1;
    assert!(
        statements[0].contains("ADD COLUMN `owner`")
            && statements[0].ends_with("ALGORITHM=INPLACE, LOCK=NONE"),
        "{statements:?}"
    );
    let recorded: String = conn
        .query_first("SELECT statements FROM outbox_schema_changes")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(recorded, statements.join(";\n"));
    assert_eq!(
        schema::check_for_run(&mut conn, &db.config.outbox_tables())
            .await
            .unwrap(),
        Ok(Vec::new())
    );
}
