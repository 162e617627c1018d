//! Configuration: one TOML file, overridden by `OUTBOX_RELAY_<SECTION>__<KEY>` environment
//! variables, overridden by command-line flags.
//!
//! Guarantee: an unknown key (in the file or in an `OUTBOX_RELAY_…` variable) and a missing
//! required value are errors that name the key; nothing is silently ignored.

// The broker settings the relay shares with the consumer library.
pub use rocketmq_outbox_consumer::config::{
    Credentials, InvalidSetting, RocketMqConfig, Secret, TopicType,
};

use crate::outbox::TableName;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Prefix of environment overrides; `__` separates section and key:
/// `OUTBOX_RELAY_MYSQL__URL`, `OUTBOX_RELAY_RELAY__SHARDS`. (`OUTBOX_RELAY_CONFIG` names the
/// file itself.)
pub const ENV_PREFIX: &str = "OUTBOX_RELAY_";

/// Keys whose environment variables are taken verbatim, as strings (credentials and namespaces
/// may look like numbers or lists).
const RAW_ENV_KEYS: &[&str] = &[
    "rocketmq.access_key",
    "rocketmq.secret_key",
    "rocketmq.namespace",
];

/// A configuration problem, phrased so the user knows what to change.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Invalid(String),
    #[error(
        "missing required setting `{key}`: set it in the config file, \
         with {env}, or with {flag}"
    )]
    Missing {
        key: &'static str,
        env: String,
        flag: &'static str,
    },
    #[error("config file {path} not found; pass an existing file with --config or omit it")]
    FileNotFound { path: PathBuf },
}

/// A `[rocketmq]` setting the consumer crate checked: the relay's [`ConfigError::Invalid`].
impl From<InvalidSetting> for ConfigError {
    fn from(InvalidSetting(message): InvalidSetting) -> Self {
        ConfigError::Invalid(message)
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub mysql: MysqlConfig,
    pub outbox: OutboxConfig,
    pub rocketmq: RocketMqConfig,
    pub relay: RelayConfig,
    pub retry: RetryConfig,
    pub sweeper: SweeperConfig,
    pub poll: PollConfig,
    pub metrics: MetricsConfig,
    pub cleanup: CleanupConfig,
}

/// `[mysql]`: the database that holds the outbox tables.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MysqlConfig {
    /// `mysql://user:password@host:port/database` (required).
    pub url: Option<String>,
    /// Server id the relay uses as a replica when it reads the binlog; unique in the topology.
    pub server_id: u32,
    /// How often the server sends a heartbeat on an idle binlog stream.
    #[serde(with = "humantime_serde")]
    pub heartbeat: Duration,
    /// Connect and query timeout.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// TLS to the server.
    pub tls: TlsMode,
    /// PEM file of the CA that signed the server's certificate (`verify_ca`, `verify_identity`);
    /// without it the built-in web roots are used.
    pub tls_ca: Option<PathBuf>,
}

impl Default for MysqlConfig {
    fn default() -> Self {
        Self {
            url: None,
            server_id: 4_207_001,
            heartbeat: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
            tls: TlsMode::Disabled,
            tls_ca: None,
        }
    }
}

/// `mysql.tls`: how the connection to MySQL is protected.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TlsMode {
    /// Plain TCP (unless the URL asks for TLS, e.g. `?require_ssl=true`).
    #[default]
    Disabled,
    /// Encrypted; the server's certificate is not checked (protects against sniffing only).
    Required,
    /// Encrypted; the certificate must chain to `mysql.tls_ca`; the host name is not checked.
    VerifyCa,
    /// Encrypted; the certificate must chain to `mysql.tls_ca` and name the URL's host.
    VerifyIdentity,
}

/// `[outbox]`: which tables hold events and what an event may be.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxConfig {
    /// Outbox tables, `table` (in the URL's database) or `schema.table`.
    pub tables: Vec<String>,
    /// Largest payload accepted, in bytes of JSON text.
    pub max_payload_bytes: usize,
    /// How far ahead a scheduled event's `deliver_at` may be: the broker's `timerMaxDelaySec`
    /// (3 days by default in Apache RocketMQ 5). An event further ahead is FAILED with the reason,
    /// instead of being refused by the broker at every retry.
    #[serde(with = "humantime_serde")]
    pub max_delay: std::time::Duration,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            tables: vec![crate::outbox::DEFAULT_TABLE.to_string()],
            max_payload_bytes: crate::outbox::DEFAULT_MAX_PAYLOAD_BYTES,
            max_delay: crate::outbox::DEFAULT_MAX_DELAY,
        }
    }
}

impl OutboxConfig {
    /// The limits a row must keep to become a message (the stream, the sweeper and the producer
    /// check the same ones).
    pub fn row_limits(&self) -> crate::outbox::message::RowLimits {
        crate::outbox::message::RowLimits {
            max_payload_bytes: self.max_payload_bytes,
            max_delay: self.max_delay,
        }
    }
}

/// How the relay finds new rows.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum RelayMode {
    /// Tail the binlog (default): milliseconds of latency.
    #[default]
    Cdc,
    /// Poll the table: for servers without binlog access.
    Poll,
}

/// How the instances of one deployment elect the one that streams (`relay.election`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum ElectionMethod {
    /// `lease` on a Galera node (`wsrep_on`), `lock` elsewhere (default).
    #[default]
    Auto,
    /// MySQL's named lock (`GET_LOCK`): takeover within about a second of a leader's death, but
    /// the lock is local to one server, so every instance must reach the same one.
    Lock,
    /// A lease in `outbox_relay_state`'s row, claimed and renewed by writes that conflict for two
    /// claimants: works wherever every instance writes the same row (Galera, multi-primary);
    /// takeover after a leader's death waits out the lease.
    Lease,
}

/// `[relay]`: the pipeline.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RelayConfig {
    pub mode: RelayMode,
    /// Ordered senders; events of one `biz_key` always use the same one.
    pub shards: usize,
    /// Where the checkpoint (sled) lives.
    pub checkpoint_dir: PathBuf,
    /// Name of this relay deployment; instances with the same name share one checkpoint
    /// mirror and elect one leader.
    pub name: String,
    /// This instance's identity in `owner` columns and leader leases; default `host-pid`.
    pub instance_id: Option<String>,
    /// Log the relay's own UPDATEs (SENT/FAILED marks, claims, leases) with
    /// `binlog_row_image = MINIMAL` in its sessions: the key and the changed columns instead of
    /// the whole row twice, which halves the binlog the relay's marks write. The account needs
    /// `BINLOG ADMIN` (MariaDB) or `SESSION_VARIABLES_ADMIN` (MySQL) to set it; without, the
    /// relay warns once and keeps the server's setting. Set `false` if another binlog reader
    /// needs full images of outbox updates. Producers' sessions (their INSERTs) are unaffected.
    pub minimal_row_image: bool,
    /// How the leader is elected: `auto` (default), `lock` or `lease`; see
    /// `docs/concepts/several-instances.md`.
    pub election: ElectionMethod,
    /// How long the events of a topic that does not accept them are held in memory before the
    /// stream parks its new ones and the senders release those they hold (but the batch they
    /// retry): leaves them PENDING in the outbox for the sweeper, which sends them in key order
    /// once the topic accepts events again, and lets the checkpoint pass them. From then on the
    /// batch the senders retry uses no retry: nothing of a parked topic is FAILED for its stall.
    /// Only with the sweeper on.
    #[serde(with = "humantime_serde")]
    pub park_after: Duration,
    /// How long a prepared XA transaction is held (keeping the checkpoint below its prepare)
    /// before it is parked: the checkpoint passes it and, at `XA COMMIT`, the sweeper sends its
    /// events. Only with the sweeper on.
    #[serde(with = "humantime_serde")]
    pub park_prepared_after: Duration,
    /// How long the marker waits after an event's `SEND_OK` for more outcomes to record in the
    /// same UPDATE. The event is already on the broker: only its SENT mark and the checkpoint
    /// wait. Longer: fewer UPDATEs (each a transaction for the database and in the binlog the
    /// relay reads back) at low rates; a kill -9 resends up to this much more. At most 1 s.
    #[serde(with = "humantime_serde")]
    pub mark_linger: Duration,
    /// When a relay starts streaming (a restart, a takeover), it reads back the messages each
    /// queue of a topic stored since the first event it is about to send was committed, and
    /// skips the events found there, recording them SENT with the stored message id: a
    /// previous leader's sends it had not recorded are not sent again. This bounds that read:
    /// at most this many of each queue's newest messages. `0`: nothing is read back.
    pub takeover_read_limit: u64,
}

/// How long a marking batch waits for more outcomes after its first before it is written (unless
/// it is full), by default (`relay.mark_linger`). Only the SENT mark and the checkpoint wait;
/// the event is already stored on the broker. Each UPDATE is a commit for the database and a
/// transaction more in the binlog the relay reads back, so at ordinary rates the marks of many
/// transactions are better written together: with commits spread evenly (one event per
/// transaction, as applications write), a 1 ms linger marked 1.7 events per UPDATE at 500/s and
/// 3.2 at 1k/s; 20 ms marks 11 and 22. Back to back in `bench/` on MariaDB 10.11: relay CPU per
/// event at 500/s 256–274 → 192–206 µs, at 1k/s 194–199 → 169–181 µs; the database CPU the
/// relay adds per event at 1k/s 171 → 128 µs (302 → 147 on MySQL 9.7; docs/performance.md).
/// The price: the checkpoint and a SENT mark trail `SEND_OK` by up to this, and a relay killed
/// with `kill -9` sends up to this much more traffic again.
pub(crate) const DEFAULT_MARK_LINGER: Duration = Duration::from_millis(20);

/// The longest `relay.mark_linger` allowed.
pub(crate) const MAX_MARK_LINGER: Duration = Duration::from_secs(1);

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            mode: RelayMode::Cdc,
            shards: 8,
            checkpoint_dir: PathBuf::from("outbox-relay-state"),
            name: "default".to_string(),
            instance_id: None,
            minimal_row_image: true,
            election: ElectionMethod::Auto,
            park_after: Duration::from_secs(5),
            park_prepared_after: Duration::from_secs(60),
            mark_linger: DEFAULT_MARK_LINGER,
            takeover_read_limit: 10_000,
        }
    }
}

/// `[retry]`: what happens after a failed send (see `retry::RetryPolicy`).
///
/// Retry `n` waits at most its ceiling, `initial_backoff` doubled `n - 1` times and never more
/// than `max_backoff`, and at least half of it: each wait is drawn at random in that range
/// (jitter), so the events, shards and relays that failed together do not retry in lockstep.
/// After `max_retry` retries the event is FAILED with its last error. With the defaults the
/// ceilings are 1, 2, 4 … 128 s (8 retries: the 5-minute cap is not reached), and an event is
/// FAILED between about 2 and 4¾ minutes after its first attempt
/// (`RetryPolicy::failed_within`, which the docs' figures are checked against).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempts after the first before the event is FAILED.
    pub max_retry: u32,
    /// The ceiling of the first retry's wait (default 1 s).
    #[serde(with = "humantime_serde")]
    pub initial_backoff: Duration,
    /// No wait is longer (default 5 min).
    #[serde(with = "humantime_serde")]
    pub max_backoff: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_retry: 8,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
        }
    }
}

/// `[sweeper]`: the slow safety net beside the stream.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SweeperConfig {
    /// Run the sweeper beside the stream (CDC mode), on the leader and on standbys.
    pub enabled: bool,
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Only rows PENDING for longer than this are swept: far behind the stream (which sends in
    /// milliseconds), so the two do not race in normal operation.
    #[serde(with = "humantime_serde")]
    pub min_age: Duration,
    /// How long a claimed row stays SENDING before another instance may take it back.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    pub batch_size: u32,
}

impl Default for SweeperConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(5),
            min_age: Duration::from_secs(30),
            lease: Duration::from_secs(30),
            batch_size: 100,
        }
    }
}

/// `[poll]`: poll mode.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PollConfig {
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    pub batch_size: u32,
}

impl Default for PollConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(500),
            batch_size: 100,
        }
    }
}

/// `[cleanup]`: deleting old SENT rows from inside `run` (off by default; the relay's user then
/// needs DELETE on the outbox tables). `outbox-relay cleanup` does the same by hand.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CleanupConfig {
    pub enabled: bool,
    /// How often a cleanup round runs.
    #[serde(with = "humantime_serde")]
    pub every: Duration,
    /// SENT rows created longer ago than this are deleted (FAILED rows never are).
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// Rows per DELETE (by primary key).
    pub batch_size: usize,
    /// Pause between two DELETEs.
    #[serde(with = "humantime_serde")]
    pub pause: Duration,
    /// Maintain daily partitions: on a partitioned outbox table each round creates the coming
    /// days and drops the days past `retention` that hold no unfinished row, instead of
    /// deleting rows (`outbox-relay partitions convert` partitions a table).
    pub partitions: bool,
    /// Day partitions to keep ready after today.
    pub partitions_ahead: u32,
}

impl Default for CleanupConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            every: Duration::from_secs(3600),
            retention: Duration::from_secs(7 * 24 * 3600),
            batch_size: 1000,
            pause: Duration::from_millis(100),
            partitions: false,
            partitions_ahead: 7,
        }
    }
}

/// `[metrics]`: the Prometheus endpoint.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` for `/metrics`, `/healthz`, `/readyz`; empty disables it.
    pub listen: String,
    /// How often the outbox table gauges (oldest PENDING, counts) are read from MySQL.
    #[serde(with = "humantime_serde")]
    pub refresh: Duration,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9464".to_string(),
            refresh: Duration::from_secs(5),
        }
    }
}

impl Config {
    /// Loads defaults ← `file` (if given) ← environment ← `overrides` (CLI flags, as a partial
    /// config tree; `None` fields are left out by the caller).
    pub fn load(file: Option<&Path>, overrides: impl Serialize) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::FileNotFound {
                    path: path.to_path_buf(),
                });
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        figment = figment.merge(
            Env::prefixed(ENV_PREFIX)
                .split("__")
                .ignore(&["config"])
                .ignore(RAW_ENV_KEYS),
        );
        // figment parses variables (`1234` becomes a number, `[a]` a list): keep these verbatim.
        for (key, value) in Env::prefixed(ENV_PREFIX)
            .split("__")
            .only(RAW_ENV_KEYS)
            .iter()
        {
            figment = figment.merge(Serialized::default(key.as_str(), value));
        }
        let config: Config = figment
            .merge(Serialized::defaults(overrides))
            .extract()
            .map_err(|e| ConfigError::Invalid(describe_figment_error(e)))?;
        config.validate()?;
        Ok(config)
    }

    /// Cross-field checks that serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        if self.outbox.tables.is_empty() {
            return invalid("`outbox.tables` is empty: name at least one outbox table".into());
        }
        for table in &self.outbox.tables {
            TableName::parse(table)
                .map_err(|e| ConfigError::Invalid(format!("`outbox.tables`: {e}")))?;
        }
        if self.relay.shards == 0 || self.relay.shards > 1024 {
            return invalid(format!(
                "`relay.shards` = {} is out of range: use 1 to 1024",
                self.relay.shards
            ));
        }
        if self.retry.initial_backoff > self.retry.max_backoff {
            return invalid("`retry.initial_backoff` is larger than `retry.max_backoff`".into());
        }
        if self.sweeper.batch_size == 0 || self.poll.batch_size == 0 {
            return invalid("`sweeper.batch_size` and `poll.batch_size` must be at least 1".into());
        }
        if self.relay.mark_linger > MAX_MARK_LINGER {
            return invalid(format!(
                "`relay.mark_linger` = {} is too long: use at most {} (the checkpoint and every \
                 SENT mark wait this long)",
                humantime::format_duration(self.relay.mark_linger),
                humantime::format_duration(MAX_MARK_LINGER)
            ));
        }
        if self.outbox.max_payload_bytes == 0 {
            return invalid("`outbox.max_payload_bytes` must be at least 1".into());
        }
        Ok(self.rocketmq.validate()?)
    }

    /// The producer API for the first outbox table of this configuration (what `outbox-dev
    /// demo` and business code configured like the relay write with).
    pub fn producer(&self) -> crate::producer::Outbox {
        crate::producer::Outbox::new(
            self.outbox_tables().remove(0),
            self.outbox.max_payload_bytes,
        )
    }

    /// `mysql.url`, or an error saying how to set it.
    pub fn mysql_url(&self) -> Result<&str, ConfigError> {
        self.mysql.url.as_deref().ok_or(ConfigError::Missing {
            key: "mysql.url",
            env: format!("{ENV_PREFIX}MYSQL__URL"),
            flag: "--mysql-url",
        })
    }

    /// `rocketmq.namesrv_addr`, or an error saying how to set it.
    pub fn namesrv_addr(&self) -> Result<&str, ConfigError> {
        self.rocketmq
            .namesrv_addr
            .as_deref()
            .ok_or(ConfigError::Missing {
                key: "rocketmq.namesrv_addr",
                env: format!("{ENV_PREFIX}ROCKETMQ__NAMESRV_ADDR"),
                flag: "--namesrv-addr",
            })
    }

    /// The configured outbox tables, parsed.
    pub fn outbox_tables(&self) -> Vec<TableName> {
        self.outbox
            .tables
            .iter()
            .map(|t| TableName::parse(t).expect("validated by Config::validate"))
            .collect()
    }

    /// `relay.instance_id`, else `hostname-pid`.
    pub fn instance_id(&self) -> String {
        self.relay.instance_id.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "relay".to_string());
            format!("{host}-{}", std::process::id())
        })
    }

    /// The configuration as TOML with the database password and the RocketMQ secret masked
    /// (for `config show`).
    pub fn to_redacted_toml(&self) -> String {
        let mut copy = self.clone();
        copy.mysql.url = copy.mysql.url.as_deref().map(redact_url_password);
        if copy.rocketmq.secret_key.is_some() {
            copy.rocketmq.secret_key = Some(Secret::new(Secret::MASK));
        }
        toml::to_string_pretty(&copy).expect("config serialises to TOML")
    }
}

/// `mysql://user:secret@host/db` → `mysql://user:***@host/db`.
pub fn redact_url_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

/// figment's errors already name the key and the source; add a hint for unknown keys.
fn describe_figment_error(error: figment::Error) -> String {
    let mut lines = Vec::new();
    for e in error {
        let mut line = e.to_string();
        if let figment::error::Kind::UnknownField(field, expected) = &e.kind {
            let path = e.path.join(".");
            let section = path.rsplit_once('.').map(|(s, _)| s).unwrap_or("");
            line = format!(
                "unknown key `{}{field}`{} (known keys here: {})",
                if section.is_empty() {
                    String::new()
                } else {
                    format!("{section}.")
                },
                e.metadata
                    .as_ref()
                    .map(|m| format!(" in {}", m.name))
                    .unwrap_or_default(),
                expected.join(", ")
            );
        }
        lines.push(line);
    }
    lines.join("; ")
}

#[cfg(test)]
mod tests;

/// The thread count in environment variable `name` (a positive integer), else `default`: one
/// reading for the relay's runtime (`TOKIO_WORKER_THREADS`) and its RocketMQ client's.
pub fn thread_count_from_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(default)
}
