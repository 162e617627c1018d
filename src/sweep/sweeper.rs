//! The sweeper: a claim loop and a lease keeper feeding the ordered shard senders. Poll mode
//! runs it alone (every row, every `poll.interval`); CDC mode runs it beside the stream (rows
//! older than `sweeper.min_age`, every `sweeper.interval`) on the leader and on standbys.

use super::claim::{ClaimStrategy, Claimed, Claimer};
use super::gate::SweepGate;
use super::lease::{self, HeldRows};
use crate::config::Config;
use crate::error::DbError;
use crate::event::Origin;
use crate::outbox::message::RowLimits;
use crate::outbox::TableName;
use crate::retry::RetryPolicy;
use crate::send::{Completion, SendInputs, ShardEvent, Stopped};
use mysql_async::prelude::*;
use mysql_async::Pool;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How a sweeper claims.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepSettings {
    /// Pause between claims (none while claims come back full: a backlog is drained at once).
    pub interval: Duration,
    /// Only rows created longer ago than this (zero: every row).
    pub min_age: Duration,
    pub batch_size: u32,
    /// How long a claimed row stays SENDING before anyone may take it back.
    pub lease: Duration,
}

impl SweepSettings {
    /// Poll mode: every PENDING row, `[poll]` interval and batch.
    pub fn poll(config: &Config) -> Self {
        SweepSettings {
            interval: config.poll.interval,
            min_age: Duration::ZERO,
            batch_size: config.poll.batch_size,
            lease: config.sweeper.lease,
        }
    }

    /// Beside the stream: rows older than `sweeper.min_age`, `[sweeper]` interval and batch.
    pub fn beside_stream(config: &Config) -> Self {
        SweepSettings {
            interval: config.sweeper.interval,
            min_age: config.sweeper.min_age,
            batch_size: config.sweeper.batch_size,
            lease: config.sweeper.lease,
        }
    }
}

/// Rows a stream holds a key back for (older rows of the key it did not read in the binlog):
/// the sweeper claims them at once, whatever their age, so the key's order is kept and its
/// stream events wait only as long as it takes to send them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nudge {
    pub table: TableName,
    pub ids: Vec<u64>,
}

/// A sweeper ready to run: one [`Claimer`] per outbox table.
pub struct Sweeper {
    pool: Pool,
    claimers: Vec<Claimer>,
    tables: Vec<TableName>,
    owner: String,
    /// What this process's claims hold (the lease keeper renews exactly these).
    held: HeldRows,
    settings: SweepSettings,
}

impl Sweeper {
    /// Checks the tables and picks the claim strategy (`strategy`, or detected from the server's
    /// version); claims go through `pool` (see [`crate::db::writer_pool`]) as `owner`.
    pub async fn new(
        pool: Pool,
        tables: Vec<TableName>,
        owner: String,
        settings: SweepSettings,
        limits: RowLimits,
        strategy: Option<ClaimStrategy>,
    ) -> Result<Self, DbError> {
        let strategy = match strategy {
            Some(strategy) => strategy,
            None => detect_strategy(&pool, &tables).await?,
        };
        tracing::info!(?strategy, %owner, lease = ?settings.lease, interval = ?settings.interval,
            min_age = ?settings.min_age, "sweeper: claiming PENDING rows");
        let held = HeldRows::default();
        let claimers = tables
            .iter()
            .map(|table| Claimer {
                table: Arc::new(table.clone()),
                owner: owner.clone(),
                lease: settings.lease,
                batch_size: settings.batch_size,
                min_age: settings.min_age,
                strategy,
                limits,
                cursor: Default::default(),
                held: held.clone(),
                stalls: Default::default(),
            })
            .collect();
        Ok(Sweeper {
            pool,
            claimers,
            tables,
            owner,
            held,
            settings,
        })
    }

    /// Starts claiming into `shards` (bad rows go to `completions`, the marker's input), and keeping
    /// this process's leases; `nudges` (beside a stream) asks for rows to claim at once.
    pub fn spawn(
        self,
        inputs: SendInputs,
        mut gate: SweepGate,
        mut nudges: Option<mpsc::Receiver<Nudge>>,
    ) -> RunningSweeper {
        let claim_stop = CancellationToken::new();
        let leases_stop = CancellationToken::new();
        let every = lease::renew_every(self.settings.lease, Duration::from_secs(5));
        let leases_task = tokio::spawn(lease::keep(
            self.pool.clone(),
            self.tables.clone(),
            self.owner.clone(),
            self.held.clone(),
            self.settings.lease,
            every,
            leases_stop.clone(),
        ));
        let claim_task = {
            // Claims leave the rows of the topics the shards find stalled alone.
            let claimers: Vec<Claimer> = self
                .claimers
                .into_iter()
                .map(|claimer| Claimer {
                    stalls: Arc::clone(inputs.stalls()),
                    ..claimer
                })
                .collect();
            let (pool, stop) = (self.pool.clone(), claim_stop.clone());
            let interval = self.settings.interval;
            tokio::spawn(async move {
                let rounds = Rounds {
                    gate: &mut gate,
                    interval,
                    nudges: &mut nudges,
                };
                claim_loop(&pool, &claimers, &inputs, rounds, &stop).await
            })
        };
        RunningSweeper {
            pool: self.pool,
            tables: self.tables,
            owner: self.owner,
            claim_task: Some(claim_task),
            claim_stop,
            leases_task,
            leases_stop,
        }
    }
}

/// A running sweeper. Stop it in two steps: [`RunningSweeper::stop_claiming`] (before the shards
/// drain), then [`RunningSweeper::finish`] (after every outcome was recorded).
pub struct RunningSweeper {
    pool: Pool,
    tables: Vec<TableName>,
    owner: String,
    claim_task: Option<JoinHandle<()>>,
    claim_stop: CancellationToken,
    leases_task: JoinHandle<()>,
    leases_stop: CancellationToken,
}

impl RunningSweeper {
    /// Stops claiming and lets go of the shard inputs; leases are still kept.
    pub async fn stop_claiming(&mut self) {
        self.claim_stop.cancel();
        if let Some(task) = self.claim_task.take() {
            let _ = task.await;
        }
    }

    /// Stops keeping leases and releases the rows this owner still holds (not sent, or not
    /// proven sent) back to PENDING.
    pub async fn finish(mut self) {
        self.stop_claiming().await;
        self.leases_stop.cancel();
        let _ = self.leases_task.await;
        lease::release_all(&self.pool, &self.tables, &self.owner).await;
        crate::db::close(self.pool).await;
    }
}

/// The claim strategy the server supports; fails if an outbox table cannot be read.
async fn detect_strategy(pool: &Pool, tables: &[TableName]) -> Result<ClaimStrategy, DbError> {
    let asking = "cannot ask the server's version (to choose the sweeper's claim strategy)";
    let mut conn = pool.get_conn().await.map_err(DbError::when(asking))?;
    let version: String = conn
        .query_first("SELECT VERSION()")
        .await
        .map_err(DbError::when(asking))?
        .unwrap_or_default();
    for table in tables {
        conn.query_drop(format!(
            "SELECT id, status, owner, lease_until FROM {} LIMIT 0",
            table.sql()
        ))
        .await
        .map_err(DbError::when(format!(
            "cannot read outbox table {table} (run `outbox-relay migrate`?)"
        )))?;
    }
    let strategy = ClaimStrategy::for_version(&version);
    if strategy == ClaimStrategy::Optimistic {
        tracing::warn!(%version, "server has no SKIP LOCKED: claiming row by row (optimistic)");
    }
    Ok(strategy)
}

/// When the claim loop claims: rounds every `interval` as `gate` allows, and at once for the
/// rows a stream asks for.
struct Rounds<'a> {
    gate: &'a mut SweepGate,
    interval: Duration,
    nudges: &'a mut Option<mpsc::Receiver<Nudge>>,
}

/// Claims and dispatches until `stop` fires; `gate` decides before each round.
async fn claim_loop(
    pool: &Pool,
    claimers: &[Claimer],
    to: &SendInputs,
    rounds: Rounds<'_>,
    stop: &CancellationToken,
) {
    let Rounds {
        gate,
        interval,
        nudges,
    } = rounds;
    let reconnect = RetryPolicy::reconnect();
    let mut failures = 0;
    let base = claimers.first().map_or(Duration::ZERO, |c| c.min_age);
    while !stop.is_cancelled() {
        let mut full = false;
        let mut pause = interval;
        let Some(min_age) = gate.min_age(base, pool).await else {
            tracing::debug!("the stream is stalled: not sweeping beside it this round");
            if pause_or_nudged(pool, claimers, to, nudges, interval, stop).await {
                return;
            }
            continue;
        };
        for claimer in claimers {
            let claimer = &Claimer {
                min_age,
                ..claimer.clone()
            };
            let claimed = crate::db::bounded(async {
                let mut conn = pool.get_conn().await?;
                claimer.claim(&mut conn).await
            })
            .await;
            match claimed {
                Ok(rows) => {
                    failures = 0;
                    full |= rows.len() >= claimer.batch_size as usize;
                    if !rows.is_empty() && !claimer.min_age.is_zero() {
                        crate::metrics::relay().rows_swept.inc_by(rows.len() as u64);
                        tracing::info!(table = %claimer.table, rows = rows.len(),
                            "sweeper claimed PENDING rows the stream has not sent");
                    }
                    if dispatch(rows, to, stop).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    failures += 1;
                    pause = reconnect.delay(failures).unwrap_or(reconnect.max);
                    tracing::warn!(table = %claimer.table, error = %e, retry_in = ?pause,
                        "cannot claim outbox rows; retrying");
                }
            }
        }
        if (!full || failures > 0) && pause_or_nudged(pool, claimers, to, nudges, pause, stop).await
        {
            return;
        }
    }
}

/// Waits `pause`, claiming what nudges ask for meanwhile; true once `stop` fired (or the shards
/// are gone).
async fn pause_or_nudged(
    pool: &Pool,
    claimers: &[Claimer],
    to: &SendInputs,
    nudges: &mut Option<mpsc::Receiver<Nudge>>,
    pause: Duration,
    stop: &CancellationToken,
) -> bool {
    let until = tokio::time::Instant::now() + pause;
    loop {
        let nudge = tokio::select! {
            _ = stop.cancelled() => return true,
            _ = tokio::time::sleep_until(until) => return false,
            Some(nudge) = next_nudge(nudges) => nudge,
        };
        for (table, ids) in with_queued(nudge, nudges) {
            let Some(claimer) = claimers.iter().find(|c| *c.table == table) else {
                continue;
            };
            if claim_nudged(pool, claimer, ids, to, stop).await {
                return true;
            }
        }
    }
}

/// `first` and every nudge queued behind it, as one set of rows per table. A stream that waits
/// asks again at every look (ten times a second) while a claim of the rows it asked for can
/// take seconds; one nudge at a time, a queue of asks made while the oldest row of each key was
/// still under a dead instance's lease (not asked for: not PENDING) was worked through, in full,
/// before the ask that names it: after a `kill -9` and a restart, a stuck topic's parked backlog
/// waited minutes for it. Merged, the oldest rows come first, and asks that are out of date cost
/// one pass.
fn with_queued(
    first: Nudge,
    nudges: &mut Option<mpsc::Receiver<Nudge>>,
) -> BTreeMap<TableName, Vec<u64>> {
    let mut asked: BTreeMap<TableName, Vec<u64>> = BTreeMap::new();
    let mut add = |nudge: Nudge| asked.entry(nudge.table).or_default().extend(nudge.ids);
    add(first);
    if let Some(receiver) = nudges {
        while let Ok(nudge) = receiver.try_recv() {
            add(nudge);
        }
    }
    asked
}

/// Claims and dispatches the rows a stream waits for (`ids`), a batch at a time, oldest first,
/// until all are claimed or sent. All of them at once: a stream held behind a long stall's
/// parked rows waits for every one (100,000 after 10 minutes at 200 events/s), and one batch
/// per ask drained them at ~100 rows/s. True once `stop` fired (or the shards are gone).
async fn claim_nudged(
    pool: &Pool,
    claimer: &Claimer,
    mut ids: Vec<u64>,
    to: &SendInputs,
    stop: &CancellationToken,
) -> bool {
    ids.sort_unstable();
    ids.dedup();
    for batch in ids.chunks(claimer.batch_size.max(1) as usize) {
        if stop.is_cancelled() {
            return true;
        }
        let claimed = crate::db::bounded(async {
            let mut conn = pool.get_conn().await?;
            claimer.claim_these(&mut conn, batch).await
        })
        .await;
        match claimed {
            Ok(rows) => {
                if !rows.is_empty() {
                    crate::metrics::relay().rows_swept.inc_by(rows.len() as u64);
                    tracing::debug!(table = %claimer.table, rows = rows.len(),
                        "sweeper claimed rows the stream holds a key back for");
                }
                if dispatch(rows, to, stop).await.is_err() {
                    return true;
                }
            }
            // The stream asks again while it still waits.
            Err(e) => {
                tracing::warn!(table = %claimer.table, error = %e,
                    "cannot claim the rows a stream waits for; it will ask again");
                return false;
            }
        }
    }
    false
}

/// The next nudge; never, without a nudge channel (or once it closed).
async fn next_nudge(nudges: &mut Option<mpsc::Receiver<Nudge>>) -> Option<Nudge> {
    match nudges {
        Some(receiver) => match receiver.recv().await {
            Some(nudge) => Some(nudge),
            None => {
                *nudges = None;
                std::future::pending().await
            }
        },
        None => std::future::pending().await,
    }
}

/// Hands claimed rows to their shards in claim (id) order; bad rows go straight to the marker.
/// A row not handed on before `stop` stays claimed and is released at the end.
async fn dispatch(
    rows: Vec<Claimed>,
    to: &SendInputs,
    stop: &CancellationToken,
) -> Result<(), Stopped> {
    for row in rows {
        let sent = match row {
            Claimed::Event(row) => {
                tokio::select! {
                    _ = stop.cancelled() => return Err(Stopped),
                    sent = to.send(ShardEvent::claimed(row)) => sent,
                }
            }
            Claimed::Problem(problem) => {
                to.complete(Completion::bad_row(Origin::Claimed, problem))
                    .await
            }
        };
        sent?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_nudges_are_claimed_as_one_set_per_table() {
        let (tx, rx) = mpsc::channel(8);
        let table = |name: &str| TableName::parse(name).unwrap();
        let nudge = |name: &str, ids: &[u64]| Nudge {
            table: table(name),
            ids: ids.to_vec(),
        };
        tx.try_send(nudge("app.outbox_event", &[7, 9])).unwrap();
        tx.try_send(nudge("app.other_outbox", &[3])).unwrap();
        tx.try_send(nudge("app.outbox_event", &[2, 9])).unwrap();
        let mut nudges = Some(rx);
        let asked = with_queued(nudge("app.outbox_event", &[9, 11]), &mut nudges);
        assert_eq!(
            asked.into_iter().collect::<Vec<_>>(),
            vec![
                (table("app.other_outbox"), vec![3]),
                (table("app.outbox_event"), vec![9, 11, 7, 9, 2, 9]),
            ]
        );
        assert!(nudges.unwrap().try_recv().is_err(), "the queue is drained");
    }
}
