//! Looking a topic's route up: its queue list, and what a client error of a send or look-up
//! means.

use super::message_type::Facts;
use super::queues::{Groups, TopicQueues};
use super::topics::{Missing, NameServerView, AUTO_CREATE_TOPIC};
use super::{is_missing_topic, RocketMqSink, SendError};
use crate::config::TopicType;
use rocketmq_client_rust::{ClientError, RouteAdmin, TopicAdmin};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a topic's queue list is trusted before it is fetched again: how soon a topic made
/// read-only (which Apache RocketMQ 5.3 enforces through the route only: its broker goes on
/// storing sends to it) or a changed queue count is followed. One name-server request per topic
/// per period.
const ROUTE_TTL: Duration = Duration::from_secs(10);
/// The same while a broker group of the topic is unavailable.
const LOST_GROUP_TTL: Duration = Duration::from_secs(1);

/// Where a topic's messages go.
pub(super) enum Route {
    /// Its queue list.
    Queues(Arc<TopicQueues>),
    /// No route yet, but the cluster creates it on its first message: sent through the
    /// default topic's route, [`AUTO_CREATED_QUEUES`](super::AUTO_CREATED_QUEUES) queues.
    AutoCreate,
}

impl RocketMqSink {
    /// Where `topic`'s messages go now: its queue list (see [`queues`](super::queues)),
    /// cached for [`ROUTE_TTL`], or for a second while a group of it is unavailable, so its
    /// return is noticed at the next retry.
    pub(super) async fn route(&self, topic: &str) -> Result<Route, SendError> {
        if let Some((queues, at)) = self.routes.lock().expect("not poisoned").get(topic) {
            let ttl = if queues.lost.is_empty() {
                ROUTE_TTL
            } else {
                LOST_GROUP_TTL
            };
            if at.elapsed() < ttl {
                return Ok(Route::Queues(Arc::clone(queues)));
            }
        }
        let mut producer = self.producer();
        let owned = topic.to_string();
        let fetched = self
            .host
            .run(async move { producer.fetch_publish_message_queues(&owned).await })
            .await
            .map_err(|e| SendError::Retryable(e.to_string()))?;
        let live = match fetched {
            Ok(live) => live,
            Err(e) => {
                return match self.classify_route_error(topic, &e).await {
                    Missing::AutoCreate => Ok(Route::AutoCreate),
                    Missing::Rejected(e) | Missing::Retry(e) => Err(e),
                }
            }
        };
        if live.is_empty() {
            return Err(SendError::Rejected(format!(
                "topic {topic} has no writable queue"
            )));
        }
        let remembered = self.recall_queues(topic).await;
        let missing = self.queue_book.missing(topic, &live);
        let left = self.groups_that_left(topic, missing).await;
        let queues = Arc::new(self.queue_book.update(topic, &live, &left, Instant::now()));
        self.save_queues(topic, remembered).await;
        self.routes
            .lock()
            .expect("not poisoned")
            .insert(topic.to_string(), (Arc::clone(&queues), Instant::now()));
        let groups: HashSet<String> = live.iter().map(|q| q.broker_name().to_string()).collect();
        self.memory.routed(topic, groups);
        if self.types.ask_cluster(topic) {
            // Not learnt if it could not be asked: asked again at the next route refresh.
            if let Some(facts) = self.ask_topic_type(topic).await {
                self.types.learn(topic, facts);
            }
        }
        Ok(Route::Queues(queues))
    }

    /// What the cluster says about `topic`'s type: whether the address the relay was given is a
    /// RocketMQ 5 proxy (it routes topics but, unlike a name server, lists no brokers), else the
    /// type its first master's topic config names. `None` if that cannot be asked (no route,
    /// no answer, a config that cannot be read).
    async fn ask_topic_type(&self, topic: &str) -> Option<Facts> {
        let mut admin = self.security().admin(self.host.client_runtime());
        admin.set_namesrv_addr(self.namesrv.as_str());
        let owned = topic.to_string();
        let asked = self
            .host
            .run(async move {
                admin.start().await?;
                let mut facts = Facts::default();
                let route = admin.examine_topic_route_info(owned.as_str().into()).await;
                let master = (route.ok().flatten().into_iter())
                    .flat_map(|route| route.broker_datas)
                    .find_map(|data| data.broker_addrs().get(&0).map(|a| a.to_string()));
                let brokers = admin.examine_broker_cluster_info().await;
                tracing::debug!(topic = %owned, ?master, brokers_listed = brokers.is_ok(),
                    "asking the cluster for the topic's type");
                let answered: Result<Facts, String> = match (master, brokers) {
                    (Some(_), Err(_)) => {
                        facts.behind_proxy = true;
                        Ok(facts)
                    }
                    (Some(addr), Ok(_)) => {
                        let config = admin.examine_topic_config(addr.into(), owned.into()).await;
                        config.map_err(|e| e.to_string()).map(|c| {
                            facts.of_cluster =
                                TopicType::from_broker(c.get_topic_message_type().as_str());
                            facts
                        })
                    }
                    (None, _) => Err("the topic's route names no master".to_string()),
                };
                admin.shutdown().await;
                Ok::<_, ClientError>(answered)
            })
            .await;
        let asked = (asked.map_err(|e| e.to_string()))
            .and_then(|answer| answer.map_err(|e| e.to_string()))
            .and_then(|answered| answered);
        asked
            .map_err(|e| tracing::debug!(%topic, error = %e,
                "cannot ask the cluster for the topic's type; asking again at the next route refresh"))
            .ok()
    }

    /// The groups of `topic` as known before this route look-up: read from the queue store the
    /// first time the topic is routed in this process.
    async fn recall_queues(&self, topic: &str) -> Groups {
        if let Some(store) = self
            .queue_store
            .as_ref()
            .filter(|_| !self.queue_book.knows(topic))
        {
            self.queue_book.recall(topic, store.load(topic).await);
        }
        self.queue_book.groups(topic)
    }

    /// Saves `topic`'s groups when they differ from `before` (a group seen for the first
    /// time, gone on purpose, or with a changed queue count).
    async fn save_queues(&self, topic: &str, before: Groups) {
        let Some(store) = self
            .queue_store
            .as_ref()
            .filter(|_| self.queue_book.stable())
        else {
            return;
        };
        let now = self.queue_book.groups(topic);
        if now != before {
            store.save(topic, &now).await;
        }
    }

    /// Those of `missing` (groups that served `topic` and are not in its route now) that are
    /// registered with their master: they left the topic on purpose. The others are
    /// unavailable, and so is every one of them while the name server cannot be asked.
    async fn groups_that_left(&self, topic: &str, missing: Vec<String>) -> HashSet<String> {
        if missing.is_empty() {
            return HashSet::new();
        }
        match self.name_server_view(topic).await {
            Ok(view) => missing
                .into_iter()
                .filter(|group| view.groups.contains(group))
                .collect(),
            Err(e) => {
                tracing::warn!(%topic, error = %e, ?missing,
                    "cannot ask the name server about the broker groups missing from {topic}'s \
                     route; taking them as unavailable");
                HashSet::new()
            }
        }
    }

    /// What a client error of a send or route look-up means; "no such topic" is decided by
    /// [`ClusterMemory::verdict`].
    pub(super) async fn classify_route_error(&self, topic: &str, error: &ClientError) -> Missing {
        let classified = self.classify(error);
        if let SendError::Unauthorized(_) = classified {
            self.reload_secret_file().await;
        }
        if !is_missing_topic(error) {
            return match classified {
                SendError::Rejected(_) => Missing::Rejected(classified),
                SendError::Retryable(_)
                | SendError::Unauthorized(_)
                | SendError::Misconfigured(_) => Missing::Retry(classified),
            };
        }
        // A topic routed before needs no name-server view (an admin client each time: a
        // stuck topic's lanes would start one per retry).
        if let Some(known) = self.memory.known(topic, classified.reason()) {
            return known;
        }
        let view = self.name_server_view(topic).await;
        self.memory.verdict(topic, classified.reason(), view)
    }

    /// The name server's registered broker groups, and whether it routes `topic` and the
    /// auto-create topic.
    async fn name_server_view(&self, topic: &str) -> Result<NameServerView, String> {
        let mut admin = self.security().admin(self.host.client_runtime());
        admin.set_namesrv_addr(self.namesrv.as_str());
        let topic = topic.to_string();
        let (info, route, auto) = self
            .host
            .run(async move {
                admin.start().await?;
                let info = admin.examine_broker_cluster_info().await;
                let route = admin.examine_topic_route_info(topic.into()).await;
                let auto = admin
                    .examine_topic_route_info(AUTO_CREATE_TOPIC.into())
                    .await;
                admin.shutdown().await;
                Ok::<_, ClientError>((info?, route, auto))
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let mut view = NameServerView::default();
        for (group, data) in info.broker_addr_table.unwrap_or_default() {
            if data.broker_addrs().contains_key(&0) {
                view.groups.insert(group.to_string());
            } else {
                view.groups_without_master += 1;
            }
        }
        view.routed = matches!(route, Ok(Some(r)) if !r.queue_datas.is_empty());
        view.auto_create = matches!(auto, Ok(Some(r)) if !r.queue_datas.is_empty());
        Ok(view)
    }
}
