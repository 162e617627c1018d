//! Dead letters watched: a consumer group whose handler keeps asking for a retry gets its
//! events moved by the broker to `%DLQ%<group>`; a relay told to watch that group
//! (`rocketmq.dead_letter_groups`) exports how many arrived there, and `status` names the group.
//! Judged by what the broker stored in the dead-letter queue. Through a RocketMQ 5 proxy, which
//! lists no brokers to ask, `status` says the figures are unknown and why.

use crate::common;

use common::http::{free_addr, get};
use common::process::{write_config_file, RelayProcess};
use common::relay::{
    current_position, relay_fixture, seed_checkpoint, wait_for, wait_until_sent, write_events,
};
use common::rocketmq::{new_topic, rocketmq};
use common::TestDb;
use outbox_devenv::{ClientHost, TopicReader};
use rocketmq_outbox::consumer::{
    ConsumedEvent, Handler, IdempotentProcessor, IdempotentPushConsumer, Outcome,
    PushConsumerOptions,
};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// A downstream that is always down: every event is retried, until the broker gives up.
struct AlwaysDown;

impl Handler for AlwaysDown {
    async fn handle(
        &self,
        _event: &ConsumedEvent,
        _tx: &mut mysql_async::Transaction<'static>,
    ) -> anyhow::Result<Outcome> {
        Ok(Outcome::Retry("the downstream service is down".into()))
    }
}

/// `outbox_dlq_received` of `group` on the relay's `/metrics`, if exported.
fn dlq_received(addr: &str, group: &str) -> Option<u64> {
    let (_, body) = get(addr, "/metrics")?;
    let series = format!("outbox_dlq_received{{group=\"{group}\"}} ");
    body.lines()
        .find_map(|line| line.strip_prefix(&series))
        .and_then(|value| value.trim().parse().ok())
}

/// What `outbox-relay -c FILE status` prints.
fn status(file: &std::path::Path) -> String {
    let out = std::process::Command::new(outbox_devenv::workspace_binary("outbox-relay"))
        .args(["-c", file.to_str().unwrap(), "status"])
        .output()
        .expect("outbox-relay status");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_a_consumer_gives_up_on_are_counted_from_the_dead_letter_queue_and_named() {
    common::init_logging();
    let db = TestDb::migrated("dlq").await;
    let topic = new_topic("dlq");
    let group = format!("dlq_billing_{}", std::process::id());
    let (mut config, dir) = relay_fixture(&db).build();
    config.rocketmq.dead_letter_groups = vec![group.clone()];
    config.metrics.refresh = Duration::from_secs(1);
    seed_checkpoint(&config, &current_position(&db).await);
    let file = write_config_file(&config, dir.path());
    let addr = free_addr();
    let relay = RelayProcess::spawn_serving(&file, &addr, &dir.path().join("relay.log"), &[]);
    write_events(&db, &topic, 1, 3, 1).await;
    wait_until_sent(&db, 3, Duration::from_secs(60)).await;
    wait_for(
        "outbox_dlq_received at 0",
        Duration::from_secs(30),
        || async { dlq_received(&addr, &group) == Some(0) },
    )
    .await;

    // No retry left after the first failure: the broker moves each event to %DLQ%<group>.
    let processor =
        IdempotentProcessor::new(db.pool.clone(), &group, AlwaysDown).expect("processor");
    let mut options = PushConsumerOptions::new(rocketmq().namesrv_addr(), &topic);
    options.max_reconsume_times = Some(0);
    let host = Arc::new(ClientHost::new("dlq-test").expect("client host"));
    let consumer = IdempotentPushConsumer::start(host, options, Arc::new(processor))
        .await
        .expect("consumer");
    wait_for(
        "outbox_dlq_received at 3",
        Duration::from_secs(90),
        || async { dlq_received(&addr, &group) == Some(3) },
    )
    .await;
    consumer.shutdown().await;

    // The broker's dead-letter queue holds exactly the three events.
    let dlq = format!("%DLQ%{group}");
    let mut reader = TopicReader::new(&rocketmq().namesrv_addr(), &dlq)
        .await
        .expect("reader");
    let stored = reader
        .read_at_least(3, Duration::from_secs(30))
        .await
        .expect("read the DLQ");
    reader.close().await;
    let ids: HashSet<&str> = stored
        .iter()
        .map(|m| m.properties["event_id"].as_str())
        .collect();
    assert_eq!((stored.len(), ids.len()), (3, 3), "{dlq}: {stored:?}");

    let printed = status(&file);
    assert!(
        printed.contains(&format!(
            "DLQ         group {group}: 3 stored, 3 ever ({dlq})"
        )),
        "status names the group:\n{printed}"
    );
    drop(relay);

    // Through a RocketMQ 5 proxy (no brokers listed to ask) the figures are unknown, and said
    // so, never a silent 0.
    if let Some(proxy) = crate::rocketmq5::proxy() {
        config.rocketmq.namesrv_addr = Some(proxy.addr());
        let printed = status(&write_config_file(&config, dir.path()));
        assert!(
            printed.contains("DLQ         dead-letter queues unknown")
                && printed.contains("probably a RocketMQ 5 proxy"),
            "status through the proxy:\n{printed}"
        );
    }
}
