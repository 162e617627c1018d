//! [`ClientSecurity`]: how every RocketMQ client the product starts signs its requests (ACL 2.0)
//! and whether it speaks TLS, from `[rocketmq]`.
//!
//! Guarantee: the relay's producer and admin client, the consumer library's push consumer and
//! the test harness's clients are all secured here, from one value, so they can never disagree
//! on the account or on TLS. The RPC hook is built once per value and shared by its clones: the
//! client pools instances by hook identity, so a producer rebuilt beside a running one must get
//! the same hook.

use crate::config::{ConfigError, Credentials, RocketMqConfig};
use rocketmq_client_rust::{
    AclClientRPCHook, ClientRuntime, DefaultMQAdminExt, DefaultMQProducer,
    DefaultMQPullConsumerBuilder, DefaultMQPushConsumer, DefaultMQPushConsumerBuilder,
    SessionCredentials,
};
use rocketmq_transport::api::RPCHook;
use std::fmt;
use std::sync::Arc;

/// The ACL account (if any) and TLS switch of the product's RocketMQ clients.
#[derive(Clone, Default)]
pub struct ClientSecurity {
    credentials: Option<Credentials>,
    /// `AclClientRPCHook` over `credentials`, built once.
    hook: Option<Arc<dyn RPCHook>>,
    tls: bool,
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
        }
    }

    /// `rocketmq.access_key` / `secret_key` / `secret_key_file` and `rocketmq.tls`; reads the
    /// secret file now.
    pub fn from_config(config: &RocketMqConfig) -> Result<Self, ConfigError> {
        Ok(Self::new(config.credentials()?, config.tls))
    }

    /// The account requests are signed with.
    pub fn credentials(&self) -> Option<&Credentials> {
        self.credentials.as_ref()
    }

    /// The access key, for messages ("the broker refused account X").
    pub fn access_key(&self) -> Option<&str> {
        self.credentials.as_ref().map(|c| c.access_key.as_str())
    }

    pub fn tls(&self) -> bool {
        self.tls
    }

    /// Secures a producer before it starts.
    pub fn secure_producer(&self, producer: &mut DefaultMQProducer) {
        self.prepare_tls();
        if let Some(hook) = &self.hook {
            producer.set_rpc_hook(Arc::clone(hook));
        }
        producer.set_use_tls(self.tls);
    }

    /// An admin client (not started) on `runtime`.
    pub fn admin(&self, runtime: Arc<ClientRuntime>) -> DefaultMQAdminExt {
        self.prepare_tls();
        let mut admin = match &self.hook {
            Some(hook) => DefaultMQAdminExt::with_rpc_hook(runtime, Arc::clone(hook)),
            None => DefaultMQAdminExt::new(runtime),
        };
        admin.set_use_tls(self.tls);
        admin
    }

    /// Signs the requests of the push consumer `builder` will build; call
    /// [`Self::secure_push_consumer`] on what it built.
    pub fn push_consumer_builder(
        &self,
        builder: DefaultMQPushConsumerBuilder,
    ) -> DefaultMQPushConsumerBuilder {
        builder.rpc_hook(self.hook.clone())
    }

    /// Sets TLS on a built push consumer before it starts (its builder has no switch for it).
    pub fn secure_push_consumer(&self, consumer: &mut DefaultMQPushConsumer) {
        self.prepare_tls();
        consumer.set_use_tls(self.tls);
    }

    /// Signs the requests of a pull consumer (the harness's topic reader, which never uses TLS).
    pub fn pull_consumer_builder(
        &self,
        builder: DefaultMQPullConsumerBuilder,
    ) -> DefaultMQPullConsumerBuilder {
        match &self.hook {
            Some(hook) => builder.rpc_hook(Arc::clone(hook)),
            None => builder,
        }
    }

    /// The client builds its TLS config with the process's rustls crypto provider.
    fn prepare_tls(&self) {
        if self.tls {
            crate::db::choose_tls_provider();
        }
    }
}

impl fmt::Debug for ClientSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientSecurity")
            .field("credentials", &self.credentials)
            .field("tls", &self.tls)
            .finish()
    }
}

impl PartialEq for ClientSecurity {
    fn eq(&self, other: &Self) -> bool {
        self.credentials == other.credentials && self.tls == other.tls
    }
}
