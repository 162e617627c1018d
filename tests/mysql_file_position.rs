//! The relay on an Oracle MySQL started with `gtid_mode=OFF`: no GTIDs in the binlog, so it
//! resumes by binlog file and offset. Proven live: the relay detects the mode, relays events,
//! checkpoints a file and offset (never a GTID set), and after a graceful stop and after a
//! `kill -9` it resumes from that checkpoint without losing an event across
//! `FLUSH BINARY LOGS` rotations (while running and while down). The sweeper is off for that:
//! only the stream can deliver, so a wrong offset would show as a missing event. Last, the
//! checkpoint's file is purged while the relay is down: it restarts at the oldest file, counts
//! the lost position, and the sweeper publishes the gap. All of it twice: the second time with
//! `binlog_transaction_compression=ON`, where each transaction is one `TRANSACTION_PAYLOAD`
//! event whose inner events carry no offsets (the checkpoint takes the payload's end).
//!
//! This binary starts its own MySQL (in the chroot of `scripts/setup.sh --mysql`) whatever
//! `OUTBOX_TEST_DB` says, since no shared server runs without GTIDs. Without the chroot, or when
//! not run as root (`mysqld` runs in a chroot), it prints why and passes without testing.

use crate::common;

use common::process::{write_config_file, RelayProcess};
use common::relay::{
    assert_every_event_arrived_in_key_order, count_status, current_position, deliveries,
    purge_all_but_the_newest_binlog, relay_fixture, seed_checkpoint, wait_for, wait_until_sent,
    write_events, RunningRelay,
};
use common::rocketmq::{new_topic, rocketmq};
use common::TestDb;
use mysql_async::prelude::*;
use outbox_devenv::SqlServer;
use outbox_devenv::{scratch_dir, MySql, MySqlOptions};
use rocketmq_outbox::binlog::reader::server_position;
use rocketmq_outbox::binlog::{BinlogPosition, ServerFlavor};
use rocketmq_outbox::checkpoint::{CheckpointStore, SledStore};
use rocketmq_outbox::config::Config;
use std::time::Duration;

/// A MySQL without GTIDs (with `binlog_transaction_compression` if `compressed`), or `None`
/// (with the reason printed) where none can run.
async fn mysql_without_gtids(compressed: bool) -> Option<MySql> {
    let mut options = MySqlOptions::new(scratch_dir("filepos-mysql").unwrap());
    if !options.chroot.join("usr/sbin/mysqld").is_file() {
        eprintln!(
            "SKIPPED: no MySQL chroot at {} (run scripts/setup.sh --mysql)",
            options.chroot.display()
        );
        return None;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: mysqld runs in a chroot, which needs root");
        return None;
    }
    options.gtid_mode = false;
    // Small files: the workload rotates on its own too.
    options.extra_args.push("--max-binlog-size=1048576".into());
    if compressed {
        // Every transaction in one TRANSACTION_PAYLOAD event whose inner events carry no
        // offsets of their own: the checkpoint's offset must be the payload's end.
        options
            .extra_args
            .push("--binlog-transaction-compression=ON".into());
    }
    let server = tokio::task::spawn_blocking(move || MySql::start(options))
        .await
        .unwrap()
        .expect("MySQL with gtid_mode=OFF starts");
    Some(server)
}

/// The relay's saved checkpoint (the relay must not be running: sled locks its directory).
fn saved_checkpoint(config: &Config) -> BinlogPosition {
    let store = SledStore::open(&config.relay.checkpoint_dir).unwrap();
    store.load().unwrap().expect("a checkpoint was saved")
}

/// A checkpoint of file/position mode: a file and an offset past its header, no GTIDs.
fn assert_file_position(position: &BinlogPosition, what: &str) -> String {
    assert!(
        position
            .mysql_gtid_set
            .as_ref()
            .is_none_or(|g| g.is_empty())
            && position.mariadb_gtid.is_none(),
        "{what}: no GTIDs without gtid_mode: {position}"
    );
    let file = position
        .file
        .clone()
        .unwrap_or_else(|| panic!("{what}: a file: {position}"));
    assert!(
        position.pos > 4,
        "{what}: an offset past the header: {position}"
    );
    file
}

async fn flush_binary_logs(db: &TestDb) {
    db.conn()
        .await
        .query_drop("FLUSH BINARY LOGS")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_position_checkpoints_resume_after_a_stop_and_a_kill_across_rotations() {
    // One after the other: the lost-position counter is the process's.
    file_positions_resume(false).await;
    // Again with compressed transactions: each is one TRANSACTION_PAYLOAD event.
    file_positions_resume(true).await;
}

async fn file_positions_resume(compressed: bool) {
    let Some(server) = mysql_without_gtids(compressed).await else {
        return;
    };
    common::init_logging();
    let url = server
        .create_database(if compressed { "filepos_z" } else { "filepos" })
        .unwrap();
    let mut config = Config::default();
    config.mysql.url = Some(url.clone());
    let db = TestDb {
        url,
        pool: rocketmq_outbox::db::pool(&config).unwrap(),
        config,
    };
    let mut conn = db.conn().await;
    rocketmq_outbox::schema::migrate(&mut conn, &db.config.outbox_tables())
        .await
        .unwrap();
    let mode: String = conn
        .query_first("SELECT @@GLOBAL.gtid_mode")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(mode, "OFF");
    let compression: String = conn
        .query_first("SELECT @@GLOBAL.binlog_transaction_compression")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(compression == "1" || compression == "ON", compressed);
    drop(conn);

    // The relay's own start-up check sees file/position mode.
    let opts = rocketmq_outbox::db::opts(&db.config).unwrap();
    let info = server_position(&opts).await.unwrap();
    assert_eq!(info.flavor, ServerFlavor::MySqlFilePos, "{}", info.current);
    let start = current_position(&db).await;
    let first_file = assert_file_position(&start, "the server's position");

    let topic = new_topic("filepos");
    let (mut config, _dir) = relay_fixture(&db).stream_only().build();
    seed_checkpoint(&config, &start);

    // 1. In process: 200 events across a rotation, then a graceful stop.
    let relay = RunningRelay::start(&config).await;
    write_events(&db, &topic, 2, 50, 20).await;
    flush_binary_logs(&db).await;
    write_events(&db, &topic, 2, 50, 20).await;
    wait_until_sent(&db, 200, Duration::from_secs(60)).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.failed, 0);
    let stopped_at = saved_checkpoint(&config);
    let file = assert_file_position(&stopped_at, "after a graceful stop");
    assert!(
        file > first_file,
        "the checkpoint followed the rotation: {stopped_at}"
    );

    // 2. Events written while it was stopped, then a relay process killed with SIGKILL while
    // 2,000 more flow and the binlog rotates under it.
    write_events(&db, &topic, 2, 50, 20).await;
    let files = tempfile::tempdir().unwrap();
    let process = RelayProcess::spawn(&write_config_file(&config, files.path()));
    let writer = {
        let db = db.clone_handle();
        let topic = topic.clone();
        tokio::spawn(async move { write_events(&db, &topic, 4, 500, 40).await })
    };
    wait_for("700 SENT", Duration::from_secs(90), || async {
        count_status(&db, rocketmq_outbox::outbox::Status::Sent).await >= 700
    })
    .await;
    flush_binary_logs(&db).await;
    wait_for("1,200 SENT", Duration::from_secs(90), || async {
        count_status(&db, rocketmq_outbox::outbox::Status::Sent).await >= 1_200
    })
    .await;
    process.kill();
    let sent_at_kill = count_status(&db, rocketmq_outbox::outbox::Status::Sent).await;
    writer.await.unwrap();
    // While it is down: another rotation and 100 more events.
    flush_binary_logs(&db).await;
    write_events(&db, &topic, 2, 50, 20).await;
    let killed_at = saved_checkpoint(&config);
    let file = assert_file_position(&killed_at, "after kill -9");
    assert!(
        killed_at.file > stopped_at.file || killed_at.pos > stopped_at.pos,
        "the killed process moved the checkpoint: {stopped_at} → {killed_at}"
    );
    println!("killed at {sent_at_kill} SENT, checkpoint {killed_at} (file {file})");

    // 3. Restarted from the offset: everything arrives, and the position was never lost.
    const TOTAL: u64 = 2_400;
    let lost_before = rocketmq_outbox::metrics::relay().binlog_position_lost.get();
    let relay = RunningRelay::start(&config).await;
    wait_until_sent(&db, TOTAL, Duration::from_secs(120)).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.failed, 0);
    assert_eq!(
        rocketmq_outbox::metrics::relay().binlog_position_lost.get(),
        lost_before,
        "the checkpoint's file and offset were found"
    );
    assert_file_position(&saved_checkpoint(&config), "at the end");
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Sending).await,
        0,
        "no row is left SENDING"
    );
    assert_every_event_arrived_in_key_order(&db, &topic, TOTAL as usize).await;

    // 4. Written while down, then every file but the newest purged: the checkpoint's file is
    // gone. The relay restarts at the oldest file left; the sweeper publishes the gap.
    write_events(&db, &topic, 2, 50, 20).await;
    flush_binary_logs(&db).await;
    purge_all_but_the_newest_binlog(&db).await;
    config.sweeper.enabled = true;
    config.sweeper.interval = Duration::from_millis(300);
    config.sweeper.min_age = Duration::from_secs(1);
    let relay = RunningRelay::start(&config).await;
    write_events(&db, &topic, 2, 25, 20).await;
    const WITH_GAP: u64 = TOTAL + 150;
    wait_until_sent(&db, WITH_GAP, Duration::from_secs(90)).await;
    relay.stop().await;
    assert!(
        rocketmq_outbox::metrics::relay().binlog_position_lost.get() > lost_before,
        "the lost position is counted for alerting"
    );
    assert_file_position(&saved_checkpoint(&config), "after the purge");
    let per_event = deliveries(&rocketmq().namesrv_addr(), &topic, WITH_GAP as usize).await;
    assert_eq!(per_event.len(), WITH_GAP as usize, "every event arrived");
    drop(server);
}
