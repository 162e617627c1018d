//! A two-node MariaDB Galera cluster on loopback (Debian's `mariadbd` with the `galera-4`
//! provider), for tests of the relay against a multi-primary source: node 1 bootstraps the
//! cluster, node 2 joins it by a state snapshot transfer (SST) over rsync.
//!
//! Guarantees:
//! - [`GaleraCluster::start`] returns once both nodes report `wsrep_cluster_size = 2` and
//!   `wsrep_local_state_comment = Synced`, or fails with the tails of both nodes' logs (an SST
//!   failure is logged by the donor, not by the joiner).
//! - Every node binlogs every replicated transaction (`log_slave_updates`) under the **same
//!   GTID** `<WSREP_GTID_DOMAIN_ID>-1-<seq>`, whichever node it was written on: a reader of
//!   node 1's binlog can resume on node 2 from the same GTID. That takes `wsrep_gtid_mode=ON`,
//!   one `wsrep_gtid_domain_id` and one `server_id` on every node (a joiner ignores its own
//!   server id and logs "Ignoring server id 2 for non bootstrap node, using 1" otherwise), and
//!   a `gtid_domain_id` of each node's own, different from the cluster's, for the transactions
//!   a node does not replicate.
//! - A node killed with `SIGKILL` leaves the other one primary (`pc.ignore_sb`: two nodes have
//!   no majority without it), and [`GaleraCluster::restart`] brings it back by IST when the
//!   survivor's gcache still holds what it missed (its own binlogs are kept), else by SST (its
//!   binlogs are replaced by the donor's last one).
//! - Dropping the cluster stops every node.
//!
//! Why the nodes run as the `mysql` system user when this process is root (and not with
//! `--user=root` like [`super::MariaDb`]): the joiner's SST script starts an rsync daemon, and
//! an rsync daemon started by root serves its modules as `nobody:nogroup` (the default `uid` and
//! `gid` of `rsyncd.conf`, which the script's generated config does not set). That daemon can
//! create nothing in a root-owned data directory: the donor then fails with `mkdir "mysql" (in
//! rsync_sst) failed: Permission denied`, `open "wsrep_sst_binlog.tar" ... No such file or
//! directory` and rsync code 23, whatever the binlog path. Run as `mysql` (as Debian's service
//! runs it), mariadbd, the SST script and its rsync daemon are one unprivileged user who owns
//! the node's directory, so a repeated SST into a used data directory works too.

use super::mariadb::{install_system_tables, mariadbd_command};
use super::process::{free_port, log_tail, port_is_open, wait_until_ready, ServerProcess};
use super::sql_server::{running_as_root, ProcessSlot, SqlEndpoint, SqlServer};
use std::collections::HashSet;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Galera's replication library, from Debian's `galera-4`.
pub const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

/// The GTID domain of every transaction the cluster replicates, on every node. Each node's own
/// `gtid_domain_id` (its number, 1 or 2) is used only for what a node does not replicate.
pub const WSREP_GTID_DOMAIN_ID: u32 = 0;

/// How long a node may take to start and reach `Synced`, a joiner's SST included (a slow
/// 2-core machine running other tests beside).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The account the nodes run as when this process is root (see the module documentation).
const SYSTEM_USER: &str = "mysql";

/// Two Galera nodes on 127.0.0.1, each with its own directory and ports; stopped when dropped.
/// Nodes are numbered 1 and 2 (node 1 bootstrapped the cluster).
#[derive(Debug)]
pub struct GaleraCluster {
    dir: PathBuf,
    nodes: Vec<GaleraNode>,
}

impl GaleraCluster {
    /// The number of nodes.
    pub const SIZE: usize = 2;

    /// Starts the cluster in `dir` (`node1/`, `node2/` inside; use a fresh
    /// [`super::scratch_dir`]): system tables on node 1, node 1 bootstraps, `root@127.0.0.1` is
    /// created there (Galera replicates it), node 2 joins by rsync SST. Returns once both nodes
    /// are `Synced` in a cluster of 2.
    pub fn start(dir: &Path) -> io::Result<Self> {
        check_installed()?;
        std::fs::create_dir_all(dir)?;
        let dir = std::fs::canonicalize(dir)?;
        let user = running_as_root().then_some(SYSTEM_USER);
        let owner = match user {
            Some(name) => {
                check_searchable(&dir)?;
                Some(system_user_ids(name)?)
            }
            None => None,
        };
        let ports = NodePorts::pick(Self::SIZE)?;
        let address = ports
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.galera))
            .collect::<Vec<_>>()
            .join(",");
        let nodes = ports
            .into_iter()
            .enumerate()
            .map(|(i, ports)| {
                let node_dir = dir.join(format!("node{}", i + 1));
                GaleraNode::prepare(i + 1, node_dir, ports, &address, user, owner)
            })
            .collect::<io::Result<Vec<_>>>()?;
        let mut cluster = Self { dir, nodes };
        install_system_tables(cluster.node(1).dir(), user)?;
        cluster.node_mut(1).bootstrap = true;
        cluster.start_node(1)?;
        cluster.node(1).endpoint().allow_root_over_tcp()?;
        cluster.start_node(2)?;
        cluster.wait_until_synced()?;
        Ok(cluster)
    }

    /// The cluster's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Node `n` (1 or 2): a [`SqlServer`] for URLs, databases and SQL as root.
    pub fn node(&self, n: usize) -> &GaleraNode {
        &self.nodes[Self::index(n)]
    }

    /// Node `n` (1 or 2), to stop, kill or restart it through [`SqlServer`] (prefer the
    /// cluster's own [`GaleraCluster::restart`], which also handles a node restarted alone).
    pub fn node_mut(&mut self, n: usize) -> &mut GaleraNode {
        &mut self.nodes[Self::index(n)]
    }

    /// Crashes node `n` (`SIGKILL`); the other node stays primary and takes writes.
    pub fn kill(&mut self, n: usize) {
        self.node_mut(n).kill();
    }

    /// Stops node `n` gracefully (it leaves the cluster; its data and position are kept).
    pub fn stop(&mut self, n: usize) {
        self.node_mut(n).stop();
    }

    /// Stops node `n` if it runs and starts it again: it rejoins the running node by IST (SST
    /// if the donor's gcache no longer holds what it missed). If no other node runs, node `n`
    /// bootstraps a new primary component from its own data (marked safe to bootstrap).
    /// Returns once every running node is `Synced` in a cluster of all running nodes.
    pub fn restart(&mut self, n: usize) -> io::Result<()> {
        self.stop(n);
        let alone = (1..=Self::SIZE)
            .filter(|&other| other != n)
            .all(|other| !self.node_mut(other).is_running());
        if alone {
            self.node(n).mark_safe_to_bootstrap()?;
            self.node_mut(n).bootstrap = true;
        }
        self.start_node(n)?;
        self.wait_until_synced()
    }

    /// Waits until every running node reports `Synced` and a cluster size equal to the number of
    /// running nodes (after a kill, until the survivor has evicted the dead node: seconds).
    pub fn wait_until_synced(&mut self) -> io::Result<()> {
        let running: Vec<usize> = (1..=Self::SIZE)
            .filter(|&n| self.node_mut(n).is_running())
            .collect();
        let expected = running.len().to_string();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let states: Vec<(usize, io::Result<(String, String)>)> = running
                .iter()
                .map(|&n| (n, self.node(n).cluster_state()))
                .collect();
            let synced = states.iter().all(|(_, state)| {
                matches!(state, Ok((size, comment)) if *size == expected && comment == "Synced")
            });
            if synced {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let seen: Vec<String> = states
                    .iter()
                    .map(|(n, state)| format!("node {n}: {state:?}"))
                    .collect();
                return Err(self.with_logs(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the Galera cluster did not reach {expected} Synced node(s) within \
                         {START_TIMEOUT:?} (cluster size, state): {}",
                        seen.join("; ")
                    ),
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Starts node `n`'s process; an error carries the other nodes' log tails (a failed SST is
    /// explained in the donor's log).
    fn start_node(&mut self, n: usize) -> io::Result<()> {
        let result = self.node_mut(n).start_process();
        result.map_err(|e| self.with_logs(e))
    }

    /// `error` with every node's error lines (the SST script's and rsync's included) and the
    /// last lines of its log appended.
    fn with_logs(&self, error: io::Error) -> io::Error {
        let mut message = error.to_string();
        for node in &self.nodes {
            let path = node.log_path();
            let text =
                String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default()).into_owned();
            let errors: Vec<&str> = text
                .lines()
                .filter(|line| {
                    ["[ERROR]", "rsync:", "rsync error"]
                        .iter()
                        .any(|e| line.contains(e))
                })
                .collect();
            message.push_str(&format!(
                "\n--- node {}: error lines of {}:\n{}\n--- node {}: last lines:\n{}",
                node.number,
                path.display(),
                errors[errors.len().saturating_sub(20)..].join("\n"),
                node.number,
                log_tail(&path, 25)
            ));
        }
        io::Error::new(error.kind(), message)
    }

    fn index(n: usize) -> usize {
        assert!(
            (1..=Self::SIZE).contains(&n),
            "Galera nodes are numbered 1..={}, not {n}",
            Self::SIZE
        );
        n - 1
    }
}

impl Drop for GaleraCluster {
    /// Stops node 2, then node 1 (each gracefully, `SIGKILL` after 30 s).
    fn drop(&mut self) {
        for node in self.nodes.iter_mut().rev() {
            node.stop();
        }
    }
}

/// The loopback ports of one node.
#[derive(Debug, Clone, Copy)]
struct NodePorts {
    /// SQL clients.
    client: u16,
    /// Group communication (`wsrep_node_address`, `gmcast.listen_addr`).
    galera: u16,
    /// Incremental state transfers to this node (`ist.recv_addr`).
    ist: u16,
    /// The rsync daemon of an SST to this node (`wsrep_sst_receive_address`).
    sst: u16,
}

impl NodePorts {
    /// Ports for `nodes` nodes, all different.
    fn pick(nodes: usize) -> io::Result<Vec<Self>> {
        let mut taken = HashSet::new();
        let mut next = || -> io::Result<u16> {
            loop {
                let port = free_port()?;
                if taken.insert(port) {
                    return Ok(port);
                }
            }
        };
        (0..nodes)
            .map(|_| {
                Ok(Self {
                    client: next()?,
                    galera: next()?,
                    ist: next()?,
                    sst: next()?,
                })
            })
            .collect()
    }
}

/// One node of a [`GaleraCluster`]: `data/`, `tmp/`, `mariadbd.sock`, `mariadbd.pid` and
/// `mariadbd.log` in its directory. `root` has no password over the socket and on
/// `127.0.0.1:<port>`.
#[derive(Debug)]
pub struct GaleraNode {
    number: usize,
    dir: PathBuf,
    ports: NodePorts,
    /// `host:port,host:port` of every node's group communication.
    cluster_address: String,
    /// `--user` for mariadbd and `mariadb-install-db`.
    user: Option<&'static str>,
    /// The next start forms a new cluster (`--wsrep-new-cluster`); cleared once started.
    bootstrap: bool,
    process: ProcessSlot,
}

impl GaleraNode {
    /// Creates the node's directories, owned by `owner` (uid, gid) when given.
    fn prepare(
        number: usize,
        dir: PathBuf,
        ports: NodePorts,
        cluster_address: &str,
        user: Option<&'static str>,
        owner: Option<(u32, u32)>,
    ) -> io::Result<Self> {
        for path in [dir.clone(), dir.join("data"), dir.join("tmp")] {
            std::fs::create_dir_all(&path)?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
            }
        }
        Ok(Self {
            number,
            dir,
            ports,
            cluster_address: cluster_address.to_string(),
            user,
            bootstrap: false,
            process: ProcessSlot::default(),
        })
    }

    /// The node's number, 1 or 2.
    pub fn number(&self) -> usize {
        self.number
    }

    /// The node's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The node's server log (the SST script's output included).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("mariadbd.log")
    }

    /// Runs `sql` as root over the node's Unix socket; returns the rows, one a line, columns
    /// separated by tabs, no header.
    pub fn query(&self, sql: &str) -> io::Result<String> {
        self.endpoint()
            .query_as_root(sql)
            .map_err(|e| io::Error::other(format!("node {}: {e}", self.number)))
    }

    /// `wsrep_cluster_size` and `wsrep_local_state_comment` (e.g. `Synced`, `Joining`).
    fn cluster_state(&self) -> io::Result<(String, String)> {
        let rows = self.query(
            "SHOW GLOBAL STATUS WHERE Variable_name IN \
             ('wsrep_cluster_size', 'wsrep_local_state_comment')",
        )?;
        let value = |name: &str| {
            rows.lines()
                .filter_map(|line| line.split_once('\t'))
                .find(|(key, _)| key.eq_ignore_ascii_case(name))
                .map(|(_, value)| value.to_string())
                .unwrap_or_default()
        };
        Ok((
            value("wsrep_cluster_size"),
            value("wsrep_local_state_comment"),
        ))
    }

    /// The Galera flags of this node (on top of [`mariadbd_command`]'s binlog settings).
    fn galera_args(&self) -> Vec<String> {
        let NodePorts {
            galera, ist, sst, ..
        } = self.ports;
        vec![
            "--wsrep-on=ON".into(),
            format!("--wsrep-provider={PROVIDER}"),
            "--wsrep-cluster-name=outbox-relay".into(),
            format!("--wsrep-cluster-address=gcomm://{}", self.cluster_address),
            format!("--wsrep-node-name=node{}", self.number),
            format!("--wsrep-node-address=127.0.0.1:{galera}"),
            format!(
                "--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{galera};\
                 ist.recv_addr=127.0.0.1:{ist};pc.ignore_sb=true;gcache.size=64M"
            ),
            "--wsrep-sst-method=rsync".into(),
            format!("--wsrep-sst-receive-address=127.0.0.1:{sst}"),
            "--wsrep-gtid-mode=ON".into(),
            format!("--wsrep-gtid-domain-id={WSREP_GTID_DOMAIN_ID}"),
            format!("--gtid-domain-id={}", self.number),
            "--log-slave-updates=ON".into(),
            "--innodb-autoinc-lock-mode=2".into(),
            "--innodb-buffer-pool-size=128M".into(),
        ]
    }

    /// `mariadbd` for this node, with `extra` flags last.
    fn command(&self, extra: &[String]) -> io::Result<Command> {
        let mut command = mariadbd_command(&self.dir, self.ports.client, self.user)?;
        command.args(self.galera_args()).args(extra);
        Ok(command)
    }

    /// After a crash (`grastate.dat` says `seqno: -1`), the position InnoDB recovered
    /// (`mariadbd --wsrep-recover`, what Debian's `galera_recovery` does), to start from: without
    /// it the node knows no position and needs a full SST. `None` for a node never started and
    /// after a clean shutdown.
    fn recovered_position(&self) -> io::Result<Option<String>> {
        let Ok(state) = std::fs::read_to_string(self.data_dir().join("grastate.dat")) else {
            return Ok(None);
        };
        let crashed = state
            .lines()
            .any(|line| line.split_whitespace().eq(["seqno:", "-1"]));
        if !crashed {
            return Ok(None);
        }
        let log = self.dir.join("wsrep-recover.log");
        let _ = std::fs::remove_file(&log);
        let output = self
            .command(&[
                "--wsrep-recover".into(),
                format!("--log-error={}", log.display()),
            ])?
            .output()?;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let position = text
            .lines()
            .find_map(|line| line.split_once("WSREP: Recovered position:"))
            .map(|(_, position)| position.trim().to_string());
        match position {
            Some(position) => Ok(Some(position)),
            None => Err(io::Error::other(format!(
                "node {}: mariadbd --wsrep-recover found no position ({}); last lines of {}:\n{}{}",
                self.number,
                output.status,
                log.display(),
                log_tail(&log, 30),
                String::from_utf8_lossy(&output.stderr)
            ))),
        }
    }

    /// Lets this node bootstrap a new cluster from its data (`safe_to_bootstrap: 1`), as an
    /// operator does for the most advanced node after the whole cluster went down.
    fn mark_safe_to_bootstrap(&self) -> io::Result<()> {
        let path = self.data_dir().join("grastate.dat");
        let Ok(state) = std::fs::read_to_string(&path) else {
            return Ok(());
        };
        let marked = state.replace("safe_to_bootstrap: 0", "safe_to_bootstrap: 1");
        if marked != state {
            std::fs::write(&path, marked)?;
        }
        Ok(())
    }
}

impl SqlServer for GaleraNode {
    fn endpoint(&self) -> SqlEndpoint {
        SqlEndpoint {
            socket: self.dir.join("mariadbd.sock"),
            port: self.ports.client,
        }
    }

    fn process_slot(&mut self) -> &mut ProcessSlot {
        &mut self.process
    }

    /// Starts mariadbd (bootstrapping if marked so, else joining the cluster) and returns once
    /// it takes connections and is `Synced`, within 120 s, else fails with its log's tail.
    fn start_process(&mut self) -> io::Result<()> {
        let mut extra = Vec::new();
        if self.bootstrap {
            extra.push("--wsrep-new-cluster".to_string());
        }
        if let Some(position) = self.recovered_position()? {
            extra.push(format!("--wsrep-start-position={position}"));
        }
        let what = format!("Galera node {}", self.number);
        let mut process = ServerProcess::start(&what, self.command(&extra)?, &self.log_path())?;
        let endpoint = self.endpoint();
        wait_until_ready(&mut process, START_TIMEOUT, &what, || {
            endpoint.socket.exists()
                && port_is_open(endpoint.port)
                && self
                    .cluster_state()
                    .is_ok_and(|(_, state)| state == "Synced")
        })?;
        self.process.set(process);
        self.bootstrap = false;
        Ok(())
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }
}

/// Fails, naming `scripts/setup.sh`, when the Galera provider or rsync is missing.
fn check_installed() -> io::Result<()> {
    // The SST script finds rsync on mariadbd's (that is, this process's) PATH.
    let rsync = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("rsync").is_file()));
    if !Path::new(PROVIDER).is_file() || !rsync {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "the Galera provider {PROVIDER} (package galera-4) or rsync is missing: \
                 run scripts/setup.sh"
            ),
        ));
    }
    Ok(())
}

/// Fails unless every directory from `/` to `dir` lets other users through (`o+x`): the nodes
/// run as [`SYSTEM_USER`], who must reach their directories.
fn check_searchable(dir: &Path) -> io::Result<()> {
    for ancestor in dir.ancestors() {
        let mode = std::fs::metadata(ancestor)?.permissions().mode();
        if mode & 0o001 == 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} (mode {:o}) keeps the `{SYSTEM_USER}` user the Galera nodes run as out \
                     of {}: start the cluster under a directory others may traverse (e.g. set \
                     TMPDIR=/tmp)",
                    ancestor.display(),
                    mode & 0o7777,
                    dir.display()
                ),
            ));
        }
    }
    Ok(())
}

/// The uid and gid of the system user `name`.
fn system_user_ids(name: &str) -> io::Result<(u32, u32)> {
    let c_name = std::ffi::CString::new(name).map_err(io::Error::other)?;
    // SAFETY: getpwnam reads the user database; the record is copied out before any other call.
    let entry = unsafe { libc::getpwnam(c_name.as_ptr()) };
    if entry.is_null() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "no `{name}` system user (Debian's mariadb-server creates it): run scripts/setup.sh"
            ),
        ));
    }
    // SAFETY: non-null, points to getpwnam's static record.
    let entry = unsafe { &*entry };
    Ok((entry.pw_uid, entry.pw_gid))
}
