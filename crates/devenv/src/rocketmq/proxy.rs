//! The Apache RocketMQ 5.x proxy (`ProxyStartup -pm cluster`) in front of a cluster the harness
//! started: what RocketMQ 5 deployments, and every cloud RocketMQ 5 instance, expose to clients.
//! Its Remoting port answers route look-ups (naming itself as every topic's broker) and takes
//! sends and pulls, so a Remoting client — the relay, the consumer library, `mqadmin` — is
//! pointed at it in place of the name server. Its gRPC port serves the official 5.x clients.
//!
//! Unlike a broker, the proxy checks each message against its topic's type (`message.type`:
//! NORMAL, FIFO, DELAY, TRANSACTION, MIXED; `enableTopicMessageTypeCheck`, on by default).
//!
//! Guarantees: [`Proxy::start`] returns only once a route look-up through the proxy's Remoting
//! port answered with the cluster's queues; the proxy is killed when its handle drops, and dies
//! with this process (see [`crate::process`]). Apache only; not with ACL or TLS.

use super::{apache, probe, RocketMq, BROKER_NAME, CLUSTER_NAME};
use crate::process::{free_port, port_is_open, wait_until_ready, ServerProcess};
use std::io;
use std::time::Duration;

/// A JVM that starts a Netty server, a gRPC server and clients of every broker: slower than a
/// broker on a loaded 2-core machine.
const PROXY_START_TIMEOUT: Duration = Duration::from_secs(120);

/// A running proxy (see the module docs).
#[derive(Debug)]
pub struct Proxy {
    /// Killed when the handle drops.
    _process: ServerProcess,
    remoting_port: u16,
    grpc_port: u16,
}

impl Proxy {
    /// Starts a proxy in cluster mode for `cluster` (its directory under the cluster's root)
    /// and waits until routes are looked up through it.
    pub fn start(cluster: &RocketMq) -> io::Result<Self> {
        if cluster.kind() != super::BrokerKind::Apache {
            return Err(io::Error::other(
                "the RocketMQ 5 proxy runs in front of Apache brokers only",
            ));
        }
        if cluster.options().acl.is_some() || cluster.options().tls {
            return Err(io::Error::other(
                "the harness's proxy is not set up for ACL or TLS",
            ));
        }
        let dir = cluster.root.join("proxy");
        std::fs::create_dir_all(&dir)?;
        let (remoting_port, grpc_port) = (free_port()?, free_port()?);
        let conf = dir.join("rmq-proxy.json");
        let settings = serde_json::json!({
            "rocketMQClusterName": CLUSTER_NAME,
            "namesrvAddr": cluster.namesrv_addr(),
            "remotingListenPort": remoting_port,
            "grpcServerPort": grpc_port,
        });
        std::fs::write(&conf, settings.to_string())?;
        let command = apache::proxy_command(&dir, &conf)?;
        let mut process = ServerProcess::start("rocketmq proxy", command, &dir.join("proxy.out"))?;
        let addr = format!("127.0.0.1:{remoting_port}");
        let probe = probe::Probe::new(&addr, cluster.client_security())?;
        let mut last = String::from("its Remoting port is not open yet");
        let waited = wait_until_ready(&mut process, PROXY_START_TIMEOUT, "RocketMQ proxy", || {
            if !port_is_open(remoting_port) {
                std::thread::sleep(Duration::from_millis(200));
                return false;
            }
            match probe.route_answers(&probe::probe_topic(BROKER_NAME)) {
                Ok(()) => true,
                Err(e) => {
                    last = e;
                    std::thread::sleep(Duration::from_millis(200));
                    false
                }
            }
        });
        waited.map_err(|e| io::Error::new(e.kind(), format!("{e}\nlast probe failure: {last}")))?;
        Ok(Proxy {
            _process: process,
            remoting_port,
            grpc_port,
        })
    }

    /// `127.0.0.1:PORT` of its Remoting endpoint: what a Remoting client is given as its name
    /// server address (`rocketmq.namesrv_addr`).
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.remoting_port)
    }

    /// `127.0.0.1:PORT` of its gRPC endpoint (the official 5.x clients' `endpoints`).
    pub fn grpc_addr(&self) -> String {
        format!("127.0.0.1:{}", self.grpc_port)
    }
}
