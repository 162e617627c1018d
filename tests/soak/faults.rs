//! Faults the soak injects, a seeded schedule of them, and how each is done.
//!
//! A slow or stalled broker is a frozen broker process (SIGSTOP … SIGCONT): its connections stay
//! open and nothing answers, so sends time out (the ambiguous "maybe stored" case). A TCP proxy
//! in front of the broker would need the broker to advertise the proxy's address through the
//! namesrv (`brokerIP1` on another loopback address), which the dev broker config does not do
//! today; cut connections are covered by stopping the broker and by `KILL` on the MySQL side.

use super::relays::Relays;
use super::rng::Rng;
use super::servers::{Servers, RELAY_USER};
use mysql_async::prelude::*;
use rocketmq_outbox::devenv::SqlServer;
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
}

impl FaultKind {
    pub const ALL: [FaultKind; 7] = [
        FaultKind::KillLeader,
        FaultKind::BrokerStop,
        FaultKind::BrokerStall,
        FaultKind::KillConnections,
        FaultKind::FlushLogs,
        FaultKind::PurgeWhileDown,
        FaultKind::DatabaseRestart,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "relay SIGKILL (leader)",
            FaultKind::BrokerStop => "broker stop/start",
            FaultKind::BrokerStall => "broker stall (SIGSTOP)",
            FaultKind::KillConnections => "KILL relay MySQL conns",
            FaultKind::FlushLogs => "FLUSH BINARY LOGS",
            FaultKind::PurgeWhileDown => "PURGE while relays down",
            FaultKind::DatabaseRestart => "database restart",
        }
    }
}

/// `count` faults: every kind once (in a seeded order) before any repeats, then seeded picks.
/// In the first round the broker stop comes last: restarting the JVM broker takes ~15 s, which
/// would otherwise push the faults after it past the short soak's writing time (a purge or a
/// database restart with no writes in flight proves little).
pub fn schedule(seed: u64, count: usize) -> Vec<FaultKind> {
    let mut rng = Rng::new(seed);
    let mut all = FaultKind::ALL.to_vec();
    for i in (1..all.len()).rev() {
        all.swap(i, rng.below(i as u64 + 1) as usize);
    }
    all.retain(|kind| *kind != FaultKind::BrokerStop);
    all.push(FaultKind::BrokerStop);
    (0..count)
        .map(|i| match all.get(i) {
            Some(kind) => *kind,
            None => FaultKind::ALL[rng.below(FaultKind::ALL.len() as u64) as usize],
        })
        .collect()
}

/// What an injected fault did (for PurgeWhileDown: the ids of the gap, the rows unsent when
/// the relays went down or written while they were down, which the stream cannot see after the
/// purge).
pub struct Injected {
    pub detail: String,
}

/// Injects `kind`, holding it for `hold` where it has a duration; returns once the fault has
/// ended (servers back, relays allowed to run).
pub async fn inject(
    kind: FaultKind,
    servers: &Arc<Servers>,
    relays: &Mutex<Relays>,
    hold: Duration,
) -> Injected {
    if kind == FaultKind::PurgeWhileDown {
        return purge_while_down(servers, relays, hold).await;
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
            servers.with_rocketmq(|mq| mq.stop_broker()).await;
            tokio::time::sleep(hold).await;
            let started = servers.with_rocketmq(|mq| mq.start_broker()).await;
            started.unwrap_or_else(|e| panic!("the broker did not start again: {e}"));
            format!("broker down for {hold:?}")
        }
        FaultKind::BrokerStall => {
            servers.with_rocketmq(|mq| mq.freeze_broker()).await;
            tokio::time::sleep(hold).await;
            servers.with_rocketmq(|mq| mq.thaw_broker()).await;
            format!("broker frozen for {hold:?}")
        }
        FaultKind::KillConnections => {
            let (all, dumps) = kill_relay_connections(servers).await;
            format!("killed {all} relay connections ({dumps} binlog dump)")
        }
        FaultKind::FlushLogs => {
            servers.query::<u8>("FLUSH BINARY LOGS").await;
            "binlog rotated".into()
        }
        FaultKind::PurgeWhileDown => unreachable!(),
        FaultKind::DatabaseRestart => {
            let restarted = servers.with_database(|db| db.restart()).await;
            let kind = servers.kind.name();
            restarted.unwrap_or_else(|e| panic!("{kind} did not start again: {e}"));
            format!("{kind} restarted")
        }
    };
    Injected { detail }
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
