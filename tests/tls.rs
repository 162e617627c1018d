//! TLS to MySQL (`mysql.tls`, `mysql.tls_ca`) against a MariaDB or MySQL (`OUTBOX_TEST_DB`) of
//! this binary serving a certificate from a CA made here with the `openssl` CLI: a user that
//! requires TLS can migrate, pass the start-up checks and stream the binlog only over a verified
//! connection. On MySQL, accounts use `caching_sha2_password`, whose full authentication differs
//! over TLS (the password in the clear) and without (RSA-encrypted with the server's key): a
//! second test proves the relay over a plain connection too, on the binary's shared server.

use crate::common;

use common::relay::{
    assert_every_event_arrived_in_key_order, current_position, relay_config, seed_checkpoint,
    wait_until_sent, write_events, RunningRelay,
};
use common::rocketmq::new_topic;
use mysql_async::prelude::*;
use outbox_devenv::{scratch_dir, Database, DatabaseKind, DatabaseOptions, ServerTls, SqlServer};
use rocketmq_outbox::config::TlsMode;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl CLI");
    assert!(status.success(), "openssl {args:?}");
}

/// A CA (`ca.pem`) and a server certificate for 127.0.0.1 (`server.pem`, `server.key`) it signed.
fn make_certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=outbox-relay test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName = IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    );
    // A second, unrelated CA: verification against it must fail.
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "other.key",
            "-out",
            "other.pem",
            "-days",
            "2",
            "-subj",
            "/CN=another CA",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_that_requires_tls_relays_over_a_verified_connection() {
    common::init_logging();
    let certs = tempfile::tempdir().unwrap();
    make_certificates(certs.path());
    let kind = DatabaseKind::from_env().unwrap();
    let options = DatabaseOptions {
        tls: Some(ServerTls {
            ca: certs.path().join("ca.pem"),
            cert: certs.path().join("server.pem"),
            key: certs.path().join("server.key"),
        }),
        ..DatabaseOptions::default()
    };
    let dir = scratch_dir(&format!("tls-{}", kind.name())).unwrap();
    let server = Database::start_with(kind, &dir, options).expect("a server with TLS");
    let url = server.create_database("tls").unwrap();
    let database = url.rsplit('/').next().unwrap().to_string();
    let mut root = mysql_async::Conn::from_url(&url).await.unwrap();
    for sql in [
        "CREATE USER 'secure'@'%' IDENTIFIED BY 'pw' REQUIRE SSL".to_string(),
        format!("GRANT ALL ON `{database}`.* TO 'secure'@'%'"),
        format!(
            "GRANT {} ON *.* TO 'secure'@'%'",
            replication_privileges(kind)
        ),
    ] {
        root.query_drop(sql).await.unwrap();
    }
    assert_auth_plugin(&mut root, kind, "secure").await;
    let secure_url = url.replacen("root@", "secure:pw@", 1);
    assert_ne!(secure_url, url, "the URL names root: {url}");

    let mut config = rocketmq_outbox::Config::default();
    config.mysql.url = Some(secure_url.clone());
    // Without TLS the server refuses the user.
    assert!(rocketmq_outbox::db::pool(&config)
        .unwrap()
        .get_conn()
        .await
        .is_err());
    // With a CA that did not sign the server's certificate, the client refuses the server.
    config.mysql.tls = TlsMode::VerifyIdentity;
    config.mysql.tls_ca = Some(certs.path().join("other.pem"));
    assert!(rocketmq_outbox::db::pool(&config)
        .unwrap()
        .get_conn()
        .await
        .is_err());
    // With the right CA: encrypted and verified.
    config.mysql.tls_ca = Some(certs.path().join("ca.pem"));
    let pool = rocketmq_outbox::db::pool(&config).unwrap();
    let mut conn = pool.get_conn().await.unwrap();
    let cipher: Option<(String, String)> = conn
        .query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .await
        .unwrap();
    let cipher = cipher.unwrap().1;
    println!("TLS cipher: {cipher}");
    assert!(!cipher.is_empty(), "the session is encrypted");
    rocketmq_outbox::schema::migrate(&mut conn, &config.outbox_tables())
        .await
        .unwrap();
    drop(conn);

    // The relay streams the binlog and marks rows over the same verified connections.
    let db = common::TestDb {
        url: secure_url,
        pool,
        config,
    };
    relay_twenty_events(&db, "tls").await;
}

/// The relay on `db`'s connections: 20 events written and SENT, and each one stored by the
/// broker, in key order, under the msg_id its row records.
async fn relay_twenty_events(db: &common::TestDb, prefix: &str) {
    let (config, _dir) = relay_config(db);
    // From the server's position now: events written while the relay starts are streamed, not
    // left to the sweeper (which would publish them after newer events of their keys).
    seed_checkpoint(&config, &current_position(db).await);
    let topic = new_topic(prefix);
    let relay = RunningRelay::start(&config).await;
    write_events(db, &topic, 1, 20, 5).await;
    wait_until_sent(db, 20, Duration::from_secs(60)).await;
    let summary = relay.stop().await;
    assert_eq!(summary.marked.failed, 0);
    assert_every_event_arrived_in_key_order(db, &topic, 20).await;
}

/// What the relay's account needs globally: the dump and the binlog position.
fn replication_privileges(kind: DatabaseKind) -> &'static str {
    match kind {
        DatabaseKind::MariaDb => "REPLICATION SLAVE, BINLOG MONITOR",
        DatabaseKind::MySql => "REPLICATION SLAVE, REPLICATION CLIENT",
    }
}

/// On MySQL, `user`'s account authenticates with `caching_sha2_password` (the 9.x default and
/// the only password plugin left).
async fn assert_auth_plugin(root: &mut mysql_async::Conn, kind: DatabaseKind, user: &str) {
    if kind == DatabaseKind::MySql {
        let plugin: Option<String> = root
            .exec_first("SELECT plugin FROM mysql.user WHERE user = ?", (user,))
            .await
            .unwrap();
        assert_eq!(plugin.as_deref(), Some("caching_sha2_password"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_user_relays_over_plain_tcp() {
    // The binary's server (no TLS asked for). A new account's first login, and every login
    // after `FLUSH PRIVILEGES` (which empties MySQL's caching_sha2_password cache), takes the
    // full authentication path: the case a plain connection must pass.
    let db = common::TestDb::empty("plain").await;
    let kind = common::database().kind();
    let user = format!("plain_{}", std::process::id());
    let mut root = db.conn().await;
    for sql in [
        format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'plain-pw'"),
        format!("GRANT ALL ON `{}`.* TO '{user}'@'%'", db.name()),
        format!(
            "GRANT {} ON *.* TO '{user}'@'%'",
            replication_privileges(kind)
        ),
    ] {
        root.query_drop(sql).await.unwrap();
    }
    assert_auth_plugin(&mut root, kind, &user).await;
    let plain_url = db.url.replacen("root@", &format!("{user}:plain-pw@"), 1);
    let mut config = rocketmq_outbox::Config::default();
    config.mysql.url = Some(plain_url.clone());
    assert_eq!(config.mysql.tls, TlsMode::Disabled);
    let pool = rocketmq_outbox::db::pool(&config).unwrap();
    let mut conn = pool.get_conn().await.unwrap();
    let cipher: Option<(String, String)> = conn
        .query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .await
        .unwrap();
    assert_eq!(cipher.unwrap().1, "", "the session is not encrypted");
    rocketmq_outbox::schema::migrate(&mut conn, &config.outbox_tables())
        .await
        .unwrap();
    drop(conn);
    pool.disconnect().await.unwrap();
    // Nothing cached: the relay's first logins take the full path again.
    root.query_drop("FLUSH PRIVILEGES").await.unwrap();
    let db = common::TestDb {
        url: plain_url,
        pool: rocketmq_outbox::db::pool(&config).unwrap(),
        config,
    };
    relay_twenty_events(&db, "plain").await;
}
