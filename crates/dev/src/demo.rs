//! `outbox-dev demo`: what business code does — change a row and enqueue an event in the
//! same transaction — so a newcomer can watch events appear in the outbox (and, with the relay
//! running, in RocketMQ).

use crate::GlobalArgs;
use clap::Args;
use mysql_async::prelude::*;
use mysql_async::TxOpts;
use rocketmq_outbox::db;
use rocketmq_outbox::outbox::Status;
use rocketmq_outbox::producer::{NewEvent, Outbox};
use serde_json::json;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How many orders to pay (one event each).
    #[arg(long, default_value_t = 3)]
    pub events: u32,
    /// Topic of the sample events.
    #[arg(long, default_value = "outbox-demo")]
    pub topic: String,
    /// How long to wait for the relay to deliver them before printing their rows (`0s`: print
    /// them at once, PENDING).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub wait: Duration,
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
    let table = config.outbox_tables()[0].sql();
    let ids: Vec<String> = written.iter().map(|e| e.event_id.clone()).collect();
    if !args.wait.is_zero() {
        println!(
            "waiting up to {:?} for the relay to deliver them ...",
            args.wait
        );
    }
    let rows = wait_for_outcomes(&pool, &table, &ids, args.wait).await?;
    print_rows(&table, &rows);
    let waiting = rows.iter().filter(|r| !r.has_outcome()).count();
    if waiting > 0 && !args.wait.is_zero() {
        println!(
            "\n{waiting} still waiting after {:?}: is the relay running (`outbox-dev up`, or \
             `outbox-relay run`)? They are delivered once it runs.",
            args.wait
        );
    }
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

/// An outbox row of a demo event, as `demo` shows it.
#[derive(Debug)]
pub struct DemoRow {
    pub id: u64,
    pub event_id: String,
    pub biz_key: String,
    pub status: Option<Status>,
    pub msg_id: Option<String>,
}

impl DemoRow {
    /// SENT or FAILED: the relay is done with it.
    pub fn has_outcome(&self) -> bool {
        matches!(self.status, Some(Status::Sent | Status::Failed))
    }
}

/// The rows of `event_ids` in `table`, once each is SENT or FAILED or `wait` has passed.
pub async fn wait_for_outcomes(
    pool: &mysql_async::Pool,
    table: &str,
    event_ids: &[String],
    wait: Duration,
) -> anyhow::Result<Vec<DemoRow>> {
    let deadline = Instant::now() + wait;
    let placeholders = vec!["?"; event_ids.len()].join(", ");
    let sql = format!(
        "SELECT id, event_id, biz_key, status, NULLIF(msg_id, '') FROM {table} \
         WHERE event_id IN ({placeholders}) ORDER BY id"
    );
    loop {
        let rows: Vec<(u64, String, String, i64, Option<String>)> = pool
            .get_conn()
            .await?
            .exec(sql.as_str(), event_ids.to_vec())
            .await?;
        let rows: Vec<DemoRow> = (rows.into_iter())
            .map(|(id, event_id, biz_key, status, msg_id)| DemoRow {
                id,
                event_id,
                biz_key,
                status: Status::from_code(status),
                msg_id,
            })
            .collect();
        if rows.iter().all(DemoRow::has_outcome) || Instant::now() >= deadline {
            return Ok(rows);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn print_rows(table: &str, rows: &[DemoRow]) {
    println!("\ntheir rows in {table}:");
    println!(
        "{:>6}  {:<36}  {:<12} {:<8} msg_id (the id the broker stored)",
        "id", "event_id", "biz_key", "status"
    );
    for row in rows {
        println!(
            "{:>6}  {:<36}  {:<12} {:<8} {}",
            row.id,
            row.event_id,
            row.biz_key,
            row.status.map_or("?", Status::name),
            row.msg_id.as_deref().unwrap_or("-")
        );
    }
}
