//! A real RocketMQ (namesrv + one broker, the `rocketmq-rust` 1.0 servers) on free loopback ports.
//!
//! Guarantees:
//! - [`RocketMq::start`] returns only once the broker is *usable*: a probe message sent through
//!   the namesrv-resolved route came back `SEND_OK` (so the broker is registered with the namesrv,
//!   listening, and its store accepts writes). No fixed sleeps.
//! - Each instance has its own ports, `ROCKETMQ_HOME`, `HOME` and store under the caller's root
//!   directory, so instances never share state (not even `~/rocketmq-namesrv/...`).
//! - Dropping a [`RocketMq`] stops the broker, then the namesrv; both also die with this process
//!   (see [`super::process`]).
//!
//! [`ClientHost`] is the private client runtime the harness uses for its probes; tests can use it
//! too, to get an `Arc<ClientRuntime>` that works from plain or async code alike.

pub use crate::send::ClientHost;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rocketmq_client_rust::{ClientRuntime, DefaultMQProducer, SendStatus};
use rocketmq_model::common::message::message_single::Message;

use super::process::{
    find_executable, free_port, free_port_with_room_below, port_is_open, wait_until_ready,
    ServerProcess,
};

/// Cluster and broker names registered by the harness (one broker per namesrv).
pub const CLUSTER_NAME: &str = "DefaultCluster";
/// The broker's name; `MessageQueue::broker_name()` of every queue.
pub const BROKER_NAME: &str = "broker-a";
/// One-queue topic the readiness probe creates (idempotently) and sends to.
const PROBE_TOPIC: &str = "outbox_relay_devenv_probe";
const NAMESRV_START_TIMEOUT: Duration = Duration::from_secs(30);
const BROKER_START_TIMEOUT: Duration = Duration::from_secs(90);
const BROKER_STOP_GRACE: Duration = Duration::from_secs(15);

/// Knobs for [`RocketMq::start_with`].
#[derive(Debug, Clone)]
pub struct RocketMqOptions {
    /// `autoCreateTopicEnable`: when true (the default, like a stock broker) the first send to an
    /// unknown topic creates it with `min(producer defaultTopicQueueNums (4), 8)` queues. Set it
    /// false to behave like a production broker, where sending to an unknown topic fails.
    pub auto_create_topics: bool,
}

impl Default for RocketMqOptions {
    fn default() -> Self {
        Self {
            auto_create_topics: true,
        }
    }
}

/// A running namesrv + broker pair. See the module docs for what is guaranteed.
#[derive(Debug)]
pub struct RocketMq {
    // Declared first so it is dropped (stopped) before the namesrv.
    broker: Option<ServerProcess>,
    namesrv: ServerProcess,
    broker_bin: PathBuf,
    broker_dir: PathBuf,
    namesrv_port: u16,
    broker_port: u16,
    options: RocketMqOptions,
}

impl RocketMq {
    /// Starts namesrv + broker under `root` (created if missing) with default options.
    pub fn start(root: &Path) -> io::Result<Self> {
        Self::start_with(root, RocketMqOptions::default())
    }

    /// Starts namesrv + broker under `root` and waits until a probe send succeeds.
    pub fn start_with(root: &Path, options: RocketMqOptions) -> io::Result<Self> {
        let bin_dir = super::cache_dir().join("rocketmq").join("bin");
        let namesrv_bin = find_executable(
            "rocketmq-namesrv-rust",
            "OUTBOX_DEVENV_ROCKETMQ_BIN",
            std::slice::from_ref(&bin_dir),
        )?;
        let broker_bin = find_executable(
            "rocketmq-broker-rust",
            "OUTBOX_DEVENV_ROCKETMQ_BIN",
            &[bin_dir],
        )?;

        let namesrv_dir = root.join("namesrv");
        let broker_dir = root.join("broker");
        std::fs::create_dir_all(&namesrv_dir)?;
        std::fs::create_dir_all(broker_dir.join("conf"))?;

        let (namesrv_port, broker_port, ha_port) = pick_ports()?;
        let mut command = Command::new(&namesrv_bin);
        command
            .arg("--listenPort")
            .arg(namesrv_port.to_string())
            .arg("--bindAddress")
            .arg("127.0.0.1")
            .arg("--rocketmqHome")
            .arg(&namesrv_dir)
            .arg("--kvConfigPath")
            .arg(namesrv_dir.join("kvConfig.json"));
        isolate_env(&mut command, &namesrv_dir);
        let mut namesrv =
            ServerProcess::start("rocketmq namesrv", command, &root.join("namesrv.log"))?;
        wait_until_ready(
            &mut namesrv,
            NAMESRV_START_TIMEOUT,
            "RocketMQ namesrv",
            || port_is_open(namesrv_port),
        )?;

        std::fs::write(
            broker_dir.join("conf").join("broker.toml"),
            broker_toml(&broker_dir, namesrv_port, broker_port, ha_port, &options),
        )?;
        let mut this = Self {
            broker: None,
            namesrv,
            broker_bin,
            broker_dir,
            namesrv_port,
            broker_port,
            options,
        };
        this.start_broker()?;
        Ok(this)
    }

    /// `127.0.0.1:PORT` of the namesrv (what clients are configured with).
    pub fn namesrv_addr(&self) -> String {
        format!("127.0.0.1:{}", self.namesrv_port)
    }

    /// `127.0.0.1:PORT` of the broker's remoting listener.
    pub fn broker_addr(&self) -> String {
        format!("127.0.0.1:{}", self.broker_port)
    }

    /// The options this instance was started with.
    pub fn options(&self) -> &RocketMqOptions {
        &self.options
    }

    /// True while the broker process is running.
    pub fn broker_is_running(&mut self) -> bool {
        self.broker.as_mut().is_some_and(ServerProcess::is_running)
    }

    /// Stops the broker gracefully (`SIGTERM`, then `SIGKILL` after 15 s). The namesrv stays up.
    pub fn stop_broker(&mut self) {
        self.thaw_broker(); // a frozen process would ignore SIGTERM until the grace period ends
        if let Some(mut broker) = self.broker.take() {
            broker.stop(BROKER_STOP_GRACE);
        }
    }

    /// Kills the broker with `SIGKILL` (a crash). The namesrv stays up.
    pub fn kill_broker(&mut self) {
        if let Some(mut broker) = self.broker.take() {
            broker.kill();
        }
    }

    /// Freezes the broker with `SIGSTOP`: connections stay open but nothing is answered, so
    /// sends time out (the ambiguous "maybe stored" case). Undo with [`Self::thaw_broker`].
    pub fn freeze_broker(&mut self) {
        self.signal_broker(libc::SIGSTOP);
        // kill(2) returns before every thread has stopped: a request sent at once could still
        // be answered (seen in CI once the broker answered in ~0.2 ms). Wait until each thread
        // shows state T (stopped), at most 5 s.
        if let Some(pid) = self.broker.as_ref().and_then(ServerProcess::pid) {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !all_threads_stopped(pid) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Resumes a broker frozen by [`Self::freeze_broker`] (`SIGCONT`).
    pub fn thaw_broker(&mut self) {
        self.signal_broker(libc::SIGCONT);
    }

    fn signal_broker(&mut self, signal: libc::c_int) {
        if let Some(pid) = self.broker.as_ref().and_then(ServerProcess::pid) {
            // SAFETY: kill(2) on the pid of a child we own and have not reaped.
            unsafe {
                libc::kill(pid as libc::pid_t, signal);
            }
        }
    }

    /// (Re)starts the broker with the same ports, config and store; returns once a probe send
    /// through the namesrv succeeds. Does nothing if the broker is already running.
    pub fn start_broker(&mut self) -> io::Result<()> {
        if self.broker_is_running() {
            return Ok(());
        }
        let mut command = Command::new(&self.broker_bin);
        command
            .arg("-c")
            .arg(self.broker_dir.join("conf").join("broker.toml"))
            .arg("-n")
            .arg(self.namesrv_addr());
        isolate_env(&mut command, &self.broker_dir);
        let log = self
            .broker_dir
            .parent()
            .unwrap_or(&self.broker_dir)
            .join("broker.log");
        let mut broker = ServerProcess::start("rocketmq broker", command, &log)?;
        wait_for_probe_send(&mut broker, &self.namesrv_addr())?;
        self.broker = Some(broker);
        Ok(())
    }

    /// Creates (or updates) `topic` with `queues` read and write queues on the broker, and waits
    /// until the namesrv route shows exactly that many queues. Works whether or not the broker
    /// auto-creates topics.
    pub fn create_topic(&self, topic: &str, queues: u32) -> io::Result<()> {
        let host = ClientHost::new("devenv-admin")?;
        let (runtime, namesrv, topic) = (
            host.client_runtime(),
            self.namesrv_addr(),
            topic.to_string(),
        );
        host.block_on(async move {
            let mut producer = start_admin_producer(runtime, &namesrv).await?;
            let result = create_topic_and_wait(&mut producer, &topic, queues).await;
            producer.shutdown().await;
            result
        })?
    }
}

impl Drop for RocketMq {
    fn drop(&mut self) {
        self.stop_broker();
        self.namesrv.stop(Duration::from_secs(10));
    }
}

/// Free ports for the namesrv, the broker (with `listenPort - 2` free too) and HA, all distinct.
fn pick_ports() -> io::Result<(u16, u16, u16)> {
    for _ in 0..20 {
        let namesrv = free_port()?;
        let broker = free_port_with_room_below(2)?;
        let ha = free_port()?;
        let broker_range = broker - 2..=broker;
        if !broker_range.contains(&namesrv) && !broker_range.contains(&ha) && namesrv != ha {
            return Ok((namesrv, broker, ha));
        }
    }
    Err(io::Error::other(
        "could not find distinct free loopback ports for RocketMQ",
    ))
}

/// Points every home-relative default of the servers (`~/rocketmq-namesrv`, `~/store`, logs) at
/// `dir`, so an instance never reads or writes anything outside its own directory.
fn isolate_env(command: &mut Command, dir: &Path) {
    command
        .env("HOME", dir)
        .env("ROCKETMQ_HOME", dir)
        .env_remove("NAMESRV_ADDR")
        .env(
            "RUST_LOG",
            std::env::var("OUTBOX_DEVENV_ROCKETMQ_LOG").unwrap_or_else(|_| "warn".into()),
        );
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

/// The broker's TOML config: loopback only, small commit-log and index files (the defaults are a
/// 1 GiB commit log and a ~400 MiB index file), no preallocation.
fn broker_toml(
    dir: &Path,
    namesrv_port: u16,
    broker_port: u16,
    ha_port: u16,
    options: &RocketMqOptions,
) -> String {
    let store = dir.join("store");
    let store = store.display();
    let mut toml = String::new();
    let _ = write!(
        toml,
        r#"[broker]
namesrvAddr = "127.0.0.1:{namesrv_port}"
brokerIp1 = "127.0.0.1"
listenPort = {broker_port}
storePathRootDir = "{store}"
autoCreateTopicEnable = {auto_create}
autoCreateSubscriptionGroup = true

[broker.brokerServerConfig]
bindAddress = "127.0.0.1"

[broker.brokerIdentity]
brokerName = "{BROKER_NAME}"
brokerClusterName = "{CLUSTER_NAME}"
brokerId = 0

[store]
storeType = "LocalFile"
brokerRole = "ASYNC_MASTER"
storePathRootDir = "{store}"
haListenAddress = "127.0.0.1"
haListenPort = {ha_port}
mappedFileSizeCommitLog = 67108864
maxHashSlotNum = 50000
maxIndexNum = 200000
linuxFilePreallocateEnable = false
# The commit log waits up to this long for more appends to batch with each one; Tokio's timer
# rounds any non-zero wait up to the next millisecond, so the default 50 µs costs every send
# about 1 ms (and concurrent sends queue behind each other's waits). Appends already queued
# are still batched without waiting.
commitLogMicroBatchMaxWaitMicros = 0
# A development broker on a busy disk (a build machine's) must still accept messages: the stock
# limit (75 % used) refuses writes, and the broker then fails its start-up probe. The broker
# requires max used < clean forcibly < warning level.
diskMaxUsedSpaceRatio = 93
diskSpaceCleanForciblyRatio = 96
diskSpaceWarningLevelRatio = 98
"#,
        auto_create = options.auto_create_topics,
    );
    toml
}

/// Waits until a probe message sent through the namesrv comes back `SEND_OK`, failing early if
/// the broker process exits. The probe first creates its one-queue topic (so it also works with
/// `autoCreateTopicEnable = false`), then sends.
fn wait_for_probe_send(broker: &mut ServerProcess, namesrv: &str) -> io::Result<()> {
    let host = ClientHost::new("devenv-probe")?;
    let stop = Arc::new(AtomicBool::new(false));
    let last_failure = Arc::new(std::sync::Mutex::new(String::from(
        "no attempt finished yet",
    )));
    let (done_tx, done_rx) = mpsc::channel();
    host.spawn({
        let (runtime, namesrv) = (host.client_runtime(), namesrv.to_string());
        let (stop, last_failure) = (Arc::clone(&stop), Arc::clone(&last_failure));
        async move {
            let result = probe_until_send_ok(runtime, &namesrv, &stop, &last_failure).await;
            let _ = done_tx.send(result);
        }
    });
    let mut probe_error = None;
    let waited = wait_until_ready(
        broker,
        BROKER_START_TIMEOUT,
        "RocketMQ broker",
        || match done_rx.try_recv() {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                probe_error = Some(e);
                true
            }
            Err(_) => false,
        },
    );
    stop.store(true, Ordering::Release);
    if let Some(e) = probe_error {
        return Err(e);
    }
    waited.map_err(|e| {
        let last = last_failure.lock().map(|s| s.clone()).unwrap_or_default();
        io::Error::new(e.kind(), format!("{e}\nlast probe failure: {last}"))
    })
}

async fn probe_until_send_ok(
    runtime: Arc<ClientRuntime>,
    namesrv: &str,
    stop: &AtomicBool,
    last_failure: &std::sync::Mutex<String>,
) -> io::Result<()> {
    let mut producer = start_admin_producer(runtime, namesrv).await?;
    let mut topic_created = false;
    let result = loop {
        if stop.load(Ordering::Acquire) {
            break Err(io::Error::other("readiness probe abandoned"));
        }
        let failure = if !topic_created {
            let created = producer
                .create_topic(BROKER_NAME, PROBE_TOPIC, 1, HashMap::new())
                .await;
            match created {
                Ok(()) => {
                    topic_created = true;
                    continue;
                }
                Err(e) => format!("create probe topic: {e}"),
            }
        } else {
            let probe = Message::builder()
                .topic(PROBE_TOPIC)
                .body_slice(b"probe")
                .build_unchecked();
            match producer.send_with_timeout(probe, 2_000).await {
                Ok(Some(sent)) if sent.send_status == SendStatus::SendOk => break Ok(()),
                Ok(other) => format!("probe send returned {other:?}"),
                Err(e) => format!("probe send: {e}"),
            }
        };
        if let Ok(mut last) = last_failure.lock() {
            *last = failure;
        }
        // Poll interval of the readiness check: the broker has no push-style "ready" signal.
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    producer.shutdown().await;
    result
}

/// A started producer used for administration and probes (short timeouts, no retries).
async fn start_admin_producer(
    runtime: Arc<ClientRuntime>,
    namesrv: &str,
) -> io::Result<DefaultMQProducer> {
    let mut producer = DefaultMQProducer::builder(runtime)
        .producer_group("outbox_relay_devenv_admin")
        .name_server_addr(namesrv)
        .send_msg_timeout(2_000)
        .retry_times_when_send_failed(0)
        .build();
    producer
        .start()
        .await
        .map_err(|e| io::Error::other(format!("cannot start the RocketMQ admin producer: {e}")))?;
    Ok(producer)
}

/// `UPDATE_AND_CREATE_TOPIC` on every master that serves [`BROKER_NAME`], then polls the namesrv
/// route until it lists `queues` queues (the broker re-registers its topics after the change).
async fn create_topic_and_wait(
    producer: &mut DefaultMQProducer,
    topic: &str,
    queues: u32,
) -> io::Result<()> {
    let queue_count =
        i32::try_from(queues).map_err(|_| io::Error::other("queue count too large"))?;
    producer
        .create_topic(BROKER_NAME, topic, queue_count, HashMap::new())
        .await
        .map_err(|e| io::Error::other(format!("cannot create topic {topic}: {e}")))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = match producer.fetch_publish_message_queues(topic).await {
            Ok(found) if found.len() == queues as usize => return Ok(()),
            Ok(found) => format!("{} queues", found.len()),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("topic {topic} was created but its route never showed {queues} queues (last: {seen})"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
