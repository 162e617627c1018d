//! The relay against RocketMQ clusters, the way production runs them: two broker groups behind
//! one name server, a `SYNC_MASTER` with its slave, a broker that auto-creates topics. Each test
//! starts its own cluster (of `$OUTBOX_BROKER`'s kind, Apache RocketMQ by default), because each
//! kills, freezes or reconfigures a broker. Delivery is judged by what the brokers stored.

use crate::common;

use common::relay::{
    commit_events, count_status, current_position, relay_fixture, seed_checkpoint, wait_for,
    wait_until_sent, RunningRelay,
};
use common::TestDb;
use mysql_async::prelude::*;
use outbox_devenv::{scratch_dir, ReceivedMessage, RocketMq, RocketMqOptions, TopicReader};
use rocketmq_outbox::config::Config;
use rocketmq_outbox::outbox::status::codes::{FAILED, SENT};
use rocketmq_outbox::producer::NewEvent;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

pub(crate) fn cluster(label: &str, options: RocketMqOptions) -> RocketMq {
    RocketMq::start_with(&scratch_dir(label).unwrap(), options).expect("cluster starts")
}

/// Two broker groups (`broker-a`, `broker-b`) behind one name server, topics created by hand.
pub(crate) fn two_groups(label: &str) -> RocketMq {
    cluster(
        label,
        RocketMqOptions {
            groups: 2,
            auto_create_topics: false,
            ..RocketMqOptions::default()
        },
    )
}

/// A relay config on `cluster` whose retry policy is 1 s doubling to 4 s, so `max_retry` 30
/// waits 1 + 2 + 4 × 28 = 115 s at most, and half of it at least (jitter), before an event is
/// FAILED: a killed JVM broker's restart took
/// over 27 s (the budget of 8 retries) with the suite running beside it on two cores.
pub(crate) fn config_on(db: &TestDb, cluster: &RocketMq) -> (Config, tempfile::TempDir) {
    let (config, dir) = relay_fixture(db)
        .on(&cluster.namesrv_addr())
        .broker_retries(
            Duration::from_secs(1),
            Duration::from_secs(1),
            Duration::from_secs(4),
            30,
        )
        .build();
    (config, dir)
}

/// `count` events of `topic` in transactions of 5, over `keys` keys, each key's events in order.
async fn write(db: &TestDb, topic: &str, from: usize, count: usize, keys: usize) {
    let mut conn = db.conn().await;
    for chunk in (from..from + count).step_by(5) {
        let events = (chunk..(chunk + 5).min(from + count))
            .map(|n| NewEvent::new(topic, format!("key-{}", n % keys), json!({"n": n})))
            .collect();
        commit_events(&mut conn, events).await;
    }
}

/// Every outbox row SENT, its `msg_id` the id of a message the cluster stored with its
/// event_id, and each key's messages in commit order within every queue they reached. Returns
/// the stored messages.
pub(crate) async fn assert_delivered(
    db: &TestDb,
    cluster: &RocketMq,
    topic: &str,
) -> Vec<ReceivedMessage> {
    let rows: Vec<(u64, String, String, i8, Option<String>)> = db
        .conn()
        .await
        .exec(
            "SELECT id, event_id, biz_key, status, NULLIF(msg_id, '') FROM outbox_event WHERE topic = ? \
             ORDER BY id",
            (topic,),
        )
        .await
        .unwrap();
    let mut reader = TopicReader::new(&cluster.namesrv_addr(), topic)
        .await
        .unwrap();
    let stored = reader
        .read_at_least(rows.len(), Duration::from_secs(60))
        .await
        .unwrap();
    reader.close().await;
    let mut ids_of: HashMap<&str, Vec<&str>> = HashMap::new();
    for m in &stored {
        ids_of
            .entry(m.properties["event_id"].as_str())
            .or_default()
            .push(m.msg_id.as_str());
    }
    let id_of_row: HashMap<&str, u64> = rows.iter().map(|r| (r.1.as_str(), r.0)).collect();
    for (id, event_id, _, status, msg_id) in &rows {
        assert_eq!(*status, SENT, "row {id} ({event_id}) is SENT");
        let msg_id = msg_id.as_deref().unwrap_or_default();
        assert!(
            ids_of
                .get(event_id.as_str())
                .is_some_and(|ids| ids.contains(&msg_id)),
            "row {id}: msg_id {msg_id} is not the id of a stored message of {event_id} ({:?})",
            ids_of.get(event_id.as_str())
        );
    }
    // Per key, per queue: the first arrival of each event follows commit (id) order.
    let mut per_queue: BTreeMap<(String, String, i32), Vec<(i64, u64)>> = BTreeMap::new();
    for m in &stored {
        let key = m.properties["biz_key"].clone();
        per_queue
            .entry((key, m.broker_name.clone(), m.queue_id))
            .or_default()
            .push((m.queue_offset, id_of_row[m.properties["event_id"].as_str()]));
    }
    for (queue, mut seen) in per_queue {
        seen.sort();
        let mut first = Vec::new();
        for (_, id) in &seen {
            if !first.contains(id) {
                first.push(*id);
            }
        }
        assert!(
            first.windows(2).all(|w| w[0] < w[1]),
            "{queue:?}: out of commit order: {seen:?}"
        );
    }
    stored
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_broker_of_two_holds_only_its_keys_for_the_policy_time_then_all_arrive() {
    let db = TestDb::migrated("cluster_freeze").await;
    let mut mq = two_groups("cluster-freeze");
    let topic = "cluster_freeze";
    mq.create_topic(topic, 4).unwrap();
    let (mut config, _dir) = config_on(&db, &mq);
    // One shard per queue (8 = 2 groups × 4): a shard is ordered, so keys of a live broker
    // flow only when no shard mixes them with keys of the frozen one.
    config.relay.shards = 8;
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;
    write(&db, topic, 0, 100, 20).await;
    wait_until_sent(&db, 100, Duration::from_secs(60)).await;

    // broker-b stops answering; its connection stays open, so its route stays (no re-routing).
    let b = mq.broker_index("broker-b", 0).unwrap();
    mq.freeze_broker_at(b);
    let frozen_at = Instant::now();
    write(&db, topic, 100, 200, 20).await;
    // The keys on broker-a keep flowing; those on broker-b back off.
    wait_for(
        "broker-a's keys to flow",
        Duration::from_secs(30),
        || async { count_status(&db, rocketmq_outbox::outbox::Status::Sent).await >= 150 },
    )
    .await;
    // Every SEND_OK on broker-a wakes the shards waiting on broker-b; with wake-ups counted as
    // retries they went FAILED within a second. Hold the freeze for 15 s, well within the policy.
    tokio::time::sleep(Duration::from_secs(15).saturating_sub(frozen_at.elapsed())).await;
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Failed).await,
        0,
        "nothing FAILED while the outage is shorter than the retry policy"
    );
    assert!(
        count_status(&db, rocketmq_outbox::outbox::Status::Sent).await < 300,
        "broker-b's keys waited"
    );
    mq.thaw_broker_at(b);
    wait_until_sent(&db, 300, Duration::from_secs(60)).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.failed, 0);
    assert_delivered(&db, &mq, topic).await;
}

/// Creates `topic` with 4 queues on the master of `group` only, and waits until its route
/// names that group.
fn create_topic_on(cluster: &RocketMq, group: &str, topic: &str) {
    let index = cluster.broker_index(group, 0).expect("the group's master");
    let addr = format!("127.0.0.1:{}", cluster.brokers()[index].port);
    let args = [
        "updateTopic",
        "-b",
        &addr,
        "-t",
        topic,
        "-r",
        "4",
        "-w",
        "4",
    ];
    cluster.mqadmin(&args).expect("mqadmin updateTopic");
    let started = Instant::now();
    while !cluster
        .mqadmin(&["topicRoute", "-t", topic])
        .is_ok_and(|route| route.contains(group))
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no route for {topic}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_broker_group_holds_back_only_the_topic_it_serves() {
    only_group_down_run(GroupFault::Frozen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_broker_group_holds_back_only_the_topic_it_serves() {
    only_group_down_run(GroupFault::Killed).await;
}

/// How a broker group stops answering.
#[derive(Clone, Copy, Debug)]
enum GroupFault {
    /// SIGSTOP: its connections stay open and its route stays registered; sends time out.
    Frozen,
    /// kill -9, restarted at the end: the name server drops its route, so a topic it alone
    /// serves has none.
    Killed,
}

/// Two topics at 50 events/s each, each on its own broker group; `broker-b`, the stuck topic's
/// only group, down (`fault`) 6 s in for 20 s (or `OUTBOX_FAULT_HOLD_SECS`), 3 s after. The
/// healthy topic's p99 stays within the bound, nothing FAILED (the retry policy outlasts the
/// hold), and both topics' events are all stored, each key on its queue in commit order.
async fn only_group_down_run(fault: GroupFault) {
    use crate::isolation::{assert_only_the_stuck_topic_waited, SteadyLoad};
    let label = match fault {
        GroupFault::Frozen => "frozen",
        GroupFault::Killed => "killed",
    };
    let db = TestDb::migrated(&format!("cluster_only_{label}")).await;
    let mut mq = two_groups(&format!("cluster-only-{label}"));
    let (healthy, stuck) = ("isolation_on_a", "isolation_on_b");
    create_topic_on(&mq, "broker-a", healthy);
    create_topic_on(&mq, "broker-b", stuck);
    let (mut config, _dir) = config_on(&db, &mq);
    config.relay.park_after = Duration::from_secs(2);
    config.sweeper.min_age = Duration::from_secs(1);
    let hold = common::fault_hold(Duration::from_secs(20));
    // 1 s, 2 s, then 4 s per retry, at least 2 s with jitter: the policy outlasts the hold.
    config.retry.max_retry = config.retry.max_retry.max(hold.as_secs() as u32 / 2 + 15);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;
    let mut load = SteadyLoad::start(&db, [stuck.to_string(), healthy.to_string()], 100).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let b = mq.broker_index("broker-b", 0).unwrap();
    match fault {
        GroupFault::Frozen => mq.freeze_broker_at(b),
        GroupFault::Killed => mq.kill_broker_at(b),
    }
    let down_from = load.elapsed().await;
    tokio::time::sleep(hold).await;
    let waiting = load.not_sent(stuck).await;
    let down_to = load.elapsed().await;
    match fault {
        GroupFault::Frozen => mq.thaw_broker_at(b),
        GroupFault::Killed => mq.start_broker_at(b).expect("broker-b restarts"),
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let total = load.stop().await;
    wait_until_sent(&db, total, Duration::from_secs(120) + hold).await;
    let summary = relay.stop().await;
    assert_eq!(
        summary.marked.failed, 0,
        "the outage is shorter than the retry policy"
    );

    let before = load.latencies(healthy, 1.0, 6.0).await;
    // From 2 s in: the first send to a frozen broker-b has timed out (1 s) by then.
    let during = load.latencies(healthy, down_from + 2.0, down_to).await;
    let name = format!("broker group {label}");
    assert_only_the_stuck_topic_waited(&before, &during, waiting, &name);
    for topic in [healthy, stuck] {
        assert_delivered(&db, &mq, topic).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_broker_group_keeps_every_key_on_its_queue_and_the_other_keys_flowing() {
    use crate::isolation::{assert_healthy_latency_kept, SteadyLoad};
    let db = TestDb::migrated("cluster_kill").await;
    let mut mq = two_groups("cluster-kill");
    // Four queues on each group: keys spread over eight.
    let topic = "cluster_kill";
    mq.create_topic(topic, 4).unwrap();
    let (mut config, _dir) = config_on(&db, &mq);
    config.sweeper.interval = Duration::from_millis(500);
    config.sweeper.min_age = Duration::from_secs(1);
    config.relay.park_after = Duration::from_secs(2);
    let hold = common::fault_hold(Duration::from_secs(15));
    config.retry.max_retry = config.retry.max_retry.max(hold.as_secs() as u32 / 2 + 15);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;
    let mut load = SteadyLoad::start(&db, [topic.to_string(), topic.to_string()], 100).await;
    // 6 s before, broker-b killed (the name server drops its route at once) for 15 s (or
    // `OUTBOX_FAULT_HOLD_SECS`). By default its keys keep their queues and wait for it;
    // broker-a's keys go on.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let b = mq.broker_index("broker-b", 0).unwrap();
    mq.kill_broker_at(b);
    let killed_at = load.elapsed().await;
    tokio::time::sleep(hold).await;
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Failed).await,
        0,
        "nothing FAILED during the outage"
    );
    let restarted_at = load.elapsed().await;
    mq.start_broker_at(b).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let total = load.stop().await;
    wait_until_sent(&db, total, Duration::from_secs(120) + hold).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.failed, 0);
    let stored = assert_delivered(&db, &mq, topic).await;

    let queues_of = assert_each_key_on_one_queue(&stored);
    let on_a: Vec<String> = queues_of
        .iter()
        .filter(|(_, q)| q[0].0 == "broker-a")
        .map(|(key, _)| key.clone())
        .collect();
    let on_b = queues_of.len() - on_a.len();
    assert!(
        !on_a.is_empty() && on_b > 0,
        "keys on both groups: {queues_of:?}"
    );

    // broker-a's keys kept flowing; broker-b's waited.
    let of_a = |key: &str| on_a.iter().any(|k| k == key);
    let before = load.latencies_of(topic, of_a, 1.0, killed_at).await;
    let during = load
        .latencies_of(topic, of_a, killed_at + 2.0, restarted_at)
        .await;
    let b_during = load
        .latencies_of(topic, |key| !of_a(key), killed_at + 2.0, restarted_at)
        .await;
    println!("{on_b} of {} keys on broker-b", queues_of.len());
    assert_healthy_latency_kept(&before, &during, "broker group killed");
    assert!(
        !b_during.is_empty() && b_during.iter().all(|&ms| ms > 1_000.0),
        "broker-b's keys waited for it: {b_during:?}"
    );
}

/// The queues (group, queue id) each key's messages were stored on, after checking that no
/// key's are on two.
pub(crate) fn assert_each_key_on_one_queue(
    stored: &[ReceivedMessage],
) -> BTreeMap<String, Vec<(String, i32)>> {
    let mut queues_of: BTreeMap<String, Vec<(String, i32)>> = BTreeMap::new();
    for m in stored {
        let queues = queues_of
            .entry(m.properties["biz_key"].clone())
            .or_default();
        let queue = (m.broker_name.clone(), m.queue_id);
        if !queues.contains(&queue) {
            queues.push(queue);
        }
    }
    let moved: Vec<_> = queues_of.iter().filter(|(_, q)| q.len() > 1).collect();
    assert!(moved.is_empty(), "keys stored on two queues: {moved:?}");
    queues_of
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_started_while_a_group_is_down_keeps_that_groups_keys_on_their_queues() {
    let db = TestDb::migrated("cluster_recall").await;
    let mut mq = two_groups("cluster-recall");
    let topic = "cluster_recall";
    mq.create_topic(topic, 4).unwrap();
    let (mut config, _dir) = config_on(&db, &mq);
    config.sweeper.min_age = Duration::from_secs(1);
    config.relay.park_after = Duration::from_secs(2);
    seed_checkpoint(&config, &current_position(&db).await);
    // A first instance sends over all eight queues, and keeps the list in the database.
    let relay = RunningRelay::start(&config).await;
    write(&db, topic, 0, 40, 10).await;
    wait_until_sent(&db, 40, Duration::from_secs(60)).await;
    relay.stop().await;
    let groups: Vec<(String, i32)> = db
        .conn()
        .await
        .exec(
            "SELECT broker_group, write_queues FROM outbox_topic_queues WHERE topic = ? \
             ORDER BY broker_group",
            (topic,),
        )
        .await
        .unwrap();
    assert_eq!(groups, [("broker-a".into(), 4), ("broker-b".into(), 4)]);

    // broker-b is down when the next instance starts (a restart, a takeover): it has never
    // seen broker-b, yet broker-b's keys keep their queues and wait; broker-a's go on.
    let b = mq.broker_index("broker-b", 0).unwrap();
    mq.kill_broker_at(b);
    let relay = RunningRelay::start(&config).await;
    write(&db, topic, 40, 40, 10).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let sent = count_status(&db, rocketmq_outbox::outbox::Status::Sent).await;
    assert!(
        (41..80).contains(&sent),
        "broker-a's keys went on, broker-b's waited: {sent} of 80 SENT"
    );
    mq.start_broker_at(b).unwrap();
    wait_until_sent(&db, 80, Duration::from_secs(120)).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.failed, 0);
    let stored = assert_delivered(&db, &mq, topic).await;
    let queues_of = assert_each_key_on_one_queue(&stored);
    assert!(
        queues_of.values().any(|q| q[0].0 == "broker-b"),
        "some keys are on broker-b: {queues_of:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topics_only_broker_down_while_another_is_up_retries_its_events() {
    let db = TestDb::migrated("cluster_only_broker").await;
    let mut mq = two_groups("cluster-only");
    // The topic lives on broker-b alone; broker-a stays up the whole time.
    let topic = "cluster_only_b";
    let b = mq.broker_index("broker-b", 0).unwrap();
    let a = mq.broker_index("broker-a", 0).unwrap();
    mq.stop_broker_at(a);
    mq.create_topic(topic, 4).unwrap();
    mq.start_broker_at(a).unwrap();
    let (config, _dir) = config_on(&db, &mq);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;
    write(&db, topic, 0, 20, 5).await;
    wait_until_sent(&db, 20, Duration::from_secs(60)).await;

    mq.kill_broker_at(b);
    write(&db, topic, 20, 20, 5).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let failed: Vec<(String, Option<String>)> = {
        use mysql_async::prelude::*;
        db.conn()
            .await
            .query(format!(
                "SELECT event_id, last_error FROM outbox_event WHERE status = {FAILED}"
            ))
            .await
            .unwrap()
    };
    assert!(failed.is_empty(), "retried, not FAILED: {failed:?}");
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Sent).await,
        20,
        "nothing SENT while broker-b is down"
    );
    mq.start_broker_at(b).unwrap();
    wait_until_sent(&db, 40, Duration::from_secs(90)).await;
    relay.stop().await;
    assert_delivered(&db, &mq, topic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_the_broker_auto_creates_gets_its_first_and_every_later_event() {
    let db = TestDb::migrated("cluster_auto_create").await;
    // Apache's default: autoCreateTopicEnable = true.
    let mq = cluster("cluster-auto", RocketMqOptions::default());
    let topic = format!("auto_created_{}", std::process::id());
    let (config, _dir) = config_on(&db, &mq);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;
    write(&db, &topic, 0, 1, 3).await;
    wait_until_sent(&db, 1, Duration::from_secs(30)).await;
    write(&db, &topic, 1, 39, 3).await;
    wait_until_sent(&db, 40, Duration::from_secs(30)).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.failed, 0);
    let stored = assert_delivered(&db, &mq, &topic).await;
    // Each key stayed on one queue: the first event went where the later ones go.
    let mut queue_of: HashMap<&str, (String, i32)> = HashMap::new();
    for m in &stored {
        let at = (m.broker_name.clone(), m.queue_id);
        let first = queue_of
            .entry(m.properties["biz_key"].as_str())
            .or_insert(at.clone());
        assert_eq!(*first, at, "{} changed queue", m.properties["biz_key"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_master_without_its_slave_is_never_taken_as_sent() {
    let db = TestDb::migrated("cluster_sync_slave").await;
    let mut mq = cluster(
        "cluster-sync",
        RocketMqOptions {
            sync_slaves: true,
            auto_create_topics: false,
            ..RocketMqOptions::default()
        },
    );
    let topic = "cluster_sync";
    mq.create_topic(topic, 4).unwrap();
    let (mut config, _dir) = config_on(&db, &mq);
    config.retry.max_retry = 1000;
    config.rocketmq.send_timeout = Duration::from_secs(3); // longer than the slaveTimeout
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;
    write(&db, topic, 0, 10, 5).await;
    wait_until_sent(&db, 10, Duration::from_secs(60)).await;

    // A slave that does not answer: the master stores each message but answers
    // FLUSH_SLAVE_TIMEOUT after its slaveTimeout. Then a slave that is gone: the master refuses.
    let slave = mq.broker_index("broker-a", 1).unwrap();
    mq.freeze_broker_at(slave);
    write(&db, topic, 10, 10, 5).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Sent).await,
        10,
        "no SENT on FLUSH_SLAVE_TIMEOUT"
    );
    mq.kill_broker_at(slave);
    write(&db, topic, 20, 10, 5).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Sent).await,
        10,
        "no SENT without the slave"
    );
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Failed).await,
        0,
        "and nothing FAILED"
    );
    mq.start_broker_at(slave).unwrap();
    wait_until_sent(&db, 30, Duration::from_secs(90)).await;
    relay.stop().await;
    let stored = assert_delivered(&db, &mq, topic).await;
    // The master stored the frozen-slave sends it answered FLUSH_SLAVE_TIMEOUT to; they were
    // sent again: stored, yet never taken as sent.
    assert!(
        stored.len() > 30,
        "the FLUSH_SLAVE_TIMEOUT answers left copies on the master ({} stored)",
        stored.len()
    );
}
