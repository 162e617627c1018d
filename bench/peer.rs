//! What the peers (Debezium Server, Canal) share: where an instance reads from and writes to,
//! and its process.

use outbox_devenv::cache_dir;
use outbox_devenv::process::ServerProcess;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Where one peer instance reads from and writes to.
pub struct PeerTarget<'a> {
    pub database_kind: outbox_devenv::DatabaseKind,
    pub database_port: u16,
    pub database: &'a str,
    /// The topic of the run (Debezium routes by the row's `topic` column instead).
    pub topic: &'a str,
    pub namesrv: &'a str,
    /// The replication client id (Debezium's `database.server.id`, Canal's `slaveId`), unique
    /// per instance.
    pub server_id: u32,
}

/// A running peer: a [`ServerProcess`] (dies with the bench, stopped if dropped).
pub struct PeerChild {
    process: ServerProcess,
}

impl PeerChild {
    pub fn start(name: &str, command: Command, log: &Path) -> Self {
        PeerChild {
            process: ServerProcess::start(name, command, log).unwrap(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.pid().expect("the peer is running")
    }

    pub fn log_path(&self) -> PathBuf {
        self.process.log_path().to_path_buf()
    }

    /// Fails the bench with the log's tail if the process has exited (Debezium ends a failed
    /// send with exit code 0).
    pub fn check_alive(&mut self) {
        if let Err(e) = self.process.check_alive() {
            panic!("{e}");
        }
    }

    /// SIGTERM (Debezium commits its offsets and closes the sink; Canal's shutdown hook stops
    /// the instance and writes its position, `meta.dat`), up to 60 s, then SIGKILL: a peer
    /// killed before its position is written skips the next backlog, which the drain's
    /// progress check then reports.
    pub fn stop(mut self) {
        self.process.stop(Duration::from_secs(60));
    }
}

/// The first line of `java -version` of `java`, for the report.
pub fn java_version(java: &Path) -> String {
    Command::new(java)
        .arg("-version")
        .stderr(Stdio::piped())
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown Java".into())
}

/// Runs `mvn -q -B <args>` with the bench's own local repository (`<cache>/m2`); fails the bench
/// with `what` ("fetch Debezium Server", "build Canal") if Maven is missing or fails.
pub fn mvn(what: &str, args: &[String]) {
    let status = Command::new("mvn")
        .args(["-q", "-B"])
        .args(args)
        .arg(format!(
            "-Dmaven.repo.local={}",
            cache_dir().join("m2").display()
        ))
        .status()
        .unwrap_or_else(|e| panic!("run mvn (Maven) to {what}: {e}; install Maven and a JDK"));
    assert!(status.success(), "mvn could not {what}");
}
