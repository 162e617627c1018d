//! What runs beside a relay in an `outbox-relay run` process, on timers: the outbox tables'
//! gauges of `/metrics` ([`super::table_metrics`]), the consumer groups' dead-letter gauges
//! ([`super::dead_letters`], when `rocketmq.dead_letter_groups` names any) and the periodic
//! cleanup ([`super::cleanup`], when `cleanup.enabled`). The relay's pipeline never needs them:
//! the process that assembles a running relay starts them beside it.

use crate::config::{Config, RelayMode};
use crate::db::Deployment;
use tokio_util::sync::CancellationToken;

/// The watchers of one relay, running until [`Watchers::stop`] (or their token is cancelled).
#[derive(Debug)]
pub struct Watchers {
    cancel: CancellationToken,
    tables: tokio::task::JoinHandle<()>,
}

impl Watchers {
    /// Starts the watchers `config` asks for on the current Tokio runtime; `cancel` (or
    /// [`Watchers::stop`]) stops them.
    pub fn spawn(config: &Config, cancel: &CancellationToken) -> anyhow::Result<Self> {
        let deployment = Deployment::resolve(config)?;
        let cancel = cancel.child_token();
        let streamed = match config.relay.mode {
            RelayMode::Cdc => Some((deployment.opts.clone(), config.relay.name.clone())),
            RelayMode::Poll => None,
        };
        let tables = tokio::spawn(super::table_metrics::watch(
            crate::db::read_committed_pool(config)?,
            deployment.tables.clone(),
            streamed,
            config.metrics.refresh,
            cancel.clone(),
        ));
        if !config.rocketmq.dead_letter_groups.is_empty() {
            tokio::spawn(super::dead_letters::watch(
                config.rocketmq.clone(),
                config.rocketmq.dead_letter_groups.clone(),
                config.metrics.refresh,
                cancel.clone(),
            ));
        }
        if config.cleanup.enabled {
            tokio::spawn(super::cleanup::run_periodically(
                config.cleanup.clone(),
                crate::db::pool(config)?,
                deployment.tables,
                format!("outbox-relay run ({})", config.relay.name),
                cancel.clone(),
            ));
        }
        Ok(Watchers { cancel, tables })
    }

    /// Stops every watcher: the tables' gauges at once (a refresh in flight is dropped), the
    /// others at their next step.
    pub fn stop(self) {
        self.cancel.cancel();
        self.tables.abort();
    }
}
