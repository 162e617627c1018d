//! The two-node Galera cluster of `devenv::galera`: rows written on either node reach both, and
//! both nodes binlog every transaction under the same GTID, so a binlog reader can move from one
//! node to the other by GTID. Then the relay on it: two instances on different nodes elect one
//! leader (by lease: `GET_LOCK` is local to each node), and when the leader's node is killed the
//! other instance takes over, losing nothing. MariaDB runs only (`OUTBOX_TEST_DB` unset or
//! `mariadb`).

use crate::common;

use common::process::{write_config_file, RelayProcess};
use common::relay::{
    assert_key_order, assert_msg_ids_stored, commit_events, copies_per_event, outbox_rows,
    relay_fixture, stored_messages, wait_for,
};
use common::rocketmq::new_topic;
use common::TestDb;
use mysql_async::prelude::*;
use mysql_async::{Conn, Pool};
use outbox_devenv::galera::WSREP_GTID_DOMAIN_ID;
use outbox_devenv::{scratch_dir, DatabaseKind, GaleraCluster, SqlServer};
use rocketmq_outbox::config::Config;
use rocketmq_outbox::outbox::status::codes::SENT;
use rocketmq_outbox::producer::NewEvent;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Connects to `database` on node `n` over TCP (as `root@127.0.0.1`, which only replication
/// created on node 2), causally: a read or a write waits until the node has applied every write
/// the cluster committed before it (`wsrep_sync_wait = 15`). Writes too: an INSERT on node 2
/// that ran before node 2 applied node 1's latest took an AUTO_INCREMENT id below it, and the
/// rows' id order was not the order they were written in (seen in CI under load).
async fn connect(cluster: &GaleraCluster, n: usize, database: &str) -> Conn {
    let url = cluster.node(n).url(database);
    let mut conn = Conn::from_url(url.as_str())
        .await
        .unwrap_or_else(|e| panic!("node {n}: connect to {url}: {e}"));
    conn.query_drop("SET SESSION wsrep_sync_wait = 15")
        .await
        .unwrap();
    conn
}

/// The GTIDs (`domain-server-seq`) of the binlogged transactions of `database`, in binlog
/// order, over every binlog file the node has, and how many of them wrote rows.
async fn binlogged_gtids(conn: &mut Conn, database: &str) -> (Vec<String>, usize) {
    let files: Vec<(String, u64)> = conn.query("SHOW BINARY LOGS").await.unwrap();
    let (mut gtids, mut with_rows) = (Vec::new(), 0);
    for (file, _) in files {
        let events: Vec<(String, u64, String, u32, u64, String)> = conn
            .query(format!("SHOW BINLOG EVENTS IN '{file}'"))
            .await
            .unwrap();
        let mut current: Option<(String, bool, bool)> = None; // (gtid, mentions db, writes rows)
        let mut close = |group: Option<(String, bool, bool)>| {
            if let Some((gtid, true, rows)) = group {
                gtids.push(gtid);
                with_rows += usize::from(rows);
            }
        };
        for (_, _, kind, _, _, info) in events {
            if kind == "Gtid" {
                close(current.take());
                let gtid = info.split_whitespace().last().unwrap_or_default();
                current = Some((gtid.to_string(), false, false));
            } else if let Some((_, mentions, rows)) = current.as_mut() {
                *mentions |= info.contains(database);
                *rows |= kind == "Table_map" && info.contains(&format!("({database}.t)"));
            }
        }
        close(current);
    }
    (gtids, with_rows)
}

async fn gtid_binlog_pos(conn: &mut Conn) -> String {
    conn.query_first("SELECT @@gtid_binlog_pos")
        .await
        .unwrap()
        .unwrap()
}

/// Both nodes' `@@gtid_binlog_pos`, once equal (a node applies a replicated commit a moment
/// after its origin returned), else after 30 s as they are.
async fn settled_positions(conns: &mut [Conn; 2]) -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (one, two) = (
            gtid_binlog_pos(&mut conns[0]).await,
            gtid_binlog_pos(&mut conns[1]).await,
        );
        if one == two || Instant::now() >= deadline {
            return (one, two);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asserts that both nodes hold the same rows, the same `@@gtid_binlog_pos` and the same
/// GTIDs for `database` in their binlogs, `transactions` of them with rows; returns the GTIDs.
async fn assert_nodes_agree(
    conns: &mut [Conn; 2],
    database: &str,
    rows: &[&str],
    transactions: usize,
) -> Vec<String> {
    for (i, conn) in conns.iter_mut().enumerate() {
        let seen: Vec<String> = conn.query("SELECT v FROM t ORDER BY id").await.unwrap();
        assert_eq!(seen, rows, "node {}: the rows of both nodes", i + 1);
    }
    let (one, two) = settled_positions(conns).await;
    assert_eq!(one, two, "@@gtid_binlog_pos of node 1 and node 2");
    let (gtids_one, rows_one) = binlogged_gtids(&mut conns[0], database).await;
    let (gtids_two, rows_two) = binlogged_gtids(&mut conns[1], database).await;
    assert_eq!(
        gtids_one, gtids_two,
        "the GTIDs of {database} in both binlogs"
    );
    assert_eq!(
        (rows_one, rows_two),
        (transactions, transactions),
        "row transactions in each binlog: {gtids_one:?}"
    );
    assert_eq!(
        gtids_one.last(),
        Some(&one),
        "the last GTID is the position"
    );
    assert!(
        gtids_one
            .iter()
            .all(|gtid| gtid.starts_with(&format!("{WSREP_GTID_DOMAIN_ID}-1-"))),
        "every replicated transaction is in the cluster's domain: {gtids_one:?}"
    );
    gtids_one
}

/// Whether this run's servers are MariaDB (Galera is MariaDB's); says so when not.
fn galera_runs() -> bool {
    let kind = DatabaseKind::from_env().expect("OUTBOX_TEST_DB");
    if kind != DatabaseKind::MariaDb {
        eprintln!(
            "galera: not run: Galera is MariaDB's, and OUTBOX_TEST_DB={}",
            kind.name()
        );
    }
    kind == DatabaseKind::MariaDb
}

/// A new two-node cluster, Synced.
async fn start_cluster(label: &str) -> GaleraCluster {
    let started = Instant::now();
    let label = label.to_string();
    let cluster = tokio::task::spawn_blocking(move || {
        let dir = scratch_dir(&label).expect("scratch dir");
        GaleraCluster::start(&dir)
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("the Galera cluster must start (run scripts/setup.sh): {e}"));
    eprintln!("galera: 2 nodes Synced after {:?}", started.elapsed());
    cluster
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_node_cluster_replicates_with_identical_gtids() {
    if !galera_runs() {
        return;
    }
    let mut cluster = start_cluster("galera").await;

    let url = cluster.node(1).create_database("galera").unwrap();
    let database = url.rsplit('/').next().unwrap().to_string();
    let mut conns = [
        connect(&cluster, 1, &database).await,
        connect(&cluster, 2, &database).await,
    ];
    conns[0]
        .query_drop("CREATE TABLE t (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(32) NOT NULL)")
        .await
        .unwrap();
    // Interleaved single-row transactions on both nodes.
    let writes = [
        (0, "n1-a"),
        (0, "n1-b"),
        (1, "n2-a"),
        (0, "n1-c"),
        (1, "n2-b"),
    ];
    for (node, value) in writes {
        conns[node]
            .exec_drop("INSERT INTO t (v) VALUES (?)", (value,))
            .await
            .unwrap();
    }
    let mut rows: Vec<&str> = writes.iter().map(|(_, v)| *v).collect();
    let gtids = assert_nodes_agree(&mut conns, &database, &rows, writes.len()).await;
    // CREATE DATABASE, CREATE TABLE, then the inserts.
    assert_eq!(gtids.len(), 2 + writes.len(), "{gtids:?}");

    // A crash of node 2: node 1 stays primary and takes writes; node 2 comes back (by IST) with
    // the rows and the GTIDs it missed, and its own binlogs.
    drop(conns);
    cluster.kill(2);
    let mut one = connect(&cluster, 1, &database).await;
    one.exec_drop("INSERT INTO t (v) VALUES (?)", ("n1-while-n2-down",))
        .await
        .unwrap();
    drop(one);
    let restarted = Instant::now();
    let cluster = tokio::task::spawn_blocking(move || cluster.restart(2).map(|()| cluster))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("node 2 must rejoin: {e}"));
    eprintln!("galera: node 2 rejoined after {:?}", restarted.elapsed());
    let mut conns = [
        connect(&cluster, 1, &database).await,
        connect(&cluster, 2, &database).await,
    ];
    conns[1]
        .exec_drop("INSERT INTO t (v) VALUES (?)", ("n2-after-rejoin",))
        .await
        .unwrap();
    rows.extend(["n1-while-n2-down", "n2-after-rejoin"]);
    let after = assert_nodes_agree(&mut conns, &database, &rows, writes.len() + 2).await;
    assert_eq!(after[..gtids.len()], gtids[..], "node 2 kept its binlogs");
    drop(conns);
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .unwrap();
}

/// A handle on `url` (a database on one node) as the relay tests use it.
fn node_db(url: &str) -> TestDb {
    let mut config = Config::default();
    config.mysql.url = Some(url.to_string());
    let pool = rocketmq_outbox::db::pool(&config).expect("pool");
    TestDb {
        url: url.to_string(),
        pool,
        config,
    }
}

/// `leader` of deployment `name`, as `db`'s node has it.
async fn leader(db: &TestDb, name: &str) -> Option<String> {
    let row: Option<Option<String>> = db
        .conn()
        .await
        .exec_first(
            "SELECT leader FROM outbox_relay_state WHERE name = ?",
            (name,),
        )
        .await
        .unwrap();
    row.flatten()
}

/// Event ids and when their commit returned.
type Committed = Arc<Mutex<Vec<(String, Instant)>>>;

/// Writes one event at a time on `pool` (keys `prefix-0..8`) until `stop` or a failed commit
/// (its node died); records each committed event_id.
fn writer(
    pool: Pool,
    topic: String,
    prefix: &'static str,
    committed: Committed,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut i = 0;
        while !stop.is_cancelled() {
            let Ok(mut conn) = pool.get_conn().await else {
                return;
            };
            let event = NewEvent::new(
                topic.clone(),
                format!("{prefix}-{}", i % 8),
                json!({"i": i}),
            );
            let mut tx = match conn.start_transaction(Default::default()).await {
                Ok(tx) => tx,
                Err(_) => return,
            };
            let Ok(ids) = rocketmq_outbox::producer::Outbox::default()
                .enqueue_batch(&mut tx, vec![event])
                .await
            else {
                return;
            };
            if tx.commit().await.is_err() {
                return;
            }
            let at = Instant::now();
            committed
                .lock()
                .unwrap()
                .extend(ids.into_iter().map(|id| (id.to_string(), at)));
            i += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// Prints the last lines of each relay log in its directory when the test panics (a timed-out
/// wait says what it waited for, the logs say why).
struct LogsOnPanic<'a>(&'a std::path::Path);

impl Drop for LogsOnPanic<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for entry in std::fs::read_dir(self.0).into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(80)..].join("\n");
            eprintln!("--- {} (last 80 lines) ---\n{tail}", entry.path().display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_on_two_nodes_elect_one_leader_and_the_survivor_takes_over() {
    if !galera_runs() {
        return;
    }
    let mut cluster = start_cluster("galera-relay").await;
    let url = cluster.node(1).create_database("galera_relay").unwrap();
    let database = url.rsplit('/').next().unwrap().to_string();
    let dbs = [node_db(&url), node_db(&cluster.node(2).url(&database))];
    let mut conn = dbs[0].conn().await;
    rocketmq_outbox::schema::migrate(&mut conn, &dbs[0].config.outbox_tables())
        .await
        .expect("migrate");
    drop(conn);

    // Instance a on node 1, b on node 2, as a load balancer in front of Galera spreads them.
    let topic = new_topic("galera");
    let logs = tempfile::tempdir().unwrap();
    let (config, dir_a) = relay_fixture(&dbs[0]).build();
    let name = config.relay.name.clone();
    let mut processes = HashMap::new();
    let mut dirs = vec![dir_a];
    for (instance, db) in ["a", "b"].into_iter().zip(&dbs) {
        let mut config = config.clone();
        config.mysql.url = Some(db.url.clone());
        config.relay.instance_id = Some(instance.into());
        if instance == "b" {
            let dir = tempfile::tempdir().unwrap();
            config.relay.checkpoint_dir = dir.path().to_path_buf();
            config.mysql.server_id += 1;
            dirs.push(dir);
        }
        let file = write_config_file(&config, dirs.last().unwrap().path());
        let log = logs.path().join(format!("{instance}.log"));
        processes.insert(instance, RelayProcess::spawn_serving(&file, "", &log, &[]));
    }
    let log = |instance: &str| {
        std::fs::read_to_string(logs.path().join(format!("{instance}.log"))).unwrap()
    };
    let _show_logs = LogsOnPanic(logs.path());
    wait_for("a leader", Duration::from_secs(60), || async {
        leader(&dbs[0], &name).await.is_some()
    })
    .await;

    // Both nodes take writes; exactly one instance streams, so each event is published once.
    let (mut first, written) = (Vec::new(), Instant::now());
    for i in 0..200 {
        let event = |node: usize| {
            NewEvent::new(topic.clone(), format!("n{node}-{}", i % 8), json!({"i": i}))
        };
        for (node, db) in dbs.iter().enumerate() {
            let mut conn = db.conn().await;
            let ids = commit_events(&mut conn, vec![event(node + 1)]).await;
            first.extend(ids.into_iter().map(|id| (id, written)));
        }
    }
    wait_for(
        "the first 400 events SENT",
        Duration::from_secs(90),
        || async { common::relay::count_where(&dbs[0], &format!("status = {SENT}")).await == 400 },
    )
    .await;
    let leaders: Vec<&str> = ["a", "b"]
        .into_iter()
        .filter(|i| log(i).contains("this instance leads"))
        .collect();
    assert_eq!(leaders.len(), 1, "exactly one instance led: {leaders:?}");
    let led = leaders[0];
    assert_eq!(leader(&dbs[0], &name).await.as_deref(), Some(led));
    let once = stored_messages(&topic, 400).await;
    assert_eq!(
        once.len(),
        400,
        "each event published once while both instances run"
    );

    // The leader's node is killed mid-stream; writes go on on the other node.
    let (dead, survivor) = if led == "a" { (1, 2) } else { (2, 1) };
    let committed: Committed = Arc::new(Mutex::new(first));
    let stop = tokio_util::sync::CancellationToken::new();
    let writers: Vec<_> = [(1, "w1"), (2, "w2")]
        .into_iter()
        .map(|(node, prefix)| {
            let pool = dbs[node - 1].pool.clone();
            writer(pool, topic.clone(), prefix, committed.clone(), stop.clone())
        })
        .collect();
    // Long enough before the kill that some events are older than the resend window below: the
    // check must have events it does not forgive.
    tokio::time::sleep(Duration::from_secs(8)).await;
    cluster.kill(dead);
    let killed = Instant::now();
    let standby = if led == "a" { "b" } else { "a" };
    let live = &dbs[survivor - 1];
    wait_for(
        "the survivor's instance leads",
        Duration::from_secs(60),
        || async { leader(live, &name).await.as_deref() == Some(standby) },
    )
    .await;
    let takeover = killed.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    for writer in writers {
        writer.await.unwrap();
    }
    let committed = committed.lock().unwrap().clone();
    let total = committed.len();
    assert!(total > 600, "writes went on during the takeover");
    // A commit in flight on the dead node when it died may have been certified and applied by
    // the survivor although its writer saw only a broken connection: such a row exists and must
    // be delivered like the others, so the wait is for "no row unsent", not for `total` SENT.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let sent = common::relay::count_where(live, &format!("status = {SENT}")).await;
        let unsent = common::relay::count_where(live, &format!("status <> {SENT}")).await;
        if unsent == 0 && sent >= total as u64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "every row of the survivor SENT within 120 s: {sent} SENT, {unsent} not, {total} acknowledged commits"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Judged by what the broker stored: every row, in key order, with its SENT msg_id.
    let rows = outbox_rows(live).await;
    let in_doubt = rows.len() - total;
    let messages = stored_messages(&topic, rows.len()).await;
    let arrived: std::collections::HashSet<&str> = messages
        .iter()
        .map(|m| m.properties["event_id"].as_str())
        .collect();
    let held: std::collections::HashSet<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    for (id, _) in &committed {
        assert!(held.contains(id.as_str()), "event {id} is on the survivor");
        assert!(arrived.contains(id.as_str()), "event {id} is stored");
    }
    for row in &rows {
        assert!(arrived.contains(row.1.as_str()), "row {row:?} is stored");
    }
    assert_msg_ids_stored(&rows, &messages);
    assert_key_order(&rows, &messages);
    let duplicates = messages.len() - arrived.len();
    println!(
        "galera: leader {led} on node {dead} killed; {standby} took over in {takeover:?}; {total} events acknowledged + {in_doubt} committed as the node died, 0 lost, {duplicates} duplicates"
    );
    assert!(
        log(led).contains("leadership is over"),
        "the leader on the dead node stopped leading:\n{}",
        log(led)
    );
    assert!(
        takeover < rocketmq_outbox::leader::lease::LEASE + Duration::from_secs(15),
        "{takeover:?}"
    );
    // No overlap (the lease): what is sent twice is only what the old leader had sent and not
    // yet recorded when its node died, i.e. events committed in the moments before the kill
    // (the marker records about once a second; measured here: up to 1.7 s before the kill; the
    // bound leaves room for a loaded machine).
    let copies = copies_per_event(&messages);
    let in_flight = |at: Instant| killed.saturating_duration_since(at) <= Duration::from_secs(5);
    let older = (committed.iter()).filter(|(_, at)| !in_flight(*at)).count();
    assert!(
        older > 100,
        "only {older} events committed more than 5 s before the kill"
    );
    let resent: Vec<Duration> = committed
        .iter()
        .filter(|(id, _)| copies.get(id.as_str()).is_some_and(|&n| n > 1))
        .map(|(id, at)| {
            assert!(
                in_flight(*at),
                "event {id}, committed {:?} before the kill, was sent twice",
                killed.saturating_duration_since(*at)
            );
            killed.saturating_duration_since(*at)
        })
        .collect();
    println!(
        "galera: the events sent twice were committed at most {:?} before the kill",
        resent.iter().max()
    );
    // The survivor's instance reads back what the dead leader stored but had not recorded, and
    // does not send it again (`relay.takeover_read_limit`): at most a few sends in flight.
    assert!(
        duplicates <= 5,
        "{duplicates} events sent twice at one takeover: more than 5"
    );
    processes.remove(standby).unwrap().stop();
    processes.remove(led).unwrap().kill();
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .unwrap();
}
