//! The harness's own client: readiness probes and topic creation, through the real client
//! against the name server, so "ready" means what a producer will see.

use super::ClientHost;
use rocketmq_client_rust::{
    ClientRuntime, DefaultMQAdminExt, DefaultMQProducer, RouteAdmin, SendStatus, TopicAdmin,
};
use rocketmq_model::common::message::message_single::Message;
use rocketmq_model::topic::TopicConfig;
use rocketmq_outbox_consumer::rocketmq_client::ClientSecurity;
use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The one-queue topic of a group's readiness probe.
pub(super) fn probe_topic(group: &str) -> String {
    format!("outbox_relay_devenv_probe_{}", group.replace('-', "_"))
}

/// Group name → broker id → address, as the name server lists them now.
type ClusterView = HashMap<String, HashMap<u64, String>>;

/// A client runtime for probes and administration.
pub(super) struct Probe {
    host: ClientHost,
    namesrv: String,
    /// Signed as the cluster's ACL super user, if it has one; TLS if the cluster has it.
    acl: ClientSecurity,
}

impl Probe {
    pub(super) fn new(namesrv: &str, acl: ClientSecurity) -> io::Result<Self> {
        Ok(Self {
            host: ClientHost::new("devenv-probe")?,
            namesrv: namesrv.to_string(),
            acl,
        })
    }

    /// Ok once broker `id` of `group` is registered and, where a master runs and the group's
    /// slave (if any) runs too, a probe message sent through the route came back `SEND_OK`. A
    /// `SYNC_MASTER` without its slave refuses sends, so registering is all it can show. The
    /// error says what is still missing.
    pub(super) fn group_usable(
        &self,
        group: &str,
        id: u32,
        master_running: bool,
        slave_running: bool,
    ) -> Result<(), String> {
        let (runtime, namesrv, acl) = (self.runtime(), self.namesrv.clone(), self.acl.clone());
        let group = group.to_string();
        let attempt = async move {
            let view = cluster_view(&runtime, &namesrv, &acl).await?;
            let addrs = view.get(&group);
            if addrs.is_none_or(|a| !a.contains_key(&u64::from(id))) {
                return Err(format!(
                    "{group}-{id} is not registered with the name server yet"
                ));
            }
            if !master_running || !slave_running {
                return Ok(());
            }
            let Some(master) = addrs.and_then(|a| a.get(&0)) else {
                return Err(format!("{group}'s master is not registered yet"));
            };
            send_probe(&runtime, &namesrv, &acl, master, &group).await
        };
        self.block_on_for(Duration::from_secs(10), attempt)
    }

    /// Controller mode: Ok once the broker at `addr` is registered in `group`, the group has an
    /// elected master (id 0), `members` brokers are registered (those running), and a probe
    /// message sent through the route came back `SEND_OK`.
    pub(super) fn elected_group_usable(
        &self,
        group: &str,
        addr: &str,
        members: usize,
    ) -> Result<(), String> {
        let (runtime, namesrv, acl) = (self.runtime(), self.namesrv.clone(), self.acl.clone());
        let (group, addr) = (group.to_string(), addr.to_string());
        let attempt = async move {
            let view = cluster_view(&runtime, &namesrv, &acl).await?;
            let addrs = view.get(&group).cloned().unwrap_or_default();
            if !addrs.values().any(|a| *a == addr) {
                return Err(format!("{addr} is not registered in {group} yet"));
            }
            let Some(master) = addrs.get(&0) else {
                return Err(format!("{group} has no elected master yet: {addrs:?}"));
            };
            if addrs.len() < members {
                return Err(format!("{group}: {} of {members} registered", addrs.len()));
            }
            send_probe(&runtime, &namesrv, &acl, master, &group).await
        };
        self.block_on_for(Duration::from_secs(10), attempt)
    }

    /// The address the name server lists as `group`'s master (id 0), if any.
    pub(super) fn master_addr(&self, group: &str) -> Result<Option<String>, String> {
        let (runtime, namesrv, acl) = (self.runtime(), self.namesrv.clone(), self.acl.clone());
        let group = group.to_string();
        let attempt = async move {
            let view = cluster_view(&runtime, &namesrv, &acl).await?;
            Ok(view.get(&group).and_then(|addrs| addrs.get(&0)).cloned())
        };
        self.block_on_for(Duration::from_secs(10), attempt)
    }

    /// `topic` with `queues` queues on every registered master; returns once the route shows
    /// `queues` × masters queues.
    pub(super) fn create_topic(&self, topic: &str, queues: u32) -> io::Result<()> {
        let (runtime, namesrv, acl) = (self.runtime(), self.namesrv.clone(), self.acl.clone());
        let topic = topic.to_string();
        let work = async move {
            let view = cluster_view(&runtime, &namesrv, &acl).await?;
            let masters: Vec<&String> = view.values().filter_map(|ids| ids.get(&0)).collect();
            if masters.is_empty() {
                return Err("no master is registered with the name server".to_string());
            }
            for master in &masters {
                create_on(&runtime, &namesrv, &acl, master, &topic, queues).await?;
            }
            let expected = queues as usize * masters.len();
            let mut producer = admin_producer(&runtime, &namesrv, &acl).await?;
            let deadline = Instant::now() + Duration::from_secs(30);
            let result = loop {
                let seen = match producer.fetch_publish_message_queues(&topic).await {
                    Ok(found) if found.len() == expected => break Ok(()),
                    Ok(found) => format!("{} queues", found.len()),
                    Err(e) => e.to_string(),
                };
                if Instant::now() >= deadline {
                    break Err(format!(
                        "topic {topic} was created but its route never showed {expected} queues \
                         (last: {seen})"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            let mut shutdown = producer;
            shutdown.shutdown().await;
            result
        };
        self.block_on_for(Duration::from_secs(60), work)
            .map_err(io::Error::other)
    }

    /// Waits until every slave the name server lists holds `topic`'s config. A slave copies its
    /// master's topics every 10 s; promoted (controller mode) before it did, it refuses the topic
    /// for good (code 17, "topic not exist"): seen beside the suite, where the JVMs starve.
    pub(super) fn slaves_hold(&self, topic: &str) -> io::Result<()> {
        let (runtime, namesrv, acl) = (self.runtime(), self.namesrv.clone(), self.acl.clone());
        let topic = topic.to_string();
        let work = async move {
            let view = cluster_view(&runtime, &namesrv, &acl).await?;
            let slaves: Vec<String> = (view.values())
                .flat_map(|ids| ids.iter().filter(|(id, _)| **id != 0))
                .map(|(_, addr)| addr.clone())
                .collect();
            let mut admin = admin(&runtime, &namesrv, &acl).await?;
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut missing = slaves;
            let result = loop {
                let mut still = Vec::new();
                for slave in missing {
                    let held = (admin
                        .examine_topic_config(slave.as_str().into(), topic.as_str().into()))
                    .await;
                    if held.is_err() {
                        still.push(slave);
                    }
                }
                missing = still;
                if missing.is_empty() {
                    break Ok(());
                }
                if Instant::now() >= deadline {
                    break Err(format!("the slaves {missing:?} never copied topic {topic}"));
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            };
            admin.shutdown().await;
            result
        };
        self.block_on_for(Duration::from_secs(90), work)
            .map_err(io::Error::other)
    }

    /// Ok once a route look-up of `topic` answers with at least one writable queue: a proxy
    /// given as the name server is serving routes.
    pub(super) fn route_answers(&self, topic: &str) -> Result<(), String> {
        let (runtime, namesrv, acl) = (self.runtime(), self.namesrv.clone(), self.acl.clone());
        let topic = topic.to_string();
        let attempt = async move {
            let mut producer = admin_producer(&runtime, &namesrv, &acl).await?;
            let found = producer.fetch_publish_message_queues(&topic).await;
            producer.shutdown().await;
            match found {
                Ok(queues) if !queues.is_empty() => Ok(()),
                Ok(_) => Err(format!("the route of {topic} has no writable queue")),
                Err(e) => Err(format!("route of {topic}: {e}")),
            }
        };
        self.block_on_for(Duration::from_secs(10), attempt)
    }

    fn runtime(&self) -> Arc<ClientRuntime> {
        self.host.client_runtime()
    }

    fn block_on_for<T: Send + 'static>(
        &self,
        limit: Duration,
        work: impl std::future::Future<Output = Result<T, String>> + Send + 'static,
    ) -> Result<T, String> {
        let bounded = async move {
            tokio::time::timeout(limit, work)
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {limit:?}")))
        };
        self.host.block_on(bounded).map_err(|e| e.to_string())?
    }
}

async fn admin(
    runtime: &Arc<ClientRuntime>,
    namesrv: &str,
    acl: &ClientSecurity,
) -> Result<DefaultMQAdminExt, String> {
    let mut admin = acl.admin(Arc::clone(runtime));
    admin.set_namesrv_addr(namesrv);
    admin
        .start()
        .await
        .map_err(|e| format!("admin client: {e}"))?;
    Ok(admin)
}

async fn cluster_view(
    runtime: &Arc<ClientRuntime>,
    namesrv: &str,
    acl: &ClientSecurity,
) -> Result<ClusterView, String> {
    let mut admin = admin(runtime, namesrv, acl).await?;
    let info = admin.examine_broker_cluster_info().await;
    admin.shutdown().await;
    let info = info.map_err(|e| format!("cluster info: {e}"))?;
    Ok(info
        .broker_addr_table
        .unwrap_or_default()
        .into_iter()
        .map(|(name, data)| {
            let addrs = data
                .broker_addrs()
                .iter()
                .map(|(id, addr)| (*id, addr.to_string()))
                .collect();
            (name.to_string(), addrs)
        })
        .collect())
}

/// Ok if a probe message to `group`'s probe topic (created on its master at `master`) is
/// `SEND_OK`.
async fn send_probe(
    runtime: &Arc<ClientRuntime>,
    namesrv: &str,
    acl: &ClientSecurity,
    master: &str,
    group: &str,
) -> Result<(), String> {
    let topic = probe_topic(group);
    create_on(runtime, namesrv, acl, master, &topic, 1).await?;
    let producer = admin_producer(runtime, namesrv, acl).await?;
    let probe = Message::builder()
        .topic(topic.as_str())
        .body_slice(b"probe")
        .build_unchecked();
    let answer = producer.send_with_timeout(probe, 2_000).await;
    let mut shutdown = producer;
    shutdown.shutdown().await;
    match answer {
        Ok(Some(sent)) if sent.send_status == SendStatus::SendOk => Ok(()),
        Ok(other) => Err(format!("probe send answered {other:?}")),
        Err(e) => Err(format!("probe send: {e}")),
    }
}

/// UPDATE_AND_CREATE_TOPIC on the broker at `addr`.
async fn create_on(
    runtime: &Arc<ClientRuntime>,
    namesrv: &str,
    acl: &ClientSecurity,
    addr: &str,
    topic: &str,
    queues: u32,
) -> Result<(), String> {
    let mut admin = admin(runtime, namesrv, acl).await?;
    let created = admin
        .create_and_update_topic_config(
            addr.into(),
            TopicConfig::with_queues(topic, queues, queues),
        )
        .await;
    admin.shutdown().await;
    created.map_err(|e| format!("create topic {topic} on {addr}: {e}"))
}

/// A started producer for probes (short timeouts, no retries).
async fn admin_producer(
    runtime: &Arc<ClientRuntime>,
    namesrv: &str,
    acl: &ClientSecurity,
) -> Result<DefaultMQProducer, String> {
    let mut producer = DefaultMQProducer::builder(Arc::clone(runtime))
        .client_config(acl.client_config())
        .producer_group("outbox_relay_devenv_admin")
        .name_server_addr(namesrv)
        .send_msg_timeout(2_000)
        .retry_times_when_send_failed(0)
        .build();
    acl.sign_producer(&mut producer);
    producer
        .start()
        .await
        .map_err(|e| format!("cannot start the RocketMQ admin producer: {e}"))?;
    Ok(producer)
}
