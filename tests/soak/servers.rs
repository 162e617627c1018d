//! The soak's own servers: a MariaDB or MySQL (`OUTBOX_TEST_DB`) it may restart and a RocketMQ
//! whose broker it may stop, freeze or restart (the shared per-binary fixtures of `tests/common`
//! must never be stopped). Also the soak database (outbox schema, the business table, a
//! dedicated `relay` account so the harness can tell the relay's connections apart) and
//! resilient helper queries.

use mysql_async::prelude::*;
use mysql_async::{Opts, Pool};
use outbox_devenv::SqlServer;
use outbox_devenv::{
    scratch_dir, Database, DatabaseKind, DatabaseOptions, RocketMq, RocketMqOptions,
};
use rocketmq_outbox::outbox::status::codes::{PENDING, SENDING};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The business table the writers update in the same transaction as their events.
const ACCOUNT_DDL: &str = "CREATE TABLE soak_account (
    biz_key VARCHAR(64) NOT NULL PRIMARY KEY,
    balance BIGINT      NOT NULL,
    version BIGINT      NOT NULL
  ) ENGINE = InnoDB";

/// The consumer's business effect: one row per handler commit, no unique key on purpose, so a
/// handler that ran twice for one event would show as two rows.
const EFFECT_DDL: &str = "CREATE TABLE soak_effect (
    id       BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id VARCHAR(64) NOT NULL,
    biz_key  VARCHAR(64) NOT NULL,
    KEY idx_event (event_id)
  ) ENGINE = InnoDB";

pub const RELAY_USER: &str = "soak_relay";
const RELAY_PASSWORD: &str = "soak-relay-pw";
/// The topic the workload publishes to, and its queue count on each of the two broker groups
/// (`broker-a`'s queues come first in its queue list, then `broker-b`'s).
pub const TOPIC: &str = "soak_events";
pub const QUEUES: u32 = 4;
/// A second topic, written beside the workload, that the stuck-topic fault makes read-only.
pub const SIDE_TOPIC: &str = "soak_side";

pub struct Servers {
    pub database_server: Mutex<Database>,
    pub kind: DatabaseKind,
    pub rocketmq: Mutex<RocketMq>,
    pub database: String,
    port: u16,
    namesrv: String,
    /// Root pool on the soak database (writers, consumer, harness).
    pub pool: Pool,
}

impl Servers {
    /// Starts the SQL server of `$OUTBOX_TEST_DB`'s kind and RocketMQ, creates the database,
    /// the relay account and the topic.
    pub async fn start() -> Self {
        let kind = DatabaseKind::from_env().expect("OUTBOX_TEST_DB");
        let database_server = tokio::task::spawn_blocking(move || {
            let dir = scratch_dir(&format!("soak-{}", kind.name())).expect("scratch dir");
            // Small binlog files: FLUSH/PURGE faults have several files to work with.
            let options = DatabaseOptions {
                extra_args: vec!["--max-binlog-size=4194304".into()],
                ..DatabaseOptions::default()
            };
            Database::start_with(kind, &dir, options).unwrap_or_else(|e| {
                panic!("{} must start (run scripts/setup.sh): {e}", kind.name())
            })
        });
        let rocketmq = tokio::task::spawn_blocking(|| {
            let dir = scratch_dir("soak-rocketmq").expect("scratch dir");
            let options = RocketMqOptions {
                groups: 2,
                auto_create_topics: false,
                ..RocketMqOptions::default()
            };
            let mq = RocketMq::start_with(&dir, options).expect(
                "RocketMQ must start (run scripts/setup.sh; 'disk capacity requires reclaim' \
                 means the disk is too full: TMPDIR=/dev/shm/soak works around it)",
            );
            mq.create_topic(TOPIC, QUEUES).expect("create topic");
            mq.create_topic(SIDE_TOPIC, QUEUES).expect("create topic");
            mq
        });
        let database_server = database_server.await.unwrap();
        let rocketmq = rocketmq.await.unwrap();
        let database = "soak".to_string();
        // ALL PRIVILEGES on *.* covers what the relay needs on either server (REPLICATION
        // SLAVE/CLIENT, MySQL's SESSION_VARIABLES_ADMIN, MariaDB's BINLOG ADMIN). On MySQL the
        // account uses caching_sha2_password, which the relay must pass over plain TCP.
        database_server
            .run_sql_as_root(&format!(
                "CREATE DATABASE {database}; \
                 CREATE USER '{RELAY_USER}'@'127.0.0.1' IDENTIFIED BY '{RELAY_PASSWORD}'; \
                 GRANT ALL PRIVILEGES ON *.* TO '{RELAY_USER}'@'127.0.0.1';"
            ))
            .expect("database and relay account");
        let url = database_server.url(&database);
        let opts = Opts::from_url(&format!("{url}?pool_min=1&pool_max=40")).unwrap();
        let pool = Pool::new(opts);
        let mut conn = pool.get_conn().await.unwrap();
        let tables = rocketmq_outbox::config::Config::default().outbox_tables();
        rocketmq_outbox::schema::migrate(&mut conn, &tables)
            .await
            .expect("migrate");
        conn.query_drop(ACCOUNT_DDL).await.unwrap();
        conn.query_drop(EFFECT_DDL).await.unwrap();
        let (port, namesrv) = (database_server.port(), rocketmq.namesrv_addr());
        Servers {
            database_server: Mutex::new(database_server),
            kind,
            rocketmq: Mutex::new(rocketmq),
            database,
            port,
            namesrv,
            pool,
        }
    }

    /// The relay account's URL (what the relay processes are configured with).
    pub fn relay_url(&self) -> String {
        format!(
            "mysql://{RELAY_USER}:{RELAY_PASSWORD}@127.0.0.1:{}/{}",
            self.port, self.database
        )
    }

    pub fn namesrv_addr(&self) -> String {
        self.namesrv.clone()
    }

    /// Runs `f` on the broker handle on a blocking thread (starting a broker blocks for seconds).
    pub async fn with_rocketmq<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut RocketMq) -> T + Send + 'static,
    ) -> T {
        let this = Arc::clone(self);
        tokio::task::spawn_blocking(move || f(&mut this.rocketmq.lock().unwrap()))
            .await
            .unwrap()
    }

    /// Runs `f` on the SQL server's handle on a blocking thread.
    pub async fn with_database<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Database) -> T + Send + 'static,
    ) -> T {
        let this = Arc::clone(self);
        tokio::task::spawn_blocking(move || f(&mut this.database_server.lock().unwrap()))
            .await
            .unwrap()
    }

    /// `query` as root, retried every 200 ms while the server is unreachable (a restart fault).
    pub async fn query<T: FromRow + Send + 'static>(&self, query: &str) -> Vec<T> {
        loop {
            match self.try_query(query).await {
                Ok(rows) => return rows,
                Err(e) => {
                    tracing::debug!(error = %e, query, "harness query failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    pub async fn try_query<T: FromRow + Send + 'static>(
        &self,
        query: &str,
    ) -> mysql_async::Result<Vec<T>> {
        let mut conn = self.pool.get_conn().await?;
        conn.query(query).await
    }

    /// The database's clock, Unix seconds (as `created_at` and `sent_at` are written).
    pub async fn db_now(&self) -> f64 {
        let now: Vec<f64> = self.query("SELECT UNIX_TIMESTAMP(NOW(3))").await;
        now[0]
    }

    /// Each of `topic`'s rows: its key, when it was created (Unix seconds, database clock) and
    /// its commit → SENT latency in ms (infinite if not SENT).
    pub async fn latencies(&self, topic: &str) -> Vec<(String, f64, f64)> {
        let rows: Vec<(String, f64, Option<f64>)> = self
            .query(&format!(
                "SELECT biz_key, UNIX_TIMESTAMP(created_at), \
                 TIMESTAMPDIFF(MICROSECOND, created_at, sent_at) / 1000 \
                 FROM outbox_event WHERE topic = '{topic}'"
            ))
            .await;
        (rows.into_iter())
            .map(|(key, created, ms)| (key, created, ms.unwrap_or(f64::INFINITY)))
            .collect()
    }

    /// Age of the oldest row not yet SENT or FAILED (PENDING or SENDING), workload keys only;
    /// `None` when there is none or the server cannot be reached.
    pub async fn oldest_unsent_age(&self) -> Result<Option<Duration>, ()> {
        let rows: Vec<Option<i64>> = self
            .try_query(&format!(
                "SELECT TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(3)) FROM outbox_event \
                 WHERE status IN ({PENDING}, {SENDING}) AND biz_key NOT LIKE 'poison-%'"
            ))
            .await
            .map_err(|_| ())?;
        Ok(rows
            .into_iter()
            .next()
            .flatten()
            .map(|us| Duration::from_micros(us.max(0) as u64)))
    }

    /// Age of `topic`'s oldest unsent row (zero when none, or the server cannot be reached).
    pub async fn oldest_unsent_age_of(&self, topic: &str) -> Duration {
        let rows: Vec<Option<i64>> = self
            .try_query(&format!(
                "SELECT TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(3)) FROM outbox_event \
                 WHERE status IN ({PENDING}, {SENDING}) AND topic = '{topic}'"
            ))
            .await
            .unwrap_or_default();
        let micros = rows.into_iter().next().flatten().unwrap_or(0);
        Duration::from_micros(micros.max(0) as u64)
    }

    /// Rows SENDING whose lease ran out more than `slack` ago (lease recovery should have put
    /// them back to PENDING).
    pub async fn stale_sending(&self, slack: Duration) -> Result<u64, ()> {
        let rows: Vec<u64> = self
            .try_query(&format!(
                "SELECT COUNT(*) FROM outbox_event WHERE status = {SENDING} \
                 AND lease_until < NOW(3) - INTERVAL {} MICROSECOND",
                slack.as_micros()
            ))
            .await
            .map_err(|_| ())?;
        Ok(rows.into_iter().next().unwrap_or(0))
    }
}
