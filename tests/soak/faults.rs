//! Faults the soak injects, a seeded schedule of them, and how each is done.
//!
//! A slow or stalled broker is a frozen broker process (SIGSTOP … SIGCONT): its connections stay
//! open and nothing answers, so sends time out (the ambiguous "maybe stored" case). A TCP proxy
//! in front of the broker would need the broker to advertise the proxy's address through the
//! namesrv (`brokerIP1` on another loopback address), which the dev broker config does not do
//! today; cut connections are covered by stopping the broker and by `KILL` on the MySQL side.

use super::relays::{Relays, SEND_TIMEOUT};
use super::rng::Rng;
use super::servers::{Servers, QUEUES, RELAY_USER, SIDE_TOPIC};
use mysql_async::prelude::*;
use outbox_devenv::rocketmq::CLUSTER_NAME;
use outbox_devenv::{RocketMq, SqlServer};
use rocketmq_outbox::outbox::status::codes::{PENDING, SENDING};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL of the leading relay (a standby takes over; the supervisor restarts the victim).
    KillLeader,
    /// The broker stopped for the hold time, then started with the same store.
    BrokerStop,
    /// The broker frozen (SIGSTOP) for the hold time, then thawed.
    BrokerStall,
    /// `KILL` of every connection of the relay account: binlog dump, leader lock, SQL pools.
    KillConnections,
    /// `FLUSH BINARY LOGS` (a rotation under the stream).
    FlushLogs,
    /// Every relay killed; writes go on for the hold time; `FLUSH` + `PURGE BINARY LOGS` to the
    /// newest file; relays started again: their checkpoint is gone, the sweeper covers the gap.
    PurgeWhileDown,
    /// The SQL server (MariaDB or MySQL) restarted: SIGTERM, then started on the same port and
    /// data directory.
    DatabaseRestart,
    /// The side topic made read-only (`mqadmin updateTopicPerm -p 4`) for the hold time, from
    /// when the relay has seen it: the workload's topic must keep its latency.
    StuckTopic,
    /// One of the two broker groups (`broker-b`) frozen (SIGSTOP) for the hold time: the keys
    /// of `broker-a`'s queues must keep their latency.
    GroupStall,
}

impl FaultKind {
    pub const ALL: [FaultKind; 9] = [
        FaultKind::KillLeader,
        FaultKind::BrokerStop,
        FaultKind::BrokerStall,
        FaultKind::KillConnections,
        FaultKind::FlushLogs,
        FaultKind::PurgeWhileDown,
        FaultKind::DatabaseRestart,
        FaultKind::StuckTopic,
        FaultKind::GroupStall,
    ];

    /// The short name `SOAK_KINDS` takes.
    pub fn short(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "kill-leader",
            FaultKind::BrokerStop => "broker-stop",
            FaultKind::BrokerStall => "broker-stall",
            FaultKind::KillConnections => "kill-connections",
            FaultKind::FlushLogs => "flush",
            FaultKind::PurgeWhileDown => "purge",
            FaultKind::DatabaseRestart => "database-restart",
            FaultKind::StuckTopic => "stuck-topic",
            FaultKind::GroupStall => "group-stall",
        }
    }

    /// The kinds named in `list` (comma-separated short names).
    pub fn parse_list(list: &str) -> Vec<FaultKind> {
        list.split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(|name| {
                *FaultKind::ALL
                    .iter()
                    .find(|kind| kind.short() == name)
                    .unwrap_or_else(|| {
                        let names: Vec<&str> = FaultKind::ALL.iter().map(|k| k.short()).collect();
                        panic!("SOAK_KINDS: unknown fault {name:?}; known: {names:?}")
                    })
            })
            .collect()
    }

    /// Whether the fault holds back only some keys, and the others' latency is judged during it.
    pub fn isolation_judged(self) -> bool {
        matches!(self, FaultKind::GroupStall | FaultKind::StuckTopic)
    }

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "relay SIGKILL (leader)",
            FaultKind::BrokerStop => "broker stop/start",
            FaultKind::BrokerStall => "broker stall (SIGSTOP)",
            FaultKind::KillConnections => "KILL relay MySQL conns",
            FaultKind::FlushLogs => "FLUSH BINARY LOGS",
            FaultKind::PurgeWhileDown => "PURGE while relays down",
            FaultKind::DatabaseRestart => "database restart",
            FaultKind::StuckTopic => "topic read-only",
            FaultKind::GroupStall => "broker group frozen",
        }
    }
}

/// `count` faults of `kinds`: every kind once (in a seeded order) before any repeats, then
/// seeded picks. In the first round the two faults whose isolation is judged come first (they
/// need writes in flight, before and during), and the broker stop last: restarting two JVM
/// brokers takes ~20 s, which would otherwise push the faults after it past the short soak's
/// writing time (a fault with no writes in flight proves little).
pub fn schedule(seed: u64, count: usize, kinds: &[FaultKind]) -> Vec<FaultKind> {
    let mut rng = Rng::new(seed);
    let mut all = kinds.to_vec();
    for i in (1..all.len()).rev() {
        all.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut all: Vec<FaultKind> = (all.iter().filter(|k| k.isolation_judged()).copied())
        .chain(all.iter().filter(|k| !k.isolation_judged()).copied())
        .collect();
    if all.contains(&FaultKind::BrokerStop) {
        all.retain(|kind| *kind != FaultKind::BrokerStop);
        all.push(FaultKind::BrokerStop);
    }
    (0..count)
        .map(|i| match all.get(i) {
            Some(kind) => *kind,
            None => kinds[rng.below(kinds.len() as u64) as usize],
        })
        .collect()
}

/// What an injected fault did (for PurgeWhileDown: the ids of the gap, the rows unsent when
/// the relays went down or written while they were down, which the stream cannot see after the
/// purge).
pub struct Injected {
    pub detail: String,
    /// For a fault that must hold back only some keys: when it held (database clock) and which
    /// keys it must not touch.
    pub isolation: Option<Isolation>,
}

/// The window of a fault that holds back only some keys, and the keys it must not touch.
#[derive(Debug, Clone, Copy)]
pub struct Isolation {
    /// The calm seconds just before the fault, whose latency is the baseline.
    pub calm: (f64, f64),
    pub from: f64,
    pub to: f64,
    /// Seconds after `from` the relay may take to notice the fault: a send in flight to a frozen
    /// broker holds its shard until it times out (`rocketmq.send_timeout`), then the queue's
    /// events move to a lane.
    pub noticed_within: f64,
    pub healthy: Healthy,
}

/// How long a fault whose isolation is judged lasts at least: long enough to measure the keys
/// it does not touch after it was noticed.
const ISOLATION_HOLD: Duration = Duration::from_secs(8);
/// The calm time measured just before such a fault: the baseline of the keys it does not touch.
const BASELINE: Duration = Duration::from_secs(4);

/// Waits [`BASELINE`]; its span on the database clock.
async fn baseline(servers: &Servers) -> (f64, f64) {
    let from = servers.db_now().await;
    tokio::time::sleep(BASELINE).await;
    (from, servers.db_now().await)
}

/// The workload's keys a fault must not hold back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Healthy {
    /// All of them (the fault is on another topic).
    All,
    /// Those of `broker-a`'s queues (the fault is on `broker-b`).
    OnGroupA,
}

impl Healthy {
    pub fn contains(self, key: &str) -> bool {
        use rocketmq_outbox::route::{index_for, java_string_hash};
        match self {
            Healthy::All => true,
            // The queue list is broker-a's QUEUES queues, then broker-b's.
            Healthy::OnGroupA => {
                index_for(java_string_hash(key), 2 * QUEUES as usize) < QUEUES as usize
            }
        }
    }
}

/// Injects `kind`, holding it for `hold` where it has a duration; returns once the fault has
/// ended (servers back, relays allowed to run).
pub async fn inject(
    kind: FaultKind,
    servers: &Arc<Servers>,
    relays: &Mutex<Relays>,
    hold: Duration,
) -> Injected {
    match kind {
        FaultKind::PurgeWhileDown => return purge_while_down(servers, relays, hold).await,
        FaultKind::StuckTopic => return stuck_topic(servers, hold).await,
        FaultKind::GroupStall => return group_stall(servers, hold).await,
        _ => {}
    }
    let detail = match kind {
        FaultKind::KillLeader => {
            let leader = leader(servers).await;
            let killed = leader
                .as_deref()
                .is_some_and(|l| relays.lock().unwrap().kill(l));
            format!("killed leader {leader:?}: {killed}")
        }
        FaultKind::BrokerStop => {
            servers
                .with_rocketmq(|mq| every_broker(mq, RocketMq::stop_broker_at))
                .await;
            tokio::time::sleep(hold).await;
            let started = servers
                .with_rocketmq(|mq| (0..mq.brokers().len()).try_for_each(|i| mq.start_broker_at(i)))
                .await;
            started.unwrap_or_else(|e| panic!("the brokers did not start again: {e}"));
            format!("every broker down for {hold:?}")
        }
        FaultKind::BrokerStall => {
            servers
                .with_rocketmq(|mq| every_broker(mq, RocketMq::freeze_broker_at))
                .await;
            tokio::time::sleep(hold).await;
            servers
                .with_rocketmq(|mq| every_broker(mq, RocketMq::thaw_broker_at))
                .await;
            format!("every broker frozen for {hold:?}")
        }
        FaultKind::KillConnections => {
            let (all, dumps) = kill_relay_connections(servers).await;
            format!("killed {all} relay connections ({dumps} binlog dump)")
        }
        FaultKind::FlushLogs => {
            servers.query::<u8>("FLUSH BINARY LOGS").await;
            "binlog rotated".into()
        }
        FaultKind::PurgeWhileDown | FaultKind::StuckTopic | FaultKind::GroupStall => {
            unreachable!()
        }
        FaultKind::DatabaseRestart => {
            let restarted = servers.with_database(|db| db.restart()).await;
            let kind = servers.kind.name();
            restarted.unwrap_or_else(|e| panic!("{kind} did not start again: {e}"));
            format!("{kind} restarted")
        }
    };
    Injected {
        detail,
        isolation: None,
    }
}

fn every_broker(mq: &mut RocketMq, act: fn(&mut RocketMq, usize)) {
    for i in 0..mq.brokers().len() {
        act(mq, i);
    }
}

/// After the baseline, the side topic read-only for `hold` (at least [`ISOLATION_HOLD`]), from
/// when a side row has waited over a second (the relay sees the permission when it looks the
/// route up again, every 10 s).
async fn stuck_topic(servers: &Arc<Servers>, hold: Duration) -> Injected {
    let calm = baseline(servers).await;
    let permission = |perm: &'static str| {
        servers.with_rocketmq(move |mq| {
            let args = [
                "updateTopicPerm",
                "-c",
                CLUSTER_NAME,
                "-t",
                SIDE_TOPIC,
                "-p",
                perm,
            ];
            mq.mqadmin(&args).expect("mqadmin updateTopicPerm");
        })
    };
    permission("4").await;
    let asked = std::time::Instant::now();
    while servers.oldest_unsent_age_of(SIDE_TOPIC).await < Duration::from_secs(1) {
        assert!(
            asked.elapsed() < Duration::from_secs(60),
            "the relay never held back the read-only {SIDE_TOPIC}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen_after = asked.elapsed();
    let from = servers.db_now().await;
    let hold = hold.max(ISOLATION_HOLD);
    tokio::time::sleep(hold).await;
    let to = servers.db_now().await;
    permission("6").await;
    Injected {
        detail: format!(
            "{SIDE_TOPIC} read-only for {hold:?} (held back {seen_after:.1?} after the change)"
        ),
        isolation: Some(Isolation {
            calm,
            from,
            to,
            noticed_within: 1.0,
            healthy: Healthy::All,
        }),
    }
}

/// After the baseline, `broker-b` frozen for `hold` (at least [`ISOLATION_HOLD`]).
async fn group_stall(servers: &Arc<Servers>, hold: Duration) -> Injected {
    let calm = baseline(servers).await;
    let b = servers
        .with_rocketmq(|mq| mq.broker_index("broker-b", 0))
        .await
        .expect("broker-b");
    servers
        .with_rocketmq(move |mq| mq.freeze_broker_at(b))
        .await;
    let from = servers.db_now().await;
    let hold = hold.max(ISOLATION_HOLD);
    tokio::time::sleep(hold).await;
    let to = servers.db_now().await;
    servers.with_rocketmq(move |mq| mq.thaw_broker_at(b)).await;
    Injected {
        detail: format!("broker-b frozen for {hold:?}"),
        isolation: Some(Isolation {
            calm,
            from,
            to,
            noticed_within: SEND_TIMEOUT.as_secs_f64() + 1.0,
            healthy: Healthy::OnGroupA,
        }),
    }
}

async fn purge_while_down(servers: &Servers, relays: &Mutex<Relays>, hold: Duration) -> Injected {
    relays.lock().unwrap().kill_all_and_hold();
    let first_unsent: Vec<u64> = servers
        .query(
            &format!("SELECT COALESCE((SELECT MIN(id) FROM outbox_event WHERE status IN ({PENDING}, {SENDING})), \
             (SELECT COALESCE(MAX(id), 0) + 1 FROM outbox_event))"),
        )
        .await;
    tokio::time::sleep(hold).await;
    servers.query::<u8>("FLUSH BINARY LOGS").await;
    let logs: Vec<mysql_async::Row> = servers.query("SHOW BINARY LOGS").await;
    let newest: String = logs.last().and_then(|r| r.get(0)).expect("a binlog");
    servers
        .query::<u8>(&format!("PURGE BINARY LOGS TO '{newest}'"))
        .await;
    let last: Vec<u64> = servers
        .query("SELECT COALESCE(MAX(id), 0) FROM outbox_event")
        .await;
    relays.lock().unwrap().release();
    Injected {
        detail: format!(
            "relays down {hold:?}, purged {} binlog files, gap ids {}..={}",
            logs.len() - 1,
            first_unsent[0],
            last[0]
        ),
        isolation: None,
    }
}

/// The instance id of the current leader, if one is recorded.
pub async fn leader(servers: &Servers) -> Option<String> {
    let rows: Vec<Option<String>> = servers
        .query("SELECT leader FROM outbox_relay_state WHERE name = 'soak'")
        .await;
    rows.into_iter().next().flatten()
}

/// `KILL` of every connection of the relay account; (all, binlog dump) counts.
async fn kill_relay_connections(servers: &Servers) -> (usize, usize) {
    let rows: Vec<(u64, String)> = servers
        .query(&format!(
            "SELECT ID, COMMAND FROM information_schema.PROCESSLIST WHERE USER = '{RELAY_USER}'"
        ))
        .await;
    let mut conn = loop {
        match servers.pool.get_conn().await {
            Ok(conn) => break conn,
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    for (id, _) in &rows {
        // The connection may be gone already.
        let _ = conn.query_drop(format!("KILL {id}")).await;
    }
    let dumps = rows.iter().filter(|(_, c)| c.contains("Binlog")).count();
    (rows.len(), dumps)
}
