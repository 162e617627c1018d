//! Relay processes under a supervisor, as systemd would run them: every instance that exits (or
//! was killed) is started again on the next [`Relays::supervise`] tick, unless the harness holds
//! them down (a purge-while-down fault). Each instance has its own config file, checkpoint
//! directory, server id and log file (`relay-<instance>.log` beside its config).

use rocketmq_outbox::config::Config;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Relays {
    instances: Vec<Instance>,
    /// While true, [`Relays::supervise`] does not restart anything.
    held_down: bool,
    /// Extra environment of every process (e.g. `FAILPOINTS`).
    env: Vec<(String, String)>,
}

struct Instance {
    id: String,
    config_file: PathBuf,
    log_file: PathBuf,
    child: Option<Child>,
    starts: u32,
}

/// A CDC relay config for the soak: short sweeper bounds so gaps (purged binlogs, lost
/// statements) are swept within seconds, and a broker retry policy that keeps trying (a broker
/// outage is retryable and must FAIL nothing).
/// The relays' `rocketmq.send_timeout`.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(2);

pub fn soak_config(url: String, namesrv: String) -> Config {
    let mut config = Config::default();
    config.mysql.url = Some(url);
    config.mysql.heartbeat = Duration::from_secs(1);
    config.rocketmq.namesrv_addr = Some(namesrv);
    config.rocketmq.send_timeout = SEND_TIMEOUT;
    config.relay.shards = 4;
    config.relay.name = "soak".into();
    config.retry.initial_backoff = Duration::from_millis(200);
    config.retry.max_backoff = Duration::from_secs(2);
    config.retry.max_retry = 10_000;
    config.sweeper.interval = Duration::from_millis(500);
    config.sweeper.min_age = Duration::from_secs(2);
    config.sweeper.lease = Duration::from_secs(10);
    config
}

impl Relays {
    /// Writes one config per instance (`a`, `b`, …) under `dir` and starts them all.
    pub fn start(base: &Config, count: usize, dir: &Path, env: Vec<(String, String)>) -> Self {
        let instances = (0..count)
            .map(|i| {
                let id = ((b'a' + i as u8) as char).to_string();
                let own_dir = dir.join(format!("relay-{id}"));
                std::fs::create_dir_all(&own_dir).unwrap();
                let mut config = base.clone();
                config.relay.instance_id = Some(id.clone());
                config.relay.checkpoint_dir = own_dir.join("checkpoint");
                config.mysql.server_id = 7_000 + std::process::id() % 1_000 * 10 + i as u32;
                config.rocketmq.producer_group = format!("soak_relay_{id}");
                let config_file = own_dir.join("relay.toml");
                std::fs::write(&config_file, toml::to_string(&config).unwrap()).unwrap();
                Instance {
                    log_file: own_dir.join(format!("relay-{id}.log")),
                    id,
                    config_file,
                    child: None,
                    starts: 0,
                }
            })
            .collect();
        let mut relays = Relays {
            instances,
            held_down: false,
            env,
        };
        relays.supervise();
        relays
    }

    /// Starts every instance that is not running (unless held down). Returns how many started.
    pub fn supervise(&mut self) -> usize {
        if self.held_down {
            return 0;
        }
        let mut started = 0;
        for instance in &mut self.instances {
            let running = match instance.child.as_mut() {
                Some(child) => matches!(child.try_wait(), Ok(None)),
                None => false,
            };
            if !running {
                instance.spawn(&self.env);
                started += 1;
            }
        }
        started
    }

    /// SIGKILL of instance `id` (no drain, no release of claimed rows). False if not running.
    pub fn kill(&mut self, id: &str) -> bool {
        let instance = self.instances.iter_mut().find(|i| i.id == id);
        instance.is_some_and(Instance::kill)
    }

    /// SIGKILL of every instance, and no restarts until [`Relays::release`].
    pub fn kill_all_and_hold(&mut self) {
        self.held_down = true;
        for instance in &mut self.instances {
            instance.kill();
        }
    }

    /// Lets [`Relays::supervise`] start instances again, and starts them.
    pub fn release(&mut self) {
        self.held_down = false;
        self.supervise();
    }

    /// Process starts beyond the first of each instance (crashes, exits and kills restarted).
    pub fn restarts(&self) -> u32 {
        self.instances
            .iter()
            .map(|i| i.starts.saturating_sub(1))
            .sum()
    }

    /// SIGTERM to every instance; each must drain and exit cleanly. Returns the instances whose
    /// exit was not clean.
    pub fn stop_all(&mut self) -> Vec<String> {
        let mut unclean = Vec::new();
        for instance in &mut self.instances {
            if let Some(mut child) = instance.child.take() {
                // SAFETY: kill(2) on our own, not yet reaped child.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
                if !child.wait().is_ok_and(|s| s.success()) {
                    unclean.push(instance.id.clone());
                }
            }
        }
        unclean
    }

    /// ERROR lines of all relay logs, counted by message (what the operator would have seen).
    pub fn error_summary(&self) -> String {
        let mut counts = std::collections::BTreeMap::new();
        for instance in &self.instances {
            let text = std::fs::read_to_string(&instance.log_file).unwrap_or_default();
            for line in text.lines().filter(|l| l.contains(" ERROR ")) {
                // The message without the timestamp and fields: up to the first field or 100 chars.
                let message = line.split(" ERROR ").nth(1).unwrap_or(line);
                let message: String = message.chars().take(100).collect();
                *counts.entry(message).or_insert(0u32) += 1;
            }
        }
        let mut out = format!(
            "  relay ERROR log lines: {}\n",
            counts.values().sum::<u32>()
        );
        for (message, n) in counts {
            out.push_str(&format!("    {n:>4} × {message}\n"));
        }
        out
    }

    /// The last `lines` lines of every instance's log (for failure messages).
    pub fn log_tails(&self, lines: usize) -> String {
        self.instances
            .iter()
            .map(|i| {
                format!(
                    "--- relay {} ({}):\n{}",
                    i.id,
                    i.log_file.display(),
                    outbox_devenv::process::log_tail(&i.log_file, lines)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Instance {
    fn spawn(&mut self, env: &[(String, String)]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_file)
            .unwrap();
        let child = Command::new(outbox_devenv::workspace_binary("outbox-relay"))
            .args(["-c", self.config_file.to_str().unwrap()])
            .args(["--metrics-listen", "", "run"])
            .env(
                "RUST_LOG",
                std::env::var("SOAK_RELAY_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .env("NO_COLOR", "1")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start outbox-relay run");
        self.child = Some(child);
        self.starts += 1;
    }

    fn kill(&mut self) -> bool {
        match self.child.take() {
            Some(mut child) => {
                let _ = child.kill();
                let _ = child.wait();
                true
            }
            None => false,
        }
    }
}

impl Drop for Relays {
    fn drop(&mut self) {
        for instance in &mut self.instances {
            instance.kill();
        }
    }
}
