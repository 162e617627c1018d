//! Either local SQL server, picked by one setting: `OUTBOX_TEST_DB=mariadb` (the default) or
//! `mysql`. Tests and `outbox-dev servers` hold a [`Database`] and do not care which.

use super::sql_server::{ProcessSlot, SqlEndpoint, SqlServer};
use super::{MariaDb, MariaDbOptions, MySql, MySqlOptions};
use std::io;
use std::path::{Path, PathBuf};

/// Which server a [`Database`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseKind {
    /// MariaDB 10.11 from Debian's packages.
    MariaDb,
    /// Oracle MySQL 9.x in the chroot of `scripts/setup.sh --mysql`.
    MySql,
}

impl DatabaseKind {
    /// The environment variable that picks the kind.
    pub const ENV: &'static str = "OUTBOX_TEST_DB";

    /// `$OUTBOX_TEST_DB`: `mariadb` (also when unset or empty) or `mysql`; anything else is an
    /// error naming the accepted values.
    pub fn from_env() -> io::Result<Self> {
        Self::parse(&std::env::var(Self::ENV).unwrap_or_default())
    }

    /// A value of [`DatabaseKind::ENV`]: `mariadb` or empty, or `mysql`.
    pub fn parse(value: &str) -> io::Result<Self> {
        match value {
            "" | "mariadb" => Ok(Self::MariaDb),
            "mysql" => Ok(Self::MySql),
            other => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}={other:?}: expected `mariadb` or `mysql`", Self::ENV),
            )),
        }
    }

    /// The value of [`DatabaseKind::ENV`] that names this kind.
    pub fn name(self) -> &'static str {
        match self {
            Self::MariaDb => "mariadb",
            Self::MySql => "mysql",
        }
    }
}

/// What [`Database::start_with`] may change for either server.
#[derive(Debug, Clone, Default)]
pub struct DatabaseOptions {
    /// Extra server flags both servers understand, e.g. `--max-binlog-size=4194304`.
    pub extra_args: Vec<String>,
    /// Serve TLS with these files.
    pub tls: Option<ServerTls>,
}

/// A server's TLS files (PEM), as this process sees them.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The CA that signed `cert` (and client certificates, if any).
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ServerTls {
    /// `--ssl-ca`, `--ssl-cert`, `--ssl-key` with the paths as the server sees them.
    pub(super) fn server_args(&self, ca: &str, cert: &str, key: &str) -> [String; 3] {
        [
            format!("--ssl-ca={ca}"),
            format!("--ssl-cert={cert}"),
            format!("--ssl-key={key}"),
        ]
    }
}

/// A running (or attached) MariaDB or MySQL: `root` without a password on `127.0.0.1:<port>`,
/// with the binlog the relay reads (ROW, FULL image, FULL metadata, GTIDs).
#[derive(Debug)]
pub enum Database {
    MariaDb(MariaDb),
    MySql(MySql),
}

impl Database {
    /// Starts a server of `kind` with its files under `dir` (MySQL's data directory is in its
    /// chroot; `dir` gets its log).
    pub fn start(kind: DatabaseKind, dir: &Path) -> io::Result<Self> {
        Self::start_with(kind, dir, DatabaseOptions::default())
    }

    /// [`Database::start`] with `options` (extra flags both servers understand, TLS).
    pub fn start_with(
        kind: DatabaseKind,
        dir: &Path,
        options: DatabaseOptions,
    ) -> io::Result<Self> {
        let DatabaseOptions { extra_args, tls } = options;
        Ok(match kind {
            DatabaseKind::MariaDb => {
                let mut mariadb = MariaDbOptions {
                    extra_args,
                    ..MariaDbOptions::new(dir)
                };
                if let Some(tls) = tls {
                    mariadb.extra_args.extend(tls.server_args(
                        &tls.ca.display().to_string(),
                        &tls.cert.display().to_string(),
                        &tls.key.display().to_string(),
                    ));
                }
                Self::MariaDb(MariaDb::start(mariadb)?)
            }
            DatabaseKind::MySql => Self::MySql(MySql::start(MySqlOptions {
                extra_args,
                tls,
                ..MySqlOptions::new(dir)
            })?),
        })
    }

    /// Which server this is.
    pub fn kind(&self) -> DatabaseKind {
        match self {
            Self::MariaDb(_) => DatabaseKind::MariaDb,
            Self::MySql(_) => DatabaseKind::MySql,
        }
    }

    /// The server, whichever it is.
    fn server(&self) -> &dyn SqlServer {
        match self {
            Self::MariaDb(server) => server,
            Self::MySql(server) => server,
        }
    }

    fn server_mut(&mut self) -> &mut dyn SqlServer {
        match self {
            Self::MariaDb(server) => server,
            Self::MySql(server) => server,
        }
    }
}

impl SqlServer for Database {
    fn endpoint(&self) -> SqlEndpoint {
        self.server().endpoint()
    }

    fn process_slot(&mut self) -> &mut ProcessSlot {
        self.server_mut().process_slot()
    }

    fn start_process(&mut self) -> io::Result<()> {
        self.server_mut().start_process()
    }

    fn data_dir(&self) -> PathBuf {
        self.server().data_dir()
    }
}

#[cfg(test)]
mod tests {
    use super::DatabaseKind;

    #[test]
    fn the_setting_names_either_server_and_defaults_to_mariadb() {
        assert_eq!(DatabaseKind::parse("").unwrap(), DatabaseKind::MariaDb);
        for kind in [DatabaseKind::MariaDb, DatabaseKind::MySql] {
            assert_eq!(DatabaseKind::parse(kind.name()).unwrap(), kind);
        }
        let error = DatabaseKind::parse("postgres").unwrap_err().to_string();
        assert!(
            error.contains("OUTBOX_TEST_DB") && error.contains("mysql"),
            "{error}"
        );
    }
}
