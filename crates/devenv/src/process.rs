//! Child processes for local servers: started so that they never outlive us.
//!
//! Guarantee: a server started here is stopped when its [`ServerProcess`] is dropped, and is
//! killed by the kernel when the process that started it exits for any reason (panic, `SIGKILL`,
//! end of a test binary whose servers live in a `static`). The second half comes from
//! `PR_SET_PDEATHSIG`, which fires when the *thread* that forked the child exits; so every child
//! is forked by one spawner thread that lives as long as the process.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Forks `command` from the long-lived spawner thread, with `PR_SET_PDEATHSIG = SIGKILL`.
fn spawn_tied_to_process(mut command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("devenv-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("cannot start the devenv spawner thread");
        Mutex::new(tx)
    });
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (reply_tx, reply_rx) = mpsc::channel();
    sender
        .lock()
        .map_err(|_| io::Error::other("devenv spawner lock poisoned"))?
        .send((command, reply_tx))
        .map_err(|_| io::Error::other("devenv spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("devenv spawner thread is gone"))?
}

/// A running server process whose output goes to a log file.
#[derive(Debug)]
pub struct ServerProcess {
    name: String,
    child: Option<Child>,
    log_path: PathBuf,
}

impl ServerProcess {
    /// Starts `command` with stdout and stderr appended to `log_path`.
    pub fn start(name: &str, mut command: Command, log_path: &Path) -> io::Result<Self> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)?;
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let program = command.get_program().to_string_lossy().into_owned();
        let child = spawn_tied_to_process(command).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot start {name} ({program}): {e}"))
        })?;
        Ok(Self {
            name: name.to_string(),
            child: Some(child),
            log_path: log_path.to_path_buf(),
        })
    }

    /// The operating-system process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Fails with the log's tail if the process has already exited.
    pub fn check_alive(&mut self) -> io::Result<()> {
        if self.is_running() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "{} exited during start-up; last lines of {}:\n{}",
                self.name,
                self.log_path.display(),
                self.log_tail(40)
            )))
        }
    }

    /// Sends `SIGKILL` and reaps the process (a crash, as tests want it).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `SIGTERM`, waits up to `grace`, then `SIGKILL`s.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: plain kill(2) on a pid we own and have not reaped yet.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// The last `lines` lines of the process log (for error messages).
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_path, lines)
    }

    /// Where the process writes its output.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// The last `lines` lines of a text file, or a note that it could not be read.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let read = || -> io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)))?;
        let mut text = String::new();
        file.read_to_string(&mut text).or_else(|_| {
            let mut bytes = Vec::new();
            file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)))?;
            file.read_to_end(&mut bytes)?;
            text = String::from_utf8_lossy(&bytes).into_owned();
            Ok::<usize, io::Error>(bytes.len())
        })?;
        Ok(text)
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// A loopback TCP port that was free a moment ago, below the kernel's ephemeral range where the
/// machine allows it: a server stopped for a restart must find its port still free, and any
/// outgoing connection (a client reconnecting meanwhile) could take a port of that range.
pub fn free_port() -> io::Result<u16> {
    const LOWEST: u16 = 10_000;
    let below = ephemeral_range_start().unwrap_or(0);
    if below > LOWEST + 1_000 {
        let span = u64::from(below - LOWEST);
        let mut seed = random_seed();
        for _ in 0..1_000 {
            // xorshift: enough to spread picks of concurrent harnesses over the range.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let port = LOWEST + (seed % span) as u16;
            if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// The first port of `net.ipv4.ip_local_port_range`, where the kernel picks outgoing ports.
fn ephemeral_range_start() -> Option<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

/// A different seed per call and per process.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(Instant::now().elapsed().as_nanos());
    hasher.finish() | 1
}

/// A port `p` such that `p - below ..= p` were all free a moment ago (RocketMQ also binds
/// `listenPort - 2`).
pub fn free_port_with_room_below(below: u16) -> io::Result<u16> {
    for _ in 0..200 {
        let port = free_port()?;
        if port <= below + 1024 {
            continue; // too close to the privileged ports for the room below
        }
        let all_free =
            (port - below..port).all(|p| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok());
        if all_free {
            return Ok(port);
        }
    }
    Err(io::Error::other("no free loopback port range found"))
}

/// True when something accepts TCP connections on `127.0.0.1:port`.
pub fn port_is_open(port: u16) -> bool {
    TcpStream::connect_timeout(
        &(Ipv4Addr::LOCALHOST, port).into(),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// Polls `ready` every 100 ms until it returns true, the process dies, or `timeout` passes.
pub fn wait_until_ready(
    process: &mut ServerProcess,
    timeout: Duration,
    what: &str,
    mut ready: impl FnMut() -> bool,
) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return Ok(());
        }
        process.check_alive()?;
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{what} was not ready after {timeout:?}; last lines of {}:\n{}",
                    process.log_path().display(),
                    process.log_tail(40)
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Finds an executable: `$env_var` if set, then each of `dirs`, then `$PATH`.
pub fn find_executable(name: &str, env_var: &str, dirs: &[PathBuf]) -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os(env_var) {
        let path = PathBuf::from(path);
        let candidate = if path.is_dir() { path.join(name) } else { path };
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    dirs.iter()
        .chain(path_dirs.iter())
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "`{name}` not found (looked in ${env_var}, {dirs:?} and $PATH); \
                     run `scripts/setup.sh` to install it"
                ),
            )
        })
}
