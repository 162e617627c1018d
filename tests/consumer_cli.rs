//! `outbox-dev consume`, the example consumer, end to end: `outbox-dev demo` writes orders
//! and outbox rows, this test publishes the rows per the message contract (as the relay would,
//! plus a resend and a bad event), and `consume` settles each order exactly once.

use crate::common;

use common::rocketmq::{new_topic, rocketmq, ContractMessage, TestProducer};
use common::TestDb;
use mysql_async::prelude::*;
use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `binary` with `args`; kills it and fails after `timeout`.
fn run_binary(binary: &std::path::Path, args: &[&str], timeout: Duration) -> Output {
    let mut child = Command::new(binary)
        .args(args)
        .env_remove("OUTBOX_RELAY_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", binary.display()));
    let deadline = Instant::now() + timeout;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            child.kill().expect("kill");
            let out = child.wait_with_output().expect("output");
            panic!(
                "{} {args:?} did not finish within {timeout:?}\nstdout:\n{}\nstderr:\n{}",
                binary.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

/// The outbox rows as the relay would publish them.
async fn outbox_messages(db: &TestDb) -> Vec<ContractMessage> {
    type Row = (
        String,
        String,
        String,
        Option<String>,
        Option<String>,
        String,
    );
    let rows: Vec<Row> = db
        .conn()
        .await
        .query(
            "SELECT event_id, biz_key, topic, tags, headers, payload FROM outbox_event ORDER BY id",
        )
        .await
        .expect("outbox rows");
    rows.into_iter()
        .map(
            |(event_id, biz_key, topic, tags, headers, payload)| ContractMessage {
                topic,
                event_id: Some(event_id),
                biz_key: Some(biz_key),
                tags,
                headers: headers
                    .map(|h| serde_json::from_str::<BTreeMap<String, String>>(&h).expect("headers"))
                    .unwrap_or_default(),
                payload: payload.into_bytes(),
            },
        )
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_settles_each_demo_order_once_and_prints_every_outcome() {
    let db = TestDb::migrated("consume_cli").await;
    let topic = new_topic("consume_cli");
    let mut config = tempfile::NamedTempFile::new().unwrap();
    write!(
        config,
        "[mysql]\nurl = \"{}\"\n[rocketmq]\nnamesrv_addr = \"{}\"\n",
        db.url,
        rocketmq().namesrv_addr()
    )
    .unwrap();
    let config = config.path().to_str().unwrap().to_string();

    let demo = run_binary(
        &common::outbox_dev(),
        &["-c", &config, "demo", "--events", "3", "--topic", &topic],
        Duration::from_secs(60),
    );
    assert!(
        demo.status.success(),
        "{}",
        String::from_utf8_lossy(&demo.stderr)
    );
    let messages = outbox_messages(&db).await;
    assert_eq!(messages.len(), 3);
    let producer = TestProducer::start().await;
    for message in &messages {
        producer.send(message, None).await;
    }
    producer.send(&messages[0], None).await; // a relay resend
    let refund = ContractMessage::event(
        &topic,
        "ev-refund",
        "order-1",
        serde_json::json!({"type": "OrderRefunded", "order_id": 1}),
    );
    producer.send(&refund, None).await;
    producer.shutdown().await;

    let out = run_binary(
        &common::outbox_dev(),
        &[
            "-c",
            &config,
            "consume",
            "--topic",
            &topic,
            "--group",
            "cli-settle",
            "--max-messages",
            "5",
        ],
        Duration::from_secs(120),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(stdout.matches("ACK   processed").count(), 3, "{stdout}");
    // The resend is a duplicate either way: caught by the in-memory pre-filter when it arrives
    // after the original in this process ("recently handled"), else by the dedup table.
    let duplicates = stdout
        .matches("ACK   duplicate (already PROCESSED)")
        .count()
        + stdout.matches("ACK   duplicate (recently handled)").count();
    assert_eq!(duplicates, 1, "{stdout}");
    assert_eq!(
        stdout
            .matches("ACK   rejected: unknown event type \"OrderRefunded\"")
            .count(),
        1,
        "{stdout}"
    );
    assert!(
        stderr.contains("5 deliveries: 3 processed, 1 duplicates ACKed, 1 rejected, 0 retried"),
        "{stderr}"
    );

    let mut conn = db.conn().await;
    let settled: Vec<(u64, String)> = conn
        .query("SELECT id, state FROM demo_order ORDER BY id")
        .await
        .unwrap();
    assert_eq!(settled.len(), 3);
    assert!(
        settled.iter().all(|(_, state)| state == "SETTLED"),
        "{settled:?}"
    );
    let settlements: u64 = conn
        .query_first("SELECT COUNT(*) FROM demo_settlement")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(settlements, 3);
}
