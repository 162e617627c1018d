//! Crashes at the two points no process-level fault can aim at, through the relay's fault hooks
//! (`src/failpoint.rs`, feature `failpoints`): right after SEND_OK and before the SENT mark, and
//! after the local (sled) checkpoint save and before its MySQL mirror. Two instances run; the
//! hooked leader crashes mid-stream (exit status 86), the standby takes over from the mirror,
//! the crashed one comes back as a standby. Every event arrives: a crash costs duplicates, never
//! an event (the one after SEND_OK costs none: the standby reads back what was stored).

use crate::common;

use common::process::write_config_file;
use common::relay::{
    count_status, current_position, deliveries, duplicates, relay_fixture, seed_checkpoint,
    wait_for, wait_until_sent, write_events,
};
use common::rocketmq::{new_topic, rocketmq};
use common::TestDb;
use mysql_async::prelude::*;
use rocketmq_outbox::failpoint::{crash_on_hit, AFTER_CHECKPOINT_SAVE, AFTER_SEND_OK, EXIT_CODE};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A relay process, killed if the test ends first.
struct Relay(Child);

impl Relay {
    fn spawn(config_file: &Path, failpoints: Option<&str>) -> Self {
        let mut command = Command::new(outbox_devenv::workspace_binary("outbox-relay"));
        command
            .args(["-c", config_file.to_str().unwrap(), "--metrics-listen", ""])
            .arg("run")
            .env(
                "RUST_LOG",
                std::env::var("OUTBOX_TEST_RELAY_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null());
        if let Some(spec) = failpoints {
            command.env("FAILPOINTS", spec);
        }
        Relay(command.spawn().expect("start outbox-relay run"))
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child; SIGTERM drains, as a supervisor's stop would.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

async fn leader(db: &TestDb, name: &str) -> Option<String> {
    db.conn()
        .await
        .exec_first(
            "SELECT leader FROM outbox_relay_state WHERE name = ?",
            (name,),
        )
        .await
        .unwrap()
        .flatten()
}

/// Runs 4 × 1,000 events through instances `a` (with `failpoints`) and `b`; `a` must crash
/// through the hook, and everything must arrive. Returns the duplicates.
async fn crash_at(prefix: &str, failpoints: &str) -> usize {
    let db = TestDb::migrated(prefix).await;
    let topic = new_topic(prefix);
    let (config, _base) = relay_fixture(&db)
        .sweeper(
            Duration::from_millis(500),
            Duration::from_secs(5),
            Duration::from_secs(5),
        )
        .build();
    let start = current_position(&db).await;
    let mut dirs = Vec::new();
    let mut files: Vec<PathBuf> = Vec::new();
    for instance in ["a", "b"] {
        let dir = tempfile::tempdir().unwrap();
        let mut own = config.clone();
        own.relay.instance_id = Some(instance.into());
        own.relay.checkpoint_dir = dir.path().join("checkpoint");
        // Its own id: `+ 1` was the next test's relay's, and both streamed at a takeover.
        if instance == "b" {
            own.mysql.server_id = common::relay::next_server_id();
        }
        own.rocketmq.producer_group = format!("{}_{instance}", config.rocketmq.producer_group);
        seed_checkpoint(&own, &start);
        files.push(write_config_file(&own, dir.path()));
        dirs.push(dir);
    }
    let name = config.relay.name.clone();
    let mut a = Relay::spawn(&files[0], Some(failpoints));
    wait_for("a leads", Duration::from_secs(30), || async {
        leader(&db, &name).await.as_deref() == Some("a")
    })
    .await;
    let _b = Relay::spawn(&files[1], None);

    const TOTAL: usize = 4_000;
    let writer = {
        let (db, topic) = (db.clone_handle(), topic.clone());
        tokio::spawn(async move { write_events(&db, &topic, 4, TOTAL / 4, 200).await })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = a.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the hook {failpoints} never fired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(EXIT_CODE), "a crashed through the hook");
    let sent_at_crash = count_status(&db, rocketmq_outbox::outbox::Status::Sent).await;
    // A supervisor restarts the crashed instance (without the hook): a standby now.
    let _a = Relay::spawn(&files[0], None);
    writer.await.unwrap();
    wait_until_sent(&db, TOTAL as u64, Duration::from_secs(120)).await;
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Sending).await,
        0,
        "nothing left SENDING"
    );
    let per_event = deliveries(&rocketmq().namesrv_addr(), &topic, TOTAL).await;
    assert_eq!(per_event.len(), TOTAL, "every event arrived");
    let dups = duplicates(&per_event);
    println!(
        "{failpoints}: crashed after {sent_at_crash} of {TOTAL} SENT; 0 lost, {dups} duplicates"
    );
    dups
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_send_ok_before_the_sent_mark_loses_nothing() {
    // The batch the broker stored just before the crash was never marked. The standby taking
    // over reads back what the topic stored and records that batch SENT instead of sending it
    // again (`relay.takeover_read_limit`); `crash_at` proves every event arrived.
    let dups = crash_at("hook_send_ok", &crash_on_hit(AFTER_SEND_OK, 30)).await;
    assert_eq!(
        dups, 0,
        "the batch stored before the crash was sent again: the takeover did not find it, or \
         found it and sent it anyway"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_sled_save_before_the_mirror_loses_nothing() {
    crash_at("hook_checkpoint", &crash_on_hit(AFTER_CHECKPOINT_SAVE, 5)).await;
}
