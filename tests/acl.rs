//! The relay and the consumer library against Apache RocketMQ 5.3 with ACL 2.0 on
//! (authentication and authorization, `RocketMqOptions::acl`), with ordinary accounts made and
//! granted by the real `mqadmin`. One cluster serves the binary; each test has its own topic,
//! accounts and database. Delivery is judged by what the broker stored.
//!
//! - How the broker refuses an unknown access key, a wrong secret and an account without `Pub`:
//!   printed, and each is `SendError::Unauthorized` for the relay's sink.
//! - Right credentials: every row SENT, and a reader signed as an ordinary account finds each
//!   row's `msg_id` on a stored message of its event.
//! - A wrong secret (in `secret_key_file`) and an account without `Pub`: nothing FAILED, the rows
//!   wait, the broker stores nothing, `/readyz` is not ready and the log says what to fix; once
//!   fixed (the file corrected, the permission granted) the rows go out without a restart.
//! - The consumer library signed as an ordinary account consumes every event once.
//! - `rocketmq.tls = true` against a cluster of its own that takes TLS only
//!   (`tls.server.mode=enforcing`, a private CA the relay process trusts through
//!   `$SSL_CERT_FILE`): plain and untrusted clients get nowhere, every row is SENT, `mqadmin
//!   queryMsgById` (over TLS) finds each `msg_id`, and the consumer library reads them over TLS.

use crate::common;

use common::http::{free_addr, get, wait_until_refused};
use common::ledger::{ledger_db, Ledger};
use common::process::{write_config_file, RelayProcess};
use common::relay::{
    assert_read_every_event_in_key_order, count_status, current_position, relay_config_on,
    seed_checkpoint, wait_for, wait_until_sent, write_events, RunningRelay,
};
use common::{wait_until, TestDb};
use mysql_async::prelude::*;
use outbox_devenv::rocketmq::apache::printed_message_ids;
use outbox_devenv::{
    scratch_dir, AclAccount, BrokerKind, ClientHost, RocketMq, RocketMqOptions, TopicReader,
};
use rocketmq_outbox::config::{Config, Secret};
use rocketmq_outbox::consumer::{IdempotentProcessor, IdempotentPushConsumer, PushConsumerOptions};
use rocketmq_outbox::leader::Fence;
use rocketmq_outbox::outbox::status::codes::SENT;
use rocketmq_outbox::outbox::OutboundMessage;
use rocketmq_outbox::send::{RocketMqSink, SendError, Sink};
use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The cluster's super user (it also signs the broker's own inner clients and the harness).
fn root() -> AclAccount {
    AclAccount::new("outboxroot", "root-secret-7")
}

/// One Apache cluster with authentication and authorization on, topics created by hand.
pub fn cluster() -> &'static RocketMq {
    static CLUSTER: OnceLock<RocketMq> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let options = RocketMqOptions {
            kind: Some(BrokerKind::Apache),
            acl: Some(root()),
            auto_create_topics: false,
            ..RocketMqOptions::default()
        };
        RocketMq::start_with(&scratch_dir("acl").unwrap(), options)
            .expect("an Apache cluster with ACL 2.0 starts")
    })
}

/// A new topic `acl_<label>_<pid>` with 4 queues.
pub fn new_topic(label: &str) -> String {
    new_topic_on(cluster(), label)
}

fn new_topic_on(cluster: &RocketMq, label: &str) -> String {
    let topic = format!("acl_{label}_{}", std::process::id());
    cluster.create_topic(&topic, 4).expect("create topic");
    topic
}

/// A new ordinary account `<name><pid>n<k>` (no permissions yet).
pub fn new_account(name: &str) -> AclAccount {
    new_account_on(cluster(), name)
}

fn new_account_on(cluster: &RocketMq, name: &str) -> AclAccount {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let k = NEXT.fetch_add(1, Ordering::Relaxed);
    let user = format!("{name}{}n{k}", std::process::id());
    let account = AclAccount::new(user, format!("{name}-pw-42"));
    cluster.create_user(&account).expect("mqadmin createUser");
    account
}

/// `account` may publish to `topic`.
pub fn grant_pub(cluster: &RocketMq, account: &AclAccount, topic: &str) {
    let resource = format!("Topic:{topic}");
    cluster
        .grant(&account.access_key, &resource, "Pub")
        .expect("mqadmin createAcl");
}

/// A new account allowed to subscribe to `topics` (and to any group).
pub fn reader_account(topics: &[&str]) -> AclAccount {
    let reader = new_account("reader");
    for topic in topics {
        cluster()
            .grant(&reader.access_key, &format!("Topic:{topic}"), "Sub")
            .unwrap();
    }
    cluster()
        .grant(&reader.access_key, "Group:*", "Sub")
        .unwrap();
    reader
}

/// A reader of `topic` signed as a new account allowed to subscribe to it (and to any group).
async fn signed_reader(topic: &str) -> TopicReader {
    let reader = reader_account(&[topic]);
    TopicReader::with_credentials(&cluster().namesrv_addr(), topic, Some(reader))
        .await
        .expect("reader starts")
}

/// A relay config for `db` on the cluster, signed as `account`, whose retry policy would FAIL
/// an event after 0.2 + 0.4 + 0.8 s if refusals counted as retries.
pub fn config_as(db: &TestDb, account: &AclAccount) -> (Config, tempfile::TempDir) {
    let (mut config, dir) = relay_config_on(db, &cluster().namesrv_addr());
    config.rocketmq.access_key = Some(account.access_key.clone());
    config.rocketmq.secret_key = Some(Secret::new(account.secret_key.as_str()));
    config.retry.max_retry = 3;
    config.retry.initial_backoff = Duration::from_millis(200);
    config.retry.max_backoff = Duration::from_millis(800);
    (config, dir)
}

fn message(topic: &str) -> OutboundMessage {
    OutboundMessage {
        event_id: "probe-event".into(),
        biz_key: "probe-key".into(),
        topic: topic.into(),
        tags: None,
        headers: vec![],
        payload: "{}".into(),
        deliver_at_ms: None,
    }
}

/// What the relay's sink and `mqadmin` (whose Java client keeps the broker's remark, which the
/// Rust client drops) get from the broker when signed as `account`.
async fn refusal_of(account: &AclAccount, topic: &str) -> (SendError, String) {
    let mut config = Config::default().rocketmq;
    config.namesrv_addr = Some(cluster().namesrv_addr());
    config.access_key = Some(account.access_key.clone());
    config.secret_key = Some(Secret::new(account.secret_key.as_str()));
    let sink = RocketMqSink::start(&config)
        .await
        .expect("the producer starts");
    let answer = sink
        .send(topic, 0, &[&message(topic)], &Fence::open())
        .await;
    sink.shutdown().await;
    let out = cluster()
        .mqadmin_as(account, &["sendMessage", "-t", topic, "-p", "probe"])
        .expect("mqadmin runs");
    let remark = out
        .stderr
        .lines()
        .find(|line| line.contains("CODE:"))
        .map(|line| line.trim().to_string())
        .unwrap_or_else(|| format!("no refusal printed: {}{}", out.stdout, out.stderr));
    (answer.expect_err("the broker refuses").error, remark)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_refuses_unknown_keys_wrong_secrets_and_missing_permissions_alike() {
    let topic = new_topic("refusals");
    let granted = new_account("granted");
    let no_pub = new_account("nopub");
    grant_pub(cluster(), &granted, &topic);
    let cases = [
        (
            "unknown access key",
            AclAccount::new("nosuchuser", "x-secret"),
        ),
        (
            "wrong secret",
            AclAccount::new(granted.access_key.as_str(), "not-the-secret"),
        ),
        ("no Pub permission", no_pub),
    ];
    for (case, account) in &cases {
        let (error, remark) = refusal_of(account, &topic).await;
        println!("{case}: relay sink: {error}\n{case}: mqadmin (Java client): {remark}");
        assert!(
            matches!(&error, SendError::Unauthorized(r) if r.contains("broker code 16")),
            "{case}: {error:?}"
        );
        assert!(remark.contains("CODE: 16"), "{case}: {remark}");
    }
    // The account with Pub is accepted, and the broker stored what it sent.
    let mut config = Config::default().rocketmq;
    config.namesrv_addr = Some(cluster().namesrv_addr());
    config.access_key = Some(granted.access_key.clone());
    config.secret_key = Some(Secret::new(granted.secret_key.as_str()));
    let sink = RocketMqSink::start(&config).await.unwrap();
    let ids = sink
        .send(&topic, 0, &[&message(&topic)], &Fence::open())
        .await
        .unwrap();
    sink.shutdown().await;
    let mut reader = signed_reader(&topic).await;
    let stored = reader
        .read_at_least(1, Duration::from_secs(30))
        .await
        .unwrap();
    reader.close().await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].msg_id, ids[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_right_credentials_every_row_is_sent_and_stored_under_its_msg_id() {
    let db = TestDb::migrated("acl_right").await;
    let topic = new_topic("right");
    let writer = new_account("writer");
    grant_pub(cluster(), &writer, &topic);
    let (config, _dir) = config_as(&db, &writer);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;
    write_events(&db, &topic, 2, 25, 8).await;
    wait_until_sent(&db, 50, Duration::from_secs(60)).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.failed, 0);
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Failed).await,
        0
    );
    let mut reader = signed_reader(&topic).await;
    let stored = assert_read_every_event_in_key_order(&db, &mut reader, 50).await;
    reader.close().await;
    assert!(stored.len() >= 50);
}

/// A relay process signed as an account the broker refuses for `topic`: its rows wait (none
/// FAILED, none SENT, nothing stored), `/readyz` names the topic and the log says what to fix,
/// never the secrets in `hidden`; after `fix` the rows go out without a restart.
async fn refused_until_fixed(
    db: &TestDb,
    topic: &str,
    (config, dir): (Config, tempfile::TempDir),
    hidden: &[&str],
    fix: impl FnOnce(),
) {
    seed_checkpoint(&config, &current_position(db).await);
    let addr = free_addr();
    let log = dir.path().join("relay.log");
    let file = write_config_file(&config, dir.path());
    let relay = RelayProcess::spawn_serving(&file, &addr, &log, &[]);
    let started = std::time::Instant::now();
    write_events(db, topic, 1, 6, 3).await;
    wait_until_refused(&addr, topic).await;
    // Refusals counted as retries would have FAILED the rows after 1.4 s.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (status, body) = get(&addr, "/readyz").unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("\"broker_auth\":false"), "{body}");
    assert_eq!(
        count_status(db, rocketmq_outbox::outbox::Status::Failed).await,
        0,
        "nothing FAILED"
    );
    assert_eq!(
        count_status(db, rocketmq_outbox::outbox::Status::Sent).await,
        0,
        "nothing SENT"
    );
    let waiting = count_status(db, rocketmq_outbox::outbox::Status::Pending).await
        + count_status(db, rocketmq_outbox::outbox::Status::Sending).await;
    assert_eq!(
        waiting, 6,
        "every row waits (PENDING, or claimed by the sweeper)"
    );
    let mut reader = signed_reader(topic).await;
    let stored = reader.read_all_for(Duration::from_secs(2)).await.unwrap();
    assert!(stored.is_empty(), "the broker stored nothing: {stored:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    let advice = format!(
        "RocketMQ refused the relay's credentials for topic {topic}: check rocketmq.access_key"
    );
    assert!(text.contains(&advice), "the log says what to fix:\n{text}");
    let first = text
        .lines()
        .find(|line| line.contains(&advice))
        .unwrap_or_default();
    println!("the relay logs: {first}");
    assert!(text.contains("ERROR"), "{text}");
    // Each lane is refused at every attempt (~every second): one line per 10 s stands for them.
    let lines = text.lines().filter(|line| line.contains(&advice)).count() as u64;
    let allowed = 1 + started.elapsed().as_secs() / 10;
    assert!(
        lines <= allowed,
        "{lines} lines of advice in {:?}, at most one per 10 s:\n{text}",
        started.elapsed()
    );
    for secret in hidden {
        assert!(!text.contains(secret), "the log shows a secret:\n{text}");
    }

    fix();
    wait_until_sent(db, 6, Duration::from_secs(60)).await;
    wait_for(
        "/readyz to be ready again",
        Duration::from_secs(30),
        || async { get(&addr, "/readyz").is_some_and(|(status, _)| status == 200) },
    )
    .await;
    relay.stop();
    assert_eq!(
        count_status(db, rocketmq_outbox::outbox::Status::Failed).await,
        0,
        "nothing FAILED"
    );
    assert_read_every_event_in_key_order(db, &mut reader, 6).await;
    reader.close().await;
}

/// Replaces `path`'s content at once (as a Kubernetes Secret update does).
fn write_secret(path: &Path, secret: &str) {
    let staged = path.with_extension("new");
    std::fs::write(&staged, format!("{secret}\n")).unwrap();
    std::fs::rename(staged, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_fails_nothing_and_the_corrected_secret_file_is_used_without_a_restart() {
    let db = TestDb::migrated("acl_wrong_secret").await;
    let topic = new_topic("wrong_secret");
    let writer = new_account("rotated");
    grant_pub(cluster(), &writer, &topic);
    let (mut config, dir) = config_as(&db, &writer);
    let secret_file = dir.path().join("rocketmq-secret");
    write_secret(&secret_file, "stale-secret-99");
    config.rocketmq.secret_key = None;
    config.rocketmq.secret_key_file = Some(secret_file.clone());
    let hidden = ["stale-secret-99", writer.secret_key.as_str()];
    refused_until_fixed(&db, &topic, (config, dir), &hidden, || {
        write_secret(&secret_file, &writer.secret_key)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_without_pub_fails_nothing_and_sends_once_granted_without_a_restart() {
    let db = TestDb::migrated("acl_no_pub").await;
    let topic = new_topic("no_pub");
    let writer = new_account("ungranted");
    let config = config_as(&db, &writer);
    let hidden = [writer.secret_key.as_str()];
    refused_until_fixed(&db, &topic, config, &hidden, || {
        grant_pub(cluster(), &writer, &topic)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_library_signed_as_an_ordinary_account_consumes_every_event_once() {
    let db = ledger_db("acl_consumer").await;
    let topic = new_topic("consumer");
    let writer = new_account("producer");
    grant_pub(cluster(), &writer, &topic);
    let (config, _dir) = config_as(&db, &writer);
    seed_checkpoint(&config, &current_position(&db).await);
    let relay = RunningRelay::start(&config).await;
    write_events(&db, &topic, 1, 20, 4).await;
    wait_until_sent(&db, 20, Duration::from_secs(60)).await;
    relay.stop().await;

    let consumer_account = new_account("consumer");
    let group = format!("acl_consumer_group_{}", std::process::id());
    cluster()
        .grant(
            &consumer_account.access_key,
            &format!("Topic:{topic}"),
            "Sub",
        )
        .unwrap();
    cluster()
        .grant(
            &consumer_account.access_key,
            &format!("Group:{group}"),
            "Sub",
        )
        .unwrap();
    let ledger = Arc::new(Ledger::new("acl"));
    let processor = Arc::new(
        IdempotentProcessor::new(db.pool.clone(), group.as_str(), Arc::clone(&ledger)).unwrap(),
    );
    let options = PushConsumerOptions::new(cluster().namesrv_addr(), topic.as_str())
        .with_security(consumer_account.security());
    let host = Arc::new(ClientHost::new("acl-consumer").unwrap());
    let consumer = IdempotentPushConsumer::start(host, options, Arc::clone(&processor))
        .await
        .expect("the signed consumer starts");
    wait_until("20 ledger rows", Duration::from_secs(90), || async {
        db.count("ledger").await == 20
    })
    .await;
    consumer.shutdown().await;
    let counts = processor.metrics().counts(&group, &topic);
    assert_eq!(counts.processed, 20, "{counts:?}");
    assert_eq!(ledger.calls(), 20);
}

/// A sink on `cluster` for `topic`, with `tls` and no trusted CA of the cluster's: how far does
/// it get?
async fn route_with_tls(cluster: &RocketMq, tls: bool, topic: &str) -> Result<usize, SendError> {
    let mut config = Config::default().rocketmq;
    config.namesrv_addr = Some(cluster.namesrv_addr());
    config.tls = tls;
    config.send_timeout = Duration::from_secs(1);
    let sink = RocketMqSink::start(&config)
        .await
        .expect("the producer starts");
    let route = sink.queue_count(topic).await;
    sink.shutdown().await;
    route
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocketmq_tls_delivers_through_a_cluster_that_accepts_tls_only() {
    let options = RocketMqOptions {
        kind: Some(BrokerKind::Apache),
        acl: Some(root()),
        tls: true,
        auto_create_topics: false,
        ..RocketMqOptions::default()
    };
    let tls_cluster = RocketMq::start_with(&scratch_dir("acl_tls").unwrap(), options)
        .expect("an Apache cluster with TLS only (tls.server.mode=enforcing) starts");
    let topic = new_topic_on(&tls_cluster, "tls");
    let writer = new_account_on(&tls_cluster, "tlswriter");
    grant_pub(&tls_cluster, &writer, &topic);
    // The servers take no plain connection, and a client that does not trust their CA gets
    // nowhere either: what goes through below went through TLS, checked against the CA.
    let plain = route_with_tls(&tls_cluster, false, &topic).await;
    println!("plain TCP against tls.server.mode=enforcing: {plain:?}");
    assert!(plain.is_err(), "{plain:?}");
    let untrusted = route_with_tls(&tls_cluster, true, &topic).await;
    println!("TLS without trusting the cluster's CA: {untrusted:?}");
    assert!(untrusted.is_err(), "{untrusted:?}");

    // The relay process trusts the CA through $SSL_CERT_FILE, as an operator's would.
    let db = ledger_db("acl_tls").await;
    let (mut config, dir) = relay_config_on(&db, &tls_cluster.namesrv_addr());
    config.rocketmq.access_key = Some(writer.access_key.clone());
    config.rocketmq.secret_key = Some(Secret::new(writer.secret_key.as_str()));
    config.rocketmq.tls = true;
    seed_checkpoint(&config, &current_position(&db).await);
    let ca = tls_cluster.tls_ca().expect("a TLS cluster has a CA");
    let relay = RelayProcess::spawn_serving(
        &write_config_file(&config, dir.path()),
        &free_addr(),
        &dir.path().join("relay.log"),
        &[("SSL_CERT_FILE", ca.to_str().unwrap())],
    );
    write_events(&db, &topic, 1, 10, 3).await;
    wait_until_sent(&db, 10, Duration::from_secs(90)).await;
    relay.stop();
    assert_eq!(
        count_status(&db, rocketmq_outbox::outbox::Status::Failed).await,
        0,
        "nothing FAILED"
    );

    // What the broker stored, asked over TLS by mqadmin: every SENT row's msg_id.
    let ids: Vec<String> = db
        .conn()
        .await
        .query(format!(
            "SELECT msg_id FROM outbox_event WHERE status = {SENT} ORDER BY id"
        ))
        .await
        .unwrap();
    let out = tls_cluster
        .mqadmin(&["queryMsgById", "-t", &topic, "-i", &ids.join(",")])
        .expect("mqadmin queryMsgById over TLS");
    let found: HashSet<String> = printed_message_ids(&out).into_iter().collect();
    assert_eq!(found, ids.iter().cloned().collect(), "{out}");

    // The consumer library over TLS (trusting the CA given to ClientSecurity) gets each event.
    let ledger = Arc::new(Ledger::new("tls"));
    let group = format!("acl_tls_group_{}", std::process::id());
    let processor = IdempotentProcessor::new(db.pool.clone(), group.as_str(), Arc::clone(&ledger));
    let processor = Arc::new(processor.unwrap());
    let options = PushConsumerOptions::new(tls_cluster.namesrv_addr(), topic.as_str())
        .with_security(tls_cluster.client_security());
    let host = Arc::new(ClientHost::new("acl-tls-consumer").unwrap());
    let consumer = IdempotentPushConsumer::start(host, options, Arc::clone(&processor))
        .await
        .expect("the consumer starts over TLS");
    wait_until("10 ledger rows", Duration::from_secs(90), || async {
        db.count("ledger").await == 10
    })
    .await;
    consumer.shutdown().await;
    assert_eq!(processor.metrics().counts(&group, &topic).processed, 10);
}
