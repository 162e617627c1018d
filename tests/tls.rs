//! TLS to MySQL (`mysql.tls`, `mysql.tls_ca`) against a MariaDB of this binary serving a
//! certificate from a CA made here with the `openssl` CLI: a user that requires TLS can migrate,
//! pass the start-up checks and stream the binlog only over a verified connection.

mod common;

use common::relay::{relay_config, wait_until_sent, write_events, RunningRelay};
use common::rocketmq::new_topic;
use mysql_async::prelude::*;
use outbox_relay::config::TlsMode;
use outbox_relay::devenv::{scratch_dir, MariaDb, MariaDbOptions};
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
    let file = |name: &str| certs.path().join(name).display().to_string();
    let mut options = MariaDbOptions::new(scratch_dir("tls-mariadb").unwrap());
    options.extra_args = vec![
        format!("--ssl-ca={}", file("ca.pem")),
        format!("--ssl-cert={}", file("server.pem")),
        format!("--ssl-key={}", file("server.key")),
    ];
    let server = MariaDb::start(options).expect("MariaDB with TLS");
    let url = server.create_database("tls").unwrap();
    let database = url.rsplit('/').next().unwrap().to_string();
    let mut root = mysql_async::Conn::from_url(&url).await.unwrap();
    for sql in [
        "CREATE USER 'secure'@'%' IDENTIFIED BY 'pw' REQUIRE SSL".to_string(),
        format!("GRANT ALL ON `{database}`.* TO 'secure'@'%'"),
        "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO 'secure'@'%'".to_string(),
    ] {
        root.query_drop(sql).await.unwrap();
    }
    let secure_url = url.replacen("root@", "secure:pw@", 1);
    assert_ne!(secure_url, url, "the URL names root: {url}");

    let mut config = outbox_relay::Config::default();
    config.mysql.url = Some(secure_url.clone());
    // Without TLS the server refuses the user.
    assert!(outbox_relay::db::pool(&config)
        .unwrap()
        .get_conn()
        .await
        .is_err());
    // With a CA that did not sign the server's certificate, the client refuses the server.
    config.mysql.tls = TlsMode::VerifyIdentity;
    config.mysql.tls_ca = Some(certs.path().join("other.pem"));
    assert!(outbox_relay::db::pool(&config)
        .unwrap()
        .get_conn()
        .await
        .is_err());
    // With the right CA: encrypted and verified.
    config.mysql.tls_ca = Some(certs.path().join("ca.pem"));
    let pool = outbox_relay::db::pool(&config).unwrap();
    let mut conn = pool.get_conn().await.unwrap();
    let cipher: Option<(String, String)> = conn
        .query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .await
        .unwrap();
    let cipher = cipher.unwrap().1;
    println!("TLS cipher: {cipher}");
    assert!(!cipher.is_empty(), "the session is encrypted");
    outbox_relay::schema::migrate(&mut conn, &config.outbox_tables())
        .await
        .unwrap();
    drop(conn);

    // The relay streams the binlog and marks rows over the same verified connections.
    let db = common::TestDb {
        url: secure_url,
        pool,
        config,
    };
    let (config, _dir) = relay_config(&db);
    let topic = new_topic("tls");
    let relay = RunningRelay::start(&config).await;
    write_events(&db, &topic, 1, 20, 5).await;
    wait_until_sent(&db, 20, Duration::from_secs(60)).await;
    relay.stop().await;
}
