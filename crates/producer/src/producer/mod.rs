//! The producer API: business code enqueues events inside its own MySQL transaction.
//!
//! ```no_run
//! # async fn example(pool: mysql_async::Pool) -> Result<(), Box<dyn std::error::Error>> {
//! use mysql_async::prelude::*;
//! use rocketmq_outbox_producer::{NewEvent, Outbox};
//!
//! let outbox = Outbox::default(); // table `outbox_event`, payloads up to 4 MiB
//! let mut tx = pool.start_transaction(Default::default()).await?;
//! tx.exec_drop("UPDATE orders SET state = 'PAID' WHERE id = ?", (42,)).await?;
//! let event_id = outbox
//!     .enqueue(&mut tx, NewEvent::new("order-events", "order-42", serde_json::json!({"paid": true})))
//!     .await?;
//! tx.commit().await?; // the event exists if and only if the business change does
//! # let _ = event_id; Ok(()) }
//! ```
//!
//! Guarantees: the event row is written in the caller's transaction, so it commits or rolls back
//! with the business change ("rollback sends nothing"). Every input rule is checked before any
//! SQL runs; a rejected event or batch writes nothing, and a failed batch leaves the caller's
//! transaction usable (it is rolled back to a savepoint).

use crate::outbox::rules;
pub use crate::outbox::rules::{MAX_BIZ_KEY_LEN, MAX_EVENT_ID_LEN, MAX_TAGS_LEN, MAX_TOPIC_LEN};

use crate::outbox::TableName;
use mysql_async::prelude::*;
use mysql_async::{Transaction, Value};
use std::collections::{BTreeMap, HashSet};
use std::fmt;

pub use crate::outbox::DEFAULT_MAX_PAYLOAD_BYTES;

/// Rows per `INSERT` statement in [`Outbox::enqueue_batch`].
const ROWS_PER_INSERT: usize = 500;
/// Bytes of payload per `INSERT` statement, well under the server's default `max_allowed_packet`.
const BYTES_PER_INSERT: usize = 8 * 1024 * 1024;

/// Why an event was not enqueued. Nothing was written when this is returned.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    /// The event breaks one of the outbox's rules (topic, biz_key, event_id, tags, headers).
    #[error(transparent)]
    Invalid(#[from] rules::RuleViolation),
    #[error("payload is {size} bytes; the limit is {limit} (outbox.max_payload_bytes)")]
    PayloadTooLarge { size: usize, limit: usize },
    #[error("payload is not valid JSON: {0}")]
    InvalidJson(#[source] serde_json::Error),
    #[error("event_id {event_id:?} already exists in the outbox")]
    DuplicateEventId { event_id: String },
    #[error("database error while enqueueing: {0}")]
    Database(#[from] mysql_async::Error),
}

/// The id of an enqueued event: a UUIDv7 unless the caller chose one. Consumers de-duplicate
/// by it; it travels as the message's `event_id` property and first key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(String);

impl EventId {
    /// A new time-ordered UUIDv7.
    pub fn generate() -> Self {
        EventId(uuid::Uuid::now_v7().to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<EventId> for String {
    fn from(id: EventId) -> String {
        id.0
    }
}

/// An event's body: a JSON value, or JSON text the caller already has (checked, not re-encoded).
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    Json(serde_json::Value),
    Raw(String),
}

impl Payload {
    /// JSON text as it is; [`Outbox::enqueue`] rejects it if it does not parse.
    pub fn raw(text: impl Into<String>) -> Self {
        Payload::Raw(text.into())
    }

    fn into_text(self) -> Result<String, EnqueueError> {
        match self {
            Payload::Json(value) => {
                serde_json::to_string(&value).map_err(EnqueueError::InvalidJson)
            }
            Payload::Raw(text) => {
                serde_json::from_str::<serde::de::IgnoredAny>(&text)
                    .map_err(EnqueueError::InvalidJson)?;
                Ok(text)
            }
        }
    }
}

impl From<serde_json::Value> for Payload {
    fn from(value: serde_json::Value) -> Self {
        Payload::Json(value)
    }
}

/// An event to enqueue. Build with [`NewEvent::new`] and the `with_*` methods.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub topic: String,
    pub biz_key: String,
    pub payload: Payload,
    pub event_id: Option<String>,
    pub tags: Option<String>,
    pub headers: BTreeMap<String, String>,
    /// When consumers get it (a scheduled event; `None`: at once). See [`NewEvent::deliver_at`].
    pub deliver_at: Option<std::time::SystemTime>,
}

impl NewEvent {
    /// An event for `topic`, ordered with the other events of `biz_key`.
    pub fn new(
        topic: impl Into<String>,
        biz_key: impl Into<String>,
        payload: impl Into<Payload>,
    ) -> Self {
        Self {
            topic: topic.into(),
            biz_key: biz_key.into(),
            payload: payload.into(),
            event_id: None,
            tags: None,
            headers: BTreeMap::new(),
            deliver_at: None,
        }
    }

    /// Use this id instead of a generated UUIDv7 (e.g. an id the caller already stored).
    pub fn with_event_id(mut self, event_id: impl Into<String>) -> Self {
        self.event_id = Some(event_id.into());
        self
    }

    /// RocketMQ tags (consumers can filter on them).
    pub fn with_tags(mut self, tags: impl Into<String>) -> Self {
        self.tags = Some(tags.into());
        self
    }

    /// A message property, e.g. a trace id.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// A scheduled event: consumers get it from `at` on, not before ("cancel the order if it is
    /// still unpaid in 30 minutes", written in the order's transaction). The relay sends it at
    /// once, as a RocketMQ 5 timer message, which the broker keeps until then; its topic must be
    /// a DELAY (or MIXED) topic. A time in the past is delivered at once; one further ahead than
    /// the broker keeps timer messages (`outbox.max_delay`, 3 days by default) is FAILED by the
    /// relay with that reason. A scheduled event is ordered by its time, not by its commit:
    /// events of one key due at the same millisecond may reach consumers in any order.
    pub fn deliver_at(mut self, at: std::time::SystemTime) -> Self {
        self.deliver_at = Some(at);
        self
    }
}

/// A validated event, ready to be bound to an `INSERT`.
#[derive(Debug)]
struct Row {
    event_id: EventId,
    params: [Value; 6],
    /// `deliver_at` as Unix seconds (the INSERT names the column only when a row has one, so
    /// tables not migrated to 0014 keep taking unscheduled events).
    deliver_at: Option<String>,
    payload_len: usize,
}

/// Writes events into one outbox table.
#[derive(Debug, Clone)]
pub struct Outbox {
    table: TableName,
    max_payload_bytes: usize,
}

impl Default for Outbox {
    /// Table `outbox_event` in the connection's database, payloads up to 4 MiB.
    fn default() -> Self {
        Self::new(TableName::default_outbox(), DEFAULT_MAX_PAYLOAD_BYTES)
    }
}

impl Outbox {
    pub fn new(table: TableName, max_payload_bytes: usize) -> Self {
        Self {
            table,
            max_payload_bytes,
        }
    }

    /// Enqueues one event in `tx` and returns its id.
    pub async fn enqueue(
        &self,
        tx: &mut Transaction<'_>,
        event: NewEvent,
    ) -> Result<EventId, EnqueueError> {
        let mut ids = self.enqueue_batch(tx, vec![event]).await?;
        Ok(ids.remove(0))
    }

    /// Enqueues several events in `tx`, in order (their ids are increasing in the table, so
    /// events of one `biz_key` keep this order). All or nothing: if one event is invalid or a
    /// duplicate, none is written.
    pub async fn enqueue_batch(
        &self,
        tx: &mut Transaction<'_>,
        events: Vec<NewEvent>,
    ) -> Result<Vec<EventId>, EnqueueError> {
        let rows = events
            .into_iter()
            .map(|event| self.prepare(event))
            .collect::<Result<Vec<_>, _>>()?;
        let mut seen = HashSet::with_capacity(rows.len());
        for row in &rows {
            if !seen.insert(&row.event_id) {
                return Err(EnqueueError::DuplicateEventId {
                    event_id: row.event_id.to_string(),
                });
            }
        }
        let ids = rows.iter().map(|row| row.event_id.clone()).collect();
        if rows.len() == 1 {
            // One statement is atomic on its own: no savepoint round trips on the common path.
            self.insert(tx, rows).await?;
        } else {
            tx.query_drop("SAVEPOINT outbox_enqueue").await?;
            match self.insert_chunked(tx, rows).await {
                Ok(()) => tx.query_drop("RELEASE SAVEPOINT outbox_enqueue").await?,
                Err(e) => {
                    // After a deadlock or lock-wait timeout the server has rolled the whole
                    // transaction back and the savepoint is gone: report the original error
                    // (the caller retries its transaction), not the missing savepoint.
                    let _ = tx.query_drop("ROLLBACK TO SAVEPOINT outbox_enqueue").await;
                    return Err(e);
                }
            }
        }
        Ok(ids)
    }

    fn prepare(&self, event: NewEvent) -> Result<Row, EnqueueError> {
        rules::topic(&event.topic)?;
        rules::biz_key(&event.biz_key)?;
        if let Some(id) = &event.event_id {
            rules::event_id(id)?;
        }
        if let Some(tags) = &event.tags {
            rules::tags(tags)?;
        }
        rules::headers(&event.headers)?;
        let deliver_at = event.deliver_at.map(rules::deliver_at).transpose()?;
        let payload = event.payload.into_text()?;
        if payload.len() > self.max_payload_bytes {
            return Err(EnqueueError::PayloadTooLarge {
                size: payload.len(),
                limit: self.max_payload_bytes,
            });
        }
        let headers = if event.headers.is_empty() {
            Value::NULL
        } else {
            Value::from(serde_json::to_string(&event.headers).expect("string map is JSON"))
        };
        let event_id = event
            .event_id
            .map(EventId)
            .unwrap_or_else(EventId::generate);
        let payload_len = payload.len();
        Ok(Row {
            params: [
                Value::from(event_id.as_str()),
                Value::from(event.biz_key),
                Value::from(event.topic),
                event.tags.map(Value::from).unwrap_or(Value::NULL),
                headers,
                Value::from(payload),
            ],
            event_id,
            deliver_at,
            payload_len,
        })
    }

    async fn insert_chunked(
        &self,
        tx: &mut Transaction<'_>,
        rows: Vec<Row>,
    ) -> Result<(), EnqueueError> {
        let mut chunk = Vec::new();
        let mut chunk_bytes = 0;
        for row in rows {
            if !chunk.is_empty()
                && (chunk.len() == ROWS_PER_INSERT
                    || chunk_bytes + row.payload_len > BYTES_PER_INSERT)
            {
                self.insert(tx, std::mem::take(&mut chunk)).await?;
                chunk_bytes = 0;
            }
            chunk_bytes += row.payload_len;
            chunk.push(row);
        }
        if !chunk.is_empty() {
            self.insert(tx, chunk).await?;
        }
        Ok(())
    }

    async fn insert(&self, tx: &mut Transaction<'_>, rows: Vec<Row>) -> Result<(), EnqueueError> {
        // `created_at` is written as `NOW(3)`, what its DEFAULT would give, because on a table
        // partitioned by day (operate::partitions) MySQL (9.7 measured) keeps a re-executed
        // prepared INSERT's partition choice for a defaulted column: after midnight every
        // INSERT of a cached statement failed with 1748 ("Found a row not matching the given
        // partition set"). An explicit NOW(3) is evaluated at each execution.
        let scheduled = rows.iter().any(|row| row.deliver_at.is_some());
        let (column, value) = match scheduled {
            true => (", deliver_at", ", FROM_UNIXTIME(?)"),
            false => ("", ""),
        };
        let placeholders =
            vec![format!("(?, ?, ?, ?, ?, ?, NOW(3){value})"); rows.len()].join(", ");
        let sql = format!(
            "INSERT INTO {} (event_id, biz_key, topic, tags, headers, payload, created_at{column}) \
             VALUES {placeholders}",
            self.table.sql()
        );
        let params: Vec<Value> = (rows.into_iter())
            .flat_map(|row| {
                let deliver_at = scheduled.then(|| row.deliver_at.map_or(Value::NULL, Value::from));
                row.params.into_iter().chain(deliver_at)
            })
            .collect();
        tx.exec_drop(sql, params)
            .await
            .map_err(classify_insert_error)
    }
}

/// MySQL error 1062 on `uk_event_id` means the event is already in the outbox.
fn classify_insert_error(error: mysql_async::Error) -> EnqueueError {
    if let mysql_async::Error::Server(server) = &error {
        if server.code == 1062 && server.message.contains("uk_event_id") {
            let event_id = server
                .message
                .split('\'')
                .nth(1)
                .unwrap_or_default()
                .to_string();
            return EnqueueError::DuplicateEventId { event_id };
        }
    }
    EnqueueError::Database(error)
}

#[cfg(test)]
mod tests;
