//! `[rocketmq]`: where events are published, and as whom.

use super::{Credentials, InvalidSetting, Secret, TopicType};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `[rocketmq]`: where events are published, and as whom.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RocketMqConfig {
    /// Name server address(es), `host:port[;host:port]` (required to send).
    pub namesrv_addr: Option<String>,
    /// Producer group of the relay.
    pub producer_group: String,
    /// Timeout of one send; a timed-out send is retried (the consumer de-duplicates).
    #[serde(with = "humantime_serde")]
    pub send_timeout: Duration,
    /// ACL 2.0 account (Apache RocketMQ 5 with authentication on): its access key (user name).
    /// Needs `secret_key` or `secret_key_file`.
    pub access_key: Option<String>,
    /// The account's secret; masked in `config show`, logs and errors.
    pub secret_key: Option<Secret>,
    /// A file holding the secret instead (a mounted Kubernetes Secret): read when a client
    /// starts, trailing newline trimmed, and again by the relay whenever the broker refuses its
    /// account, so a rotated secret is used without a restart. Not together with `secret_key`.
    pub secret_key_file: Option<PathBuf>,
    /// TLS to the name server and brokers; the servers' certificates must chain to the system's
    /// roots (or to the PEM bundle in `$SSL_CERT_FILE`).
    pub tls: bool,
    /// When a broker group is lost, send the keys of its queues to the other groups' queues
    /// (as RocketMQ's own producers do) instead of waiting for it. Off by default: a consumer
    /// could then read a key's newer events before its older ones, stored on the lost group.
    pub reroute_on_broker_loss: bool,
    /// The message type of topics whose type the relay cannot ask the cluster for (through a
    /// RocketMQ 5 proxy, which answers no topic-config request), e.g. `{ orders = "FIFO" }`:
    /// events of a FIFO or MIXED topic carry their `biz_key` as message group. Others are asked
    /// of the brokers, or learnt from the proxy's answer to a send.
    pub topic_types: std::collections::BTreeMap<String, TopicType>,
    /// The RocketMQ namespace of the relay's topics and the consumers' groups, as the Java
    /// clients' `namespace` setting has it (cloud instances and shared clusters give each tenant
    /// one): topic `orders` is the broker's `<namespace>%orders`, consumer group `billing` is
    /// `<namespace>%billing` (its retry and dead-letter topics `%RETRY%<namespace>%billing` and
    /// `%DLQ%<namespace>%billing`). Rows and metrics keep the names without it. None by
    /// default.
    pub namespace: Option<String>,
    /// Consumer groups whose dead-letter queue (`%DLQ%<group>`) the relay reads from the broker
    /// every `metrics.refresh`, exported as `outbox_dlq_received` / `outbox_dlq_messages` and
    /// shown by `status`: events the relay delivered that these groups never processed. None
    /// by default.
    pub dead_letter_groups: Vec<String>,
}

impl Default for RocketMqConfig {
    fn default() -> Self {
        Self {
            namesrv_addr: None,
            producer_group: "outbox-relay".to_string(),
            send_timeout: Duration::from_secs(3),
            access_key: None,
            secret_key: None,
            secret_key_file: None,
            tls: false,
            reroute_on_broker_loss: false,
            topic_types: Default::default(),
            namespace: None,
            dead_letter_groups: Vec::new(),
        }
    }
}

impl RocketMqConfig {
    /// `name` (a topic or a consumer group) as the broker names it in `namespace` (see
    /// [`super::namespace`]).
    pub fn in_namespace<'a>(&self, name: &'a str) -> std::borrow::Cow<'a, str> {
        super::namespace::inside(self.namespace.as_deref(), name)
    }

    /// The checks of this section that serde cannot express.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        if let Some(namespace) = &self.namespace {
            let valid = !namespace.is_empty()
                && namespace.len() <= 64
                && (namespace.chars()).all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !valid {
                return Err(InvalidSetting(format!(
                    "`rocketmq.namespace` = {namespace:?}: use 1 to 64 letters, digits, `-` or `_` \
                     (the broker joins it to each name with `%`)"
                )));
            }
        }
        self.check_credentials()
    }

    /// The ACL account, `None` without `access_key`; reads `secret_key_file` if that is how
    /// the secret is given. Errors name the key to fix and never contain the secret.
    pub fn credentials(&self) -> Result<Option<Credentials>, InvalidSetting> {
        self.check_credentials()?;
        let Some(access_key) = &self.access_key else {
            return Ok(None);
        };
        let secret_key = match (&self.secret_key, &self.secret_key_file) {
            (Some(secret), _) => secret.clone(),
            (None, Some(path)) => read_secret_file(path)?,
            (None, None) => unreachable!("checked by check_credentials"),
        };
        Ok(Some(Credentials {
            access_key: access_key.clone(),
            secret_key,
        }))
    }

    /// `access_key` and exactly one of `secret_key` / `secret_key_file`, or none of them.
    fn check_credentials(&self) -> Result<(), InvalidSetting> {
        let invalid = |msg: &str| Err(InvalidSetting(msg.to_string()));
        match (&self.access_key, &self.secret_key, &self.secret_key_file) {
            (_, Some(_), Some(_)) => invalid(
                "both `rocketmq.secret_key` and `rocketmq.secret_key_file` are set: keep one",
            ),
            (Some(key), _, _) if key.trim().is_empty() => {
                invalid("`rocketmq.access_key` is empty: give the ACL account's access key")
            }
            (Some(_), None, None) => invalid(
                "`rocketmq.access_key` is set without a secret: set `rocketmq.secret_key` or \
                 `rocketmq.secret_key_file`",
            ),
            (Some(_), Some(secret), None) if secret.expose().is_empty() => {
                invalid("`rocketmq.secret_key` is empty")
            }
            (None, Some(_), _) | (None, _, Some(_)) => invalid(
                "a secret (`rocketmq.secret_key` or `rocketmq.secret_key_file`) is set without \
                 `rocketmq.access_key`",
            ),
            _ => Ok(()),
        }
    }
}

/// The secret in `path`, without its trailing newline.
fn read_secret_file(path: &Path) -> Result<Secret, InvalidSetting> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        InvalidSetting(format!(
            "cannot read `rocketmq.secret_key_file` {}: {e}",
            path.display()
        ))
    })?;
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        return Err(InvalidSetting(format!(
            "`rocketmq.secret_key_file` {} is empty",
            path.display()
        )));
    }
    Ok(Secret::new(secret))
}
