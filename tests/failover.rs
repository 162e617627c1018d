//! Three relay processes on one database: one leads (tails the binlog), two stand by. The leader
//! is killed with SIGKILL every 10 s while events are written at 1,000/s; a standby takes over
//! each time, every event arrives in key order, duplicates stay within 0.01 % of the events, and
//! nothing is left SENDING. A frozen leader, and a backlog written while every instance was down.

use crate::common;

use common::process::{write_config_file, RelayProcess};
use common::relay::{
    assert_every_event_arrived_in_key_order, assert_read_every_event_in_key_order, commit_events,
    copies_per_event, count_status, current_position, deliveries, duplicates, relay_fixture,
    seed_checkpoint, stored_messages, wait_for, wait_until_sent, write_at_rate, write_events,
};
use common::rocketmq::{new_topic, rocketmq};
use common::TestDb;
use mysql_async::prelude::*;
use outbox_devenv::{ReceivedMessage, TopicReader};
use rocketmq_outbox::config::Config;
use rocketmq_outbox::producer::NewEvent;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `(leader, leader_epoch)` of the deployment `name`.
async fn leader(db: &TestDb, name: &str) -> Option<(Option<String>, u64)> {
    db.conn()
        .await
        .exec_first(
            "SELECT leader, leader_epoch FROM outbox_relay_state WHERE name = ?",
            (name,),
        )
        .await
        .unwrap()
}

/// One config file and checkpoint directory per instance a, b and c, all starting at the
/// server's current end.
async fn three_instances(
    db: &TestDb,
    config: &Config,
) -> (Vec<tempfile::TempDir>, HashMap<String, PathBuf>) {
    let start = current_position(db).await;
    let mut dirs = Vec::new();
    let mut files = HashMap::new();
    for instance in ["a", "b", "c"] {
        let dir = tempfile::tempdir().unwrap();
        let mut own = config.clone();
        own.relay.instance_id = Some(instance.to_string());
        own.relay.checkpoint_dir = dir.path().join("checkpoint");
        own.rocketmq.producer_group = format!("{}_{instance}", config.rocketmq.producer_group);
        seed_checkpoint(&own, &start);
        files.insert(instance.to_string(), write_config_file(&own, dir.path()));
        dirs.push(dir);
    }
    (dirs, files)
}

/// Starts a process per instance file and waits until one of them leads deployment `name`.
async fn start_all(
    db: &TestDb,
    name: &str,
    files: &HashMap<String, PathBuf>,
) -> HashMap<String, RelayProcess> {
    let processes = files
        .iter()
        .map(|(instance, file)| (instance.clone(), RelayProcess::spawn(file)))
        .collect();
    wait_for("a leader", Duration::from_secs(30), || async {
        leader(db, name).await.is_some_and(|(l, _)| l.is_some())
    })
    .await;
    processes
}

/// How long the steady-rate failover test writes (`OUTBOX_FAILOVER_SECONDS`; the leader is
/// killed every 10 s meanwhile). 35 s in CI: three kills. The 2-minute demonstration:
/// `OUTBOX_FAILOVER_SECONDS=120 scripts/test.sh --test suite -- failover::a_leader_killed`.
fn failover_seconds() -> u32 {
    std::env::var("OUTBOX_FAILOVER_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(35)
}

/// Three instances; eight writers commit single events at 1,000/s in all while the
/// leader is killed with SIGKILL every 10 s (a supervisor restarts it at once, as a standby). A
/// standby takes over each time and reads back what the old leader stored but had not recorded
/// SENT: every event arrives once, in key order, and nothing is left SENDING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_every_ten_seconds_loses_nothing_and_resends_almost_nothing() {
    let db = TestDb::migrated("failover").await;
    let topic = new_topic("failover");
    let (config, _base_dir) = relay_fixture(&db)
        .sweeper(
            Duration::from_secs(1),
            Duration::from_secs(10),
            Duration::from_secs(5),
        )
        .build();
    let name = config.relay.name.clone();
    let (_dirs, files) = three_instances(&db, &config).await;
    let mut processes = start_all(&db, &name, &files).await;

    const RATE: u32 = 1_000;
    let seconds = failover_seconds();
    let started = Instant::now();
    let writer = {
        let db = db.clone_handle();
        let topic = topic.clone();
        tokio::spawn(async move { write_at_rate(&db, &topic, RATE, seconds, 400).await })
    };
    let mut takeovers = Vec::new();
    let mut kill_at = Duration::from_secs(10);
    while kill_at < Duration::from_secs(u64::from(seconds)) {
        tokio::time::sleep(kill_at.saturating_sub(started.elapsed())).await;
        kill_at += Duration::from_secs(10);
        let (current, epoch) = leader(&db, &name).await.unwrap();
        let current = current.expect("a leader is recorded");
        processes.remove(&current).unwrap().kill();
        let killed_at = Instant::now();
        // The killed instance comes back at once, as a supervisor would restart it: a standby now.
        processes.insert(current.clone(), RelayProcess::spawn(&files[&current]));
        wait_for("a new leader", Duration::from_secs(30), || async {
            leader(&db, &name)
                .await
                .is_some_and(|(l, e)| e > epoch && l.is_some())
        })
        .await;
        let (next, _) = leader(&db, &name).await.unwrap();
        takeovers.push((current, next.unwrap(), killed_at.elapsed()));
    }
    let total = writer.await.unwrap();
    let writing = started.elapsed();
    wait_until_sent(&db, total as u64, Duration::from_secs(180)).await;
    // Whatever the killed leaders had claimed was recovered within a lease.
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Sending).await,
        0,
        "no row is left SENDING"
    );
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Failed).await,
        0,
        "no row FAILED"
    );
    for process in processes.into_values() {
        process.stop();
    }

    assert_every_event_arrived_in_key_order(&db, &topic, total).await;
    let per_event = deliveries(&rocketmq().namesrv_addr(), &topic, total).await;
    assert_eq!(per_event.len(), total, "every event arrived");
    for (killed, next, took) in &takeovers {
        println!("leader {killed} killed: {next} took over in {took:?}");
        assert!(*took < Duration::from_secs(15), "takeover is bounded");
    }
    let duplicates = duplicates(&per_event);
    let per_second = total as f64 / writing.as_secs_f64();
    // The bound of issue 52: at most 0.01 % of the events, and never more than 5 per takeover.
    let bound = (total / 10_000).max(1).min(5 * takeovers.len());
    println!(
        "{} leader kills during {total} events written at {per_second:.0}/s: 0 lost, \
         {duplicates} duplicates (bound {bound})",
        takeovers.len()
    );
    assert!(
        duplicates <= bound,
        "{duplicates} duplicates for {} takeovers of {total} events: more than {bound}",
        takeovers.len()
    );
}

/// Every instance was down for twice `sweeper.min_age` while a backlog was written. When they
/// start, the new leader re-reads the backlog from the binlog; the sweepers (the standbys' and
/// its own) must leave it alone, since they stay behind how far the stream has read, not behind
/// the wall clock. Few duplicates, key order kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_written_while_every_instance_was_down_is_not_swept_twice() {
    let db = TestDb::migrated("catch_up").await;
    let topic = new_topic("catch_up");
    let (config, _base_dir) = relay_fixture(&db)
        .sweeper(
            Duration::from_millis(500),
            Duration::from_secs(3),
            Duration::from_secs(10),
        )
        .build();
    let name = config.relay.name.clone();
    let (_dirs, files) = three_instances(&db, &config).await;

    // A first life: the three run, 1,000 events flow, all stop.
    const FIRST: usize = 1_000;
    let processes = start_all(&db, &name, &files).await;
    write_events(&db, &topic, 2, FIRST / 2, 200).await;
    wait_until_sent(&db, FIRST as u64, Duration::from_secs(60)).await;
    for process in processes.into_values() {
        process.stop();
    }
    // While all are down: 20,000 events, then twice min_age.
    const BACKLOG: usize = 20_000;
    write_events(&db, &topic, 4, BACKLOG / 4, 200).await;
    tokio::time::sleep(config.sweeper.min_age * 2).await;

    let started = Instant::now();
    let processes = start_all(&db, &name, &files).await;
    const TOTAL: usize = FIRST + BACKLOG;
    wait_until_sent(&db, TOTAL as u64, Duration::from_secs(180)).await;
    let took = started.elapsed();
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Sending).await,
        0,
        "no row is left SENDING"
    );
    for process in processes.into_values() {
        process.stop();
    }
    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), &topic)
        .await
        .unwrap();
    let messages = assert_read_every_event_in_key_order(&db, &mut reader, TOTAL).await;
    reader.close().await;
    let duplicates = messages.len() - TOTAL;
    println!(
        "backlog of {BACKLOG} after every instance was down: SENT {took:.1?} after the restart, \
         {duplicates} duplicates"
    );
    assert!(
        duplicates * 100 < BACKLOG,
        "{duplicates} duplicates: the sweepers raced the catching-up stream"
    );
}

/// A leader frozen (`SIGSTOP`, as a paused VM or a stalled host) longer than its lock connection's
/// idle limit: the server frees its lock and a standby takes over. When the old leader thaws, its
/// fence stops it before its next send (its validity ran out, and its watch finds the lock
/// lost, whichever it meets first): it publishes nothing it read after the freeze, only what was
/// already in flight. Judged by the broker: each stored message names its producer's process in
/// its `UNIQ_KEY`, and no message of the frozen process stored after the thaw is of an event
/// committed after it froze.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_sends_nothing_new_once_it_thaws() {
    let db = TestDb::migrated("frozen_leader").await;
    let topic = new_topic("frozen_leader");
    let (config, _base_dir) = relay_fixture(&db).build();
    let name = config.relay.name.clone();
    let (_dirs, files) = three_instances(&db, &config).await;
    let processes = start_all(&db, &name, &files).await;

    // Each event_id with when its commit returned (ms since the epoch, this machine's clock,
    // which is the broker's too).
    let committed: Arc<Mutex<HashMap<String, i64>>> = Arc::default();
    let stop_writing = tokio_util::sync::CancellationToken::new();
    let writer = {
        let (db, topic) = (db.clone_handle(), topic.clone());
        let (committed, stop) = (committed.clone(), stop_writing.clone());
        tokio::spawn(async move {
            let mut n = 0usize;
            while !stop.is_cancelled() {
                let events = (0..2)
                    .map(|i| {
                        let key = format!("key-{}", (n + i) % 16);
                        NewEvent::new(topic.clone(), key, serde_json::json!({ "n": n + i }))
                    })
                    .collect();
                let ids = commit_events(&mut db.conn().await, events).await;
                let at = now_ms();
                committed
                    .lock()
                    .unwrap()
                    .extend(ids.into_iter().map(|id| (id, at)));
                n += 2;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (frozen, epoch) = leader(&db, &name).await.unwrap();
    let frozen = frozen.expect("a leader is recorded");
    let frozen_pid = processes[&frozen].pid();
    assert!(
        (processes.values())
            .all(|p| p.pid() == frozen_pid || p.pid() & 0xFFFF != frozen_pid & 0xFFFF),
        "two instances share the low 16 bits of their pids: their messages cannot be told apart"
    );
    let frozen_ms = now_ms();
    processes[&frozen].signal(libc::SIGSTOP);
    wait_for("a standby takes over", Duration::from_secs(40), || async {
        leader(&db, &name).await.is_some_and(|(_, e)| e > epoch)
    })
    .await;
    // Past the frozen leader's validity (8 s) for sure, then thaw it while events keep flowing.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let thawed_ms = now_ms();
    processes[&frozen].signal(libc::SIGCONT);
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_writing.cancel();
    writer.await.unwrap();
    let committed = committed.lock().unwrap().clone();
    let total = committed.len();
    wait_until_sent(&db, total as u64, Duration::from_secs(120)).await;
    for process in processes.into_values() {
        process.stop();
    }

    let messages = stored_messages(&topic, total).await;
    assert_eq!(
        copies_per_event(&messages).len(),
        total,
        "every event stored"
    );
    // UNIQ_KEY: the producer's IP (8 hex digits), then its process id (4).
    let by_frozen = |m: &&ReceivedMessage| {
        u32::from_str_radix(m.msg_id.get(8..12).unwrap_or_default(), 16).ok()
            == Some(frozen_pid & 0xFFFF)
    };
    // The frozen process is told apart by its messages: it led for 3 s before the freeze, so
    // it stored some then (else the check below would pass with nothing to check).
    let before_freeze = (messages.iter().filter(by_frozen))
        .filter(|m| m.store_timestamp < frozen_ms)
        .count();
    assert!(
        before_freeze > 0,
        "no stored message names the frozen leader's process ({frozen_pid}): its messages \
         cannot be told apart"
    );
    let after_thaw: Vec<&ReceivedMessage> = messages
        .iter()
        .filter(by_frozen)
        .filter(|m| m.store_timestamp >= thawed_ms)
        .collect();
    let read_after_freeze = after_thaw
        .iter()
        .filter(|m| committed[&m.properties["event_id"]] > frozen_ms)
        .count();
    println!(
        "frozen leader {frozen}: {total} events, {} duplicates; {before_freeze} of its messages \
         stored before the freeze; after the thaw it published {} messages already in flight, \
         {read_after_freeze} committed after it froze",
        messages.len() - total,
        after_thaw.len()
    );
    assert_eq!(
        read_after_freeze, 0,
        "the thawed leader published events committed after it froze"
    );
    // The new leader read back what the frozen one stored but had not recorded: what is sent
    // twice is at most the frozen leader's sends in flight.
    let duplicates = messages.len() - total;
    assert!(
        duplicates <= 5,
        "{duplicates} duplicates at one takeover of a frozen leader: more than 5"
    );
    assert_every_event_arrived_in_key_order(&db, &topic, total).await;
}

/// Now, in milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
