//! What `/healthz` and `/readyz` report: this instance's role and whether its last contact with
//! MySQL and with the broker worked.

use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::OnceLock;

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
}

/// The body of `/readyz`.
#[derive(Debug, Clone, Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub role: Role,
    pub mysql: bool,
    pub broker: bool,
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

    /// Ready: streaming, standing by or polling, with MySQL and the broker reachable.
    pub fn readiness(&self) -> Readiness {
        let role = self.role();
        let mysql = self.mysql_ok.load(Ordering::Relaxed);
        let broker = self.broker_ok.load(Ordering::Relaxed);
        let serving = matches!(role, Role::Standby | Role::Streaming | Role::Polling);
        Readiness {
            ready: serving && mysql && broker,
            role,
            mysql,
            broker,
        }
    }
}

/// The process's health.
pub fn health() -> &'static Health {
    static HEALTH: OnceLock<Health> = OnceLock::new();
    HEALTH.get_or_init(|| Health {
        role: AtomicU8::new(0),
        mysql_ok: AtomicBool::new(false),
        broker_ok: AtomicBool::new(true),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_serving_with_both_servers_reachable() {
        let health = Health {
            role: AtomicU8::new(0),
            mysql_ok: AtomicBool::new(true),
            broker_ok: AtomicBool::new(true),
        };
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
}
