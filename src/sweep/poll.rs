//! Poll mode: the polling relay on its own, for servers without binlog access and as the
//! benchmark baseline. Claim a batch → route → the same ordered shard senders as the CDC relay
//! → the marker (owner rule) ; leases renewed and expired ones recovered beside it.

use super::claim::{ClaimStrategy, Claimed, Claimer};
use super::lease;
use crate::binlog::decode::RowLimits;
use crate::binlog::BinlogPosition;
use crate::config::{Config, TableName};
use crate::mark::{run_marker, MarkRule};
use crate::relay::{qualified_tables, RunOptions, RunSummary, Shards};
use crate::retry::RetryPolicy;
use crate::route::Router;
use crate::send::{Completion, ShardEvent, Sink};
use mysql_async::prelude::*;
use mysql_async::Pool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Runs the polling relay until `cancel` fires (then drains in-flight events, records their
/// outcomes and releases the rows it still holds) or a start-up error.
///
/// Every `poll.interval` it claims up to `poll.batch_size` rows per table (at once again when a
/// claim came back full, to drain a backlog), under a `sweeper.lease` lease owned by
/// `config.instance_id()`.
pub async fn run_poll<S: Sink>(
    config: &Config,
    sink: Arc<S>,
    options: RunOptions,
    cancel: CancellationToken,
) -> anyhow::Result<RunSummary> {
    // READ COMMITTED on every connection: claims, lease updates and marks take no gap locks,
    // so they never block or deadlock the producers' INSERTs.
    let opts = mysql_async::OptsBuilder::from_opts(crate::db::opts(config)?).init(vec![
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    ]);
    let pool = Pool::new(opts);
    let tables = qualified_tables(config)?;
    let strategy = match options.claim_strategy {
        Some(strategy) => strategy,
        None => detect_strategy(&pool, &tables).await?,
    };
    let owner = config.instance_id();
    let lease_length = config.sweeper.lease;
    if lease_length < config.rocketmq.send_timeout * 5 {
        tracing::warn!(lease = ?lease_length, send_timeout = ?config.rocketmq.send_timeout,
            "sweeper.lease is under 5 × rocketmq.send_timeout: a stalled instance's rows may be taken over (and sent twice) early");
    }
    tracing::info!(?strategy, %owner, lease = ?lease_length, interval = ?config.poll.interval,
        "poll mode: claiming PENDING rows");
    let claimers: Vec<Claimer> = tables
        .iter()
        .map(|table| Claimer {
            table: Arc::new(table.clone()),
            owner: owner.clone(),
            lease: lease_length,
            batch_size: config.poll.batch_size,
            strategy,
            limits: RowLimits {
                max_payload_bytes: config.outbox.max_payload_bytes,
            },
        })
        .collect();

    // The same machinery as the CDC relay: shards → marker (owner rule, no watermark).
    let (done_tx, done_rx) = mpsc::channel(super::CHANNEL_CAPACITY);
    let router = Router::new(config.relay.shards);
    let (shards, shard_inputs) = Shards::start(
        &sink,
        router.shards(),
        super::CHANNEL_CAPACITY,
        RetryPolicy::from_config(&config.retry),
        &done_tx,
    );
    let marker_task = tokio::spawn(run_marker(
        pool.clone(),
        done_rx,
        MarkRule::Claimed {
            owner: owner.clone(),
        },
    ));
    let leases_stop = CancellationToken::new();
    let leases_task = tokio::spawn(keep_leases(
        pool.clone(),
        tables.clone(),
        owner.clone(),
        lease_length,
        lease::renew_every(lease_length, config.sweeper.interval),
        leases_stop.clone(),
    ));

    claim_loop(
        &pool,
        &claimers,
        &router,
        &shard_inputs,
        &done_tx,
        config.poll.interval,
        &cancel,
    )
    .await;

    // Stopped claiming: let the shards finish what they hold, within the drain timeout.
    drop(shard_inputs);
    drop(done_tx);
    shards
        .drain(
            options.drain_timeout,
            "their rows are released and sent again",
        )
        .await;
    let marked = marker_task.await?;
    leases_stop.cancel();
    let _ = leases_task.await;
    // Every outcome is recorded; what this instance still holds was not sent (or not proven).
    match pool.get_conn().await {
        Ok(mut conn) => {
            for table in &tables {
                match lease::release(&mut conn, table, &owner).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(%table, rows = n, "released unsent claimed rows"),
                    Err(e) => tracing::warn!(%table, error = %e,
                        "cannot release claimed rows; they return when their lease expires"),
                }
            }
        }
        Err(e) => tracing::warn!(error = %e,
            "cannot release claimed rows; they return when their lease expires"),
    }
    pool.disconnect().await?;
    Ok(RunSummary {
        marked,
        checkpoint: BinlogPosition::default(),
        unidentifiable: 0,
    })
}

/// The claim strategy the server supports; fails if an outbox table cannot be read.
async fn detect_strategy(pool: &Pool, tables: &[TableName]) -> anyhow::Result<ClaimStrategy> {
    let mut conn = pool.get_conn().await?;
    let version: String = conn
        .query_first("SELECT VERSION()")
        .await?
        .unwrap_or_default();
    for table in tables {
        conn.query_drop(format!(
            "SELECT id, status, owner, lease_until FROM {} LIMIT 0",
            table.sql()
        ))
        .await
        .map_err(|e| {
            anyhow::anyhow!("cannot read outbox table {table} (run `outbox-relay migrate`?): {e}")
        })?;
    }
    let strategy = ClaimStrategy::for_version(&version);
    if strategy == ClaimStrategy::Optimistic {
        tracing::warn!(%version, "server has no SKIP LOCKED: claiming row by row (optimistic)");
    }
    Ok(strategy)
}

/// Claims and dispatches until `cancel` fires.
async fn claim_loop(
    pool: &Pool,
    claimers: &[Claimer],
    router: &Router,
    shards: &[mpsc::Sender<ShardEvent>],
    problems: &mpsc::Sender<Completion>,
    interval: Duration,
    cancel: &CancellationToken,
) {
    let reconnect = RetryPolicy::reconnect();
    let mut failures = 0;
    while !cancel.is_cancelled() {
        let mut full = false;
        let mut pause = interval;
        for claimer in claimers {
            let claimed = match pool.get_conn().await {
                Ok(mut conn) => claimer.claim(&mut conn).await,
                Err(e) => Err(e),
            };
            match claimed {
                Ok(rows) => {
                    failures = 0;
                    full |= rows.len() >= claimer.batch_size as usize;
                    if dispatch(rows, router, shards, problems, cancel)
                        .await
                        .is_err()
                    {
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
        if !full || failures > 0 {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// Hands claimed rows to their shards in claim (id) order; bad rows go straight to the marker.
async fn dispatch(
    rows: Vec<Claimed>,
    router: &Router,
    shards: &[mpsc::Sender<ShardEvent>],
    problems: &mpsc::Sender<Completion>,
    cancel: &CancellationToken,
) -> Result<(), ()> {
    for row in rows {
        let sent = match row {
            Claimed::Event(row) => {
                let event = ShardEvent::claimed(row);
                let shard = &shards[router.shard(event.key_hash)];
                tokio::select! {
                    _ = cancel.cancelled() => return Err(()),
                    sent = shard.send(event) => sent.map_err(|_| ()),
                }
            }
            Claimed::Problem(problem) => problems
                .send(Completion::bad_row(None, problem))
                .await
                .map_err(|_| ()),
        };
        sent?;
    }
    Ok(())
}

/// Every `every`: renews this instance's leases and returns expired ones (anyone's) to PENDING.
async fn keep_leases(
    pool: Pool,
    tables: Vec<TableName>,
    owner: String,
    lease_length: Duration,
    every: Duration,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let mut conn = match pool.get_conn().await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "cannot renew or recover leases; retrying");
                continue;
            }
        };
        for table in &tables {
            if let Err(e) = lease::renew(&mut conn, table, &owner, lease_length).await {
                tracing::warn!(%table, error = %e, "cannot renew leases; retrying");
            }
            match lease::recover_expired(&mut conn, table).await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(%table, rows = n,
                    "SENDING rows with an expired lease returned to PENDING (an instance stopped or stalled)"),
                Err(e) => {
                    tracing::warn!(%table, error = %e, "cannot recover expired leases; retrying")
                }
            }
        }
    }
}
