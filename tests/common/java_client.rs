//! The official RocketMQ 5 Java client (`rocketmq-client-java`, gRPC through the proxy) as a test
//! consumer: `tests/java/FifoConsumer.java`, run by the JDK's single-file source launcher on the
//! jars `scripts/setup.sh` fetches into `<cache>/rocketmq-client-java/lib`.

use outbox_devenv::cache_dir;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// One delivery as the Java consumer's listener got it.
#[derive(Debug, Clone)]
pub struct JavaDelivery {
    /// When the listener got it (Unix ms, this machine's clock).
    pub at_ms: u64,
    pub event_id: String,
    pub biz_key: String,
    pub message_group: Option<String>,
    pub msg_id: String,
    /// A scheduled message's delivery time (Unix ms).
    pub delivery_ms: Option<u64>,
}

/// A running Java push consumer; see the module documentation.
pub struct JavaConsumer {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    _home: tempfile::TempDir,
}

fn lib_dir() -> PathBuf {
    let dir = cache_dir().join("rocketmq-client-java").join("lib");
    assert!(
        dir.join("rocketmq-client-java-5.0.8.jar").is_file(),
        "the RocketMQ 5 Java client is not in {} (run scripts/setup.sh)",
        dir.display()
    );
    dir
}

impl JavaConsumer {
    /// Subscribes `group` to `topic` through the proxy's gRPC `endpoint`; returns once the
    /// consumer has started. It ends after `count` deliveries or `timeout`.
    pub async fn start(
        endpoint: &str,
        topic: &str,
        group: &str,
        count: usize,
        timeout: Duration,
    ) -> Self {
        let java = std::env::var_os("JAVA_HOME")
            .map(|home| PathBuf::from(home).join("bin").join("java"))
            .unwrap_or_else(|| PathBuf::from("java"));
        let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/java/FifoConsumer.java");
        // The client logs under ${user.home}/logs/rocketmq: a directory of this consumer's.
        let home = tempfile::tempdir().expect("home");
        let mut child = Command::new(java)
            .arg(format!("-Duser.home={}", home.path().display()))
            .args([
                "-Xmx192m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-cp",
            ])
            .arg(format!("{}/*", lib_dir().display()))
            .arg(source)
            .args([
                endpoint,
                topic,
                group,
                &count.to_string(),
                &timeout.as_secs().to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start java (scripts/setup.sh installs a JDK)");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = tokio::time::timeout(Duration::from_secs(90), lines.next_line()).await;
        match first {
            Ok(Ok(Some(line))) if line == "started" => {}
            other => panic!("the Java consumer did not start: {other:?}"),
        }
        JavaConsumer {
            child,
            lines,
            _home: home,
        }
    }

    /// Every delivery until the consumer ends (its `count` reached or its timeout).
    pub async fn deliveries(mut self) -> Vec<JavaDelivery> {
        let mut deliveries = Vec::new();
        while let Ok(Some(line)) = self.lines.next_line().await {
            let fields: Vec<&str> = line.split('\t').collect();
            match fields[..] {
                ["received", at, event_id, biz_key, group, msg_id, delivery] => {
                    let optional = |v: &str| (v != "-").then(|| v.to_string());
                    deliveries.push(JavaDelivery {
                        at_ms: at.parse().expect("ms"),
                        event_id: event_id.into(),
                        biz_key: biz_key.into(),
                        message_group: optional(group),
                        msg_id: msg_id.into(),
                        delivery_ms: optional(delivery).map(|v| v.parse().expect("ms")),
                    });
                }
                _ if line.starts_with("done ") => break,
                _ => panic!("unexpected line from the Java consumer: {line}"),
            }
        }
        let _ = self.child.wait().await;
        deliveries
    }
}
