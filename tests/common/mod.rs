//! Shared fixtures for integration tests: one real SQL server per test run (the one
//! `scripts/test.sh` shares with every binary, else started on first use and killed when the
//! binary exits), and a fresh database per test. `OUTBOX_TEST_DB` picks the server: `mariadb`
//! (the default) or `mysql`.
#![allow(dead_code)]

pub mod http;
pub mod java_client;
pub mod ledger;
pub mod process;
pub mod proxy;
pub mod reads;
pub mod relay;
pub mod rocketmq;
pub mod rows;

use mysql_async::prelude::*;
use mysql_async::{Conn, Pool};
use outbox_devenv::SqlServer;
use outbox_devenv::{scratch_dir, Database, DatabaseKind};
use rocketmq_outbox::config::Config;
use rocketmq_outbox::outbox::TableName;
use std::sync::OnceLock;

/// The development binary `outbox-dev` (`demo`, `up`, `servers`), built beside the relay by
/// `cargo build --workspace --bins` (scripts/test.sh does).
pub fn outbox_dev() -> std::path::PathBuf {
    outbox_devenv::workspace_binary("outbox-dev")
}

/// The binary's SQL server, of `$OUTBOX_TEST_DB`'s kind. Tests must not stop it, nor change
/// what every client of it sees (global settings, purged binlogs): such a test takes
/// [`own_database`]. A test that restarts its server starts its own.
pub fn database() -> &'static Database {
    static SERVER: OnceLock<Database> = OnceLock::new();
    SERVER.get_or_init(|| {
        if let Some(shared) = outbox_devenv::shared::database() {
            return shared;
        }
        own_database("shared")
    })
}

/// A SQL server of `$OUTBOX_TEST_DB`'s kind that only the calling test uses (stopped when
/// dropped), for a test that changes what every client of a server sees: the tests running
/// beside it on [`database`] would see that change too.
pub fn own_database(label: &str) -> Database {
    let kind = DatabaseKind::from_env().expect("OUTBOX_TEST_DB");
    let dir = scratch_dir(&format!("{}-{label}", kind.name())).expect("scratch dir");
    Database::start(kind, &dir).unwrap_or_else(|e| {
        panic!(
            "{} must start (run scripts/setup.sh{}): {e}",
            kind.name(),
            if kind == DatabaseKind::MySql {
                " --mysql"
            } else {
                ""
            }
        )
    })
}

/// A test's own database on the shared server, migrated, with a pool and a config pointing at it.
pub struct TestDb {
    pub url: String,
    pub pool: Pool,
    pub config: Config,
}

impl TestDb {
    /// A new empty database, not migrated.
    pub async fn empty(prefix: &str) -> Self {
        Self::empty_on(database(), prefix).await
    }

    /// A new empty database on `server`, not migrated.
    pub async fn empty_on(server: &Database, prefix: &str) -> Self {
        init_logging();
        let url = server.create_database(prefix).expect("create database");
        let mut config = Config::default();
        config.mysql.url = Some(url.clone());
        let pool = rocketmq_outbox::db::pool(&config).expect("pool");
        TestDb { url, pool, config }
    }

    /// A new database with every migration applied.
    pub async fn migrated(prefix: &str) -> Self {
        Self::migrated_on(database(), prefix).await
    }

    /// A new database on `server` with every migration applied.
    pub async fn migrated_on(server: &Database, prefix: &str) -> Self {
        let db = Self::empty_on(server, prefix).await;
        let mut conn = db.conn().await;
        rocketmq_outbox::schema::migrate(&mut conn, &db.config.outbox_tables())
            .await
            .expect("migrate");
        db
    }

    /// Another handle on the same database (same pool), e.g. for a spawned writer task.
    pub fn clone_handle(&self) -> Self {
        TestDb {
            url: self.url.clone(),
            pool: self.pool.clone(),
            config: self.config.clone(),
        }
    }

    /// The database's name (the last part of its URL).
    pub fn name(&self) -> String {
        self.url.rsplit('/').next().expect("a URL").to_string()
    }

    pub async fn conn(&self) -> Conn {
        self.pool.get_conn().await.expect("connection")
    }

    /// `SELECT COUNT(*)` of a table.
    pub async fn count(&self, table: &str) -> u64 {
        let table = TableName::parse(table).expect("table name");
        self.conn()
            .await
            .query_first(format!("SELECT COUNT(*) FROM {}", table.sql()))
            .await
            .expect("count")
            .unwrap_or_default()
    }
}

/// Polls `condition` every 20 ms until it holds; panics naming `what` after `timeout`.
pub async fn wait_until<F, Fut>(what: &str, timeout: std::time::Duration, condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_until_every(
        what,
        timeout,
        std::time::Duration::from_millis(20),
        condition,
    )
    .await
}

/// [`wait_until`] polling every `period`.
pub async fn wait_until_every<F, Fut>(
    what: &str,
    timeout: std::time::Duration,
    period: std::time::Duration,
    mut condition: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + timeout;
    while !condition().await {
        if std::time::Instant::now() >= deadline {
            timed_out(what, timeout);
        }
        tokio::time::sleep(period).await;
    }
}

/// Fails the test: `timeout` passed waiting for `what`, with the binary's notes.
pub fn timed_out(what: &str, timeout: std::time::Duration) -> ! {
    // Read before panicking (a panic holding the lock would poison it for every later test of
    // the binary).
    let notes: String = timeout_notes()
        .iter()
        .map(|note| format!("\n(in this test binary) {note}"))
        .collect();
    panic!("timed out after {timeout:?} waiting for {what}{notes}");
}

/// How long the isolation and cluster tests hold a fault once the relay has met it: `short`
/// (what CI runs), or `OUTBOX_FAULT_HOLD_SECS` seconds when set. The 5-minute runs are
/// `OUTBOX_FAULT_HOLD_SECS=300 cargo test --features failpoints --test suite -- isolation::
/// cluster::`; waits that scale with the backlog a fault leaves scale with it.
pub fn fault_hold(short: std::time::Duration) -> std::time::Duration {
    match std::env::var("OUTBOX_FAULT_HOLD_SECS") {
        Ok(secs) => std::time::Duration::from_secs(
            secs.parse()
                .expect("OUTBOX_FAULT_HOLD_SECS is a number of seconds"),
        ),
        Err(_) => short,
    }
}

/// What a timed-out wait should also report (a relay that ended on its own, with how).
static TIMEOUT_NOTES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Adds `note` to what every later timed-out wait of this binary reports.
pub fn note_for_timeouts(note: String) {
    timeout_notes().push(note);
}

/// The notes; a test that panicked elsewhere does not take them from the others.
fn timeout_notes() -> std::sync::MutexGuard<'static, Vec<String>> {
    TIMEOUT_NOTES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Relay logs go to the test's captured output (shown when a test fails); `RUST_LOG` overrides
/// the default `warn,rocketmq_outbox=info`.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,rocketmq_outbox=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .with_ansi(false)
        .try_init();
}
