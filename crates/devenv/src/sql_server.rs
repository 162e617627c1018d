//! What the local MariaDB and MySQL servers share: starting the server process and waiting for
//! it, the root account over TCP, running SQL as root, URLs and fresh databases, and the
//! [`SqlServer`] lifecycle (stop, kill, restart) every server type and [`super::Database`] offer.
//!
//! Guarantee: [`SqlEndpoint::start_process`] returns only once the server takes connections on
//! its Unix socket and on `127.0.0.1:<port>`, or fails with the tail of its log.

use super::process::{find_executable, port_is_open, wait_until_ready, ServerProcess};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

const SEARCH_DIRS: [&str; 2] = ["/usr/sbin", "/usr/bin"];

/// A MariaDB tool (`mariadbd`, `mariadb-install-db`, the `mariadb` client): in
/// `$OUTBOX_DEVENV_MARIADB_BIN`, `/usr/sbin`, `/usr/bin` or `$PATH`.
pub(super) fn mariadb_tool(name: &str) -> io::Result<PathBuf> {
    let dirs: Vec<PathBuf> = SEARCH_DIRS.iter().map(PathBuf::from).collect();
    find_executable(name, "OUTBOX_DEVENV_MARIADB_BIN", &dirs)
}

/// True when this process runs as root (the servers then need `--user=root`).
pub(super) fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A local SQL server this process started (or attached to): where it listens and its process.
/// The provided methods are the whole lifecycle; a server type says only how it starts.
pub trait SqlServer {
    /// Where it listens.
    #[doc(hidden)]
    fn endpoint(&self) -> SqlEndpoint;
    /// Its process, if this handle started one.
    #[doc(hidden)]
    fn process_slot(&mut self) -> &mut ProcessSlot;
    /// Starts the server process on its port and data directory, returning once it is ready.
    #[doc(hidden)]
    fn start_process(&mut self) -> io::Result<()>;
    /// The data directory as this process sees it (binlogs are `binlog.NNNNNN` in it).
    fn data_dir(&self) -> PathBuf;

    /// The TCP port on 127.0.0.1.
    fn port(&self) -> u16 {
        self.endpoint().port
    }

    /// A `mysql://` URL for `root` and `database` (empty for none).
    fn url(&self, database: &str) -> String {
        self.endpoint().url(database)
    }

    /// Creates a new, empty database named `<prefix>_<pid>_<n>` and returns its URL.
    fn create_database(&self, prefix: &str) -> io::Result<String> {
        self.endpoint().create_database(prefix)
    }

    /// Runs SQL as `root` (the host's `mariadb` client over the server's Unix socket).
    fn run_sql_as_root(&self, sql: &str) -> io::Result<()> {
        self.endpoint().run_sql_as_root(sql)
    }

    /// Graceful shutdown (`SIGTERM`) of a server this handle started; the data is kept for
    /// [`SqlServer::restart`]. Does nothing to an attached server.
    fn stop(&mut self) {
        self.process_slot().stop();
    }

    /// Crash (`SIGKILL`) of a server this handle started; InnoDB recovers on the next start.
    fn kill(&mut self) {
        self.process_slot().kill();
    }

    /// Stops the server (if running) and starts it again on the same port and data.
    fn restart(&mut self) -> io::Result<()> {
        self.stop();
        self.start_process()
    }

    /// True while a server process this handle started runs.
    fn is_running(&mut self) -> bool {
        self.process_slot().is_running()
    }
}

/// Where a server listens: its Unix socket (as this process sees it) and its TCP port on
/// 127.0.0.1, where `root` has no password.
#[derive(Debug, Clone)]
pub struct SqlEndpoint {
    pub socket: PathBuf,
    pub port: u16,
}

impl SqlEndpoint {
    /// Starts `command` (output appended to `log`) and waits up to 60 s until the socket exists
    /// and the TCP port accepts connections.
    pub fn start_process(
        &self,
        what: &str,
        command: Command,
        log: &Path,
    ) -> io::Result<ServerProcess> {
        let mut process = ServerProcess::start(what, command, log)?;
        let (socket, port) = (self.socket.clone(), self.port);
        wait_until_ready(&mut process, Duration::from_secs(60), what, || {
            socket.exists() && port_is_open(port)
        })?;
        Ok(process)
    }

    /// A fresh data directory has `root@localhost` only (socket; name resolution is skipped);
    /// add `root@127.0.0.1` so TCP clients can connect.
    pub fn allow_root_over_tcp(&self) -> io::Result<()> {
        self.run_sql_as_root(
            "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; \
             GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;",
        )
    }

    /// Runs SQL with the `mariadb` command-line client as `root` over the Unix socket (it speaks
    /// to MySQL too).
    pub fn run_sql_as_root(&self, sql: &str) -> io::Result<()> {
        self.query_as_root(sql).map(drop)
    }

    /// [`SqlEndpoint::run_sql_as_root`], returning the rows: one a line, columns separated by
    /// tabs, no header.
    pub fn query_as_root(&self, sql: &str) -> io::Result<String> {
        let output = Command::new(mariadb_tool("mariadb")?)
            .arg("--no-defaults")
            .arg(format!("--socket={}", self.socket.display()))
            .args(["--user=root", "--batch", "--skip-column-names", "-e", sql])
            .output()?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(io::Error::other(format!(
                "mariadb client failed on `{sql}`: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }

    /// A `mysql://` URL for `root` and `database` (empty for none).
    pub fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a new, empty database named `<prefix>_<pid>_<n>` and returns its URL.
    pub fn create_database(&self, prefix: &str) -> io::Result<String> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "{prefix}_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        self.run_sql_as_root(&format!("CREATE DATABASE `{name}`"))?;
        Ok(self.url(&name))
    }
}

/// A server's process, if this handle runs one: empty once stopped or killed, and for a handle
/// attached to a server started elsewhere.
#[derive(Debug, Default)]
pub struct ProcessSlot(Option<ServerProcess>);

impl ProcessSlot {
    pub(super) fn set(&mut self, process: ServerProcess) {
        self.0 = Some(process);
    }

    /// Graceful shutdown: `SIGTERM`, then `SIGKILL` after 30 s.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.0.take() {
            process.stop(Duration::from_secs(30));
        }
    }

    /// Crash: `SIGKILL`.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.0.take() {
            process.kill();
        }
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        self.0.as_mut().is_some_and(ServerProcess::is_running)
    }
}
