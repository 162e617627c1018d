//! [`ClientSecurity`]: how every RocketMQ client the product starts signs its requests (ACL 2.0)
//! and whether it speaks TLS, from `[rocketmq]`.
//!
//! Guarantee: the relay's producer and admin client, the consumer library's push consumer and
//! the test harness's clients are all secured here, from one value, so they can never disagree
//! on the account or on TLS. The RPC hook is built once per value and shared by its clones: the
//! client pools instances by hook identity, so a producer rebuilt beside a running one must get
//! the same hook.
//!
//! With TLS the servers' certificates must chain to the system's roots, or to the PEM bundle in
//! `$SSL_CERT_FILE` (read by the client's `rustls-native-certs`), or to the CA given to
//! [`ClientSecurity::trusting`]; and a certificate must name the address dialled (an IP SAN for
//! `127.0.0.1:9876`).

use crate::config::{Credentials, InvalidSetting, RocketMqConfig};
use rocketmq_client_rust::{
    AclClientRPCHook, ClientConfig, ClientRuntime, DefaultMQAdminExt, DefaultMQProducer,
    DefaultMQPullConsumerBuilder, DefaultMQPushConsumerBuilder, SessionCredentials,
};
use rocketmq_transport::api::RPCHook;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// The ACL account (if any) and TLS of the product's RocketMQ clients.
#[derive(Clone, Default)]
pub struct ClientSecurity {
    credentials: Option<Credentials>,
    /// `AclClientRPCHook` over `credentials`, built once.
    hook: Option<Arc<dyn RPCHook>>,
    tls: bool,
    /// The CA (PEM) TLS trusts instead of the system's roots.
    trusted_ca: Option<PathBuf>,
}

impl ClientSecurity {
    /// Signs with `credentials` (none: unsigned requests) and uses TLS if `tls`.
    pub fn new(credentials: Option<Credentials>, tls: bool) -> Self {
        let hook = credentials.as_ref().map(|c| {
            let keys = SessionCredentials::with_keys(c.access_key.as_str(), c.secret_key.expose());
            Arc::new(AclClientRPCHook::new(keys)) as Arc<dyn RPCHook>
        });
        ClientSecurity {
            credentials,
            hook,
            tls,
            trusted_ca: None,
        }
    }

    /// `rocketmq.access_key` / `secret_key` / `secret_key_file` and `rocketmq.tls`; reads the
    /// secret file now.
    pub fn from_config(config: &RocketMqConfig) -> Result<Self, InvalidSetting> {
        Ok(Self::new(config.credentials()?, config.tls))
    }

    /// The same over TLS, trusting only the CA in `ca` (PEM): for servers with a private CA,
    /// such as the harness's.
    pub fn trusting(mut self, ca: impl Into<PathBuf>) -> Self {
        self.tls = true;
        self.trusted_ca = Some(ca.into());
        self
    }

    /// The account requests are signed with.
    pub fn credentials(&self) -> Option<&Credentials> {
        self.credentials.as_ref()
    }

    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The client config a producer builder starts from (`.client_config(..)` first: it
    /// replaces what was set before it): TLS on or off, and the CA it trusts. Signing is a second
    /// step, [`Self::sign_producer`], as the producer's builder type is private to the client.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::default();
        config.set_use_tls(self.tls);
        if self.tls {
            // The client builds its TLS config with the process's rustls crypto provider.
            super::choose_tls_provider();
        }
        if let Some(ca) = &self.trusted_ca {
            config.set_tls_client_trust_cert_path(ca.display().to_string());
        }
        config
    }

    /// Signs the requests of a producer built from [`Self::client_config`], before it starts.
    pub fn sign_producer(&self, producer: &mut DefaultMQProducer) {
        if let Some(hook) = &self.hook {
            producer.set_rpc_hook(Arc::clone(hook));
        }
    }

    /// An admin client (not started) on `runtime`.
    pub fn admin(&self, runtime: Arc<ClientRuntime>) -> DefaultMQAdminExt {
        let mut admin = match &self.hook {
            Some(hook) => DefaultMQAdminExt::with_rpc_hook(runtime, Arc::clone(hook)),
            None => DefaultMQAdminExt::new(runtime),
        };
        let tls = self.client_config().tls_config().clone();
        admin.set_use_tls(self.tls);
        admin.client_config_mut().set_tls_config(tls);
        admin
    }

    /// `builder` secured like this; call it first (it replaces the builder's client config).
    pub fn push_consumer_builder(
        &self,
        builder: DefaultMQPushConsumerBuilder,
    ) -> DefaultMQPushConsumerBuilder {
        builder
            .client_config(self.client_config())
            .rpc_hook(self.hook.clone())
    }

    /// `builder` (the harness's topic reader) signed like this. The classic pull consumer of
    /// client 1.0 cannot use TLS: its builder turns it off whatever the client config says.
    pub fn pull_consumer_builder(
        &self,
        builder: DefaultMQPullConsumerBuilder,
    ) -> DefaultMQPullConsumerBuilder {
        match &self.hook {
            Some(hook) => builder.rpc_hook(Arc::clone(hook)),
            None => builder,
        }
    }
}

impl fmt::Debug for ClientSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientSecurity")
            .field("credentials", &self.credentials)
            .field("tls", &self.tls)
            .field("trusted_ca", &self.trusted_ca)
            .finish()
    }
}

impl PartialEq for ClientSecurity {
    fn eq(&self, other: &Self) -> bool {
        self.credentials == other.credentials
            && self.tls == other.tls
            && self.trusted_ca == other.trusted_ca
    }
}
