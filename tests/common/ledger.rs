//! A business handler for consumer tests: each event appends one `ledger` row (the business
//! effect; no unique key, so a duplicate effect would show as a second row). Failures can be
//! planned per event, and a gate can hold the first attempt inside its transaction.

use super::TestDb;
use mysql_async::prelude::*;
use mysql_async::Transaction;
use rocketmq_outbox::consumer::{ConsumedEvent, Handler, Outcome};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use tokio::sync::watch;

/// The business table. `seq` orders one account's events; `handled_by` names the consumer.
pub const LEDGER_DDL: &str = "CREATE TABLE ledger (
    id         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_key  VARCHAR(191) NOT NULL,
    account    VARCHAR(64)  NOT NULL,
    amount     BIGINT       NOT NULL,
    seq        BIGINT       NULL,
    handled_by VARCHAR(32)  NOT NULL
  ) ENGINE = InnoDB";

/// A migrated test database with the `ledger` table.
pub async fn ledger_db(prefix: &str) -> TestDb {
    let db = TestDb::migrated(prefix).await;
    db.conn()
        .await
        .query_drop(LEDGER_DDL)
        .await
        .expect("ledger table");
    db
}

/// How a planned failure shows itself, after the business row was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Returns `Outcome::Retry`.
    Retry,
    /// Returns `Err` (a database-style error escaping with `?`).
    Error,
    /// Panics.
    Panic,
    /// Never finishes (the processor's timeout must end it).
    Hang,
}

/// Holds the first attempt that reaches it until [`Gate::open`].
#[derive(Debug)]
pub struct Gate {
    /// True once an attempt is held (or was), announced to [`Gate::held`]'s receivers.
    taken: watch::Sender<bool>,
    open: watch::Sender<bool>,
}

impl Gate {
    pub fn new() -> Self {
        Self {
            taken: watch::Sender::new(false),
            open: watch::Sender::new(false),
        }
    }

    /// True once an attempt is held (or was).
    pub fn is_holding(&self) -> bool {
        *self.taken.borrow()
    }

    /// [`Gate::is_holding`], woken when an attempt arrives (see `test_utils::wait_notified`).
    pub fn held(&self) -> watch::Receiver<bool> {
        self.taken.subscribe()
    }

    pub fn open(&self) {
        self.open.send_replace(true);
    }

    async fn pass(&self) {
        if self.taken.send_replace(true) {
            return;
        }
        let mut open = self.open.subscribe();
        let _ = open.wait_for(|open| *open).await;
    }
}

/// The test handler; share it with `Arc` to inspect it while a consumer runs.
#[derive(Debug)]
pub struct Ledger {
    name: String,
    calls: AtomicU32,
    plan: Mutex<HashMap<String, (u32, Failure)>>,
    gate: Option<Gate>,
}

impl Ledger {
    /// A handler that names itself `name` in `ledger.handled_by`.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            calls: AtomicU32::new(0),
            plan: Mutex::new(HashMap::new()),
            gate: None,
        }
    }

    /// Holds the first attempt in its transaction until the gate opens.
    pub fn with_gate(mut self) -> Self {
        self.gate = Some(Gate::new());
        self
    }

    /// The first `times` attempts of the event with dedup key `key` fail as `how`.
    pub fn fail(&self, key: &str, times: u32, how: Failure) {
        self.plan
            .lock()
            .unwrap()
            .insert(key.to_string(), (times, how));
    }

    pub fn gate(&self) -> &Gate {
        self.gate.as_ref().expect("a ledger built with_gate")
    }

    /// Handler invocations so far (dedup hits never invoke it).
    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    fn planned_failure(&self, key: &str) -> Option<Failure> {
        let mut plan = self.plan.lock().unwrap();
        let (left, how) = plan.get_mut(key)?;
        if *left == 0 {
            return None;
        }
        *left -= 1;
        Some(*how)
    }
}

impl Handler for Ledger {
    async fn handle(
        &self,
        event: &ConsumedEvent,
        tx: &mut Transaction<'static>,
    ) -> anyhow::Result<Outcome> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let payload: serde_json::Value = match event.json() {
            Ok(value) => value,
            Err(e) => return Ok(Outcome::Reject(format!("payload is not JSON: {e}"))),
        };
        if let Some(why) = payload["bad"].as_str() {
            return Ok(Outcome::Reject(format!("bad event: {why}")));
        }
        let key = event.dedup_key().map_err(anyhow::Error::msg)?;
        tx.exec_drop(
            "INSERT INTO ledger (event_key, account, amount, seq, handled_by) VALUES (?, ?, ?, ?, ?)",
            (
                &key,
                payload["account"].as_str().unwrap_or("none"),
                payload["amount"].as_i64().unwrap_or(0),
                payload["seq"].as_i64(),
                &self.name,
            ),
        )
        .await?;
        match self.planned_failure(&key) {
            None => {}
            Some(Failure::Retry) => return Ok(Outcome::Retry("planned retry".into())),
            Some(Failure::Error) => anyhow::bail!("planned error after the business write"),
            Some(Failure::Panic) => panic!("planned panic after the business write"),
            Some(Failure::Hang) => std::future::pending::<()>().await,
        }
        if let Some(gate) = &self.gate {
            gate.pass().await;
        }
        Ok(Outcome::Success)
    }
}

/// Waits until some transaction is blocked on a row lock (e.g. a second attempt at a dedup key
/// held by an attempt parked at a [`Gate`]).
///
/// Polls every 150 ms: InnoDB refreshes its `information_schema` transaction tables only when
/// they were not read for 100 ms, so faster polling keeps showing the first snapshot forever.
pub async fn wait_for_lock_wait(db: &TestDb, timeout: std::time::Duration) {
    super::wait_until_every(
        "a transaction waiting for a row lock",
        timeout,
        std::time::Duration::from_millis(150),
        || async {
            let waiting: Option<u64> = db
                .conn()
                .await
                .query_first(
                    "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'",
                )
                .await
                .expect("INNODB_TRX");
            waiting.unwrap_or(0) > 0
        },
    )
    .await;
}
