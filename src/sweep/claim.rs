//! Claiming PENDING rows under a lease: `status 0 → 1` with `owner` and `lease_until`.
//!
//! Guarantees: a row is returned only if this call moved it from PENDING to SENDING for `owner`,
//! so two claimers never both claim the same row at the same time (one of them may claim it
//! again after the lease expired and lease recovery returned it to PENDING: a duplicate, not a
//! loss). Rows are returned in `id` order. Each claimed row is either a message that passed the
//! same checks as the binlog decoder's
//! ([`message_from_text`](crate::outbox::message::message_from_text)) or a [`RowProblem`] to be
//! marked FAILED with its reason.
//!
//! Two strategies, chosen once at start-up from the server's version:
//! - [`ClaimStrategy::SkipLocked`] (MySQL ≥ 8.0, MariaDB ≥ 10.6): in one transaction,
//!   `SELECT … ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED`, then one `UPDATE … WHERE id IN (…)`.
//!   Concurrent claimers skip each other's locked rows instead of waiting. The transaction runs
//!   at READ COMMITTED (no gap locks), so producers' INSERTs are never blocked by a claim.
//! - [`ClaimStrategy::Optimistic`] (older servers): a plain `SELECT`, then per row
//!   `UPDATE … WHERE id = ? AND <PENDING>`; a row is ours only if exactly one row was affected.

mod row;

use super::cursor::ClaimCursor;
use super::lease::HeldRows;
use super::waiting::{
    newest_per_key, on_pending_index, pending_topics, waiting_rows_of_keys, OrderKey,
};
use crate::event::{OutboxRow, RowProblem};
use crate::outbox::message::{RowLimits, RowText};
use crate::outbox::{Status, TableName};
use crate::send::{StalledSet, Stalls};
use mysql_async::prelude::*;
use mysql_async::{Conn, IsolationLevel, Row, TxOpts, Value};
use row::{read_row, ROW_COLUMNS};
use std::sync::Arc;
use std::time::Duration;

/// How rows are claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimStrategy {
    /// `FOR UPDATE SKIP LOCKED` and one UPDATE per batch.
    SkipLocked,
    /// One `UPDATE … WHERE id = ? AND <PENDING>` per row; affected rows = 1 means claimed.
    Optimistic,
}

impl ClaimStrategy {
    /// The strategy for a server reporting `version` (`SELECT VERSION()`): SKIP LOCKED needs
    /// MySQL 8.0 or MariaDB 10.6.
    pub fn for_version(version: &str) -> Self {
        let mut numbers = version
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<u32>().unwrap_or(0));
        let major = numbers.next().unwrap_or(0);
        let minor = numbers.next().unwrap_or(0);
        let supported = if version.to_ascii_lowercase().contains("mariadb") {
            (major, minor) >= (10, 6)
        } else {
            major >= 8
        };
        if supported {
            ClaimStrategy::SkipLocked
        } else {
            ClaimStrategy::Optimistic
        }
    }
}

/// One claimed row.
#[derive(Debug, Clone, PartialEq)]
pub enum Claimed {
    Event(OutboxRow),
    Problem(RowProblem),
}

impl Claimed {
    /// The row's id.
    pub fn id(&self) -> u64 {
        match self {
            Claimed::Event(row) => row.id,
            Claimed::Problem(problem) => problem.id,
        }
    }
}

/// Claims batches of one outbox table for one owner.
#[derive(Debug, Clone)]
pub struct Claimer {
    pub table: Arc<TableName>,
    pub owner: String,
    pub lease: Duration,
    pub batch_size: u32,
    /// Only rows created longer ago than this are claimed (zero: any row).
    pub min_age: Duration,
    pub strategy: ClaimStrategy,
    pub limits: RowLimits,
    /// Where the next claim starts reading (shared by clones; see [`ClaimCursor`]).
    pub cursor: Arc<ClaimCursor>,
    /// The rows this process holds (shared by every claimer of the process): each claim adds
    /// what it returns, and the key-order check passes over these alone.
    pub held: HeldRows,
    /// The topics that do not accept events now: their rows are not claimed meanwhile (the
    /// shards would only hold them; see [`Stalls`]).
    pub stalls: Arc<Stalls>,
}

/// Which PENDING rows a claim reads.
#[derive(Debug, Clone, Copy)]
enum Scope<'a> {
    /// The next batch in id order, from the cursor, older than `min_age`.
    Next,
    /// These rows, any age.
    These(&'a [u64]),
}

impl Claimer {
    /// The claimable rows of `scope`, in id order. The next batch is read topic by topic, the
    /// topic with the oldest PENDING row first, each as one range of `idx_pending (status,
    /// topic)` in id order (hinted unless the table lacks the index), until the batch is full:
    /// a stalled topic's rows are never read, however many wait. (Through `idx_pending (status)`
    /// every claim read a stalled topic's parked rows to leave them out: 63,000 after a
    /// 5-minute stall at 200 events/s, the most of what the relay read then.)
    async fn select_claimable<Q: Queryable>(
        &self,
        q: &mut Q,
        scope: Scope<'_>,
    ) -> Result<Vec<(u64, RowText)>, mysql_async::Error> {
        let stalled = self.stalls.stalled();
        let mut rows: Vec<(u64, RowText)> = match scope {
            Scope::Next => {
                let pending = pending_topics(q, &self.table).await?;
                self.cursor.keep_only(&pending);
                // Every stalled topic is left out, also one of which only some queues are: the
                // shards would only hold its rows.
                let stalled_topics = stalled.topics();
                let mut rows = Vec::new();
                for topic in pending.iter().filter(|t| !stalled_topics.contains(t)) {
                    let want = (self.batch_size as usize).saturating_sub(rows.len());
                    if want == 0 {
                        break;
                    }
                    let after = self.cursor.start(topic);
                    let params = self.select_params(topic, after, want);
                    let sql = |hinted| self.select_sql(hinted);
                    let read: Vec<Row> = on_pending_index(q, &self.table, sql, params).await?;
                    let read: Vec<(u64, RowText)> = read.into_iter().map(read_row).collect();
                    let highest = read.iter().map(|(id, _)| *id).max().unwrap_or(0);
                    self.cursor.record(topic, after, read.len(), highest, want);
                    rows.extend(read);
                }
                rows.sort_unstable_by_key(|(id, _)| *id);
                rows
            }
            Scope::These(ids) => {
                let rows: Vec<Row> = q.query(self.select_these_sql(ids)).await?;
                rows.into_iter().map(read_row).collect()
            }
        };
        // The rows of stalled topics and queues wait where they are (all of a key's rows are
        // bound for one queue, so a key's order is kept), whichever way they were asked for.
        if !stalled.is_empty() {
            rows.retain(|(_, text)| !is_held_back(&stalled, text));
        }
        Ok(rows)
    }

    /// The SELECT of one topic's claimable rows (binds: the topic, the id to read past, the
    /// minimum age if any, how many rows): one range of `idx_pending (status, topic)`, in id
    /// order.
    pub fn select_sql(&self, hinted: bool) -> String {
        let lock = match self.strategy {
            ClaimStrategy::SkipLocked => " FOR UPDATE SKIP LOCKED",
            ClaimStrategy::Optimistic => "",
        };
        let age = if self.min_age.is_zero() {
            ""
        } else {
            " AND created_at < NOW(3) - INTERVAL ? MICROSECOND"
        };
        let hint = super::waiting::pending_index_hint(hinted);
        format!(
            "SELECT {ROW_COLUMNS} FROM {}{hint} \
             WHERE {} AND topic = ? AND id > ? AND next_retry_at <= NOW(3){age} \
             ORDER BY id LIMIT ?{lock}",
            self.table.sql(),
            Status::Pending.sql()
        )
    }

    /// The SELECT of the rows among `ids` that are claimable now (any age), by primary key.
    pub fn select_these_sql(&self, ids: &[u64]) -> String {
        let lock = match self.strategy {
            ClaimStrategy::SkipLocked => " FOR UPDATE SKIP LOCKED",
            ClaimStrategy::Optimistic => "",
        };
        format!(
            "SELECT {ROW_COLUMNS} FROM {} \
             WHERE id IN ({}) AND {} AND next_retry_at <= NOW(3) ORDER BY id{lock}",
            self.table.sql(),
            crate::db::id_list(ids.iter().copied()),
            Status::Pending.sql()
        )
    }

    /// The values for [`Claimer::select_sql`]: the topic, the id to read past, the minimum age
    /// (if any), how many rows.
    fn select_params(&self, topic: &str, after: u64, rows: usize) -> Vec<Value> {
        let mut params = vec![Value::from(topic), Value::from(after)];
        if !self.min_age.is_zero() {
            params.push(Value::from(
                u64::try_from(self.min_age.as_micros()).unwrap_or(u64::MAX),
            ));
        }
        params.push(Value::from(rows as u64));
        params
    }

    /// `(id, key)` of the rows of the keys of `rows` with a smaller id than the key's newest in
    /// `rows` that are waiting ([`waiting_rows_of_keys`]): PENDING, or SENDING but not held by this
    /// process (another instance's, an earlier life's, or a claim whose reply was lost).
    async fn older_rows_of_keys(
        &self,
        tx: &mut mysql_async::Transaction<'_>,
        rows: &[(u64, RowText)],
    ) -> Result<Vec<(u64, OrderKey)>, mysql_async::Error> {
        let keyed: Vec<(u64, OrderKey)> = (rows.iter())
            .filter_map(|(id, t)| Some((*id, order_key(t)?)))
            .collect();
        let keys = newest_per_key(keyed.iter().map(|(id, key)| (*id, key)));
        let waiting = waiting_rows_of_keys(tx, &self.table, &keys).await?;
        Ok(waiting
            .into_iter()
            .filter(|row| !row.sending || !self.held.contains(&self.table, row.id))
            .map(|row| (row.id, row.key))
            .collect())
    }

    /// The UPDATE that claims `rows` selected rows (binds: owner, lease µs, then the ids).
    pub fn update_sql(&self, rows: usize) -> String {
        let which = match self.strategy {
            ClaimStrategy::SkipLocked => format!("id IN ({})", vec!["?"; rows].join(", ")),
            ClaimStrategy::Optimistic => format!("id = ? AND {}", Status::Pending.sql()),
        };
        format!(
            "UPDATE {} SET {}, owner = ?, lease_until = NOW(3) + INTERVAL ? MICROSECOND \
             WHERE {which}",
            self.table.sql(),
            Status::Sending.sql()
        )
    }

    fn lease_micros(&self) -> u64 {
        u64::try_from(self.lease.as_micros()).unwrap_or(u64::MAX)
    }

    /// Claims up to `batch_size` rows, in id order, and records them as held by this process.
    /// Rows a failed claim may have left SENDING are not recorded: they expire within a lease.
    pub async fn claim(&self, conn: &mut Conn) -> Result<Vec<Claimed>, mysql_async::Error> {
        self.claim_scope(conn, Scope::Next).await
    }

    /// Claims those of `ids` that are PENDING now, whatever their age (rows a stream waits for),
    /// with the same key-order rule and bookkeeping as [`Claimer::claim`]: at most `batch_size`
    /// of them, the oldest first. A stream that waits for more (the keys it holds behind a long
    /// stall's parked rows: 114,000 of them after 10 minutes at 200 events/s, past the server's
    /// 65,535 placeholders a statement) asks again for the rest while it still waits.
    pub async fn claim_these(
        &self,
        conn: &mut Conn,
        ids: &[u64],
    ) -> Result<Vec<Claimed>, mysql_async::Error> {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        ids.truncate(self.batch_size as usize);
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.claim_scope(conn, Scope::These(&ids)).await
    }

    async fn claim_scope(
        &self,
        conn: &mut Conn,
        scope: Scope<'_>,
    ) -> Result<Vec<Claimed>, mysql_async::Error> {
        let claimed = match self.strategy {
            ClaimStrategy::SkipLocked => self.claim_skip_locked(conn, scope).await,
            ClaimStrategy::Optimistic => self.claim_optimistic(conn, scope).await,
        }?;
        self.held.add(&self.table, claimed.iter().map(Claimed::id));
        Ok(claimed)
    }

    async fn claim_skip_locked(
        &self,
        conn: &mut Conn,
        scope: Scope<'_>,
    ) -> Result<Vec<Claimed>, mysql_async::Error> {
        // READ COMMITTED: no gap locks, so the claim never blocks (or deadlocks with) the
        // business transactions inserting new rows behind the claimed range.
        let mut opts = TxOpts::default();
        opts.with_isolation_level(IsolationLevel::ReadCommitted);
        let mut tx = conn.start_transaction(opts).await?;
        let rows = self.select_claimable(&mut tx, scope).await?;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        // SKIP LOCKED passes over rows locked for a moment by other statements (or claimed by
        // another instance): a later row of the same key must not overtake them. Ask which
        // older rows of these keys are still waiting and keep only rows with none before them.
        let waiting = self.older_rows_of_keys(&mut tx, &rows).await?;
        let locked: Vec<(u64, Option<OrderKey>)> =
            rows.iter().map(|(id, t)| (*id, order_key(t))).collect();
        let keep = keep_key_order(&waiting, &locked);
        let rows: Vec<(u64, RowText)> = rows
            .into_iter()
            .zip(keep)
            .filter(|(_, k)| *k)
            .map(|(r, _)| r)
            .collect();
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let mut params: Vec<Value> = vec![self.owner.clone().into(), self.lease_micros().into()];
        params.extend(rows.iter().map(|(id, _)| Value::from(*id)));
        tx.exec_drop(self.update_sql(rows.len()), params).await?;
        tx.commit().await?;
        Ok(rows.into_iter().map(|row| self.build(row)).collect())
    }

    async fn claim_optimistic(
        &self,
        conn: &mut Conn,
        scope: Scope<'_>,
    ) -> Result<Vec<Claimed>, mysql_async::Error> {
        let rows = self.select_claimable(conn, scope).await?;
        let sql = self.update_sql(1);
        let mut claimed = Vec::with_capacity(rows.len());
        // A key whose row someone else took: its later rows wait, so they cannot overtake it.
        let mut lost_keys = std::collections::HashSet::new();
        for (id, text) in rows {
            let key = order_key(&text);
            if lost_keys.contains(&key) {
                continue;
            }
            conn.exec_drop(&sql, (&self.owner, self.lease_micros(), id))
                .await?;
            if conn.affected_rows() == 1 {
                claimed.push(self.build((id, text)));
            } else {
                lost_keys.insert(key);
            }
        }
        Ok(claimed)
    }

    fn build(&self, row: (u64, RowText)) -> Claimed {
        row::build(&self.table, self.limits, row)
    }
}

/// Whether `text`'s row is of a stalled topic or queue.
fn is_held_back(stalled: &StalledSet, text: &RowText) -> bool {
    let topic = text.topic.as_deref().unwrap_or_default();
    stalled.contains(topic, text.biz_key.as_deref().unwrap_or_default())
}

/// The key a selected row keeps order within; none when it has no `biz_key` (such a row is
/// FAILED as malformed, never sent).
fn order_key(text: &RowText) -> Option<OrderKey> {
    let biz_key = text.biz_key.as_deref()?;
    Some(OrderKey::new(
        text.topic.as_deref().unwrap_or_default(),
        biz_key,
    ))
}

/// Which of the `locked` rows may be claimed: a row is dropped when an older row of its key is
/// waiting (in `waiting`) and is not one of the rows we locked, so a key's rows are claimed in id
/// order.
fn keep_key_order<K: Eq + std::hash::Hash>(
    waiting: &[(u64, K)],
    locked: &[(u64, Option<K>)],
) -> Vec<bool> {
    let ours: std::collections::HashSet<u64> = locked.iter().map(|(id, _)| *id).collect();
    // For each key, the smallest waiting id we did not get.
    let mut first_missed: std::collections::HashMap<&K, u64> = std::collections::HashMap::new();
    for (id, key) in waiting {
        if !ours.contains(id) {
            first_missed.entry(key).or_insert(*id);
        }
    }
    locked
        .iter()
        .map(
            |(id, key)| match key.as_ref().and_then(|k| first_missed.get(k)) {
                Some(missed) => id < missed,
                None => true,
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skipped_row_holds_back_the_later_rows_of_its_key() {
        let candidates = [(1, "a"), (2, "b"), (3, "a"), (4, "c"), (5, "b")];
        // Row 2 (key b) was locked elsewhere and skipped; 6 (key a) became visible later.
        let locked = [
            (1, Some("a")),
            (3, Some("a")),
            (4, Some("c")),
            (5, Some("b")),
            (6, Some("a")),
        ];
        assert_eq!(
            keep_key_order(&candidates, &locked),
            vec![true, true, true, false, true]
        );
        // Nothing skipped: everything is kept.
        let all: Vec<(u64, Option<&str>)> =
            candidates.iter().map(|(id, k)| (*id, Some(*k))).collect();
        assert!(keep_key_order(&candidates, &all).iter().all(|k| *k));
    }

    #[test]
    fn a_biz_key_waiting_in_one_topic_holds_back_no_other_topic() {
        let stuck = OrderKey::new("stuck", "order-7");
        let healthy = OrderKey::new("healthy", "order-7");
        // Row 2 (the stuck topic's) waits, claimed by no one; row 3 has the same biz_key.
        let waiting = [(2, stuck.clone())];
        let locked = [(3, Some(healthy)), (4, Some(stuck))];
        assert_eq!(keep_key_order(&waiting, &locked), vec![true, false]);
    }

    fn claimer(strategy: ClaimStrategy) -> Claimer {
        Claimer {
            table: Arc::new(TableName::parse("app.outbox_event").unwrap()),
            owner: "me".into(),
            lease: Duration::from_millis(1500),
            batch_size: 100,
            min_age: Duration::ZERO,
            strategy,
            limits: RowLimits {
                max_payload_bytes: 1024,
                max_delay: crate::outbox::DEFAULT_MAX_DELAY,
            },
            cursor: Default::default(),
            held: HeldRows::default(),
            stalls: Default::default(),
        }
    }

    #[test]
    fn skip_locked_needs_mysql_8_or_mariadb_10_6() {
        use ClaimStrategy::*;
        for (version, expected) in [
            ("8.0.36", SkipLocked),
            ("8.4.0-commercial", SkipLocked),
            ("5.7.44-log", Optimistic),
            ("10.11.6-MariaDB-0+deb12u1-log", SkipLocked),
            ("10.6.0-MariaDB", SkipLocked),
            ("10.5.23-MariaDB", Optimistic),
            ("5.5.5-10.4.1-MariaDB", Optimistic),
            ("11.4.2-MariaDB", SkipLocked),
        ] {
            assert_eq!(ClaimStrategy::for_version(version), expected, "{version}");
        }
    }

    #[test]
    fn claim_sql_locks_skips_and_leases() {
        let c = claimer(ClaimStrategy::SkipLocked);
        let (pending, sending) = (Status::Pending.sql(), Status::Sending.sql());
        // One topic's rows: one range of idx_pending (status, topic), in id order.
        assert_eq!(
            c.select_sql(true),
            format!(
                "SELECT id, event_id, biz_key, topic, tags, headers, payload, \
                 UNIX_TIMESTAMP(deliver_at) FROM `app`.`outbox_event` FORCE INDEX (idx_pending) \
                 WHERE {pending} AND topic = ? AND id > ? AND next_retry_at <= NOW(3) \
                 ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED"
            )
        );
        assert!(!c.select_sql(false).contains("FORCE INDEX"));
        assert_eq!(
            c.select_params("t", 7, 40),
            vec![Value::from("t"), Value::from(7u64), Value::from(40u64)]
        );
        assert_eq!(
            c.update_sql(3),
            format!(
                "UPDATE `app`.`outbox_event` SET {sending}, owner = ?, lease_until = NOW(3) + \
                 INTERVAL ? MICROSECOND WHERE id IN (?, ?, ?)"
            )
        );
        assert_eq!(c.lease_micros(), 1_500_000);
        let aged = Claimer {
            min_age: Duration::from_secs(30),
            ..c.clone()
        };
        assert!(aged.select_sql(true).contains(
            "next_retry_at <= NOW(3) AND created_at < NOW(3) - INTERVAL ? MICROSECOND ORDER BY"
        ));
        assert_eq!(
            aged.select_params("t", 7, 100),
            vec![
                Value::from("t"),
                Value::from(7u64),
                Value::from(30_000_000u64),
                Value::from(100u64)
            ]
        );
        let o = claimer(ClaimStrategy::Optimistic);
        assert!(!o.select_sql(true).contains("FOR UPDATE"));
        assert!(o
            .update_sql(1)
            .ends_with(&format!("WHERE id = ? AND {pending}")));
    }
}
