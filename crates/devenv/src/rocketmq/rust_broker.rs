//! rocketmq-rust 1.0, the Rust reimplementation of the servers (`rocketmq-namesrv-rust`,
//! `rocketmq-broker-rust`, built by `scripts/setup.sh` from crates.io), kept as a second broker.
//!
//! Guarantee: as for the Java servers, each instance's `HOME`, `ROCKETMQ_HOME` and store are in
//! its own directory.

use super::{BrokerNode, RocketMqOptions, CLUSTER_NAME};
use crate::process::find_executable;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

fn executable(name: &str) -> io::Result<PathBuf> {
    let bin_dir = crate::cache_dir().join("rocketmq").join("bin");
    find_executable(name, "OUTBOX_DEVENV_ROCKETMQ_BIN", &[bin_dir])
}

/// Points every home-relative default of the servers at `dir`.
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

/// The name server on `127.0.0.1:port`.
pub fn namesrv_command(dir: &Path, port: u16) -> io::Result<Command> {
    let mut command = Command::new(executable("rocketmq-namesrv-rust")?);
    command
        .arg("--listenPort")
        .arg(port.to_string())
        .arg("--bindAddress")
        .arg("127.0.0.1")
        .arg("--rocketmqHome")
        .arg(dir)
        .arg("--kvConfigPath")
        .arg(dir.join("kvConfig.json"));
    isolate_env(&mut command, dir);
    Ok(command)
}

/// One broker, its TOML config written to its directory.
pub fn broker_command(
    node: &BrokerNode,
    namesrv: &str,
    options: &RocketMqOptions,
) -> io::Result<Command> {
    if options.acl.is_some() {
        return Err(io::Error::other(
            "the harness enables ACL only on the Apache broker",
        ));
    }
    let conf = node.dir.join("broker.toml");
    std::fs::write(&conf, broker_toml(node, namesrv, options))?;
    let mut command = Command::new(executable("rocketmq-broker-rust")?);
    command.arg("-c").arg(conf).arg("-n").arg(namesrv);
    isolate_env(&mut command, &node.dir);
    Ok(command)
}

/// The broker's TOML config: loopback only, small commit-log and index files (the defaults are a
/// 1 GiB commit log and a ~400 MiB index file), no preallocation.
fn broker_toml(node: &BrokerNode, namesrv: &str, options: &RocketMqOptions) -> String {
    let store = node.dir.join("store");
    let store = store.display();
    format!(
        r#"[broker]
namesrvAddr = "{namesrv}"
brokerIp1 = "127.0.0.1"
listenPort = {port}
storePathRootDir = "{store}"
autoCreateTopicEnable = {auto_create}
autoCreateSubscriptionGroup = true

[broker.brokerServerConfig]
bindAddress = "127.0.0.1"

[broker.brokerIdentity]
brokerName = "{group}"
brokerClusterName = "{CLUSTER_NAME}"
brokerId = {id}

[store]
storeType = "LocalFile"
brokerRole = "{role}"
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
        group = node.group,
        id = node.id,
        role = node.role.apache_name(),
        port = node.port,
        ha_port = node.ha_port,
        auto_create = options.auto_create_topics,
    )
}
