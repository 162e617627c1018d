//! Which older rows of a key are still waiting: the one question behind per-key order, asked by
//! a claim (may it take a key's row?) and by the stream's key-order guard (may it hand a key's
//! event on?).
//!
//! A row is *waiting* while it is PENDING or SENDING: it may still be published. A key's row may
//! go only when no older row of the key waits, except the rows the asker itself is carrying
//! ahead of it in the same ordered sender.
//!
//! A *key* is an [`OrderKey`]: a `biz_key` within one topic. Order is what a consumer reads from
//! one queue, and a queue belongs to one topic, so the same `biz_key` in two topics is two keys:
//! a topic that cannot take its events never holds back another topic's events of that
//! `biz_key`.

use crate::outbox::{Status, TableName};
use mysql_async::prelude::*;
use mysql_async::Value;

/// What per-key order is kept for, within one outbox table (ids, and so order, are per table):
/// a `biz_key` of one topic.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OrderKey {
    pub topic: String,
    pub biz_key: String,
}

impl OrderKey {
    pub fn new(topic: impl Into<String>, biz_key: impl Into<String>) -> Self {
        OrderKey {
            topic: topic.into(),
            biz_key: biz_key.into(),
        }
    }
}

impl std::fmt::Display for OrderKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of topic {}", self.biz_key, self.topic)
    }
}

/// An older row of a key that may still be published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingRow {
    pub id: u64,
    pub key: OrderKey,
    /// SENDING (claimed by someone) rather than PENDING.
    pub sending: bool,
}

impl WaitingRow {
    /// From the columns `(id, topic, biz_key, status)`.
    fn from_columns((id, topic, biz_key, status): (u64, String, String, i8)) -> Self {
        WaitingRow {
            id,
            key: OrderKey { topic, biz_key },
            sending: status == Status::Sending.code(),
        }
    }
}

/// (table, index) pairs found without the index a query names (its migration not applied):
/// those queries run unhinted.
static MISSING_INDEXES: std::sync::Mutex<std::collections::BTreeSet<(String, &'static str)>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// MySQL's ER_KEY_DOES_NOT_EXITS: an index hint names a missing index.
const NO_SUCH_INDEX: u16 = 1176;

/// Runs `sql(hinted)` on `table`, hinted at `idx_pending` unless the table is known to lack it;
/// when the hint names a missing index, warns once, remembers the table and runs it unhinted.
///
/// Without the hint the optimizer may walk the primary key from the first id (it looks cheaper
/// while statistics still say most rows are PENDING), reading every SENT row before the first
/// PENDING one: a poll-mode drain of 50k rows read 38k rows per 100-row claim.
pub async fn on_pending_index<Q: Queryable, T: FromRow + Send + 'static>(
    q: &mut Q,
    table: &TableName,
    sql: impl Fn(bool) -> String,
    params: Vec<Value>,
) -> Result<Vec<T>, mysql_async::Error> {
    on_index(q, table, PENDING_INDEX, sql, params).await
}

/// ` FORCE INDEX (idx_pending)` when `hinted` (see [`on_pending_index`]), else nothing.
pub fn pending_index_hint(hinted: bool) -> String {
    index_hint(PENDING_INDEX.0, hinted)
}

/// ` FORCE INDEX (index)` when `hinted`, else nothing.
fn index_hint(index: &str, hinted: bool) -> String {
    match hinted {
        true => format!(" FORCE INDEX ({index})"),
        false => String::new(),
    }
}

/// The index claims walk (migrations 0008 and 0016).
const PENDING_INDEX: (&str, &str) = (
    "idx_pending",
    "claims may read every SENT row before the PENDING ones",
);
/// The index the waiting-rows question reads (migrations 0013 and 0017).
const WAITING_INDEX: (&str, &str) = (
    "idx_waiting_key",
    "each check of a key's older rows reads every waiting row of the table",
);

/// Runs `sql(hinted)` on `table`, hinted at `index` (its name and what its absence costs)
/// unless the table is known to lack it; when the hint names a missing index, warns once,
/// remembers that and runs it unhinted.
async fn on_index<Q: Queryable, T: FromRow + Send + 'static>(
    q: &mut Q,
    table: &TableName,
    (index, cost): (&'static str, &str),
    sql: impl Fn(bool) -> String,
    params: Vec<Value>,
) -> Result<Vec<T>, mysql_async::Error> {
    let key = (table.to_string(), index);
    let hinted = !MISSING_INDEXES.lock().expect("not poisoned").contains(&key);
    match q.exec(sql(hinted), params.clone()).await {
        Err(mysql_async::Error::Server(e)) if hinted && e.code == NO_SUCH_INDEX => {
            tracing::warn!(%table, "the outbox table has no `{index}` index \
                (run `outbox-relay migrate`): {cost}");
            MISSING_INDEXES.lock().expect("not poisoned").insert(key);
            q.exec(sql(false), params).await
        }
        other => other,
    }
}

/// The waiting rows of `table` of each of `keys` with an id below that key's bound, in id
/// order, read through `idx_waiting_key (topic, biz_key)`: only those keys' rows from the first
/// waiting row of their topics on (one dive of `idx_pending (status, topic)` per topic and
/// status), never a key's older SENT history (through `(biz_key, id)` a claim read a hot key's
/// whole history) nor the other keys' waiting rows (through `idx_pending` a check read a stuck
/// topic's whole parked backlog). A key's bound is the newest id of its own rows being asked
/// about: a row at or above it holds none of them back. Non-locking (READ COMMITTED sees
/// committed rows only).
///
/// Two SELECTs whatever the number of keys: the first waiting id of the keys' topics, then a
/// range of the index per key, from there to the highest bound; the rows at or above their own
/// key's bound (the asker's own rows, mostly) are dropped here. One SELECT per key (a `UNION ALL`) cost the server ~40 µs of CPU per key on MariaDB
/// 10.11 (each a statement to open, plan and estimate); this form ~12–19 µs, its own rows read
/// back included (docs/development/performance-journal.md, "The key-order check as one
/// SELECT").
pub async fn waiting_rows_of_keys<Q: Queryable>(
    q: &mut Q,
    table: &TableName,
    keys: &[(&OrderKey, u64)],
) -> Result<Vec<WaitingRow>, mysql_async::Error> {
    Ok(waiting_rows_of_keys_read(q, table, keys, None).await?.0)
}

/// [`waiting_rows_of_keys`], reading at most `limit` rows of the index (the asker's own rows
/// included): the rows, and whether they are all (fewer than `limit` were read). A look that
/// stops short has read an arbitrary part of the keys' waiting rows: it tells that rows wait,
/// not which key's are the oldest. A stream held behind a stall's 100,000 parked rows read them
/// all at every look, ten times a second, where a look needs only to know that some still wait.
pub async fn waiting_rows_of_keys_at_most<Q: Queryable>(
    q: &mut Q,
    table: &TableName,
    keys: &[(&OrderKey, u64)],
    limit: usize,
) -> Result<(Vec<WaitingRow>, bool), mysql_async::Error> {
    waiting_rows_of_keys_read(q, table, keys, Some(limit)).await
}

async fn waiting_rows_of_keys_read<Q: Queryable>(
    q: &mut Q,
    table: &TableName,
    keys: &[(&OrderKey, u64)],
    limit: Option<usize>,
) -> Result<(Vec<WaitingRow>, bool), mysql_async::Error> {
    let Some(highest) = keys.iter().map(|(_, below)| *below).max() else {
        return Ok((Vec::new(), true));
    };
    // From the first waiting row of the keys' topics: asked first, as a value (MariaDB 10.11
    // reads a subquery's bound as a filter, not as the start of each key's range: each key's
    // whole history, where MySQL 9.7 read 14 rows).
    let topics: std::collections::BTreeSet<&str> =
        keys.iter().map(|(key, _)| key.topic.as_str()).collect();
    let topic_values: Vec<Value> = topics.iter().map(|topic| Value::from(*topic)).collect();
    let sql = |hinted| first_waiting_id_sql(table, hinted, topics.len());
    let first: Vec<Option<u64>> = on_pending_index(q, table, sql, topic_values).await?;
    let Some(from) = first.into_iter().flatten().next() else {
        return Ok((Vec::new(), true)); // nothing of these topics waits
    };
    let mut params = Vec::with_capacity(keys.len() * 2 + 3);
    for (key, _) in keys {
        params.push(Value::from(key.topic.as_str()));
        params.push(Value::from(key.biz_key.as_str()));
    }
    params.push(Value::from(from));
    params.push(Value::from(highest));
    if let Some(limit) = limit {
        params.push(Value::from(limit as u64));
    }
    let sql = |hinted| {
        let mut sql = waiting_rows_sql(table, hinted, keys.len());
        if limit.is_some() {
            sql.push_str(" LIMIT ?");
        }
        sql
    };
    let rows: Vec<(u64, String, String, i8)> =
        on_index(q, table, WAITING_INDEX, sql, params).await?;
    let complete = limit.is_none_or(|limit| rows.len() < limit);
    Ok((below_own_bounds(rows, keys), complete))
}

/// `(topic, id)` of the waiting rows of each of `topics` in `table` with ids up to `up_to`, at
/// most `limit` of each topic: one range of `idx_pending (status, topic)` per topic and status
/// (covering: the index holds the id), never another topic's rows, so a stalled topic's parked
/// backlog costs the look at a healthy topic nothing. The stream's key-order guard asks this to
/// learn that every waiting row of a topic it has read past is its own (see
/// `pipeline::key_order`). Non-locking. Fails where the table has no `idx_pending`.
pub async fn waiting_ids_of_topics<Q: Queryable>(
    q: &mut Q,
    table: &TableName,
    topics: &[String],
    up_to: u64,
    limit: usize,
) -> Result<Vec<(String, u64)>, mysql_async::Error> {
    if topics.is_empty() {
        return Ok(Vec::new());
    }
    let mut params: Vec<Value> = Vec::with_capacity(topics.len() * 3);
    for topic in topics {
        params.extend([
            Value::from(topic.as_str()),
            Value::from(up_to),
            Value::from(limit as u64),
        ]);
    }
    // Through the index or not at all: unhinted, a look could walk the primary key over every
    // row up to the highest id read, every 100 ms. Without the index (its migration not applied)
    // this fails, and the guard asks by key as before.
    q.exec(waiting_ids_of_topics_sql(table, topics.len()), params)
        .await
}

/// The SELECT of [`waiting_ids_of_topics`] for `topics` topics (binds per topic: the topic, the
/// highest id, the limit; bound, not written in, so the text is prepared once per connection).
fn waiting_ids_of_topics_sql(table: &TableName, topics: usize) -> String {
    let one = format!(
        "(SELECT topic, id FROM {}{} WHERE {} AND topic = ? AND id <= ? LIMIT ?)",
        table.sql(),
        pending_index_hint(true),
        waiting_ranges()
    );
    vec![one; topics].join(" UNION ALL ")
}

/// The waiting rows of `table` with ids from `from` to `to` (inclusive), at most `limit` of them,
/// in no particular order, read by primary key: the rows in the range, waiting or not (a few:
/// the stream's key-order guard asks this about the ids it skipped, mostly another writer's
/// older rows committed a moment later; knowing their keys, it holds only those keys' later
/// events until it reads them). Not through `idx_pending (status, topic)`: its waiting entries
/// are in topic order, so a range of ids would read every one of them (a stalled topic's
/// parked rows too) on the stream's path. Non-locking.
pub async fn waiting_rows_between<Q: Queryable>(
    q: &mut Q,
    table: &TableName,
    (from, to): (u64, u64),
    limit: usize,
) -> Result<Vec<WaitingRow>, mysql_async::Error> {
    let sql = format!(
        "SELECT id, topic, biz_key, status FROM {} WHERE id BETWEEN ? AND ? AND {} LIMIT ?",
        table.sql(),
        waiting_ranges()
    );
    let rows: Vec<(u64, String, String, i8)> = q.exec(sql, (from, to, limit as u64)).await?;
    Ok(rows.into_iter().map(WaitingRow::from_columns).collect())
}

/// The topics of `table` that have PENDING rows, the one with the oldest PENDING row first:
/// one dive of `idx_pending (status, topic)` per topic (a loose index scan, `GROUP BY status,
/// topic` with each topic's `MIN(id)`), however many rows wait. Claims read the topics in this
/// order.
pub async fn pending_topics<Q: Queryable>(
    q: &mut Q,
    table: &TableName,
) -> Result<Vec<String>, mysql_async::Error> {
    let sql = |hinted| {
        format!(
            "SELECT topic, MIN(id) FROM {}{} WHERE {} GROUP BY status, topic",
            table.sql(),
            pending_index_hint(hinted),
            Status::Pending.sql()
        )
    };
    let mut topics: Vec<(String, u64)> = on_pending_index(q, table, sql, Vec::new()).await?;
    topics.sort_unstable_by_key(|(_, first)| *first);
    Ok(topics.into_iter().map(|(topic, _)| topic).collect())
}

/// The SELECT of the lowest PENDING id of `table`: the lowest of each topic's, each one dive of
/// `idx_pending (status, topic)` (see [`pending_topics`]), `hinted` or not.
pub(crate) fn first_pending_id_sql(table: &TableName, hinted: bool) -> String {
    format!(
        "SELECT MIN(first) FROM (SELECT MIN(id) AS first FROM {}{} WHERE {} \
         GROUP BY status, topic) AS per_topic",
        table.sql(),
        pending_index_hint(hinted),
        Status::Pending.sql()
    )
}

/// The rows `(id, topic, biz_key, status)` read below the highest bound that are also below
/// their own key's bound in `keys`, in id order.
fn below_own_bounds(
    rows: Vec<(u64, String, String, i8)>,
    keys: &[(&OrderKey, u64)],
) -> Vec<WaitingRow> {
    let bounds: std::collections::HashMap<(&str, &str), u64> = (keys.iter())
        .map(|(key, below)| ((key.topic.as_str(), key.biz_key.as_str()), *below))
        .collect();
    let mut rows: Vec<WaitingRow> = rows
        .into_iter()
        .filter(|(id, topic, biz_key, _)| {
            bounds
                .get(&(topic.as_str(), biz_key.as_str()))
                .is_some_and(|below| id < below)
        })
        .map(WaitingRow::from_columns)
        .collect();
    rows.sort_unstable_by_key(|row| row.id);
    rows
}

/// The newest id of each key of `rows` (`(id, key)`): the bounds of [`waiting_rows_of_keys`].
/// Any key type: the stream's guard passes borrowed `(topic, biz_key)` pairs, so it builds one
/// [`OrderKey`] per key rather than per event.
pub fn newest_per_key<K: Ord>(rows: impl IntoIterator<Item = (u64, K)>) -> Vec<(K, u64)> {
    let mut newest: std::collections::BTreeMap<K, u64> = std::collections::BTreeMap::new();
    for (id, key) in rows {
        let bound = newest.entry(key).or_insert(id);
        *bound = (*bound).max(id);
    }
    newest.into_iter().collect()
}

/// PENDING or SENDING as one range of `status` (their codes are adjacent): one index dive per
/// key in `idx_waiting_key`, where `status IN (0, 1)` made two.
fn undelivered_range() -> String {
    const _: () = assert!(Status::Sending.code() == Status::Pending.code() + 1);
    format!(
        "status BETWEEN {} AND {}",
        Status::Pending.code(),
        Status::Sending.code()
    )
}

/// PENDING or SENDING as an IN list: on `idx_pending (status)` (the id implied after it) two
/// ranges that each go on into the id, where a BETWEEN on `status` would stop there.
fn waiting_ranges() -> String {
    Status::sql_in(&Status::UNDELIVERED)
}

/// The SELECT of [`waiting_rows_of_keys`] for `keys` keys (binds: each key's topic and
/// `biz_key`, the first waiting id of their topics (asked first), the highest
/// bound).
pub fn waiting_rows_sql(table: &TableName, hinted: bool, keys: usize) -> String {
    let hint = index_hint(WAITING_INDEX.0, hinted);
    // A row constructor IN: MariaDB 10.11 and MySQL 9.7 both read it as one range of the index
    // per key. (As an OR of `topic = ? AND biz_key = ? AND … AND id < ?` per key, MySQL 9.7
    // scanned the whole index instead, each key's SENT history included.) No ORDER BY: the
    // caller sorts.
    format!(
        "SELECT id, topic, biz_key, status FROM {}{hint} \
         WHERE (topic, biz_key) IN ({}) AND id >= ? AND id < ? AND {}",
        table.sql(),
        vec!["(?, ?)"; keys].join(", "),
        undelivered_range()
    )
}

/// The SELECT of the lowest waiting id of `topics` topics of `table` (binds: the topics): the
/// lowest of each topic's and status's first entry in `idx_pending (status, topic)`, one dive
/// each (a loose index scan); NULL when none waits. The by-key question reads each key's rows
/// from there: `idx_waiting_key (topic, biz_key)` does not hold `status` (so a SENT mark moves
/// no entry in it), and a key's rows below the first waiting row of its topic are all done.
fn first_waiting_id_sql(table: &TableName, hinted: bool, topics: usize) -> String {
    format!(
        "SELECT MIN(first) FROM (SELECT MIN(id) AS first FROM {}{} WHERE {} AND topic IN ({}) \
         GROUP BY status, topic) AS waiting_from",
        table.sql(),
        pending_index_hint(hinted),
        waiting_ranges(),
        vec!["?"; topics].join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_rows_are_read_through_the_waiting_key_index() {
        let table = TableName::parse("app.outbox_event").unwrap();
        assert_eq!(
            waiting_rows_sql(&table, true, 2),
            "SELECT id, topic, biz_key, status FROM `app`.`outbox_event` \
             FORCE INDEX (idx_waiting_key) WHERE (topic, biz_key) IN ((?, ?), (?, ?)) \
             AND id >= ? AND id < ? AND status BETWEEN 0 AND 1"
        );
        assert!(!waiting_rows_sql(&table, false, 1).contains("FORCE INDEX"));
        assert_eq!(
            first_waiting_id_sql(&table, true, 2),
            "SELECT MIN(first) FROM (SELECT MIN(id) AS first FROM `app`.`outbox_event` \
             FORCE INDEX (idx_pending) WHERE status IN (0, 1) AND topic IN (?, ?) \
             GROUP BY status, topic) AS waiting_from"
        );
    }

    #[test]
    fn a_look_reads_each_topic_as_its_own_range() {
        let table = TableName::parse("app.outbox_event").unwrap();
        let one = "(SELECT topic, id FROM `app`.`outbox_event` FORCE INDEX (idx_pending) \
                   WHERE status IN (0, 1) AND topic = ? AND id <= ? LIMIT ?)";
        assert_eq!(waiting_ids_of_topics_sql(&table, 1), one);
        assert_eq!(
            waiting_ids_of_topics_sql(&table, 2),
            format!("{one} UNION ALL {one}")
        );
    }

    #[test]
    fn each_key_keeps_only_the_rows_below_its_own_bound() {
        let (a, b) = (OrderKey::new("t", "a"), OrderKey::new("t", "b"));
        let row = |id, key: &str, status| (id, "t".to_string(), key.to_string(), status);
        // Read below the highest bound (9): a's rows at or above a's own bound (5) are its
        // asker's own, b's row 7 is older than b's newest (9) and waits, SENDING.
        let rows = vec![
            row(7, "b", 1),
            row(6, "a", 0),
            row(3, "a", 0),
            row(5, "a", 0),
        ];
        let kept = below_own_bounds(rows, &[(&a, 5), (&b, 9)]);
        assert_eq!(
            kept,
            vec![
                WaitingRow {
                    id: 3,
                    key: a,
                    sending: false
                },
                WaitingRow {
                    id: 7,
                    key: b,
                    sending: true
                },
            ]
        );
    }
}
