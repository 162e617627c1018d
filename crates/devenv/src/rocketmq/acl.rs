//! ACL 2.0 on the Apache broker: [`AclAccount`], and the users and permissions a test sets up
//! with the real `mqadmin`.

use super::{apache, RocketMq, CLUSTER_NAME};
use rocketmq_outbox_consumer::config::Credentials;
use rocketmq_outbox_consumer::rocketmq_client::ClientSecurity;
use std::io;

/// An account of the broker's ACL 2.0 (Apache only): the initial super user in
/// [`RocketMqOptions::acl`](super::RocketMqOptions::acl), or one a test creates with [`RocketMq::create_user`].
#[derive(Debug, Clone)]
pub struct AclAccount {
    pub access_key: String,
    pub secret_key: String,
}

impl AclAccount {
    pub fn new(access_key: impl Into<String>, secret_key: impl Into<String>) -> Self {
        AclAccount {
            access_key: access_key.into(),
            secret_key: secret_key.into(),
        }
    }

    /// Clients signed as this account (plain TCP).
    pub fn security(&self) -> ClientSecurity {
        let credentials = Credentials::new(self.access_key.as_str(), self.secret_key.as_str());
        ClientSecurity::new(Some(credentials), false)
    }
}

impl RocketMq {
    /// Runs `mqadmin` signed as `account` (its own `ROCKETMQ_HOME` under the cluster's
    /// directory), and returns everything it printed: how the broker answers that account.
    pub fn mqadmin_as(
        &self,
        account: &AclAccount,
        args: &[&str],
    ) -> io::Result<apache::MqadminOutput> {
        let home = self.root.join(format!("mqadmin-{}", account.access_key));
        apache::mqadmin_run(
            &self.namesrv_addr,
            args,
            &home,
            Some(account),
            self.tls.as_ref(),
        )
    }

    /// Creates `account` as an ordinary (not super) user on every master, with `mqadmin
    /// createUser`; it may do nothing until [granted](Self::grant) permissions.
    pub fn create_user(&self, account: &AclAccount) -> io::Result<()> {
        self.mqadmin_acl(&[
            "createUser",
            "-c",
            CLUSTER_NAME,
            "-u",
            &account.access_key,
            "-p",
            &account.secret_key,
        ])
    }

    /// Allows `user` the `actions` (`Pub`, `Sub`, `Pub,Sub`, ...) on `resource` (`Topic:orders`,
    /// `Group:*`, ...) on every master, with `mqadmin createAcl`. It takes effect at once on
    /// running clients (the broker checks each request).
    pub fn grant(&self, user: &str, resource: &str, actions: &str) -> io::Result<()> {
        self.acl_on("createAcl", user, resource, &["-a", actions, "-d", "Allow"])
    }

    /// Takes back what `user` was allowed on `resource` ([`RocketMq::grant`]), on every master,
    /// with `mqadmin deleteAcl`.
    pub fn revoke(&self, user: &str, resource: &str) -> io::Result<()> {
        self.acl_on("deleteAcl", user, resource, &[])
    }

    /// `mqadmin COMMAND -c CLUSTER -s User:USER -r RESOURCE EXTRA…`.
    fn acl_on(&self, command: &str, user: &str, resource: &str, extra: &[&str]) -> io::Result<()> {
        let subject = format!("User:{user}");
        let mut args = vec![command, "-c", CLUSTER_NAME, "-s", &subject, "-r", resource];
        args.extend_from_slice(extra);
        self.mqadmin_acl(&args)
    }

    /// An ACL command of `mqadmin`: it prints `... success.` per broker, and an exception (still
    /// exiting 0) when the broker refused.
    fn mqadmin_acl(&self, args: &[&str]) -> io::Result<()> {
        if self.options.acl.is_none() {
            return Err(io::Error::other(
                "this cluster runs without ACL (RocketMqOptions::acl)",
            ));
        }
        let out = self.mqadmin(args)?;
        if out.contains("success") && !out.contains("Exception") {
            Ok(())
        } else {
            Err(io::Error::other(format!("mqadmin {}: {out}", args[0])))
        }
    }
}
