//! `outbox-dev consume`: an example consumer built on the consumer library. It settles the
//! demo's "OrderPaid" events idempotently and prints what became of every delivery.
//!
//! Per event, in one transaction with the dedup mark: move `demo_order` from PAID to SETTLED
//! (a state-machine guard: a repeated or illegal move is ignored) and, when it moved, write one
//! `demo_settlement` row. Delivering an event twice settles the order once.

use crate::GlobalArgs;
use anyhow::Context;
use clap::Args;
use mysql_async::prelude::*;
use mysql_async::Transaction;
use rocketmq_outbox::consumer::{
    ClientSecurity, ConsumedEvent, ConsumerMetrics, Disposition, Handler, IdempotentProcessor,
    IdempotentPushConsumer, ListenerMode, Outcome, PushConsumerOptions, StateGuard, StateMachine,
    Transition,
};
use rocketmq_outbox::db;
use rocketmq_outbox::rocketmq_client::ClientHost;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// Topic to consume.
    #[arg(long, default_value = "outbox-demo")]
    pub topic: String,
    /// Consumer group: RocketMQ offsets and the dedup marks are kept per group.
    #[arg(long, default_value = "outbox-demo-settlement")]
    pub group: String,
    /// Consume each queue in order (orderly listener) instead of concurrently.
    #[arg(long)]
    pub orderly: bool,
    /// A new group starts with new messages only (default: from the first stored message).
    #[arg(long)]
    pub from_last: bool,
    /// Exit after this many deliveries (default: run until Ctrl-C).
    #[arg(long)]
    pub max_messages: Option<u64>,
}

const SETTLEMENT_DDL: &str = "CREATE TABLE IF NOT EXISTS demo_settlement (
    order_id     BIGINT       NOT NULL PRIMARY KEY,
    amount_cents BIGINT       NOT NULL,
    event_id     VARCHAR(191) NOT NULL,
    settled_at   DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
  ) ENGINE = InnoDB";

/// Settles one "OrderPaid" event; see the module docs.
struct SettleOrderPaid {
    guard: StateGuard,
}

#[derive(serde::Deserialize)]
struct OrderPaid {
    order_id: u64,
    amount_cents: i64,
}

impl Handler for SettleOrderPaid {
    async fn handle(
        &self,
        event: &ConsumedEvent,
        tx: &mut Transaction<'static>,
    ) -> anyhow::Result<Outcome> {
        if event.event_type.as_deref() != Some("OrderPaid") {
            return Ok(Outcome::Reject(format!(
                "unknown event type {:?}",
                event.event_type.as_deref().unwrap_or("(none)")
            )));
        }
        let paid: OrderPaid = match event.json() {
            Ok(paid) => paid,
            Err(e) => return Ok(Outcome::Reject(format!("malformed OrderPaid payload: {e}"))),
        };
        match self.guard.apply(tx, paid.order_id, "SETTLED").await? {
            Transition::Apply => {
                let event_id = event.dedup_key().unwrap_or_default();
                tx.exec_drop(
                    "INSERT INTO demo_settlement (order_id, amount_cents, event_id) VALUES (?, ?, ?)",
                    (paid.order_id, paid.amount_cents, event_id),
                )
                .await?;
                Ok(Outcome::Success)
            }
            // Already settled by another event, or in a state that cannot settle: nothing to do.
            Transition::Repeated | Transition::Illegal { .. } => Ok(Outcome::Success),
            Transition::Missing => Ok(Outcome::Reject(format!(
                "order {} does not exist in demo_order",
                paid.order_id
            ))),
        }
    }
}

pub async fn run(global: &GlobalArgs, args: ConsumeArgs) -> anyhow::Result<()> {
    let config = global.load_config()?;
    let namesrv = config.namesrv_addr()?.to_string();
    let pool = db::pool(&config)?;
    let mut conn = pool.get_conn().await?;
    let has_orders: Option<String> = conn
        .query_first("SHOW TABLES LIKE 'demo_order'")
        .await
        .context("cannot reach the database")?;
    if has_orders.is_none() {
        anyhow::bail!(
            "table demo_order does not exist: run `outbox-relay migrate` and `outbox-dev demo` first"
        );
    }
    conn.query_drop(SETTLEMENT_DDL).await?;
    drop(conn);

    let metrics = ConsumerMetrics::new();
    let guard = StateGuard::new(
        StateMachine::new([("PAID", "SETTLED")]),
        "demo_order",
        "id",
        "state",
    )?
    .with_metrics(metrics.clone());
    let seen = Arc::new(AtomicU64::new(0));
    let enough = Arc::new(Notify::new());
    let observer = {
        let (seen, enough, max) = (Arc::clone(&seen), Arc::clone(&enough), args.max_messages);
        Arc::new(move |event: &ConsumedEvent, outcome: &Disposition| {
            println!("{}", describe(event, outcome));
            let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
            if max.is_some_and(|max| n >= max) {
                enough.notify_one();
            }
        })
    };
    let processor =
        IdempotentProcessor::new(pool.clone(), args.group.clone(), SettleOrderPaid { guard })?
            .with_metrics(metrics.clone())
            .with_prefilter(10_000)
            .with_observer(observer);
    let mut options = PushConsumerOptions::new(namesrv, args.topic.clone())
        .with_security(ClientSecurity::from_config(&config.rocketmq)?)
        .with_namespace(config.rocketmq.namespace.clone());
    options.from_first_offset = !args.from_last;
    if args.orderly {
        options.mode = ListenerMode::Orderly;
    }
    let host = Arc::new(ClientHost::new("consume")?);
    let consumer =
        IdempotentPushConsumer::start(Arc::clone(&host), options, Arc::new(processor)).await?;
    eprintln!(
        "consuming topic {} as group {} (Ctrl-C to stop)",
        args.topic, args.group
    );
    if args.max_messages == Some(0) {
        enough.notify_one();
    }
    tokio::select! {
        _ = enough.notified() => {}
        signal = tokio::signal::ctrl_c() => signal?,
    }
    consumer.shutdown().await;
    let counts = metrics.counts(&args.group, &args.topic);
    eprintln!(
        "{} deliveries: {} processed, {} duplicates ACKed, {} rejected, {} retried; {} settlement(s) ignored by the state guard",
        counts.consumed,
        counts.processed,
        counts.dedup_hits,
        counts.rejected,
        counts.retries,
        metrics.guard_ignored("state", "repeated") + metrics.guard_ignored("state", "illegal"),
    );
    pool.disconnect().await?;
    Ok(())
}

/// One output line per delivery.
fn describe(event: &ConsumedEvent, outcome: &Disposition) -> String {
    let key = event.dedup_key().unwrap_or_else(|_| "-".into());
    let ack = if outcome.is_ack() { "ACK  " } else { "RETRY" };
    format!(
        "{ack} {outcome}  event {key} biz_key {} queue {} offset {} redelivery {}",
        event.biz_key.as_deref().unwrap_or("-"),
        event.queue_id,
        event.queue_offset,
        event.reconsume_times
    )
}
