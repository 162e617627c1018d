//! What `/healthz` and `/readyz` report: this instance's role, whether its last contact with
//! MySQL and with the broker worked, whether the broker refuses the relay's account for a topic,
//! and whether the checkpointer can save the checkpoint.

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// This instance's part in the deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Starting,
    /// Waiting for leadership (and sweeping).
    Standby,
    /// The leader: tailing the binlog.
    Streaming,
    /// Poll mode.
    Polling,
    Stopping,
}

/// The process's health, updated by the stages.
pub struct Health {
    role: AtomicU8,
    mysql_ok: AtomicBool,
    broker_ok: AtomicBool,
    /// Topics whose last send the cluster refused for the relay's configuration (its account,
    /// or the topic's type), with the reason, until one of their sends gets `SEND_OK`.
    refused: Mutex<BTreeMap<String, String>>,
    /// `refused.len()`, so that a `SEND_OK` takes no lock while nothing is refused.
    refused_count: AtomicUsize,
    /// False from a failed checkpoint save until a save succeeds again.
    checkpoint_ok: AtomicBool,
}

/// The body of `/readyz`.
#[derive(Debug, Clone, Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub role: Role,
    pub mysql: bool,
    pub broker: bool,
    /// False while the cluster refuses a topic's events for the relay's configuration: its
    /// credentials or permissions, or a topic type it cannot send.
    pub broker_auth: bool,
    /// Those topics.
    pub refused_topics: Vec<String>,
    /// Each of them with the cluster's reason and what to change.
    pub refusals: BTreeMap<String, String>,
    /// False while the checkpointer cannot save the checkpoint (disk full, unwritable
    /// `relay.checkpoint_dir`): the stream goes on, but its progress is not durable.
    pub checkpoint: bool,
}

const ROLES: [Role; 5] = [
    Role::Starting,
    Role::Standby,
    Role::Streaming,
    Role::Polling,
    Role::Stopping,
];

impl Health {
    pub fn set_role(&self, role: Role) {
        let index = ROLES.iter().position(|r| *r == role).unwrap_or(0);
        self.role.store(index as u8, Ordering::Relaxed);
    }

    pub fn role(&self) -> Role {
        ROLES[usize::from(self.role.load(Ordering::Relaxed)).min(ROLES.len() - 1)]
    }

    /// The last query to MySQL worked (or not).
    pub fn set_mysql(&self, ok: bool) {
        self.mysql_ok.store(ok, Ordering::Relaxed);
    }

    /// The last send got `SEND_OK` (true) or a retryable error (false).
    pub fn set_broker(&self, ok: bool) {
        self.broker_ok.store(ok, Ordering::Relaxed);
    }

    /// A send to `topic` was refused for the relay's configuration (`Some(reason)`), or got
    /// `SEND_OK` (`None`, which ends a refusal of that topic).
    pub fn set_refused(&self, topic: &str, reason: Option<&str>) {
        if reason.is_none() && self.refused_count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut refused = self.refused.lock().expect("not poisoned");
        match reason {
            None => {
                refused.remove(topic);
            }
            Some(reason) => {
                refused.insert(topic.to_string(), reason.to_string());
            }
        }
        self.refused_count.store(refused.len(), Ordering::Relaxed);
    }

    /// The last checkpoint save worked (true) or failed (false).
    pub fn set_checkpoint(&self, ok: bool) {
        self.checkpoint_ok.store(ok, Ordering::Relaxed);
    }

    /// Ready: streaming, standing by or polling, with MySQL and the broker reachable, no topic
    /// refused for the relay's account, and the checkpoint saved.
    pub fn readiness(&self) -> Readiness {
        let role = self.role();
        let mysql = self.mysql_ok.load(Ordering::Relaxed);
        let broker = self.broker_ok.load(Ordering::Relaxed);
        let refusals = self.refused.lock().expect("not poisoned").clone();
        let refused_topics: Vec<String> = refusals.keys().cloned().collect();
        let broker_auth = refused_topics.is_empty();
        let checkpoint = self.checkpoint_ok.load(Ordering::Relaxed);
        let serving = matches!(role, Role::Standby | Role::Streaming | Role::Polling);
        Readiness {
            ready: serving && mysql && broker && broker_auth && checkpoint,
            role,
            mysql,
            broker,
            broker_auth,
            refused_topics,
            refusals,
            checkpoint,
        }
    }

    /// A process's health (the relay's is [`health()`]; tests make their own).
    pub(crate) fn new(mysql_ok: bool) -> Self {
        Health {
            role: AtomicU8::new(0),
            mysql_ok: AtomicBool::new(mysql_ok),
            broker_ok: AtomicBool::new(true),
            refused: Mutex::new(BTreeMap::new()),
            refused_count: AtomicUsize::new(0),
            checkpoint_ok: AtomicBool::new(true),
        }
    }
}

/// The process's health.
pub fn health() -> &'static Health {
    static HEALTH: OnceLock<Health> = OnceLock::new();
    HEALTH.get_or_init(|| Health::new(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_serving_with_both_servers_reachable() {
        let health = Health::new(true);
        assert!(!health.readiness().ready, "starting");
        health.set_role(Role::Standby);
        assert!(health.readiness().ready);
        health.set_broker(false);
        assert!(!health.readiness().ready);
        health.set_broker(true);
        health.set_role(Role::Streaming);
        assert_eq!(health.readiness().role, Role::Streaming);
        health.set_mysql(false);
        assert!(!health.readiness().ready);
    }

    #[test]
    fn a_refused_topic_keeps_it_unready_until_a_send_to_that_topic_is_accepted() {
        let health = Health::new(true);
        health.set_role(Role::Streaming);
        health.set_refused("orders", Some("no Pub"));
        health.set_refused("orders", Some("no Pub"));
        let r = health.readiness();
        assert!(!r.ready && !r.broker_auth, "{r:?}");
        assert_eq!(r.refused_topics, vec!["orders".to_string()]);
        assert_eq!(r.refusals["orders"], "no Pub");
        health.set_refused("payments", None);
        assert!(
            !health.readiness().ready,
            "another topic's SEND_OK does not clear it"
        );
        health.set_refused("orders", None);
        let r = health.readiness();
        assert!(
            r.ready && r.broker_auth && r.refused_topics.is_empty(),
            "{r:?}"
        );
    }

    #[test]
    fn a_checkpoint_that_cannot_be_saved_keeps_it_unready_until_a_save_works() {
        let health = Health::new(true);
        health.set_role(Role::Streaming);
        assert!(health.readiness().checkpoint && health.readiness().ready);
        health.set_checkpoint(false);
        let r = health.readiness();
        assert!(!r.ready && !r.checkpoint && r.mysql && r.broker, "{r:?}");
        health.set_checkpoint(true);
        assert!(health.readiness().ready);
    }
}
