//! The relay as its own process: the `outbox-relay` binary users run, started from a config
//! file, killed with `kill -9` or stopped with SIGTERM by the tests.

use rocketmq_outbox::config::Config;
use std::process::{Child, Command, Output, Stdio};

/// Writes `config` as the TOML file of a relay process.
pub fn write_config_file(config: &Config, dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("relay.toml");
    std::fs::write(&path, toml::to_string(config).unwrap()).unwrap();
    path
}

/// Starts `outbox-relay -c FILE run` as a child process (no metrics endpoint), logging warnings
/// to the test's stderr (`OUTBOX_TEST_RELAY_LOG` sets another `RUST_LOG`, e.g.
/// `warn,rocketmq_outbox=info` for the relay's figures in a demonstration).
pub fn spawn_relay_process(config_file: &std::path::Path) -> Child {
    Command::new(outbox_devenv::workspace_binary("outbox-relay"))
        .args([
            "-c",
            config_file.to_str().unwrap(),
            "--metrics-listen",
            "",
            "run",
        ])
        .env(
            "RUST_LOG",
            std::env::var("OUTBOX_TEST_RELAY_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .spawn()
        .expect("start outbox-relay run")
}

/// A relay process that is killed if the test fails before stopping it; a failing test
/// prints the tail of its log (the log's directory is usually a temporary one, gone after).
pub struct RelayProcess {
    child: Child,
    log: Option<std::path::PathBuf>,
}

/// How much of a failed test's relay log is printed.
const LOG_TAIL_LINES: usize = 60;

impl RelayProcess {
    pub fn spawn(config_file: &std::path::Path) -> Self {
        RelayProcess {
            child: spawn_relay_process(config_file),
            log: None,
        }
    }

    /// `outbox-relay -c FILE --metrics-listen ADDR run` with `env` set, logging at the default
    /// level to `log`.
    pub fn spawn_serving(
        config_file: &std::path::Path,
        metrics: &str,
        log: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Self {
        let mut command = Command::new(outbox_devenv::workspace_binary("outbox-relay"));
        command
            .args([
                "-c",
                config_file.to_str().unwrap(),
                "--metrics-listen",
                metrics,
                "run",
            ])
            .env_remove("RUST_LOG")
            .envs(env.iter().copied());
        Self::spawn_command(command, log)
    }

    /// Starts `command` (a relay however launched: e.g. from an image's root filesystem) with
    /// its stderr to `log`.
    pub fn spawn_command(mut command: Command, log: &std::path::Path) -> Self {
        let file = std::fs::File::create(log).expect("relay log file");
        let child = command
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start outbox-relay run");
        RelayProcess {
            child,
            log: Some(log.to_path_buf()),
        }
    }

    /// How the process ended, if it has.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (e.g. `SIGSTOP` to freeze the process, `SIGCONT` to thaw it).
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
    }

    /// SIGKILL: no drain, no release of claimed rows.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM (graceful stop); the exit must be clean.
    pub fn stop(mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "SIGTERM is a clean stop: {status:?}");
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            if let Some(text) = self
                .log
                .as_ref()
                .and_then(|p| std::fs::read_to_string(p).ok())
            {
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
                println!(
                    "the relay's log ({}), its last {} lines:\n{}",
                    self.log.as_ref().unwrap().display(),
                    tail.len(),
                    tail.join("\n")
                );
            }
        }
    }
}

/// Runs `outbox-relay ARGS` (a command an operator types) to its end.
pub fn outbox_relay(args: &[&str]) -> Output {
    outbox_relay_with(args, &[])
}

/// Runs `outbox-relay ARGS` with `env` set, without a configuration file from the environment.
pub fn outbox_relay_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(outbox_devenv::workspace_binary("outbox-relay"))
        .args(args)
        .env_remove("OUTBOX_RELAY_CONFIG")
        .envs(env.iter().copied())
        .output()
        .expect("run outbox-relay")
}
