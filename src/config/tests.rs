#![allow(clippy::result_large_err)] // figment::Jail closures return figment::Error

use super::*;
use std::io::Write;

fn write_toml(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file
}

#[test]
fn defaults_match_the_documented_policy() {
    let c = Config::default();
    assert_eq!(c.retry.max_retry, 8);
    assert_eq!(c.retry.initial_backoff, Duration::from_secs(1));
    assert_eq!(c.retry.max_backoff, Duration::from_secs(300));
    assert_eq!(c.sweeper.interval, Duration::from_secs(5));
    assert_eq!(c.poll.interval, Duration::from_millis(500));
    assert_eq!(c.poll.batch_size, 100);
    assert_eq!(c.outbox.max_payload_bytes, 4 * 1024 * 1024);
    assert_eq!(c.relay.mode, RelayMode::Cdc);
    assert_eq!(c.outbox.tables, vec!["outbox_event".to_string()]);
}

#[test]
fn file_then_flags_override_in_order() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "relay.toml",
            r#"
            [mysql]
            url = "mysql://relay:pw@db:3306/app"
            [relay]
            shards = 4
            mode = "poll"
            [sweeper]
            interval = "10s"
            "#,
        )?;
        jail.set_env("OUTBOX_RELAY_RELAY__SHARDS", "16");
        let c = Config::load(
            Some(Path::new("relay.toml")),
            serde_json::json!({"rocketmq": {"namesrv_addr": "ns:9876"}}),
        )
        .unwrap();
        assert_eq!(c.mysql_url().unwrap(), "mysql://relay:pw@db:3306/app");
        assert_eq!(c.relay.shards, 16, "env overrides the file");
        assert_eq!(c.relay.mode, RelayMode::Poll);
        assert_eq!(c.sweeper.interval, Duration::from_secs(10));
        assert_eq!(c.namesrv_addr().unwrap(), "ns:9876");

        let c = Config::load(
            Some(Path::new("relay.toml")),
            serde_json::json!({"relay": {"shards": 2}}),
        )
        .unwrap();
        assert_eq!(c.relay.shards, 2, "flags override the environment");
        Ok(())
    });
}

#[test]
fn unknown_key_in_file_is_an_error_naming_it() {
    // Inside a Jail: another test sets OUTBOX_RELAY_* variables, and Jails run one at a time.
    figment::Jail::expect_with(|_jail| {
        let file = write_toml("[relay]\nshardz = 4\n");
        let err = Config::load(Some(file.path()), serde_json::json!({})).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("relay.shardz"), "{text}");
        assert!(text.contains("shards"), "lists the known keys: {text}");
        Ok(())
    });
}

#[test]
fn unknown_section_and_unknown_env_key_are_errors() {
    figment::Jail::expect_with(|jail| {
        let file = write_toml("[mysqll]\nurl = \"x\"\n");
        let text = Config::load(Some(file.path()), serde_json::json!({}))
            .unwrap_err()
            .to_string();
        assert!(text.contains("mysqll"), "{text}");
        jail.set_env("OUTBOX_RELAY_MYSQL__URLL", "mysql://x/y");
        let text = Config::load(None, serde_json::json!({}))
            .unwrap_err()
            .to_string();
        assert!(text.contains("mysql.urll"), "{text}");
        Ok(())
    });
}

#[test]
fn missing_required_values_name_the_key_and_how_to_set_it() {
    // Inside a Jail: another test sets OUTBOX_RELAY_* variables, and Jails run one at a time.
    figment::Jail::expect_with(|_jail| {
        let c = Config::load(None, serde_json::json!({})).unwrap();
        let text = c.mysql_url().unwrap_err().to_string();
        assert!(
            text.contains("mysql.url") && text.contains("OUTBOX_RELAY_MYSQL__URL"),
            "{text}"
        );
        let text = c.namesrv_addr().unwrap_err().to_string();
        assert!(
            text.contains("rocketmq.namesrv_addr") && text.contains("--namesrv-addr"),
            "{text}"
        );
        Ok(())
    });
}

#[test]
fn bad_values_are_rejected_with_the_key() {
    // Inside a Jail: another test sets OUTBOX_RELAY_* variables, and Jails run one at a time.
    figment::Jail::expect_with(|_jail| {
        let file = write_toml("[relay]\nshards = 0\n");
        let text = Config::load(Some(file.path()), serde_json::json!({}))
            .unwrap_err()
            .to_string();
        assert!(text.contains("relay.shards"), "{text}");

        let file = write_toml("[outbox]\ntables = [\"a;b\"]\n");
        let text = Config::load(Some(file.path()), serde_json::json!({}))
            .unwrap_err()
            .to_string();
        assert!(text.contains("outbox.tables"), "{text}");

        let file = write_toml("[sweeper]\ninterval = \"soon\"\n");
        let text = Config::load(Some(file.path()), serde_json::json!({}))
            .unwrap_err()
            .to_string();
        assert!(text.contains("interval"), "{text}");

        let file = write_toml("[relay]\nmark_linger = \"2s\"\n");
        let text = Config::load(Some(file.path()), serde_json::json!({}))
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("relay.mark_linger") && text.contains("at most 1s"),
            "{text}"
        );
        let file = write_toml("[relay]\nmark_linger = \"50ms\"\n");
        let config = Config::load(Some(file.path()), serde_json::json!({})).unwrap();
        assert_eq!(config.relay.mark_linger, Duration::from_millis(50));
        Ok(())
    });
}

#[test]
fn missing_file_is_a_clear_error() {
    // Inside a Jail: another test sets OUTBOX_RELAY_* variables, and Jails run one at a time.
    figment::Jail::expect_with(|_jail| {
        let err = Config::load(
            Some(Path::new("/nonexistent/relay.toml")),
            serde_json::json!({}),
        )
        .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/relay.toml"));
        Ok(())
    });
}

#[test]
fn redacted_output_hides_the_password() {
    let mut c = Config::default();
    c.mysql.url = Some("mysql://relay:s3cret@db:3306/app".into());
    let text = c.to_redacted_toml();
    assert!(!text.contains("s3cret"), "{text}");
    assert!(text.contains("relay:***@db:3306/app"), "{text}");
    assert_eq!(
        redact_url_password("mysql://root@h/db"),
        "mysql://root@h/db"
    );
}

#[test]
fn rocketmq_credentials_come_from_the_file_or_the_environment() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "relay.toml",
            "[rocketmq]\naccess_key = \"relay\"\nsecret_key = \"from-file\"\ntls = true\n",
        )?;
        let c = Config::load(Some(Path::new("relay.toml")), serde_json::json!({})).unwrap();
        assert_eq!(
            c.rocketmq.credentials().unwrap(),
            Some(Credentials::new("relay", "from-file"))
        );
        assert!(c.rocketmq.tls);
        assert!(!Config::default().rocketmq.tls, "TLS is off by default");
        assert_eq!(Config::default().rocketmq.credentials().unwrap(), None);

        // Variables are taken verbatim: a secret that looks like a number keeps its zeros.
        jail.set_env("OUTBOX_RELAY_ROCKETMQ__SECRET_KEY", "007");
        jail.set_env("OUTBOX_RELAY_ROCKETMQ__ACCESS_KEY", "1234");
        let c = Config::load(Some(Path::new("relay.toml")), serde_json::json!({})).unwrap();
        assert_eq!(
            c.rocketmq.credentials().unwrap(),
            Some(Credentials::new("1234", "007")),
            "the environment overrides the file"
        );
        Ok(())
    });
}

#[test]
fn the_secret_file_is_read_with_its_trailing_newline_trimmed() {
    let secret = write_toml("s3cret\n");
    let config = RocketMqConfig {
        access_key: Some("relay".into()),
        secret_key_file: Some(secret.path().to_path_buf()),
        ..RocketMqConfig::default()
    };
    assert_eq!(
        config.credentials().unwrap(),
        Some(Credentials::new("relay", "s3cret"))
    );

    let empty = write_toml("\n");
    let config = RocketMqConfig {
        secret_key_file: Some(empty.path().to_path_buf()),
        ..config
    };
    let text = config.credentials().unwrap_err().to_string();
    assert!(
        text.contains("secret_key_file") && text.contains("empty"),
        "{text}"
    );

    let config = RocketMqConfig {
        secret_key_file: Some("/nonexistent/secret".into()),
        ..config
    };
    let text = config.credentials().unwrap_err().to_string();
    assert!(text.contains("/nonexistent/secret"), "{text}");
}

#[test]
fn incomplete_or_doubled_credentials_are_errors_naming_the_keys() {
    figment::Jail::expect_with(|jail| {
        let load = |toml: &str| {
            let file = write_toml(toml);
            Config::load(Some(file.path()), serde_json::json!({}))
                .unwrap_err()
                .to_string()
        };
        let text = load("[rocketmq]\naccess_key = \"relay\"\n");
        assert!(
            text.contains("rocketmq.access_key")
                && text.contains("rocketmq.secret_key")
                && text.contains("rocketmq.secret_key_file"),
            "{text}"
        );
        let text = load("[rocketmq]\nsecret_key = \"s3cret\"\n");
        assert!(text.contains("rocketmq.access_key"), "{text}");
        assert!(!text.contains("s3cret"), "the secret is not echoed: {text}");
        let text = load("[rocketmq]\nsecret_key_file = \"/run/secret\"\n");
        assert!(text.contains("rocketmq.access_key"), "{text}");
        let text = load(
            "[rocketmq]\naccess_key = \"relay\"\nsecret_key = \"s3cret\"\n\
             secret_key_file = \"/run/secret\"\n",
        );
        assert!(
            text.contains("both") && text.contains("secret_key_file"),
            "{text}"
        );
        assert!(!text.contains("s3cret"), "{text}");

        // A secret of the wrong type is refused without being shown.
        let text = load("[rocketmq]\naccess_key = \"relay\"\nsecret_key = 918273\n");
        assert!(
            text.contains("secret_key") && !text.contains("918273"),
            "{text}"
        );
        jail.set_env("OUTBOX_RELAY_ROCKETMQ__ACCESS_KEY", "relay");
        let text = Config::load(None, serde_json::json!({}))
            .unwrap_err()
            .to_string();
        assert!(text.contains("without a secret"), "{text}");
        Ok(())
    });
}

#[test]
fn the_rocketmq_secret_is_masked_for_people_and_kept_for_processes() {
    let mut c = Config::default();
    c.rocketmq.access_key = Some("relay".into());
    c.rocketmq.secret_key = Some(Secret::new("s3cret-value"));
    let shown = c.to_redacted_toml();
    assert!(!shown.contains("s3cret-value"), "{shown}");
    assert!(shown.contains("secret_key = \"***\""), "{shown}");
    assert!(shown.contains("access_key = \"relay\""), "{shown}");
    let debug = format!("{c:?} {:?}", c.rocketmq.credentials().unwrap());
    assert!(!debug.contains("s3cret-value"), "{debug}");
    assert_eq!(format!("{}", Secret::new("x")), "***");

    // A config file written for a relay process keeps the real secret.
    let written = toml::to_string(&c).unwrap();
    let read: Config = toml::from_str(&written).unwrap();
    assert_eq!(read, c);
}

#[test]
fn a_namespace_is_taken_verbatim_and_checked() {
    figment::Jail::expect_with(|jail| {
        jail.create_file("relay.toml", "[rocketmq]\nnamespace = \"tenant-a\"\n")?;
        let c = Config::load(Some(Path::new("relay.toml")), serde_json::json!({})).unwrap();
        assert_eq!(c.rocketmq.namespace.as_deref(), Some("tenant-a"));
        assert_eq!(c.rocketmq.in_namespace("orders"), "tenant-a%orders");
        assert_eq!(Config::default().rocketmq.in_namespace("orders"), "orders");

        jail.set_env("OUTBOX_RELAY_ROCKETMQ__NAMESPACE", "0042");
        let c = Config::load(Some(Path::new("relay.toml")), serde_json::json!({})).unwrap();
        assert_eq!(c.rocketmq.namespace.as_deref(), Some("0042"));

        for bad in ["a%b", "", "ten ant"] {
            jail.set_env("OUTBOX_RELAY_ROCKETMQ__NAMESPACE", bad);
            let e = Config::load(Some(Path::new("relay.toml")), serde_json::json!({}));
            let e = e.expect_err(bad).to_string();
            assert!(e.contains("`rocketmq.namespace`"), "{bad:?}: {e}");
        }
        Ok(())
    });
}
