//! Schema migrations against a real MariaDB.

use crate::common;

use common::TestDb;
use mysql_async::prelude::*;
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
        "idx_status_created",
        "idx_key_order",
    ] {
        assert!(
            indexes.iter().any(|i| i == expected),
            "{expected} missing from {indexes:?}"
        );
    }
    for dropped in ["idx_claim", "idx_lease"] {
        assert!(
            !indexes.iter().any(|i| i == dropped),
            "0009 and 0010 drop {dropped}: {indexes:?}"
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
