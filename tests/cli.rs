//! The `outbox-relay` binary: configuration errors a user sees, and `migrate` end to end.

use crate::common;

use common::process::{outbox_relay, outbox_relay_with};
use outbox_devenv::SqlServer;
use std::io::Write;
use std::process::{Command, Output};

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn version_names_the_git_commit_of_the_build() {
    let out = outbox_relay(&["--version"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let expected = format!("outbox-relay {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(line.starts_with(&expected), "{line}");
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match (option_env!("OUTBOX_RELAY_GIT_COMMIT"), head) {
        (Some(given), _) => assert!(line.contains(given), "{line}"),
        (None, Some(head)) => assert!(line.contains(&head), "HEAD {head}: {line}"),
        (None, None) => assert!(line.contains("commit unknown"), "{line}"),
    }
}

#[test]
fn migrate_without_a_database_url_says_which_key_to_set() {
    let out = outbox_relay(&["migrate"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("mysql.url"), "{err}");
    assert!(err.contains("OUTBOX_RELAY_MYSQL__URL"), "{err}");
}

#[test]
fn an_unknown_config_key_fails_naming_the_key() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(
        file,
        "[mysql]\nurl = \"mysql://root@127.0.0.1:1/x\"\n[sweeper]\nintervall = \"5s\""
    )
    .unwrap();
    let out = outbox_relay(&["-c", file.path().to_str().unwrap(), "config", "check"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("sweeper.intervall"), "{err}");
}

#[test]
fn config_show_masks_the_password_and_the_rocketmq_secret() {
    let out = outbox_relay_with(
        &[
            "--mysql-url",
            "mysql://relay:hunter2@db:3306/app",
            "config",
            "show",
        ],
        &[
            ("OUTBOX_RELAY_ROCKETMQ__ACCESS_KEY", "relay"),
            ("OUTBOX_RELAY_ROCKETMQ__SECRET_KEY", "correct-horse"),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("relay:***@db:3306/app"), "{text}");
    assert!(!text.contains("correct-horse"), "{text}");
    assert!(text.contains("secret_key = \"***\""), "{text}");
}

#[test]
fn config_check_reads_the_rocketmq_secret_file() {
    let args = [
        "--mysql-url",
        "mysql://relay@db:3306/app",
        "config",
        "check",
    ];
    let account = ("OUTBOX_RELAY_ROCKETMQ__ACCESS_KEY", "relay");
    let missing = (
        "OUTBOX_RELAY_ROCKETMQ__SECRET_KEY_FILE",
        "/nonexistent/rocketmq-secret",
    );
    let out = outbox_relay_with(&args, &[account, missing]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("rocketmq.secret_key_file") && err.contains("/nonexistent/rocketmq-secret"),
        "{err}"
    );
    let mut secret = tempfile::NamedTempFile::new().unwrap();
    writeln!(secret, "s3cret").unwrap();
    let file = secret.path().to_str().unwrap();
    let out = outbox_relay_with(
        &args,
        &[account, ("OUTBOX_RELAY_ROCKETMQ__SECRET_KEY_FILE", file)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn migrate_applies_then_reports_up_to_date() {
    let url = common::database().create_database("cli_migrate").unwrap();
    let out = outbox_relay(&["--mysql-url", &url, "migrate"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("applied 0001 0001_outbox_event"), "{text}");
    let all = rocketmq_outbox::schema::MIGRATIONS.len();
    assert!(text.contains(&format!("{all} applied now")), "{text}");

    let out = outbox_relay(&["--mysql-url", &url, "migrate"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains(&format!("0 applied now, {all} already applied")));

    let out = outbox_relay(&["--mysql-url", &url, "migrate", "--status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("applied").count(), all, "{text}");
}

#[test]
fn demo_enqueues_events_in_business_transactions() {
    let url = common::database().create_database("cli_demo").unwrap();
    assert!(outbox_relay(&["--mysql-url", &url, "migrate"])
        .status
        .success());
    let out = Command::new(common::outbox_dev())
        .args(["--mysql-url", &url, "demo", "--events", "2"])
        .env_remove("OUTBOX_RELAY_CONFIG")
        .output()
        .expect("run outbox-dev");
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.matches("enqueued on topic outbox-demo").count(),
        2,
        "{text}"
    );
}

#[test]
fn an_unreachable_database_is_a_clear_error() {
    let out = outbox_relay(&[
        "--mysql-url",
        "mysql://root:secret@127.0.0.1:1/app",
        "migrate",
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("cannot connect to MySQL"), "{err}");
    assert!(!err.contains("secret"), "password leaked: {err}");
}
