//! `outbox-dev demo`: what business code does — change a row and enqueue an event in the
//! same transaction — so a newcomer can watch events appear in the outbox (and, with the relay
//! running, in RocketMQ).

use crate::GlobalArgs;
use clap::Args;
use mysql_async::prelude::*;
use mysql_async::TxOpts;
use rocketmq_outbox::db;
use rocketmq_outbox::producer::{NewEvent, Outbox};
use serde_json::json;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How many orders to pay (one event each).
    #[arg(long, default_value_t = 3)]
    pub events: u32,
    /// Topic of the sample events.
    #[arg(long, default_value = "outbox-demo")]
    pub topic: String,
}

/// One sample order paid and its event enqueued, both in one transaction.
#[derive(Debug, Clone)]
pub struct DemoEvent {
    pub order_id: u64,
    pub event_id: String,
}

pub async fn run(global: &GlobalArgs, args: DemoArgs) -> anyhow::Result<()> {
    let config = global.load_config()?;
    let pool = db::pool(&config)?;
    let outbox = config.producer();
    let written = write_demo_events(&pool, &outbox, &args).await?;
    for event in &written {
        println!(
            "order {} paid; event {} enqueued on topic {} in the same transaction",
            event.order_id, event.event_id, args.topic
        );
    }
    print_outbox_rows(&pool, &config.outbox_tables()[0].sql(), written.len()).await?;
    pool.disconnect().await?;
    Ok(())
}

/// Pays `args.events` sample orders, each in its own transaction with its event.
pub async fn write_demo_events(
    pool: &mysql_async::Pool,
    outbox: &Outbox,
    args: &DemoArgs,
) -> anyhow::Result<Vec<DemoEvent>> {
    let mut conn = pool.get_conn().await?;
    conn.query_drop(
        "CREATE TABLE IF NOT EXISTS demo_order (
           id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
           amount_cents BIGINT NOT NULL,
           state VARCHAR(16) NOT NULL
         ) ENGINE = InnoDB",
    )
    .await?;
    drop(conn);
    let mut written = Vec::new();
    for i in 0..args.events {
        let amount = 1000 + u64::from(i) * 250;
        let mut tx = pool.start_transaction(TxOpts::default()).await?;
        tx.exec_drop(
            "INSERT INTO demo_order (amount_cents, state) VALUES (?, 'PAID')",
            (amount,),
        )
        .await?;
        let order_id = tx.last_insert_id().unwrap_or_default();
        let event = NewEvent::new(
            args.topic.clone(),
            format!("order-{order_id}"),
            json!({ "type": "OrderPaid", "order_id": order_id, "amount_cents": amount }),
        )
        .with_tags("OrderPaid");
        let event_id = outbox.enqueue(&mut tx, event).await?;
        tx.commit().await?;
        written.push(DemoEvent {
            order_id,
            event_id: event_id.into(),
        });
    }
    Ok(written)
}

async fn print_outbox_rows(
    pool: &mysql_async::Pool,
    table: &str,
    limit: usize,
) -> anyhow::Result<()> {
    let mut conn = pool.get_conn().await?;
    let rows: Vec<(u64, String, String, u8, Option<String>)> = conn
        .query(format!(
            "SELECT id, event_id, biz_key, status, NULLIF(msg_id, '') FROM {table} ORDER BY id DESC LIMIT {limit}"
        ))
        .await?;
    println!("\nnewest rows of {table} (status 0 PENDING, 1 SENDING, 2 SENT, 3 FAILED):");
    println!(
        "{:>6}  {:<36}  {:<12} {:>6}  msg_id",
        "id", "event_id", "biz_key", "status"
    );
    for (id, event_id, biz_key, status, msg_id) in rows.into_iter().rev() {
        println!(
            "{id:>6}  {event_id:<36}  {biz_key:<12} {status:>6}  {}",
            msg_id.unwrap_or_else(|| "-".into())
        );
    }
    Ok(())
}
