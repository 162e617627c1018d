//! The binary's `retry`, `cleanup` and `reconcile` end to end: what an operator types, what
//! it refuses, what it prints and audits.

use super::rows::{age_rows, insert_rows, FAILED, SENT};
use crate::common::process::{outbox_relay, outbox_relay_with};
use crate::common::TestDb;
use serde_json::Value as Json;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn cli_retry_requires_operator_and_reason_then_audits() {
    let db = TestDb::migrated("op_cli_retry").await;
    insert_rows(&db, "f", 2, FAILED, "orders").await;
    let url = db.url.clone();

    let out = outbox_relay(&["--mysql-url", &url, "retry", "--id", "1", "--reason", "x"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--operator is required"),
        "{}",
        text(&out.stderr)
    );
    let out = outbox_relay(&[
        "--mysql-url",
        &url,
        "retry",
        "--id",
        "1",
        "--operator",
        "ann",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--reason is required"),
        "{}",
        text(&out.stderr)
    );
    let out = outbox_relay(&[
        "--mysql-url",
        &url,
        "retry",
        "--operator",
        "ann",
        "--reason",
        "x",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no selector given"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(db.count("outbox_audit").await, 0);

    let args = [
        "--mysql-url",
        &url,
        "retry",
        "--topic",
        "orders",
        "--operator",
        "ann",
        "--reason",
        "INC-7",
    ];
    let out = outbox_relay(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("retry: 2 changed"),
        "{}",
        text(&out.stdout)
    );
    let out = outbox_relay(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("retry: 0 changed"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(db.count("outbox_audit").await, 2);

    // --json: machine output.
    let out = outbox_relay(&[
        "--mysql-url",
        &url,
        "mark-failed",
        "--event-id",
        "f-0",
        "--operator",
        "ann",
        "--reason",
        "poison",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["action"], "mark-failed");
    assert_eq!(report["rows"][0]["outcome"], "changed");
    assert_eq!(report["rows"][0]["after"], "FAILED");
}

#[tokio::test]
async fn cli_cleanup_and_reconcile_print_summaries() {
    let db = TestDb::migrated("op_cli_cleanup").await;
    insert_rows(&db, "old", 30, SENT, "t").await;
    age_rows(&db, "old", "8 DAY").await;
    insert_rows(&db, "recent", 5, SENT, "t").await;
    age_rows(&db, "recent", "1 HOUR").await;
    let url = db.url.clone();

    let out = outbox_relay(&["--mysql-url", &url, "cleanup", "--dry-run"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("would delete 30 SENT rows"),
        "{}",
        text(&out.stdout)
    );
    // Without --older-than, the configured retention.
    let out = outbox_relay_with(
        &["--mysql-url", &url, "cleanup", "--dry-run"],
        &[("OUTBOX_RELAY_CLEANUP__RETENTION", "30m")],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("would delete 35 SENT rows"),
        "{}",
        text(&out.stdout)
    );
    let out = outbox_relay(&[
        "--mysql-url",
        &url,
        "cleanup",
        "--batch-size",
        "20",
        "--pause",
        "1ms",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("total: deleted 30 rows in 2 batches"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stderr).contains("batch 2 deleted 10 rows (30 so far)"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(db.count("outbox_event").await, 5);

    let out = outbox_relay(&["--mysql-url", &url, "reconcile"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--consumer-group is required"),
        "{}",
        text(&out.stderr)
    );
    let out = outbox_relay(&[
        "--mysql-url",
        &url,
        "reconcile",
        "--consumer-group",
        "g",
        "--consumer-url",
        &url,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("total: 5 sent, 0 seen downstream, 5 missing (5 new)"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(db.count("outbox_reconcile_diff").await, 5);
}
