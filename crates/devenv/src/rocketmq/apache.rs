//! Apache RocketMQ 5.x, the Java servers users run: the jars `scripts/setup.sh` fetches from
//! Maven Central (`org.apache.rocketmq:rocketmq-namesrv`, `rocketmq-broker`, `rocketmq-proxy`,
//! `rocketmq-tools`), run with the machine's Java on loopback ports, and `mqadmin` for the checks
//! the article makes.
//!
//! Guarantee: nothing here reads or writes outside the instance directory it is given (the JVM's
//! `user.home`, where the servers put `logs/` and `store/` by default, points into it).

use super::tls::TlsFiles;
use super::{BrokerNode, RocketMqOptions, CLUSTER_NAME};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Apache RocketMQ release the harness runs (and `scripts/setup.sh` fetches).
pub const APACHE_ROCKETMQ_VERSION: &str = "5.3.3";

/// The directory of the jars: `$OUTBOX_DEVENV_APACHE_ROCKETMQ_LIB`, else
/// `<cache>/apache-rocketmq/<version>/lib`.
pub fn lib_dir() -> io::Result<PathBuf> {
    let dir = match std::env::var_os("OUTBOX_DEVENV_APACHE_ROCKETMQ_LIB") {
        Some(dir) => PathBuf::from(dir),
        None => crate::cache_dir()
            .join("apache-rocketmq")
            .join(APACHE_ROCKETMQ_VERSION)
            .join("lib"),
    };
    let broker_jar = dir.join(format!("rocketmq-broker-{APACHE_ROCKETMQ_VERSION}.jar"));
    if broker_jar.is_file() {
        Ok(dir)
    } else {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "Apache RocketMQ {APACHE_ROCKETMQ_VERSION} jars not found in {} \
                 (run `scripts/setup.sh`, which fetches them from Maven Central)",
                dir.display()
            ),
        ))
    }
}

/// `java` with a small heap and fast start-up, the class path of the jars, and `user.home` in
/// `home`, then `flags`. The servers' stock scripts ask for 4-8 GiB of heap; tests need a
/// fraction of it.
fn java(home: &Path, heap_mb: u32, flags: &[String]) -> io::Result<Command> {
    let lib = lib_dir()?;
    let java = std::env::var_os("JAVA_HOME")
        .map(|h| PathBuf::from(h).join("bin").join("java"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("java"));
    let mut command = Command::new(java);
    command
        .arg(format!("-Xms{}m", heap_mb.min(64)))
        .arg(format!("-Xmx{heap_mb}m"))
        .args(["-XX:+UseSerialGC", "-XX:-UsePerfData", "-Xss512k"])
        .arg(format!("-Duser.home={}", home.display()))
        .args(flags)
        .arg("-cp")
        .arg(format!("{}/*", lib.display()))
        .env("HOME", home)
        .env("ROCKETMQ_HOME", home)
        .env_remove("NAMESRV_ADDR");
    Ok(command)
}

/// The name server on `127.0.0.1:port`, its config written to `dir`; TLS only with `tls`; with
/// `controller`, a RocketMQ 5 controller embedded in it, serving brokers on that port (its
/// DLedger port: a single-node controller group, which elects masters but cannot itself fail
/// over).
pub fn namesrv_command(
    dir: &Path,
    port: u16,
    tls: Option<&TlsFiles>,
    controller: Option<u16>,
) -> io::Result<Command> {
    let conf = dir.join("namesrv.properties");
    let mut properties = format!("listenPort={port}\nbindAddress=127.0.0.1\n");
    if let Some(controller) = controller {
        properties.push_str(&format!(
            "enableControllerInNamesrv=true
controllerDLegerGroup=outbox-test
controllerDLegerPeers=n0-127.0.0.1:{controller}
controllerDLegerSelfId=n0
controllerStorePath={store}
enableElectUncleanMaster=false
notifyBrokerRoleChanged=true
",
            store = dir.join("controller").display()
        ));
    }
    std::fs::write(&conf, properties)?;
    let flags = tls.map(TlsFiles::server_flags).unwrap_or_default();
    let heap = if controller.is_some() { 256 } else { 128 };
    let mut command = java(dir, heap, &flags)?;
    command
        .arg("org.apache.rocketmq.namesrv.NamesrvStartup")
        .arg("-c")
        .arg(conf);
    Ok(command)
}

/// The RocketMQ 5 proxy in cluster mode, its settings in `conf` (see `super::proxy`).
pub fn proxy_command(dir: &Path, conf: &Path) -> io::Result<Command> {
    let proxy_jar = lib_dir()?.join(format!("rocketmq-proxy-{APACHE_ROCKETMQ_VERSION}.jar"));
    if !proxy_jar.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} not found (run `scripts/setup.sh`, which fetches it from Maven Central)",
                proxy_jar.display()
            ),
        ));
    }
    let mut command = java(dir, 256, &[])?;
    command
        .arg("org.apache.rocketmq.proxy.ProxyStartup")
        .arg("-pm")
        .arg("cluster")
        .arg("-pc")
        .arg(conf);
    Ok(command)
}

/// Where a broker registers: its name server and, in controller mode, its controller.
#[derive(Debug, Clone, Copy)]
pub struct Servers<'a> {
    pub namesrv: &'a str,
    pub controller: Option<&'a str>,
}

/// One broker of the cluster, its `broker.conf` written to its directory; TLS only with `tls`.
pub fn broker_command(
    node: &BrokerNode,
    servers: Servers<'_>,
    options: &RocketMqOptions,
    tls: Option<&TlsFiles>,
) -> io::Result<Command> {
    let conf = node.dir.join("broker.conf");
    std::fs::write(&conf, broker_conf(node, servers, options))?;
    let mut flags = tls.map(TlsFiles::server_flags).unwrap_or_default();
    // The store's mlock and buffer cleaner use the JDK's internal buffer class, as the stock
    // scripts allow.
    flags.push("--add-exports=java.base/sun.nio.ch=ALL-UNNAMED".into());
    // Its collections with wall-clock times, to tell a broker pause from the relay's own.
    flags.push(format!(
        "-Xlog:gc:file={}:time,uptime",
        node.dir.join("gc.log").display()
    ));
    let mut command = java(&node.dir, 384, &flags)?;
    command
        .arg("org.apache.rocketmq.broker.BrokerStartup")
        .arg("-c")
        .arg(conf);
    Ok(command)
}

/// The broker's properties: loopback only, small store files (the stock commit-log file is
/// 1 GiB and the index ~400 MiB, each mapped per broker), the role of the node in its group.
fn broker_conf(node: &BrokerNode, servers: Servers<'_>, options: &RocketMqOptions) -> String {
    let namesrv = servers.namesrv;
    let store = node.dir.join("store");
    let store = store.display();
    let role = node.role.apache_name();
    let mut conf = format!(
        "brokerClusterName={CLUSTER_NAME}
brokerName={group}
brokerId={id}
brokerRole={role}
flushDiskType=ASYNC_FLUSH
namesrvAddr={namesrv}
brokerIP1=127.0.0.1
brokerIP2=127.0.0.1
listenPort={port}
haListenPort={ha_port}
storePathRootDir={store}
storePathCommitLog={store}/commitlog
autoCreateTopicEnable={auto_create}
autoCreateSubscriptionGroup=true
mappedFileSizeCommitLog=67108864
mappedFileSizeConsumeQueue=600000
maxHashSlotNum=50000
maxIndexNum=200000
diskMaxUsedSpaceRatio=95
waitTimeMillsInSendQueue=1000
",
        group = node.group,
        id = node.id,
        port = node.port,
        ha_port = node.ha_port,
        auto_create = options.auto_create_topics,
    );
    if let (super::BrokerRole::Elected, Some(controller)) = (node.role, servers.controller) {
        // The controller assigns the id and the role; a send is SEND_OK once every replica in
        // the sync state set holds it, so the one it promotes has every acknowledged message.
        conf = conf.replace(&format!("brokerId={}\n", node.id), "brokerId=-1\n");
        conf.push_str(&format!(
            "enableControllerMode=true\ncontrollerAddr={controller}\nallAckInSyncStateSet=true\n"
        ));
    }
    if node.role == super::BrokerRole::SyncMaster {
        // 5.x acknowledges a SYNC_MASTER's send once `inSyncReplicas` copies hold it (1 by
        // default: the master alone). Two, as a master+slave pair means: a slave that is gone
        // makes sends fail (IN_SYNC_REPLICAS_NOT_ENOUGH), one that does not answer within
        // `slaveTimeout` makes them FLUSH_SLAVE_TIMEOUT (stored on the master, not SEND_OK).
        conf.push_str("totalReplicas=2\ninSyncReplicas=2\nslaveTimeout=500\n");
    }
    if let Some(acl) = &options.acl {
        conf.push_str(&acl_conf(acl));
    }
    if let Ok(extra) = std::env::var(EXTRA_CONF_ENV) {
        for line in extra.split(';').filter(|l| !l.trim().is_empty()) {
            conf.push_str(line.trim());
            conf.push('\n');
        }
    }
    conf
}

/// Extra `broker.conf` lines for every Apache broker the harness starts, `;`-separated (e.g.
/// `warmMapedFileEnable=true`): to try a broker setting in a test or a benchmark run.
pub const EXTRA_CONF_ENV: &str = "OUTBOX_APACHE_BROKER_CONF";

/// ACL 2.0 (authentication and authorization on), with `acl`'s account as the initial super
/// user that the broker also uses for its own inner clients.
fn acl_conf(acl: &super::AclAccount) -> String {
    format!(
        "authenticationEnabled=true
authenticationProvider=org.apache.rocketmq.auth.authentication.provider.DefaultAuthenticationProvider
authenticationMetadataProvider=org.apache.rocketmq.auth.authentication.provider.LocalAuthenticationMetadataProvider
authorizationEnabled=true
authorizationProvider=org.apache.rocketmq.auth.authorization.provider.DefaultAuthorizationProvider
authorizationMetadataProvider=org.apache.rocketmq.auth.authorization.provider.LocalAuthorizationMetadataProvider
initAuthenticationUser={{\"username\":\"{user}\",\"password\":\"{secret}\"}}
innerClientAuthenticationCredentials={{\"accessKey\":\"{user}\",\"secretKey\":\"{secret}\"}}
",
        user = acl.access_key,
        secret = acl.secret_key,
    )
}

/// What one `mqadmin` run printed.
#[derive(Debug, Clone)]
pub struct MqadminOutput {
    /// Standard output without logback's own status lines.
    pub stdout: String,
    /// Standard error: where `mqadmin` prints the exception of a refused command, though it
    /// still exits 0.
    pub stderr: String,
    /// It exited 0.
    pub success: bool,
}

/// Runs `mqadmin <args> -n <namesrv>` (the real `MQAdminStartup` of `rocketmq-tools`) and
/// returns what it printed. Errors if it exits non-zero; its own "not found" answers are output.
/// With `acl`, its requests are signed as that account, and with `tls` it speaks TLS (see
/// [`mqadmin_run`]).
pub fn mqadmin(
    namesrv: &str,
    args: &[&str],
    home: &Path,
    acl: Option<&super::AclAccount>,
    tls: Option<&TlsFiles>,
) -> io::Result<String> {
    let out = mqadmin_run(namesrv, args, home, acl, tls)?;
    if out.success {
        Ok(out.stdout)
    } else {
        Err(io::Error::other(format!(
            "mqadmin {} failed: {}{}",
            args.join(" "),
            out.stdout,
            out.stderr
        )))
    }
}

/// Runs `mqadmin <args> -n <namesrv>` with `home` as its `ROCKETMQ_HOME`. With `acl`, its
/// requests are signed as that account: 5.x `mqadmin` reads the keys from
/// `$ROCKETMQ_HOME/conf/tools.yml` (`accessKey`, `secretKey`), written here (replaced at once, so
/// runs sharing `home` never read half a file). With `tls` it speaks TLS, trusting its CA.
pub fn mqadmin_run(
    namesrv: &str,
    args: &[&str],
    home: &Path,
    acl: Option<&super::AclAccount>,
    tls: Option<&TlsFiles>,
) -> io::Result<MqadminOutput> {
    let conf = home.join("conf");
    std::fs::create_dir_all(&conf)?;
    let tools_yml = conf.join("tools.yml");
    match acl {
        Some(acl) => {
            let keys = format!(
                "accessKey: \"{}\"\nsecretKey: \"{}\"\n",
                acl.access_key, acl.secret_key
            );
            let staged = conf.join(format!(
                "tools.yml.{}.{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            std::fs::write(&staged, keys)?;
            std::fs::rename(&staged, &tools_yml)?;
        }
        None => match std::fs::remove_file(&tools_yml) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        },
    }
    let flags = tls.map(TlsFiles::client_flags).unwrap_or_default();
    let output = java(home, 128, &flags)?
        .arg("-XX:TieredStopAtLevel=1")
        .arg("org.apache.rocketmq.tools.command.MQAdminStartup")
        .args(args)
        .arg("-n")
        .arg(namesrv)
        .output()?;
    // Logback prints its configuration status on stdout; keep only the tool's own lines.
    let stdout: String = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| !line.contains("|-INFO in ") && !line.contains("|-WARN in "))
        .map(|line| format!("{line}\n"))
        .collect();
    Ok(MqadminOutput {
        stdout,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        success: output.status.success(),
    })
}

/// The `UNIQ_KEY` (the message id a consumer sees) of every message that `mqadmin`'s
/// `queryMsgById` or `queryMsgByUniqueKey` printed, in order. Ids it did not find print nothing.
pub fn printed_message_ids(output: &str) -> Vec<String> {
    output
        .lines()
        .filter(|line| line.trim_start().starts_with("Properties:"))
        .filter_map(|line| {
            let start = line.find("UNIQ_KEY=")? + "UNIQ_KEY=".len();
            let rest = &line[start..];
            let end = rest.find([',', '}']).unwrap_or(rest.len());
            Some(rest[..end].trim().to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn message_ids_are_read_from_the_printed_properties() {
        let out = "OffsetID:            7F00\nTopic:               t\n\
                   Properties:          {biz_key=k, UNIQ_KEY=C0A1, CLUSTER=DefaultCluster}\n\n\
                   Properties:          {UNIQ_KEY=C0A2}\nMessageTrack [consumerGroup=g]\n";
        assert_eq!(super::printed_message_ids(out), ["C0A1", "C0A2"]);
        assert!(super::printed_message_ids("").is_empty());
    }
}
