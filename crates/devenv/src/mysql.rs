//! A real Oracle MySQL server (`mysqld` of Debian sid's `mysql-server-core`, 9.x) run in the
//! chroot `scripts/setup.sh --mysql` builds, with the binlog settings the relay needs: ROW
//! format, FULL row image, FULL row metadata, GTID mode on (or off: file/position only, see
//! [`MySqlOptions::gtid_mode`]).
//!
//! The chroot shares the loopback network, so clients connect to `127.0.0.1:<port>` as to any
//! server; the server's files (data, socket, pid file, tmp) must be inside the chroot. They live
//! in a [`scratch_dir_in`] directory under `<chroot>/var/lib/outbox-relay`, named after this
//! process, so the next start removes those of processes that have died.

use super::database::ServerTls;
use super::process::free_port;
use super::sql_server::{ProcessSlot, SqlEndpoint, SqlServer};
use super::{cache_dir, scratch_dir_in};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the chroot's server directories go, as seen from inside it.
const SERVERS_IN_CHROOT: &str = "var/lib/outbox-relay";

/// How to start a [`MySql`].
#[derive(Debug, Clone)]
pub struct MySqlOptions {
    /// The caller's directory: `mysqld.log` and `server`, a link to the server's directory in
    /// the chroot, go in it.
    pub dir: PathBuf,
    /// TCP port on 127.0.0.1; `None` picks a free one.
    pub port: Option<u16>,
    /// Extra `mysqld` flags, e.g. `--max-binlog-size=65536` to force rotations.
    pub extra_args: Vec<String>,
    /// `--gtid-mode=ON` (the default) or, when false, `OFF` with GTID consistency not enforced:
    /// the binlog has anonymous transactions only and replicas resume by file and offset.
    pub gtid_mode: bool,
    /// Serve TLS with these files (copied into the server's directory in the chroot, where
    /// `mysqld` can read them).
    pub tls: Option<ServerTls>,
    /// The chroot with `/usr/sbin/mysqld`: `$OUTBOX_DEVENV_MYSQL_CHROOT`, else
    /// `<cache_dir>/mysql-chroot` (where `scripts/setup.sh --mysql` builds it).
    pub chroot: PathBuf,
}

impl MySqlOptions {
    /// Defaults: a free port, no extra flags, GTIDs on, no TLS files (MySQL then serves the
    /// self-signed certificate it generates), the default chroot.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let chroot = std::env::var_os("OUTBOX_DEVENV_MYSQL_CHROOT")
            .map(PathBuf::from)
            .unwrap_or_else(|| cache_dir().join("mysql-chroot"));
        Self {
            dir: dir.into(),
            port: None,
            extra_args: Vec::new(),
            gtid_mode: true,
            tls: None,
            chroot,
        }
    }
}

/// A running MySQL; stopped (`SIGTERM`, then `SIGKILL`) when dropped.
///
/// The server accepts `root` without a password on `127.0.0.1:<port>`. Its data lives as long
/// as the process that started it: a new [`MySql::start`] initialises a new data directory.
#[derive(Debug)]
pub struct MySql {
    options: MySqlOptions,
    /// The server's directory in the chroot, as this process sees it.
    server_dir: PathBuf,
    port: u16,
    process: ProcessSlot,
}

impl MySql {
    /// Initialises a data directory in the chroot, starts `mysqld` and waits until it answers.
    pub fn start(options: MySqlOptions) -> io::Result<Self> {
        let mysqld = options.chroot.join("usr/sbin/mysqld");
        if !mysqld.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no MySQL chroot at {} (no {}): run `scripts/setup.sh --mysql`",
                    options.chroot.display(),
                    mysqld.display()
                ),
            ));
        }
        std::fs::create_dir_all(&options.dir)?;
        let dir = std::fs::canonicalize(&options.dir)?;
        let chroot = std::fs::canonicalize(&options.chroot)?;
        let options = MySqlOptions {
            dir,
            chroot,
            ..options
        };
        let server_dir = scratch_dir_in(&options.chroot.join(SERVERS_IN_CHROOT), "mysql")?;
        std::fs::create_dir_all(server_dir.join("tmp"))?;
        let link = options.dir.join("server");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&server_dir, &link)?;
        let port = match options.port {
            Some(port) => port,
            None => free_port()?,
        };
        let mut server = Self {
            options,
            server_dir,
            port,
            process: ProcessSlot::default(),
        };
        server.initialize()?;
        server.start_process()?;
        server.endpoint().allow_root_over_tcp()?;
        Ok(server)
    }

    /// A server started elsewhere whose directory (socket `mysqld.sock` inside) is
    /// `server_dir` as this process sees it, on `port`: e.g. the one `outbox-dev
    /// servers` shares with a whole test run. Never stopped by this handle.
    pub fn attach(server_dir: impl Into<PathBuf>, port: u16) -> Self {
        let server_dir = server_dir.into();
        Self {
            options: MySqlOptions::new(&server_dir),
            server_dir,
            port,
            process: ProcessSlot::default(),
        }
    }

    /// The server's directory in the chroot, as this process sees it (pass it to
    /// [`MySql::attach`]).
    pub fn server_dir(&self) -> &Path {
        &self.server_dir
    }

    /// `path` (under the server's directory) as `mysqld` sees it from inside the chroot.
    fn inside(&self, path: &Path) -> String {
        let relative = path
            .strip_prefix(&self.options.chroot)
            .expect("the server's directory is inside the chroot");
        Path::new("/").join(relative).display().to_string()
    }

    /// `chroot <root> /usr/sbin/mysqld --user=root --datadir=<data>` and `args`.
    fn mysqld(&self, args: &[String]) -> Command {
        let mut command = Command::new("chroot");
        command
            .arg(&self.options.chroot)
            .arg("/usr/sbin/mysqld")
            .arg("--no-defaults")
            .arg("--user=root")
            .arg(format!("--datadir={}", self.inside(&self.data_dir())))
            .args(args);
        command
    }

    /// `mysqld --initialize-insecure`: system tables and `root@localhost` without a password.
    fn initialize(&self) -> io::Result<()> {
        let output = self
            .mysqld(&["--initialize-insecure".to_string()])
            .output()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run chroot mysqld: {e}")))?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "mysqld --initialize-insecure failed for {}:\n{}{}",
                self.data_dir().display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(())
    }
}

impl SqlServer for MySql {
    fn endpoint(&self) -> SqlEndpoint {
        SqlEndpoint {
            socket: self.server_dir.join("mysqld.sock"),
            port: self.port,
        }
    }

    fn process_slot(&mut self) -> &mut ProcessSlot {
        &mut self.process
    }

    fn start_process(&mut self) -> io::Result<()> {
        let dir = &self.server_dir;
        let mut args = vec![
            format!("--port={}", self.port),
            "--bind-address=127.0.0.1".into(),
            format!("--socket={}", self.inside(&dir.join("mysqld.sock"))),
            format!("--pid-file={}", self.inside(&dir.join("mysqld.pid"))),
            format!("--tmpdir={}", self.inside(&dir.join("tmp"))),
        ];
        args.extend(
            [
                "--mysqlx=OFF",
                "--secure-file-priv=",
                "--server-id=1",
                "--log-bin=binlog",
                "--binlog-format=ROW",
                "--binlog-row-image=FULL",
                "--binlog-row-metadata=FULL",
                "--skip-name-resolve",
                "--max-connections=1000",
            ]
            .map(String::from),
        );
        if self.options.gtid_mode {
            args.extend(["--gtid-mode=ON", "--enforce-gtid-consistency=ON"].map(String::from));
        } else {
            args.extend(["--gtid-mode=OFF", "--enforce-gtid-consistency=OFF"].map(String::from));
        }
        if let Some(tls) = &self.options.tls {
            let tls_dir = dir.join("tls");
            std::fs::create_dir_all(&tls_dir)?;
            let mut inside = Vec::new();
            for (file, name) in [
                (&tls.ca, "ca.pem"),
                (&tls.cert, "cert.pem"),
                (&tls.key, "key.pem"),
            ] {
                std::fs::copy(file, tls_dir.join(name))?;
                inside.push(self.inside(&tls_dir.join(name)));
            }
            args.extend(tls.server_args(&inside[0], &inside[1], &inside[2]));
        }
        args.extend(self.options.extra_args.iter().cloned());
        let command = self.mysqld(&args);
        let log = self.options.dir.join("mysqld.log");
        let process = self.endpoint().start_process("MySQL", command, &log)?;
        self.process.set(process);
        Ok(())
    }

    fn data_dir(&self) -> PathBuf {
        self.server_dir.join("data")
    }
}
