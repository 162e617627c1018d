//! A real RocketMQ cluster on free loopback ports: one name server and one or more broker
//! groups (`broker-a`, `broker-b`, ...), each a master and optionally a `SYNC_MASTER` + slave
//! pair. The servers are **Apache RocketMQ 5.x** (the Java broker users run, the default) or
//! **rocketmq-rust 1.0** (kept as a second broker); `$OUTBOX_BROKER` = `apache` | `rust` picks.
//!
//! Guarantees:
//! - [`RocketMq::start_with`] returns only once every broker is *usable*: registered with the
//!   name server and, for a master, a probe message sent through the name-server-resolved route
//!   was stored (`SEND_OK`; a `SYNC_MASTER` whose slave is down counts once it answers at all).
//!   No fixed sleeps.
//! - Each server has its own ports, home and store under the caller's root directory, so
//!   instances never share state.
//! - Dropping a [`RocketMq`] kills its brokers, then its name server (a test's cluster is thrown
//!   away with its scratch directory; a graceful stop costs an Apache broker ~14 s), or stops
//!   them gracefully with [`RocketMqOptions::keep_store`]; all also die with this process (see
//!   [`super::process`]). A cluster [attached](RocketMq::attach) to is never stopped.
//!
//! [`ClientHost`] is the private client runtime the harness uses for its probes; tests can use it
//! too, to get an `Arc<ClientRuntime>` that works from plain or async code alike.

mod acl;
pub mod apache;
mod faults;
mod probe;
mod proxy;
mod rust_broker;
mod tls;

pub use acl::AclAccount;
pub use proxy::Proxy;
pub use rocketmq_outbox_consumer::rocketmq_client::ClientHost;
pub use tls::TlsFiles;

use rocketmq_outbox_consumer::rocketmq_client::ClientSecurity;

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::process::{
    free_port, free_port_with_room_below, port_is_open, wait_until_ready, ServerProcess,
};

/// Cluster name every broker registers under.
pub const CLUSTER_NAME: &str = "DefaultCluster";
/// The first broker group's name; `MessageQueue::broker_name()` of its queues.
pub const BROKER_NAME: &str = "broker-a";
const NAMESRV_START_TIMEOUT: Duration = Duration::from_secs(60);
const BROKER_START_TIMEOUT: Duration = Duration::from_secs(120);
const BROKER_STOP_GRACE: Duration = Duration::from_secs(15);

/// Which server implementation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    /// Apache RocketMQ 5.x (Java), from Maven Central.
    Apache,
    /// rocketmq-rust 1.0, from crates.io.
    Rust,
}

impl BrokerKind {
    /// The variable that picks the kind for tests, `dev up` and the bench.
    pub const ENV: &'static str = "OUTBOX_BROKER";

    /// `$OUTBOX_BROKER`: `apache` (also when unset) or `rust`.
    pub fn from_env() -> io::Result<Self> {
        match std::env::var(Self::ENV).as_deref() {
            Err(_) | Ok("") | Ok("apache") => Ok(BrokerKind::Apache),
            Ok("rust") => Ok(BrokerKind::Rust),
            Ok(other) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}={other:?}: expected `apache` or `rust`", Self::ENV),
            )),
        }
    }

    /// `apache` or `rust`.
    pub fn name(self) -> &'static str {
        match self {
            BrokerKind::Apache => "apache",
            BrokerKind::Rust => "rust",
        }
    }
}

/// Knobs for [`RocketMq::start_with`].
#[derive(Debug, Clone)]
pub struct RocketMqOptions {
    /// The servers; `None` reads [`BrokerKind::ENV`].
    pub kind: Option<BrokerKind>,
    /// `autoCreateTopicEnable`: when true (the default, like a stock broker) the first send to an
    /// unknown topic creates it. Set it false to behave like a production broker.
    pub auto_create_topics: bool,
    /// Broker groups (`broker-a`, `broker-b`, ...), each with its own share of a topic's queues.
    pub groups: usize,
    /// Each group is a `SYNC_MASTER` with one `SLAVE` (a master's `SEND_OK` then means the slave
    /// has the message too) instead of a lone `ASYNC_MASTER`.
    pub sync_slaves: bool,
    /// RocketMQ 5's controller mode (Apache only): the name server embeds a controller, and each
    /// group is two brokers whose master the controller elects, and replaces by the other when
    /// it dies (automatic master switch). A send is `SEND_OK` once both hold it
    /// (`allAckInSyncStateSet`).
    pub controller: bool,
    /// Authentication and authorization on (ACL 2.0), with this super user (Apache only).
    pub acl: Option<AclAccount>,
    /// The name server and brokers accept TLS only (`tls.server.mode=enforcing`), with a
    /// certificate for `127.0.0.1` from a CA of the cluster's own ([`RocketMq::tls_ca`]); the
    /// harness's clients trust it (Apache only; needs the `openssl` command).
    pub tls: bool,
    /// The store is used again by a later start (`outbox-dev up`): dropping the handle
    /// stops the servers gracefully. Otherwise (the default) it kills them: the store goes with
    /// its scratch directory.
    pub keep_store: bool,
}

impl Default for RocketMqOptions {
    fn default() -> Self {
        Self {
            kind: None,
            auto_create_topics: true,
            groups: 1,
            sync_slaves: false,
            controller: false,
            acl: None,
            tls: false,
            keep_store: false,
        }
    }
}

/// What a broker does in its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerRole {
    AsyncMaster,
    SyncMaster,
    Slave,
    /// In a controller-mode group: master or slave as the controller decides.
    Elected,
}

impl BrokerRole {
    /// The `brokerRole` value both implementations read.
    pub fn apache_name(self) -> &'static str {
        match self {
            BrokerRole::AsyncMaster => "ASYNC_MASTER",
            BrokerRole::SyncMaster => "SYNC_MASTER",
            // Controller mode starts every broker as a slave; the controller promotes one.
            BrokerRole::Slave | BrokerRole::Elected => "SLAVE",
        }
    }
}

/// One broker process of the cluster.
#[derive(Debug)]
pub struct BrokerNode {
    /// Its group (`brokerName`).
    pub group: String,
    /// `brokerId`: 0 for the master, 1 for the slave (in controller mode: its place in the
    /// group, whichever is master; see [`RocketMq::master_of`]).
    pub id: u32,
    pub role: BrokerRole,
    /// Its config, store and logs.
    pub dir: PathBuf,
    /// Remoting port (clients connect here; `port - 2` is the "fast" port, `port + 1` free too).
    pub port: u16,
    /// Master-slave replication port.
    pub ha_port: u16,
    process: Option<ServerProcess>,
}

impl BrokerNode {
    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// True while its process runs.
    pub fn is_running(&mut self) -> bool {
        self.process.as_mut().is_some_and(ServerProcess::is_running)
    }
}

/// A running (or attached) cluster. See the module docs for what is guaranteed.
#[derive(Debug)]
pub struct RocketMq {
    brokers: Vec<BrokerNode>,
    /// `None` for a cluster attached to (not ours to stop).
    namesrv: Option<ServerProcess>,
    namesrv_addr: String,
    kind: BrokerKind,
    options: RocketMqOptions,
    root: PathBuf,
    /// The certificates of a TLS cluster.
    tls: Option<TlsFiles>,
    /// The controller's address in controller mode (its DLedger port, in the name server).
    controller_addr: Option<String>,
}

impl RocketMq {
    /// Starts a name server and one broker under `root` (created if missing) with default options.
    pub fn start(root: &Path) -> io::Result<Self> {
        Self::start_with(root, RocketMqOptions::default())
    }

    /// Starts the cluster `options` describe under `root` and waits until every broker is usable.
    pub fn start_with(root: &Path, options: RocketMqOptions) -> io::Result<Self> {
        let kind = match options.kind {
            Some(kind) => kind,
            None => BrokerKind::from_env()?,
        };
        if (options.acl.is_some() || options.tls || options.controller)
            && kind != BrokerKind::Apache
        {
            return Err(io::Error::other(
                "ACL, TLS and controller mode are set up only on the Apache broker",
            ));
        }
        std::fs::create_dir_all(root)?;
        let root = std::fs::canonicalize(root)?;
        let tls = match options.tls {
            true => Some(TlsFiles::make(&root.join("tls"))?),
            false => None,
        };
        let namesrv_dir = root.join("namesrv");
        std::fs::create_dir_all(&namesrv_dir)?;
        let namesrv_port = free_port()?;
        let controller_port = match options.controller {
            true => Some(free_port()?),
            false => None,
        };
        let command = match kind {
            BrokerKind::Apache => {
                apache::namesrv_command(&namesrv_dir, namesrv_port, tls.as_ref(), controller_port)?
            }
            BrokerKind::Rust => rust_broker::namesrv_command(&namesrv_dir, namesrv_port)?,
        };
        let mut namesrv =
            ServerProcess::start("rocketmq namesrv", command, &root.join("namesrv.log"))?;
        wait_until_ready(
            &mut namesrv,
            NAMESRV_START_TIMEOUT,
            "RocketMQ namesrv",
            || port_is_open(namesrv_port),
        )?;
        let mut this = Self {
            brokers: Vec::new(),
            controller_addr: controller_port.map(|port| format!("127.0.0.1:{port}")),
            namesrv: Some(namesrv),
            namesrv_addr: format!("127.0.0.1:{namesrv_port}"),
            kind,
            options: options.clone(),
            root: root.clone(),
            tls,
        };
        for group in 0..options.groups.max(1) {
            let name = group_name(group);
            let roles: &[BrokerRole] = if options.controller {
                &[BrokerRole::Elected, BrokerRole::Elected]
            } else if options.sync_slaves {
                &[BrokerRole::SyncMaster, BrokerRole::Slave]
            } else {
                &[BrokerRole::AsyncMaster]
            };
            for (id, role) in roles.iter().enumerate() {
                let (port, ha_port) = pick_broker_ports(&this)?;
                let dir = root.join(format!("{name}-{id}"));
                std::fs::create_dir_all(&dir)?;
                this.brokers.push(BrokerNode {
                    group: name.clone(),
                    id: id as u32,
                    role: *role,
                    dir,
                    port,
                    ha_port,
                    process: None,
                });
            }
        }
        // Every broker's JVM starts at once; then each is waited for.
        for index in 0..this.brokers.len() {
            this.spawn_broker_at(index)?;
        }
        for index in 0..this.brokers.len() {
            this.wait_until_usable(index)?;
        }
        Ok(this)
    }

    /// A cluster started elsewhere (by `outbox-dev servers` for a whole test run): its
    /// name server at `namesrv_addr`. Nothing is stopped when the handle drops.
    pub fn attach(namesrv_addr: &str, kind: BrokerKind, root: &Path) -> Self {
        Self {
            brokers: Vec::new(),
            namesrv: None,
            namesrv_addr: namesrv_addr.to_string(),
            kind,
            options: RocketMqOptions {
                kind: Some(kind),
                ..RocketMqOptions::default()
            },
            root: root.to_path_buf(),
            tls: None,
            controller_addr: None,
        }
    }

    /// `127.0.0.1:PORT` of the name server (what clients are configured with).
    pub fn namesrv_addr(&self) -> String {
        self.namesrv_addr.clone()
    }

    /// Which servers run.
    pub fn kind(&self) -> BrokerKind {
        self.kind
    }

    /// The CA (PEM) of a TLS cluster ([`RocketMqOptions::tls`]): what a relay process is given
    /// in `$SSL_CERT_FILE`.
    pub fn tls_ca(&self) -> Option<&Path> {
        self.tls.as_ref().map(|files| files.ca.as_path())
    }

    /// How the harness's own clients connect: signed as the super user of
    /// [`RocketMqOptions::acl`], over TLS trusting the cluster's CA if it has one.
    pub fn client_security(&self) -> ClientSecurity {
        let security = self
            .options
            .acl
            .as_ref()
            .map(AclAccount::security)
            .unwrap_or_default();
        match &self.tls {
            Some(files) => security.trusting(&files.ca),
            None => security,
        }
    }

    /// The options this instance was started with.
    pub fn options(&self) -> &RocketMqOptions {
        &self.options
    }

    /// Every broker this handle started, masters before their slaves, group by group.
    pub fn brokers(&self) -> &[BrokerNode] {
        &self.brokers
    }

    /// The index in [`Self::brokers`] of `group`'s broker `id` (0 master, 1 slave).
    pub fn broker_index(&self, group: &str, id: u32) -> Option<usize> {
        self.brokers
            .iter()
            .position(|b| b.group == group && b.id == id)
    }

    /// `127.0.0.1:PORT` of the first master's remoting listener.
    pub fn broker_addr(&self) -> String {
        self.brokers
            .first()
            .map(BrokerNode::addr)
            .unwrap_or_default()
    }

    /// Controller mode: the index of the broker of `group` the name server lists as its master
    /// now, if any.
    pub fn master_of(&self, group: &str) -> io::Result<Option<usize>> {
        let probe = probe::Probe::new(&self.namesrv_addr, self.client_security())?;
        let master = probe.master_addr(group).map_err(io::Error::other)?;
        Ok(master.and_then(|addr| self.brokers.iter().position(|b| b.addr() == addr)))
    }

    /// Creates (or updates) `topic` with `queues` read and write queues on every master the
    /// name server lists, and waits until the route shows them all; in controller mode also until
    /// every slave holds it (a slave promoted without it refuses it). Works whether or not the
    /// brokers auto-create topics.
    pub fn create_topic(&self, topic: &str, queues: u32) -> io::Result<()> {
        let probe = probe::Probe::new(&self.namesrv_addr, self.client_security())?;
        probe.create_topic(topic, queues)?;
        if self.options.controller {
            probe.slaves_hold(topic)?;
        }
        Ok(())
    }

    /// Runs Apache's `mqadmin` against this cluster's name server (`-n` is added), e.g.
    /// `["queryMsgByKey", "-t", topic, "-k", key]`; returns what it printed. On a cluster with
    /// ACL on it signs as the super user of [`RocketMqOptions::acl`].
    pub fn mqadmin(&self, args: &[&str]) -> io::Result<String> {
        let home = self.root.join("mqadmin");
        let (acl, tls) = (self.options.acl.as_ref(), self.tls.as_ref());
        apache::mqadmin(&self.namesrv_addr, args, &home, acl, tls)
    }

    fn node(&mut self, index: usize) -> &mut BrokerNode {
        &mut self.brokers[index]
    }

    fn signal(&mut self, index: usize, signal: libc::c_int) -> Option<u32> {
        let pid = self.brokers.get(index)?.process.as_ref()?.pid()?;
        // SAFETY: kill(2) on the pid of a child we own and have not reaped.
        unsafe {
            libc::kill(pid as libc::pid_t, signal);
        }
        Some(pid)
    }
}

impl Drop for RocketMq {
    fn drop(&mut self) {
        let keep = self.options.keep_store;
        for index in (0..self.brokers.len()).rev() {
            match keep {
                true => self.stop_broker_at(index),
                false => self.kill_broker_at(index),
            }
        }
        if let Some(mut namesrv) = self.namesrv.take() {
            match keep {
                true => namesrv.stop(Duration::from_secs(10)),
                false => namesrv.kill(),
            }
        }
    }
}

/// `broker-a`, `broker-b`, ...
fn group_name(index: usize) -> String {
    let letter = (b'a' + (index % 26) as u8) as char;
    format!("broker-{letter}")
}

/// A free remoting port `p` with `p - 2 ..= p + 1` free (the fast port and Apache's default HA
/// port), and a separate HA port, clear of every port the cluster already uses.
fn pick_broker_ports(cluster: &RocketMq) -> io::Result<(u16, u16)> {
    let namesrv_port: u16 = cluster
        .namesrv_addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let taken = |p: u16| {
        p == namesrv_port
            || cluster
                .brokers
                .iter()
                .any(|b| (b.port - 2..=b.port + 1).contains(&p) || b.ha_port == p)
    };
    for _ in 0..50 {
        let port = free_port_with_room_below(2)?;
        let ha = free_port()?;
        let range = port - 2..=port + 1;
        let clear = !range.clone().any(taken)
            && !taken(ha)
            && !range.contains(&ha)
            && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok();
        if clear {
            return Ok((port, ha));
        }
    }
    Err(io::Error::other(
        "could not find distinct free loopback ports for a RocketMQ broker",
    ))
}

/// Whether every thread of process `pid` is stopped (`/proc/<pid>/task/*/stat` state `T`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true; // gone: nothing left to answer
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).map_or(true, |stat| {
            // "pid (comm) S ...": the state follows the last ')'.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_none_or(|state| state == "T" || state == "t")
        })
    })
}
