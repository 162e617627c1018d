//! Poll-mode relay processes: SIGKILL mid-run then restart (after the lease expires) loses
//! nothing; two processes on one table deliver every event, with duplicates counted.

mod common;

use common::relay::{
    count_status, deliveries, duplicates, poll_config, wait_for, wait_until_sent,
    write_config_file, write_events, RelayProcess as Relay,
};
use common::rocketmq::{new_topic, rocketmq};
use common::TestDb;
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
        count_status(&db, 2).await >= 300
    })
    .await;
    relay.kill();
    let sent_at_kill = count_status(&db, 2).await;
    let held_at_kill = count_status(&db, 1).await;

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
