//! The queue book kept in MySQL (`outbox_topic_queues`, migration 0012), shared by every
//! instance of a relay deployment.
//!
//! Guarantee: a topic's remembered broker groups outlive the process that saw them, so an
//! instance that starts, or takes over, while a group is down keeps that group's keys on their
//! queues (they wait for it). Without the table (not migrated) or its privileges the book
//! lives in memory only: logged once at WARN with what to do, and nothing else changes.

use super::queues::{Groups, QueueStore, StoreFuture};
use mysql_async::prelude::*;
use mysql_async::Pool;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long a send may wait for the table: it is asked only when a topic is first routed or its
/// list changes, but a stuck database must not hold sends for long.
const LIMIT: Duration = Duration::from_secs(3);

async fn limited<T>(
    work: impl std::future::Future<Output = Result<T, mysql_async::Error>>,
) -> Result<T, mysql_async::Error> {
    tokio::time::timeout(LIMIT, work).await.unwrap_or_else(|_| {
        Err(mysql_async::Error::Other(
            format!("no answer from MySQL within {LIMIT:?}").into(),
        ))
    })
}

/// See the module documentation.
pub struct QueueTable {
    pool: Pool,
    relay: String,
    warned: AtomicBool,
}

impl QueueTable {
    /// The book of relay deployment `relay` (`relay.name`), through `pool`.
    pub fn new(pool: Pool, relay: &str) -> Self {
        QueueTable {
            pool,
            relay: relay.to_string(),
            warned: AtomicBool::new(false),
        }
    }

    /// `Ok` with what `result` holds; on an error, its default after a WARN (the first of a
    /// missing table or privilege, every other error).
    fn or_memory<T: Default>(&self, topic: &str, result: Result<T, mysql_async::Error>) -> T {
        match result {
            Ok(value) => value,
            Err(e) if crate::db::permanent_fault(&e).is_some() => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e,
                        "cannot keep the topics' queue lists in outbox_topic_queues: run \
                         `outbox-relay migrate` and GRANT SELECT, INSERT, DELETE ON it to the \
                         relay's account. Until then an instance that starts while a broker \
                         group is down moves that group's keys to other queues");
                }
                T::default()
            }
            Err(e) => {
                tracing::warn!(%topic, error = %e,
                    "cannot read or save the topic's queue list in outbox_topic_queues; kept in memory");
                T::default()
            }
        }
    }
}

impl QueueStore for QueueTable {
    fn load<'a>(&'a self, topic: &'a str) -> StoreFuture<'a, Groups> {
        Box::pin(async move {
            let rows = limited(async {
                let mut conn = self.pool.get_conn().await?;
                conn.exec::<(String, i32), _, _>(
                    "SELECT broker_group, write_queues FROM outbox_topic_queues \
                     WHERE relay = ? AND topic = ?",
                    (&self.relay, topic),
                )
                .await
            })
            .await;
            self.or_memory(topic, rows).into_iter().collect()
        })
    }

    fn save<'a>(&'a self, topic: &'a str, groups: &'a Groups) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let saved = limited(async {
                let mut conn = self.pool.get_conn().await?;
                let mut tx = conn.start_transaction(Default::default()).await?;
                tx.exec_drop(
                    "DELETE FROM outbox_topic_queues WHERE relay = ? AND topic = ?",
                    (&self.relay, topic),
                )
                .await?;
                tx.exec_batch(
                    "INSERT INTO outbox_topic_queues (relay, topic, broker_group, write_queues) \
                     VALUES (?, ?, ?, ?)",
                    groups
                        .iter()
                        .map(|(group, queues)| (&self.relay, topic, group, queues)),
                )
                .await?;
                tx.commit().await
            })
            .await;
            self.or_memory(topic, saved);
        })
    }
}
