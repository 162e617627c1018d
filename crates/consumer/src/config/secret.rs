//! [`Secret`]: a setting that is never shown, and the RocketMQ account it belongs to.

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;

/// A secret setting (`rocketmq.secret_key`).
///
/// Guarantee: `Debug` and `Display` print `***`, so a secret cannot leak through a log line, a
/// `{:?}` of the configuration or an error that formats it; a value of the wrong type is refused
/// without being echoed. `Serialize` writes the real value, because a configuration written for
/// a relay process must round-trip: every path that shows a configuration to a person masks it
/// explicitly (the relay's `Config::to_redacted_toml`).
#[derive(Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// What is shown instead of a secret.
    pub const MASK: &'static str = "***";

    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value itself, for the code that signs requests with it; never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Self::MASK)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Self::MASK)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_string(SecretVisitor)
    }
}

/// Accepts a string only; anything else is refused with a message that does not contain it
/// (serde's default "invalid type: found unsigned int `1234`" would print the secret).
struct SecretVisitor;

impl SecretVisitor {
    fn refuse<E: de::Error>(&self) -> E {
        E::custom("expected a string: quote the secret in TOML (or use `secret_key_file`)")
    }
}

impl Visitor<'_> for SecretVisitor {
    type Value = Secret;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Secret, E> {
        Ok(Secret::new(value))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Secret, E> {
        Ok(Secret(value))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Secret, E> {
        Err(self.refuse())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Secret, E> {
        Err(self.refuse())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Secret, E> {
        Err(self.refuse())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Secret, E> {
        Err(self.refuse())
    }
}

/// An ACL 2.0 account of the broker: what every RocketMQ client of the product signs its
/// requests with. `Debug` masks the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: Secret,
}

impl Credentials {
    pub fn new(access_key: impl Into<String>, secret_key: impl Into<String>) -> Self {
        Credentials {
            access_key: access_key.into(),
            secret_key: Secret::new(secret_key),
        }
    }
}
