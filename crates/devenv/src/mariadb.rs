//! A real MariaDB server (`mariadbd` from Debian's `mariadb-server`) with the binlog settings
//! the relay needs: ROW format, FULL row image, FULL row metadata, GTID strict mode.

use super::process::free_port;
use super::sql_server::{
    mariadb_tool as tool, running_as_root, ProcessSlot, SqlEndpoint, SqlServer,
};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How to start a [`MariaDb`].
#[derive(Debug, Clone)]
pub struct MariaDbOptions {
    /// Root directory: `data/` (initialised by `mariadb-install-db` when empty), `tmp/`, the
    /// socket, the pid file and `mariadbd.log` go in it.
    pub dir: PathBuf,
    /// TCP port on 127.0.0.1; `None` picks a free one.
    pub port: Option<u16>,
    /// Extra `mariadbd` flags, e.g. `--max-binlog-size=65536` to force rotations.
    pub extra_args: Vec<String>,
}

impl MariaDbOptions {
    /// Defaults: a free port and no extra flags.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            port: None,
            extra_args: Vec::new(),
        }
    }
}

/// A running MariaDB; stopped (`SIGTERM`, then `SIGKILL`) when dropped.
///
/// The server accepts `root` without a password on `127.0.0.1:<port>` only.
#[derive(Debug)]
pub struct MariaDb {
    options: MariaDbOptions,
    port: u16,
    process: ProcessSlot,
}

impl MariaDb {
    /// Initialises the data directory if needed, starts `mariadbd` and waits until it answers.
    pub fn start(options: MariaDbOptions) -> io::Result<Self> {
        std::fs::create_dir_all(options.dir.join("tmp"))?;
        let dir = std::fs::canonicalize(&options.dir)?;
        let options = MariaDbOptions { dir, ..options };
        if !options.dir.join("data").join("mysql").exists() {
            install_system_tables(&options.dir, running_as_root().then_some("root"))?;
        }
        let port = match options.port {
            Some(port) => port,
            None => free_port()?,
        };
        let mut server = Self {
            options,
            port,
            process: ProcessSlot::default(),
        };
        server.start_process()?;
        server.allow_root_over_tcp()?;
        Ok(server)
    }

    /// A server started elsewhere in `dir` (its socket is `dir/mariadbd.sock`) on `port`, e.g.
    /// the one `outbox-dev servers` shares with a whole test run. Never stopped by this
    /// handle.
    pub fn attach(dir: impl Into<PathBuf>, port: u16) -> Self {
        Self {
            options: MariaDbOptions::new(dir),
            port,
            process: ProcessSlot::default(),
        }
    }

    /// The server's directory (pass it to [`MariaDb::attach`]).
    pub fn dir(&self) -> &Path {
        &self.options.dir
    }

    fn socket_path(&self) -> PathBuf {
        self.options.dir.join("mariadbd.sock")
    }

    /// `mariadb-install-db` creates `root@localhost` (socket only, since we skip name
    /// resolution); add `root@127.0.0.1` so TCP clients can connect.
    fn allow_root_over_tcp(&self) -> io::Result<()> {
        self.endpoint().allow_root_over_tcp()
    }
}

impl SqlServer for MariaDb {
    fn endpoint(&self) -> SqlEndpoint {
        SqlEndpoint {
            socket: self.socket_path(),
            port: self.port,
        }
    }

    fn process_slot(&mut self) -> &mut ProcessSlot {
        &mut self.process
    }

    fn start_process(&mut self) -> io::Result<()> {
        let dir = &self.options.dir;
        let user = running_as_root().then_some("root");
        let mut command = mariadbd_command(dir, self.port, user)?;
        command.args(&self.options.extra_args);
        let process =
            self.endpoint()
                .start_process("MariaDB", command, &dir.join("mariadbd.log"))?;
        self.process.set(process);
        Ok(())
    }

    fn data_dir(&self) -> PathBuf {
        self.options.dir.join("data")
    }
}

/// `mariadbd` for a server whose files live in `dir` (`data/`, `tmp/`, the socket
/// `mariadbd.sock` and the pid file), listening on `127.0.0.1:port` only, with the binlog
/// settings the relay needs: ROW format, FULL row image, FULL row metadata, server id 1, GTID
/// strict mode. `user` is its `--user` (needed when started as root). Callers add their own
/// flags after these (a later flag wins).
pub(super) fn mariadbd_command(dir: &Path, port: u16, user: Option<&str>) -> io::Result<Command> {
    let data_dir = dir.join("data");
    let mut command = Command::new(tool("mariadbd")?);
    command
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data_dir.display()))
        .arg(format!("--port={port}"))
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--socket={}", dir.join("mariadbd.sock").display()))
        .arg(format!("--pid-file={}", dir.join("mariadbd.pid").display()))
        .arg(format!("--tmpdir={}", dir.join("tmp").display()))
        .arg(format!("--log-bin={}", data_dir.join("binlog").display()))
        .args([
            "--binlog-format=ROW",
            "--binlog-row-image=FULL",
            "--binlog-row-metadata=FULL",
            "--server-id=1",
            "--gtid-strict-mode=1",
            "--skip-name-resolve",
            "--max-connections=1000",
            "--innodb-buffer-pool-size=256M",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_general_ci",
        ]);
    if let Some(user) = user {
        command.arg(format!("--user={user}"));
    }
    Ok(command)
}

/// Creates the system tables in the empty `dir/data` of a server laid out as for
/// [`mariadbd_command`] (`root@localhost` without a password, no test database); the files
/// belong to `user` when given (`--user`, needed when run as root).
///
/// Its temporary tables go to `dir/tmp`, not `/tmp`: every `mariadbd` deletes the `#sql*` files
/// in its tmpdir when it starts, so two installs in `/tmp` at once (tests in parallel) can fail
/// each other ("Could not remove temporary table ... /tmp/#sql-temptable-...").
pub(super) fn install_system_tables(dir: &Path, user: Option<&str>) -> io::Result<()> {
    let data_dir = dir.join("data");
    let mut command = Command::new(tool("mariadb-install-db")?);
    command
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data_dir.display()))
        .arg(format!("--tmpdir={}", dir.join("tmp").display()))
        .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
    if let Some(user) = user {
        command.arg(format!("--user={user}"));
    }
    let output = command.output().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot run mariadb-install-db: {e}; run scripts/setup.sh to install MariaDB"),
        )
    })?;
    if !output.status.success() {
        return Err(io::Error::other(format!(
            "mariadb-install-db failed for {}:\n{}{}",
            data_dir.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(())
}
