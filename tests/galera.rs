//! The two-node Galera cluster of `devenv::galera`: rows written on either node reach both, and
//! both nodes binlog every transaction under the same GTID, so a binlog reader can move from one
//! node to the other by GTID. MariaDB runs only (`OUTBOX_TEST_DB` unset or `mariadb`).

use mysql_async::prelude::*;
use mysql_async::Conn;
use rocketmq_outbox::devenv::galera::WSREP_GTID_DOMAIN_ID;
use rocketmq_outbox::devenv::{scratch_dir, DatabaseKind, GaleraCluster, SqlServer};
use std::time::{Duration, Instant};

/// Connects to `database` on node `n` over TCP (as `root@127.0.0.1`, which only replication
/// created on node 2), reading causally: a read waits until the node has applied every write
/// the cluster committed before it (`wsrep_sync_wait`).
async fn connect(cluster: &GaleraCluster, n: usize, database: &str) -> Conn {
    let url = cluster.node(n).url(database);
    let mut conn = Conn::from_url(url.as_str())
        .await
        .unwrap_or_else(|e| panic!("node {n}: connect to {url}: {e}"));
    conn.query_drop("SET SESSION wsrep_sync_wait = 1")
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_node_cluster_replicates_with_identical_gtids() {
    let kind = DatabaseKind::from_env().expect("OUTBOX_TEST_DB");
    if kind != DatabaseKind::MariaDb {
        eprintln!(
            "galera: not run: Galera is MariaDB's, and OUTBOX_TEST_DB={}",
            kind.name()
        );
        return;
    }
    let started = Instant::now();
    let mut cluster = tokio::task::spawn_blocking(|| {
        let dir = scratch_dir("galera").expect("scratch dir");
        GaleraCluster::start(&dir)
    })
    .await
    .unwrap()
    .unwrap_or_else(|e| panic!("the Galera cluster must start (run scripts/setup.sh): {e}"));
    eprintln!("galera: 2 nodes Synced after {:?}", started.elapsed());

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
