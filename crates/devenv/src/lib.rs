//! # outbox-devenv
//!
//! Local servers for development, tests and benchmarks: a real MariaDB or Oracle MySQL and a
//! real RocketMQ namesrv + broker, each on free loopback ports with its own data directory.
//!
//! Nothing here is used by the relay in production (this crate is not published). It exists so that `outbox-dev up`,
//! the integration tests in `tests/` and `bench/` all start the servers the same way.
//!
//! Guarantee: every server started here dies with the process that started it (see
//! [`process`]), and its data directory lives under [`scratch_root`] (MySQL's: in its chroot,
//! see [`mysql`]) where stale directories of dead processes are removed by the next start.

#![recursion_limit = "256"]

pub mod database;
pub mod galera;
pub mod mariadb;
pub mod mysql;
pub mod process;
pub mod rocketmq;
mod sql_server;
pub mod topic_reader;

pub use database::{Database, DatabaseKind, DatabaseOptions, ServerTls};
pub use galera::{GaleraCluster, GaleraNode};
pub use mariadb::{MariaDb, MariaDbOptions};
pub use mysql::{MySql, MySqlOptions};
pub use rocketmq::{
    AclAccount, BrokerKind, BrokerRole, ClientHost, Proxy, RocketMq, RocketMqOptions,
};
pub use sql_server::SqlServer;
pub use topic_reader::{ReceivedMessage, TopicReader};

/// Servers one process starts for a whole test run (`outbox-dev servers`, run by
/// `scripts/test.sh`) and hands to every test binary through these variables. A test binary
/// run alone finds none of them and starts its own.
pub mod shared {
    use super::{BrokerKind, Database, DatabaseKind, MariaDb, MySql, RocketMq, SqlServer};

    /// The shared MariaDB's directory (socket `mariadbd.sock` inside).
    pub const MARIADB_DIR: &str = "OUTBOX_TEST_MARIADB_DIR";
    /// The shared MariaDB's TCP port on 127.0.0.1.
    pub const MARIADB_PORT: &str = "OUTBOX_TEST_MARIADB_PORT";
    /// The shared MySQL's directory in its chroot, as seen from outside (socket `mysqld.sock`
    /// inside).
    pub const MYSQL_DIR: &str = "OUTBOX_TEST_MYSQL_DIR";
    /// The shared MySQL's TCP port on 127.0.0.1.
    pub const MYSQL_PORT: &str = "OUTBOX_TEST_MYSQL_PORT";
    /// The shared RocketMQ cluster's name server, `127.0.0.1:PORT`.
    pub const NAMESRV: &str = "OUTBOX_TEST_NAMESRV";

    /// The shared MariaDB, if this process was given one.
    pub fn mariadb() -> Option<MariaDb> {
        let dir = std::env::var_os(MARIADB_DIR)?;
        let port = std::env::var(MARIADB_PORT).ok()?.parse().ok()?;
        Some(MariaDb::attach(dir, port))
    }

    /// The shared MySQL, if this process was given one.
    pub fn mysql() -> Option<MySql> {
        let dir = std::env::var_os(MYSQL_DIR)?;
        let port = std::env::var(MYSQL_PORT).ok()?.parse().ok()?;
        Some(MySql::attach(dir, port))
    }

    /// The shared server of `$OUTBOX_TEST_DB`'s kind, if this process was given one.
    pub fn database() -> Option<Database> {
        match DatabaseKind::from_env().ok()? {
            DatabaseKind::MariaDb => mariadb().map(Database::MariaDb),
            DatabaseKind::MySql => mysql().map(Database::MySql),
        }
    }

    /// The `NAME=value` lines that hand `database` to test binaries (with
    /// [`DatabaseKind::ENV`], so they pick the same kind).
    pub fn database_env(database: &Database) -> String {
        let (dir_var, port_var, dir) = match database {
            Database::MariaDb(server) => (MARIADB_DIR, MARIADB_PORT, server.dir()),
            Database::MySql(server) => (MYSQL_DIR, MYSQL_PORT, server.server_dir()),
        };
        format!(
            "{}={}\n{dir_var}={}\n{port_var}={}\n",
            DatabaseKind::ENV,
            database.kind().name(),
            dir.display(),
            database.port()
        )
    }

    /// The shared RocketMQ cluster (of `$OUTBOX_BROKER`'s kind), if this process was given one.
    pub fn rocketmq() -> Option<RocketMq> {
        let namesrv = std::env::var(NAMESRV).ok()?;
        let kind = BrokerKind::from_env().ok()?;
        let root = super::scratch_dir("attached-rocketmq").ok()?;
        Some(RocketMq::attach(&namesrv, kind, &root))
    }
}

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

/// Where tool caches live: `$OUTBOX_DEVENV_CACHE`, else `$HOME/.cache/outbox-relay`.
/// `scripts/setup.sh` installs the RocketMQ binaries under `<cache>/rocketmq/bin`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("OUTBOX_DEVENV_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
    PathBuf::from(home).join(".cache").join("outbox-relay")
}

/// A binary of the workspace (`outbox-relay`, `outbox-dev`) built beside the running test or
/// bench executable: the profile directory above its `deps/`. Test binaries of the relay's
/// package cannot name another package's binary (`CARGO_BIN_EXE_*`), so `scripts/test.sh`
/// builds them first (`cargo build --workspace --bins --features failpoints`); a run without
/// them stops here with that command.
pub fn workspace_binary(name: &str) -> PathBuf {
    let binary = workspace_binary_path(name);
    assert!(
        binary.is_file(),
        "{} is missing: build it with `cargo build --workspace --bins --features failpoints` \
         (scripts/test.sh does)",
        binary.display()
    );
    binary
}

/// Where [`workspace_binary`] looks for `name`, whether or not it is there yet.
pub fn workspace_binary_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the running executable's path");
    let profile_dir = exe
        .parent()
        .filter(|dir| dir.ends_with("deps"))
        .and_then(|deps| deps.parent())
        .or_else(|| exe.parent())
        .expect("the executable's directory");
    profile_dir.join(name)
}

/// The parent of every scratch directory: `$TMPDIR/outbox-relay-devenv`.
pub fn scratch_root() -> PathBuf {
    std::env::temp_dir().join("outbox-relay-devenv")
}

/// A fresh directory `<scratch_root>/<pid>-<n>-<label>` for one server's data.
///
/// Directories left by processes that no longer exist (a test binary killed with `SIGKILL`, say)
/// are removed first, so repeated runs do not fill the disk.
pub fn scratch_dir(label: &str) -> io::Result<PathBuf> {
    scratch_dir_in(&scratch_root(), label)
}

/// [`scratch_dir`] under another parent `root` (created if missing), with the same naming and
/// the same removal of directories left by dead processes: e.g. MySQL's data directories,
/// which must live inside its chroot.
pub fn scratch_dir_in(root: &std::path::Path, label: &str) -> io::Result<PathBuf> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    std::fs::create_dir_all(root)?;
    remove_stale_scratch_dirs(root);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = root.join(format!("{}-{n}-{label}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn remove_stale_scratch_dirs(root: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: kill(pid, 0) only probes whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0
            || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
