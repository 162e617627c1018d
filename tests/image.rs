//! The container image without a Docker engine: the release binary, run from a root filesystem
//! that holds what the Dockerfile's runtime stage holds (Debian 12 minbase, what bookworm-slim is
//! made from, with `deploy/image/runtime-setup.sh` applied: ca-certificates, user 10001) plus the
//! binary and the migrations at the image's paths, with the image's environment, as user 10001.
//! From there it prints its version, migrates an empty database, and two instances (a leader and
//! a standby, as the Kubernetes Deployment runs them) deliver every event to the broker in key
//! order, then stop cleanly on SIGTERM.
//!
//! Needs root (chroot, mounts) and the release binary: `scripts/test.sh` runs it, as
//! `OUTBOX_IMAGE_BINARY=target/release/outbox-relay cargo test --test image -- --ignored`, after
//! `scripts/setup.sh --image` made the base root filesystem.

use crate::common;

use common::http::{free_addr, get};
use common::process::RelayProcess;
use common::relay::{
    assert_every_event_arrived_in_key_order, relay_config_on, wait_for, wait_until_sent,
    write_events,
};
use common::rocketmq::{new_topic, rocketmq};
use common::TestDb;
use outbox_devenv::{cache_dir, scratch_dir};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The image's user (Dockerfile `USER`, runtime-setup.sh's `useradd`).
const IMAGE_USER: &str = "10001:10001";
/// Where the image puts the binary.
const IMAGE_BINARY: &str = "/usr/local/bin/outbox-relay";
/// Where the image puts the migrations.
const IMAGE_MIGRATIONS: &str = "/usr/share/outbox-relay/migrations";
/// The image's state volume (the local checkpoint), the one writable directory.
const STATE_DIR: &str = "/var/lib/outbox-relay";

/// A root filesystem made like the image, seen by the relay as Kubernetes' chart runs it: read-only
/// (`readOnlyRootFilesystem`) but for the state volume at `/var/lib/outbox-relay`, with `/proc`
/// mounted as a container runtime mounts it. Unmounted when dropped.
struct ImageRoot {
    /// The assembled tree (writable from the host: the test writes the config here).
    dir: PathBuf,
    /// `dir` bound read-only, with the state directory bound writable: where the relay runs.
    view: PathBuf,
    /// The runtime stage's `ENV` lines, read from the Dockerfile.
    env: Vec<(String, String)>,
}

impl ImageRoot {
    fn assemble() -> Self {
        let binary = std::env::var_os("OUTBOX_IMAGE_BINARY").map(PathBuf::from).expect(
            "OUTBOX_IMAGE_BINARY must name the release binary (cargo build --release; scripts/test.sh does it)",
        );
        let base = std::env::var_os("OUTBOX_IMAGE_BASE")
            .map(PathBuf::from)
            .unwrap_or_else(|| cache_dir().join("image-base-bookworm"));
        assert!(
            base.join("etc/debian_version").exists(),
            "no image base at {}: run scripts/setup.sh --image",
            base.display()
        );
        let dir = scratch_dir("image-root").unwrap();
        run(Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", base.display()))
            .arg(&dir));
        let root = ImageRoot {
            dir,
            view: scratch_dir("image-view").unwrap(),
            env: dockerfile_runtime_env(),
        };
        std::fs::copy(&binary, root.path(IMAGE_BINARY)).unwrap();
        std::fs::create_dir_all(root.path(IMAGE_MIGRATIONS)).unwrap();
        for file in
            std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations")).unwrap()
        {
            let file = file.unwrap().path();
            std::fs::copy(
                &file,
                root.path(IMAGE_MIGRATIONS).join(file.file_name().unwrap()),
            )
            .unwrap();
        }
        // What a container runtime provides: an /etc/hosts and /proc (debootstrap made the
        // device nodes a runtime puts in /dev). No bind mount of the host's /dev: the removal of
        // a killed test's scratch directory would walk into it.
        std::fs::copy("/etc/hosts", root.path("/etc/hosts")).unwrap();
        let view = |inside: &str| root.view.join(inside.trim_start_matches('/'));
        run(Command::new("mount")
            .arg("--bind")
            .arg(&root.dir)
            .arg(&root.view));
        run(Command::new("mount")
            .args(["-o", "remount,bind,ro"])
            .arg(&root.view));
        run(Command::new("mount")
            .arg("--bind")
            .arg(root.path(STATE_DIR))
            .arg(view(STATE_DIR)));
        run(Command::new("mount")
            .args(["-t", "proc", "proc"])
            .arg(view("/proc")));
        root
    }

    /// `inside` (an absolute path in the image) on the host.
    fn path(&self, inside: &str) -> PathBuf {
        self.dir.join(inside.trim_start_matches('/'))
    }

    /// The image's binary with `args`, as the image's user, with only the image's environment
    /// and `env`.
    fn command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut command = Command::new("/usr/sbin/chroot");
        command
            .arg(format!("--userspec={IMAGE_USER}"))
            .arg(&self.view)
            .arg(IMAGE_BINARY)
            .args(args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(env.iter().copied());
        command
    }
}

impl Drop for ImageRoot {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .args(["--recursive", "--lazy"])
            .arg(&self.view)
            .status();
    }
}

/// Runs `command` to success.
fn run(command: &mut Command) {
    let status = command.status().unwrap();
    assert!(status.success(), "{command:?}: {status}");
}

/// The Dockerfile's runtime stage (its last), from the word after `FROM`.
fn dockerfile_runtime_stage() -> String {
    let dockerfile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile")).unwrap();
    dockerfile.rsplit("\nFROM ").next().unwrap().to_string()
}

/// The `ENV` key=value pairs of the Dockerfile's runtime stage.
fn dockerfile_runtime_env() -> Vec<(String, String)> {
    let runtime = dockerfile_runtime_stage();
    let mut env = Vec::new();
    let mut in_env = false;
    for line in runtime.lines() {
        let line = line.trim();
        let rest = match line.strip_prefix("ENV ") {
            Some(rest) => rest,
            None if in_env => line,
            None => continue,
        };
        in_env = rest.ends_with('\\');
        for pair in rest.trim_end_matches('\\').split_whitespace() {
            let (key, value) = pair.split_once('=').expect("ENV KEY=value");
            env.push((key.to_string(), value.to_string()));
        }
    }
    assert!(!env.is_empty(), "the runtime stage sets no ENV");
    env
}

#[test]
fn the_dockerfile_installs_what_this_test_runs() {
    let runtime = dockerfile_runtime_stage();
    assert!(runtime.starts_with("debian:bookworm-slim"), "{runtime}");
    for needle in [
        "deploy/image/runtime-setup.sh",
        &format!("USER {IMAGE_USER}"),
        &format!("/usr/local/bin/outbox-relay {IMAGE_BINARY}"),
        &format!("COPY migrations {IMAGE_MIGRATIONS}"),
        &format!("ENTRYPOINT [\"{IMAGE_BINARY}\"]"),
    ] {
        assert!(
            runtime.contains(needle),
            "the runtime stage lacks `{needle}`"
        );
    }
    let env = dockerfile_runtime_env();
    for key in [
        "OUTBOX_RELAY_CONFIG",
        "OUTBOX_RELAY_RELAY__CHECKPOINT_DIR",
        "OUTBOX_RELAY_METRICS__LISTEN",
    ] {
        assert!(env.iter().any(|(k, _)| k == key), "{key} not in {env:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and the release binary: scripts/test.sh runs it (OUTBOX_IMAGE_BINARY)"]
async fn the_image_binary_migrates_and_two_instances_relay_from_a_minimal_root_filesystem() {
    let root = ImageRoot::assemble();
    assert!(
        !root.path("/usr/bin/cargo").exists() && !root.path("/usr/bin/mysql").exists(),
        "the image holds no build tools or database client"
    );

    let touch = Command::new("/usr/sbin/chroot")
        .arg(&root.view)
        .args(["/usr/bin/touch", "/etc/outbox-relay/probe"])
        .output()
        .unwrap();
    let refused = String::from_utf8_lossy(&touch.stderr);
    assert!(
        !touch.status.success() && refused.contains("Read-only file system"),
        "the root filesystem is read-only, even for root: {refused}"
    );

    let version = root.command(&["--version"], &[]).output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    assert!(
        version.starts_with(&format!(
            "outbox-relay {} (commit ",
            env!("CARGO_PKG_VERSION")
        )),
        "{version}"
    );

    let db = TestDb::empty("image").await;
    let topic = new_topic("image");
    let (mut config, _dir) = relay_config_on(&db, &rocketmq().namesrv_addr());
    config.sweeper.min_age = Duration::from_secs(2);
    let config_file = root.path("/etc/outbox-relay/relay.toml");
    std::fs::write(&config_file, toml::to_string(&config).unwrap()).unwrap();

    let migrate = root.command(&["migrate"], &[]).output().unwrap();
    assert!(
        migrate.status.success(),
        "migrate from the image: {}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    assert_eq!(db.count("outbox_event").await, 0, "migrate made the outbox");

    // Two pods: own instance id (the pod name), own state volume, own metrics port.
    let logs = scratch_dir("image-logs").unwrap();
    let pods: Vec<(String, RelayProcess)> = ["relay-0", "relay-1"]
        .iter()
        .map(|pod| {
            let addr = free_addr();
            let state = format!("{STATE_DIR}/{pod}");
            let command = root.command(
                &["--metrics-listen", &addr, "run", "--drain-timeout", "10s"],
                &[
                    ("OUTBOX_RELAY_RELAY__INSTANCE_ID", pod),
                    ("OUTBOX_RELAY_RELAY__CHECKPOINT_DIR", &state),
                ],
            );
            let process = RelayProcess::spawn_command(command, &logs.join(format!("{pod}.log")));
            (addr, process)
        })
        .collect();
    let roles = || {
        pods.iter()
            .filter_map(|(addr, _)| get(addr, "/readyz"))
            .filter(|(status, _)| *status == 200)
            .map(|(_, body)| {
                serde_json::from_str::<serde_json::Value>(&body).unwrap()["role"].clone()
            })
            .collect::<Vec<_>>()
    };
    wait_for(
        "a leader and a ready standby",
        Duration::from_secs(60),
        || {
            let mut roles = roles();
            roles.sort_by_key(|r| r.to_string());
            async move { roles == [serde_json::json!("standby"), serde_json::json!("streaming")] }
        },
    )
    .await;

    write_events(&db, &topic, 2, 300, 40).await;
    wait_until_sent(&db, 600, Duration::from_secs(60)).await;
    assert_every_event_arrived_in_key_order(&db, &topic, 600).await;

    for (_, pod) in pods {
        pod.stop();
    }
    let state = root.path(&format!("{STATE_DIR}/relay-0"));
    let owner = std::fs::metadata(&state).unwrap().uid();
    assert_eq!(
        owner, 10001,
        "the relay wrote its state as user 10001, not root"
    );
}
