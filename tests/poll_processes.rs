//! Poll-mode relay processes: SIGKILL mid-run then restart (after the lease expires) loses
//! nothing; two processes on one table deliver every event, with duplicates counted.

use crate::common;

use common::process::{write_config_file, RelayProcess as Relay};
use common::relay::{
    count_status, deliveries, duplicates, poll_config, wait_for, wait_until_sent, write_events,
};
use common::rocketmq::{new_topic, rocketmq};
use common::TestDb;
use rocketmq_outbox::failpoint::{crash_on_hit, AFTER_SEND_OK};
use rocketmq_outbox::outbox::status::codes::SENDING;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_a_poll_relay_then_restart_loses_nothing() {
    let db = TestDb::migrated("poll_kill").await;
    let topic = new_topic("poll_kill");
    // The restarted process is another owner: it gets the killed one's rows when the lease ends.
    let (mut config, dir) = poll_config(&db, "first", Duration::from_secs(2));
    let first = write_config_file(&config, dir.path());
    config.relay.instance_id = Some("second".into());
    let second_dir = tempfile::tempdir().unwrap();
    let second = write_config_file(&config, second_dir.path());

    let relay = Relay::spawn(&first);
    const TOTAL: usize = 3000;
    let writer = {
        let db = db.clone_handle();
        let topic = topic.clone();
        tokio::spawn(async move { write_events(&db, &topic, 4, TOTAL / 4, 200).await })
    };
    wait_for("some events SENT", Duration::from_secs(60), || async {
        count_status(&db, rocketmq_outbox::outbox::Status::Sent).await >= 300
    })
    .await;
    relay.kill();
    let sent_at_kill = count_status(&db, rocketmq_outbox::outbox::Status::Sent).await;
    let held_at_kill = count_status(&db, rocketmq_outbox::outbox::Status::Sending).await;

    let relay = Relay::spawn(&second);
    writer.await.unwrap();
    wait_until_sent(&db, TOTAL as u64, Duration::from_secs(120)).await;
    relay.stop();
    let per_event = deliveries(&rocketmq().namesrv_addr(), &topic, TOTAL).await;
    assert_eq!(per_event.len(), TOTAL, "every event arrived");
    println!(
        "poll SIGKILL after {sent_at_kill} of {TOTAL} SENT ({held_at_kill} SENDING): 0 lost, {} duplicates",
        duplicates(&per_event)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_poll_relays_on_one_table_deliver_everything() {
    let db = TestDb::migrated("poll_two").await;
    let topic = new_topic("poll_two");
    let (mut config, dir) = poll_config(&db, "a", Duration::from_secs(30));
    let file_a = write_config_file(&config, dir.path());
    config.relay.instance_id = Some("b".into());
    config.rocketmq.producer_group.push_str("_b");
    let dir_b = tempfile::tempdir().unwrap();
    let file_b = write_config_file(&config, dir_b.path());
    let (a, b) = (Relay::spawn(&file_a), Relay::spawn(&file_b));

    const TOTAL: usize = 4000;
    write_events(&db, &topic, 4, TOTAL / 4, 400).await;
    wait_until_sent(&db, TOTAL as u64, Duration::from_secs(120)).await;
    a.stop();
    b.stop();
    let per_event = deliveries(&rocketmq().namesrv_addr(), &topic, TOTAL).await;
    assert_eq!(per_event.len(), TOTAL, "every event arrived");
    let by_owner: Vec<(Option<String>, u64)> = {
        use mysql_async::prelude::*;
        db.conn()
            .await
            .query("SELECT owner, COUNT(*) FROM outbox_event GROUP BY owner")
            .await
            .unwrap()
    };
    println!(
        "two poll relays: {TOTAL} events, {} duplicates; owners left: {by_owner:?}",
        duplicates(&per_event)
    );
}

/// A supervisor restarts a crashed relay under the same `relay.instance_id` (a StatefulSet, a
/// fixed id in the config): the rows the dead process held SENDING are not the new process's. It
/// must not renew their leases; they expire within one lease, return to PENDING and are sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_under_the_same_instance_id_delivers_the_dead_process_rows_within_one_lease() {
    let db = TestDb::migrated("poll_same_id").await;
    let topic = new_topic("poll_same_id");
    let lease = Duration::from_secs(3);
    let (config, dir) = poll_config(&db, "steady", lease);
    let file = write_config_file(&config, dir.path());
    const TOTAL: usize = 400;
    write_events(&db, &topic, 4, TOTAL / 4, 400).await;

    // The first life crashes right after a SEND_OK, holding its claimed batch SENDING.
    let log = dir.path().join("first.log");
    let mut first = Relay::spawn_serving(
        &file,
        "",
        &log,
        &[("FAILPOINTS", &crash_on_hit(AFTER_SEND_OK, 3))],
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = first.exit_status() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the hook never fired; the first life logged:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        status.code(),
        Some(rocketmq_outbox::failpoint::EXIT_CODE),
        "crashed through the hook"
    );
    let held: u64 = {
        use mysql_async::prelude::*;
        db.conn()
            .await
            .query_first(format!(
                "SELECT COUNT(*) FROM outbox_event WHERE status = {SENDING} AND owner = 'steady'"
            ))
            .await
            .unwrap()
            .unwrap()
    };
    assert!(held > 0, "the crashed life held SENDING rows");

    let restarted = std::time::Instant::now();
    let second = Relay::spawn(&file);
    // One lease for the dead life's rows to expire, a lease-keeper round to recover them, a
    // poll to claim and send them; generous for a loaded machine, far below "never".
    wait_until_sent(&db, TOTAL as u64, lease * 2 + Duration::from_secs(10)).await;
    let took = restarted.elapsed();
    second.stop();
    let per_event = deliveries(&rocketmq().namesrv_addr(), &topic, TOTAL).await;
    assert_eq!(per_event.len(), TOTAL, "every event arrived");
    println!(
        "same instance id after a crash: {held} rows held by the dead life, all {TOTAL} SENT \
         {took:.1?} after the restart (lease {lease:?}), {} duplicates",
        duplicates(&per_event)
    );
}
