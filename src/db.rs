//! MySQL connection helpers shared by the commands and the relay.

use crate::config::{Config, TlsMode};
use crate::outbox::TableName;
use mysql_async::{Opts, OptsBuilder, Pool, SslOpts};

/// Why a database URL could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DbUrlError {
    #[error(
        "`mysql.url` is not a valid MySQL URL ({0}); expected mysql://user:password@host:port/database"
    )]
    Invalid(String),
    #[error("`mysql.url` names no database; add it: mysql://user:password@host:port/database")]
    NoDatabase,
}

/// Connection options from `mysql.url`. The URL must name a database: the outbox tables live
/// there.
pub fn opts(config: &Config) -> anyhow::Result<Opts> {
    let url = config.mysql_url()?;
    let opts = Opts::from_url(url).map_err(|e| DbUrlError::Invalid(e.to_string()))?;
    if opts.db_name().is_none_or(str::is_empty) {
        return Err(DbUrlError::NoDatabase.into());
    }
    let mut builder =
        OptsBuilder::from_opts(opts).conn_ttl(Some(std::time::Duration::from_secs(300)));
    if let Some(ssl) = ssl_opts(config.mysql.tls, config.mysql.tls_ca.as_deref())? {
        builder = builder.ssl_opts(ssl);
    }
    Ok(builder.into())
}

/// The database a deployment runs against, resolved once from the config and passed down (to
/// every stage and task of a run, and to each leadership of an instance): its connection options
/// and its outbox tables, qualified with the URL's database.
#[derive(Debug, Clone)]
pub struct Deployment {
    /// [`opts`] of `mysql.url`.
    pub opts: Opts,
    /// `outbox.tables`, each as `schema.table`.
    pub tables: Vec<TableName>,
}

impl Deployment {
    pub fn resolve(config: &Config) -> anyhow::Result<Self> {
        let opts = opts(config)?;
        let database = opts.db_name().unwrap_or_default().to_string();
        let tables = config
            .outbox_tables()
            .into_iter()
            .map(|t| t.in_schema(&database))
            .collect();
        Ok(Deployment { opts, tables })
    }
}

/// The TLS options of `mysql.tls` / `mysql.tls_ca` (`None`: leave the URL's own settings).
fn ssl_opts(mode: TlsMode, ca: Option<&std::path::Path>) -> anyhow::Result<Option<SslOpts>> {
    let with_ca = |ssl: SslOpts| -> anyhow::Result<SslOpts> {
        Ok(match ca {
            Some(path) => {
                if !path.is_file() {
                    anyhow::bail!(
                        "mysql.tls_ca = {} is not a readable file: give the PEM of the CA that signed the server's certificate",
                        path.display()
                    );
                }
                ssl.with_root_certs(vec![path.to_path_buf().into()])
            }
            None => ssl,
        })
    };
    if mode != TlsMode::Disabled {
        crate::rocketmq_client::choose_tls_provider();
    }
    Ok(match mode {
        TlsMode::Disabled => None,
        TlsMode::Required => Some(
            SslOpts::default()
                .with_danger_accept_invalid_certs(true)
                .with_danger_skip_domain_validation(true),
        ),
        TlsMode::VerifyCa => Some(with_ca(
            SslOpts::default().with_danger_skip_domain_validation(true),
        )?),
        TlsMode::VerifyIdentity => Some(with_ca(SslOpts::default())?),
    })
}

/// A connection pool for `mysql.url`.
pub fn pool(config: &Config) -> anyhow::Result<Pool> {
    Ok(Pool::new(opts(config)?))
}

/// Where [`writer_pool`] sets `binlog_row_image` per session.
const MINIMAL_ROW_IMAGE: &str = "SET SESSION binlog_row_image = 'MINIMAL'";
const READ_COMMITTED: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// A pool whose sessions run at READ COMMITTED (claims, lease updates and marks take no gap
/// locks, so they never block or deadlock the producers' INSERTs).
pub fn read_committed_pool(config: &Config) -> anyhow::Result<Pool> {
    Ok(session_pool(opts(config)?, vec![READ_COMMITTED]))
}

/// Options whose every connection runs `session` once, and keeps it: mysql_async resets a
/// connection returned to the pool by default (COM_RESET_CONNECTION), which drops session
/// settings made by `init` after the first use and would cost a round trip per checkout. Our
/// callers leave no other session state behind (an open transaction is still rolled back).
fn session_opts(opts: Opts, session: Vec<&str>) -> Opts {
    let pool_opts = opts.pool_opts().clone().with_reset_connection(false);
    OptsBuilder::from_opts(opts)
        .pool_opts(pool_opts)
        .init(session)
        .into()
}

fn session_pool(opts: Opts, session: Vec<&str>) -> Pool {
    Pool::new(session_opts(opts, session))
}

/// The pool of the relay's own writes (SENT/FAILED marks, claims, leases, the checkpoint
/// mirror): READ COMMITTED like [`read_committed_pool`], and with `relay.minimal_row_image`
/// each session logs its UPDATEs with `binlog_row_image = MINIMAL` when the server lets this
/// account set it (otherwise a warning and the server's own setting).
/// Only row images of these UPDATEs change: the stream reads INSERTs, which producers write.
pub async fn writer_pool(config: &Config) -> anyhow::Result<Pool> {
    Ok(Pool::new(writer_opts(config).await?))
}

/// The options of a [`writer_pool`], asking the server once: several pools made from them (each
/// closed on its own) share one answer.
pub async fn writer_opts(config: &Config) -> anyhow::Result<Opts> {
    Ok(writer_opts_from(opts(config)?, config).await)
}

/// [`writer_opts`] from options already resolved from `config` ([`Deployment::opts`]): the
/// pipeline's pools, with no configuration left to fail.
pub async fn writer_opts_from(opts: Opts, config: &Config) -> Opts {
    let mut init = vec![READ_COMMITTED];
    if config.relay.minimal_row_image && minimal_row_image_allowed(&opts).await {
        init.push(MINIMAL_ROW_IMAGE);
    }
    session_opts(opts, init)
}

/// Whether a session of `opts` may set `binlog_row_image` (MariaDB asks for `BINLOG ADMIN` or
/// `SUPER`, MySQL for `SESSION_VARIABLES_ADMIN`). `false` when the server cannot be asked now.
async fn minimal_row_image_allowed(opts: &Opts) -> bool {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let tried = bounded(async {
        let mut conn = mysql_async::Conn::new(opts.clone()).await?;
        let result =
            mysql_async::prelude::Queryable::query_drop(&mut conn, MINIMAL_ROW_IMAGE).await;
        let _ = conn.disconnect().await;
        result
    })
    .await;
    match tried {
        Ok(()) => true,
        // ER_SPECIFIC_ACCESS_DENIED_ERROR: the account may not set it.
        Err(mysql_async::Error::Server(e)) if e.code == 1227 => {
            if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(error = %e.message,
                    "cannot set binlog_row_image = MINIMAL for the relay's own UPDATEs (grant \
                     BINLOG ADMIN on MariaDB or SESSION_VARIABLES_ADMIN on MySQL, or set \
                     relay.minimal_row_image = false to silence this); they are logged with the \
                     server's setting");
            }
            false
        }
        Err(e) => {
            tracing::debug!(error = %e, "cannot ask whether binlog_row_image may be set");
            false
        }
    }
}

/// `1, 2, 3`: integer ids inlined into a text-protocol `IN (…)`. One round trip, where a prepared
/// statement with one placeholder per id (a new shape for nearly every batch size) costs a
/// prepare, an execute and a close.
pub fn id_list(ids: impl IntoIterator<Item = u64>) -> String {
    let mut list = String::new();
    for id in ids {
        if !list.is_empty() {
            list.push_str(", ");
        }
        list.push_str(&id.to_string());
    }
    list
}

/// Longest a single housekeeping query may take (leader checks, claims, lease updates, status
/// look-ups) before it counts as failed: a connection cut mid-statement must turn into a retry,
/// never a hang.
pub const QUERY_LIMIT: std::time::Duration = std::time::Duration::from_secs(15);

/// `work` bounded by [`QUERY_LIMIT`]; running out of time is an error like any other.
pub async fn bounded<T>(
    work: impl std::future::Future<Output = Result<T, mysql_async::Error>>,
) -> Result<T, mysql_async::Error> {
    match tokio::time::timeout(QUERY_LIMIT, work).await {
        Ok(result) => result,
        Err(_) => Err(mysql_async::Error::Other(
            format!("no answer from MySQL within {QUERY_LIMIT:?}").into(),
        )),
    }
}

/// Closes `pool`, waiting at most [`QUERY_LIMIT`]: a connection the server killed mid-statement
/// can keep `Pool::disconnect` waiting for ever, and shutting down (or handing leadership over)
/// must not hang on it. Whatever is left is dropped.
pub async fn close(pool: Pool) {
    match tokio::time::timeout(QUERY_LIMIT, pool.disconnect()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "pool did not close cleanly"),
        Err(_) => tracing::warn!("a MySQL pool did not close within {QUERY_LIMIT:?}; dropping it"),
    }
}

/// Why a statement can never succeed as it is, whatever the number of retries: the one
/// classification of the server's permanent errors (start-up checks and the marker use it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermanentFault {
    /// The account lacks a privilege: 1044 (database), 1142 (command on a table), 1143
    /// (column), 1227 (a global privilege).
    Privilege,
    /// The table or a column is missing: 1049 (database), 1146 (table), 1054 (column).
    Schema,
    /// A value does not fit its column (a column narrowed or retyped by hand): 1048 (NULL),
    /// 1264 (out of range), 1292 / 1366 (wrong value), 1406 (too long).
    Data,
}

/// The [`PermanentFault`] of `error`, or `None` for anything worth retrying (connection
/// faults, lock waits, deadlocks, a read-only server during a failover, timeouts).
pub fn permanent_fault(error: &mysql_async::Error) -> Option<PermanentFault> {
    let mysql_async::Error::Server(e) = error else {
        return None;
    };
    match e.code {
        1044 | 1142 | 1143 | 1227 => Some(PermanentFault::Privilege),
        1049 | 1054 | 1146 => Some(PermanentFault::Schema),
        1048 | 1264 | 1292 | 1366 | 1406 => Some(PermanentFault::Data),
        _ => None,
    }
}

/// Whether `error` is the server's ER_BAD_FIELD_ERROR (1054, unknown column): a table from
/// before the migration that added the column.
pub fn is_unknown_column(error: &mysql_async::Error) -> bool {
    matches!(error, mysql_async::Error::Server(e) if e.code == 1054)
}

/// Whether `error` is ER_LOCK_WAIT_TIMEOUT (1205): a row lock, or (for DDL and `LOCK TABLES`)
/// the table's metadata lock, waited longer than the session's timeout.
pub fn is_lock_wait_timeout(error: &mysql_async::Error) -> bool {
    matches!(error, mysql_async::Error::Server(e) if e.code == 1205)
}

/// Whether `error` means the server took a connection and then cut it (`KILL`, a shutdown, a
/// reset socket), as opposed to a server that cannot be reached or that refuses the account.
/// A cut connection is worth retrying even at first start; an unreachable server is reported.
pub fn is_cut_connection(error: &mysql_async::Error) -> bool {
    use mysql_async::{DriverError, Error, IoError};
    use std::io::ErrorKind;
    match error {
        // ER_SERVER_SHUTDOWN, ER_CONNECTION_KILLED (MariaDB), ER_SESSION_WAS_KILLED (MySQL).
        Error::Server(e) => matches!(e.code, 1053 | 1927 | 3169),
        Error::Driver(DriverError::ConnectionClosed) => true,
        Error::Io(IoError::Io(e)) => {
            let cut = matches!(
                e.kind(),
                ErrorKind::UnexpectedEof
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
            );
            // The stream ended inside a packet: tokio-util's codec says so only in words.
            cut || e.to_string().contains("bytes remaining on stream")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_connections_are_told_from_unreachable_servers() {
        use mysql_async::{DriverError, Error, IoError, ServerError};
        use std::io::{Error as Io, ErrorKind};
        let server = |code| {
            Error::Server(ServerError {
                code,
                message: String::new(),
                state: String::new(),
            })
        };
        let io = |kind| Error::Io(IoError::Io(Io::new(kind, "x")));
        assert!(is_cut_connection(&server(1927)));
        assert!(is_cut_connection(&io(ErrorKind::UnexpectedEof)));
        let mid_packet = Io::other("bytes remaining on stream");
        assert!(is_cut_connection(&Error::Io(IoError::Io(mid_packet))));
        assert!(is_cut_connection(&Error::Driver(
            DriverError::ConnectionClosed
        )));
        assert!(!is_cut_connection(&server(1045)), "access denied");
        assert!(!is_cut_connection(&io(ErrorKind::ConnectionRefused)));
    }

    #[test]
    fn permanent_faults_are_told_from_errors_worth_retrying() {
        use mysql_async::{Error, ServerError};
        let server = |code| {
            Error::Server(ServerError {
                code,
                message: String::new(),
                state: String::new(),
            })
        };
        let fault = |code| permanent_fault(&server(code));
        assert_eq!(
            fault(1142),
            Some(PermanentFault::Privilege),
            "UPDATE denied"
        );
        assert_eq!(
            fault(1143),
            Some(PermanentFault::Privilege),
            "column denied"
        );
        assert_eq!(fault(1054), Some(PermanentFault::Schema), "unknown column");
        assert!(is_unknown_column(&server(1054)) && !is_unknown_column(&server(1146)));
        assert_eq!(fault(1146), Some(PermanentFault::Schema), "no such table");
        assert_eq!(fault(1406), Some(PermanentFault::Data), "data too long");
        // Lock wait timeout, deadlock, read-only (a failover), a killed connection: retried.
        for code in [1205, 1213, 1290, 1927] {
            assert_eq!(fault(code), None, "{code}");
        }
        assert!(is_lock_wait_timeout(&server(1205)) && !is_lock_wait_timeout(&server(1213)));
        assert_eq!(permanent_fault(&Error::Other("timed out".into())), None);
    }

    #[test]
    fn id_lists_inline_integers() {
        assert_eq!(id_list([7, 9, 12]), "7, 9, 12");
        assert_eq!(id_list([]), "");
    }

    #[test]
    fn tls_modes_map_to_ssl_options() {
        assert!(ssl_opts(TlsMode::Disabled, None).unwrap().is_none());
        let required = ssl_opts(TlsMode::Required, None).unwrap().unwrap();
        assert!(required.accept_invalid_certs() && required.skip_domain_validation());
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\n").unwrap();
        let verify_ca = ssl_opts(TlsMode::VerifyCa, Some(&ca)).unwrap().unwrap();
        assert!(!verify_ca.accept_invalid_certs() && verify_ca.skip_domain_validation());
        assert_eq!(verify_ca.root_certs().len(), 1);
        let identity = ssl_opts(TlsMode::VerifyIdentity, Some(&ca))
            .unwrap()
            .unwrap();
        assert!(!identity.skip_domain_validation());
        let missing = ssl_opts(TlsMode::VerifyCa, Some(&dir.path().join("nope.pem")));
        assert!(missing.unwrap_err().to_string().contains("mysql.tls_ca"));
    }
}
