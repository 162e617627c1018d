//! Start-up checks: the server must write the binlog the way the relay reads it, and the relay's
//! user must be allowed to read it and to mark outbox rows. Each failure says what to change.

use super::ServerFlavor;
use crate::binlog::position::BinlogPosition;
use crate::outbox::TableName;
use mysql_async::prelude::*;
use mysql_async::{Conn, Opts, Row};

/// What the checks learned about the server.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    pub version: String,
    pub flavor: ServerFlavor,
    /// The server's current end of binlog (where a relay without a checkpoint starts).
    pub current: BinlogPosition,
    /// A Galera node (`wsrep_on`): every node accepts writes, so a MySQL named lock
    /// (`GET_LOCK`) is not cluster-wide (see the `leader` module).
    pub galera: bool,
}

/// A server or account the relay cannot work with. What the relay does with each kind:
/// [`crate::error::PipelineError::class`].
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("cannot connect to MySQL: {0}")]
    Connect(mysql_async::Error),
    #[error("{0}")]
    Misconfigured(String),
    #[error("the relay's user lacks a privilege: {0}")]
    Privilege(String),
    #[error("database error during start-up checks: {0}")]
    Database(#[from] mysql_async::Error),
}

fn misconfigured(text: String) -> StartupError {
    StartupError::Misconfigured(text)
}

/// A global server variable; `None` when this server has no such variable. A lost connection is
/// an error, never "unset": that would read as a misconfigured server and stop the relay.
async fn variable(conn: &mut Conn, name: &str) -> Result<Option<String>, StartupError> {
    // `SHOW GLOBAL VARIABLES` needs no privilege on MySQL or MariaDB (MySQL 8 has no
    // information_schema.GLOBAL_VARIABLES). The names are the relay's own constants.
    debug_assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    let row: Option<(String, Option<String>)> = conn
        .query_first(format!(
            "SHOW GLOBAL VARIABLES WHERE Variable_name = '{name}'"
        ))
        .await?;
    Ok(row.and_then(|(_, value)| value))
}

/// A new connection. A server that cannot be reached (or refuses the account) is a
/// [`StartupError::Connect`]; one that took the connection and then cut it (killed, shut down,
/// reset) is a [`StartupError::Database`] error like a cut in any later query: the relay retries
/// those even at its first start.
async fn open(opts: &Opts) -> Result<Conn, StartupError> {
    Conn::new(opts.clone()).await.map_err(|e| {
        if crate::db::is_cut_connection(&e) {
            StartupError::Database(e)
        } else {
            StartupError::Connect(e)
        }
    })
}

/// A connection, the server's `VERSION()`, and whether it is MariaDB.
async fn connect(opts: &Opts) -> Result<(Conn, String, bool), StartupError> {
    let mut conn = open(opts).await?;
    let version: String = conn
        .query_first("SELECT VERSION()")
        .await?
        .unwrap_or_default();
    let is_mariadb = version.to_ascii_lowercase().contains("mariadb");
    Ok((conn, version, is_mariadb))
}

/// Checks binlog settings and privileges; returns the flavour and current position.
pub async fn check_server(opts: &Opts, tables: &[TableName]) -> Result<ServerInfo, StartupError> {
    let (mut conn, version, is_mariadb) = connect(opts).await?;
    check_binlog_settings(&mut conn, is_mariadb).await?;
    let info = read_server_info(&mut conn, version, is_mariadb).await?;
    check_replication_slave(&mut conn).await?;
    if info.galera {
        check_galera(&mut conn).await?;
    }
    check_table_privileges(&mut conn, tables).await?;
    conn.disconnect().await?;
    Ok(info)
}

/// The server writes a binlog in the form the relay decodes: row-based, full row images with
/// column names, and (MySQL) no partial JSON updates.
async fn check_binlog_settings(conn: &mut Conn, is_mariadb: bool) -> Result<(), StartupError> {
    let log_bin = variable(conn, "log_bin").await?.unwrap_or_default();
    if !matches!(log_bin.to_ascii_uppercase().as_str(), "ON" | "1") {
        return Err(misconfigured("the server does not write a binlog: start it with --log-bin (or use relay.mode = \"poll\")".into()));
    }
    let expect = [
        ("binlog_format", "ROW", "set binlog_format=ROW"),
        ("binlog_row_image", "FULL", "set binlog_row_image=FULL"),
        (
            "binlog_row_metadata",
            "FULL",
            "set binlog_row_metadata=FULL so the binlog carries column names",
        ),
    ];
    for (name, wanted, fix) in expect {
        let value = variable(conn, name).await?.unwrap_or_default();
        if !value.eq_ignore_ascii_case(wanted) {
            return Err(misconfigured(format!(
                "{name} is {:?} on the server, the relay needs {wanted}: {fix} (in the server's config, then restart it)",
                value
            )));
        }
    }
    if !is_mariadb {
        let options = variable(conn, "binlog_row_value_options")
            .await?
            .unwrap_or_default();
        if options.to_ascii_uppercase().contains("PARTIAL_JSON") {
            return Err(misconfigured("binlog_row_value_options=PARTIAL_JSON writes partial JSON updates the relay cannot decode: set it to ''".into()));
        }
    }
    Ok(())
}

/// SELECT and UPDATE on every outbox table, and SELECT, INSERT and UPDATE on the relay's state
/// table (leader election, checkpoint mirror), without changing a row. A missing table or
/// column is a misconfiguration, a missing grant a privilege error naming it.
async fn check_table_privileges(conn: &mut Conn, tables: &[TableName]) -> Result<(), StartupError> {
    for (what, sql, table) in privilege_probes(tables) {
        if let Err(e) = conn.query_drop(&sql).await {
            use crate::db::PermanentFault;
            return Err(match (crate::db::permanent_fault(&e), e) {
                (Some(PermanentFault::Schema), mysql_async::Error::Server(s)) => {
                    misconfigured(format!(
                        "outbox table {table}: {}; run `outbox-relay migrate` or fix outbox.tables",
                        s.message
                    ))
                }
                (Some(PermanentFault::Privilege), mysql_async::Error::Server(s)) => {
                    StartupError::Privilege(format!("{}; grant {what} on {table}", s.message))
                }
                (_, other) => other.into(),
            });
        }
    }
    Ok(())
}

/// The statements that prove each privilege without changing a row: `(privilege, statement,
/// table)`.
fn privilege_probes(tables: &[TableName]) -> Vec<(&'static str, String, String)> {
    let state = "outbox_relay_state";
    let mut probes = Vec::new();
    for table in tables {
        let table = table.sql();
        probes.push((
            "SELECT",
            format!("SELECT id FROM {table} LIMIT 0"),
            table.clone(),
        ));
        probes.push((
            "UPDATE",
            format!("UPDATE {table} SET status = status WHERE 1 = 0"),
            table,
        ));
    }
    for (what, sql) in [
        ("SELECT", format!("SELECT name FROM {state} LIMIT 0")),
        (
            "INSERT",
            format!("INSERT INTO {state} SELECT * FROM {state} WHERE 1 = 0"),
        ),
        (
            "UPDATE",
            format!("UPDATE {state} SET name = name WHERE 1 = 0"),
        ),
    ] {
        probes.push((what, sql, state.to_string()));
    }
    probes
}

/// Whether the server is a Galera node (`wsrep_on` is ON; MySQL has no such variable).
async fn is_galera(conn: &mut Conn) -> Result<bool, StartupError> {
    let on = variable(conn, "wsrep_on").await?.unwrap_or_default();
    Ok(matches!(on.to_ascii_uppercase().as_str(), "ON" | "1"))
}

/// On a Galera node, what lets a leader on any node read every event and resume where a leader
/// on another node stopped: each node's binlog holds the whole cluster's writes
/// (`log_slave_updates`), under the same GTIDs on every node (`wsrep_gtid_mode`).
async fn check_galera(conn: &mut Conn) -> Result<(), StartupError> {
    for (name, why) in [
        ("log_slave_updates", "so its binlog holds the writes of every node, not only its own"),
        ("wsrep_gtid_mode", "so a transaction has the same GTID on every node and a leader on another node can resume from this one's checkpoint"),
    ] {
        let value = variable(conn, name).await?.unwrap_or_default();
        if !matches!(value.to_ascii_uppercase().as_str(), "ON" | "1") {
            return Err(misconfigured(format!(
                "this Galera node has {name} = {value:?}: set {name}=ON on every node ({why}); see docs/concepts/several-instances.md"
            )));
        }
    }
    Ok(())
}

/// The server's version, flavour and current end of binlog, with no other check (what `status`
/// needs: REPLICATION CLIENT / BINLOG MONITOR only).
pub async fn server_position(opts: &Opts) -> Result<ServerInfo, StartupError> {
    let (mut conn, version, is_mariadb) = connect(opts).await?;
    let info = read_server_info(&mut conn, version, is_mariadb).await?;
    conn.disconnect().await?;
    Ok(info)
}

/// What [`check_server`] and [`server_position`] return, read on `conn`.
async fn read_server_info(
    conn: &mut Conn,
    version: String,
    is_mariadb: bool,
) -> Result<ServerInfo, StartupError> {
    let (flavor, current) = read_position(conn, is_mariadb).await?;
    let galera = is_galera(conn).await?;
    Ok(ServerInfo {
        version,
        flavor,
        current,
        galera,
    })
}

/// The flavour and the current end of binlog (file/offset and GTIDs).
async fn read_position(
    conn: &mut Conn,
    is_mariadb: bool,
) -> Result<(ServerFlavor, BinlogPosition), StartupError> {
    // REPLICATION CLIENT (BINLOG MONITOR on MariaDB 10.5+): needed to ask for the position.
    let status: Result<Option<Row>, _> = match conn.query_first("SHOW MASTER STATUS").await {
        // MySQL 8.4 renamed it.
        Err(mysql_async::Error::Server(e)) if e.code == 1064 => {
            conn.query_first("SHOW BINARY LOG STATUS").await
        }
        other => other,
    };
    let status = match status {
        Ok(status) => status,
        Err(mysql_async::Error::Server(e)) if e.code == 1227 || e.code == 1142 => {
            return Err(StartupError::Privilege(format!(
                "{}; grant REPLICATION CLIENT (BINLOG MONITOR on MariaDB) to the relay's user",
                e.message
            )))
        }
        Err(e) => return Err(e.into()),
    };
    let mut current = BinlogPosition::default();
    if let Some(mut row) = status {
        current.file = row.take::<Option<String>, _>(0).flatten();
        current.pos = row.take::<Option<u64>, _>(1).flatten().unwrap_or(4);
    }
    let flavor = if is_mariadb {
        let gtid: String = conn
            .query_first("SELECT @@GLOBAL.gtid_binlog_pos")
            .await?
            .unwrap_or_default();
        current.mariadb_gtid = Some(gtid.parse().map_err(|e| misconfigured(format!("{e}")))?);
        ServerFlavor::MariaDb
    } else {
        let mode = variable(conn, "gtid_mode").await?.unwrap_or_default();
        if mode.eq_ignore_ascii_case("ON") {
            let executed: String = conn
                .query_first("SELECT @@GLOBAL.gtid_executed")
                .await?
                .unwrap_or_default();
            current.mysql_gtid_set = Some(
                executed
                    .parse()
                    .map_err(|e| misconfigured(format!("{e}")))?,
            );
            ServerFlavor::MySqlGtid
        } else {
            ServerFlavor::MySqlFilePos
        }
    };
    Ok((flavor, current))
}

/// REPLICATION SLAVE, without which the server refuses the binlog dump. Judged from the
/// account's own global privileges (`information_schema.USER_PRIVILEGES`); when those are not
/// visible, or a role is active (its privileges are not listed there), the dump request itself
/// reports a missing privilege ([`super::ReaderError::NotAllowed`]).
async fn check_replication_slave(conn: &mut Conn) -> Result<(), StartupError> {
    const OWN_PRIVILEGES: &str = "SELECT GRANTEE, PRIVILEGE_TYPE \
        FROM information_schema.USER_PRIVILEGES WHERE GRANTEE = CONCAT('''', \
        SUBSTRING_INDEX(CURRENT_USER(), '@', 1), '''@''', \
        SUBSTRING_INDEX(CURRENT_USER(), '@', -1), '''')";
    let privileges: Vec<(String, String)> = conn.query(OWN_PRIVILEGES).await.unwrap_or_default();
    let Some(grantee) = privileges.first().map(|p| p.0.clone()) else {
        return Ok(());
    };
    let role: Option<Option<String>> = conn
        .query_first("SELECT CURRENT_ROLE()")
        .await
        .unwrap_or(None);
    if role
        .flatten()
        .is_some_and(|r| !r.is_empty() && !r.eq_ignore_ascii_case("NONE"))
    {
        return Ok(());
    }
    let types: Vec<&str> = privileges.iter().map(|p| p.1.as_str()).collect();
    if has_replication_slave(&types) {
        return Ok(());
    }
    Err(StartupError::Privilege(format!(
        "{grantee} may not read the binlog (no REPLICATION SLAVE); \
         GRANT REPLICATION SLAVE ON *.* TO {grantee}"
    )))
}

/// Whether global privileges `types` (as `USER_PRIVILEGES` lists them) allow a binlog dump.
fn has_replication_slave(types: &[&str]) -> bool {
    types.iter().any(|t| {
        ["REPLICATION SLAVE", "REPLICATION REPLICA", "ALL PRIVILEGES"]
            .iter()
            .any(|p| t.eq_ignore_ascii_case(p))
    })
}

/// The oldest position the server can still stream from: where a relay whose checkpoint was
/// purged from the server restarts (the sweeper publishes the PENDING rows of the gap).
///
/// MariaDB: the GTID state at the start of the oldest binlog file (`BINLOG_GTID_POS`); MySQL
/// with GTIDs: `gtid_purged` (the server sends every transaction not in it); MySQL without:
/// the start of the oldest file.
pub async fn oldest_position(
    opts: &Opts,
    flavor: ServerFlavor,
) -> Result<BinlogPosition, StartupError> {
    let mut conn = open(opts).await?;
    let logs: Vec<Row> = conn.query("SHOW BINARY LOGS").await?;
    let first = logs
        .into_iter()
        .next()
        .and_then(|mut row| row.take::<Option<String>, _>(0).flatten());
    let mut position = BinlogPosition {
        file: first.clone(),
        pos: 4,
        ..BinlogPosition::default()
    };
    match flavor {
        ServerFlavor::MariaDb => {
            let gtid: Option<Option<String>> = match &first {
                Some(file) => {
                    conn.exec_first("SELECT BINLOG_GTID_POS(?, 4)", (file,))
                        .await?
                }
                None => None,
            };
            let gtid = gtid.flatten().unwrap_or_default();
            position.mariadb_gtid = Some(gtid.parse().map_err(|e| misconfigured(format!("{e}")))?);
        }
        ServerFlavor::MySqlGtid => {
            let purged: String = conn
                .query_first("SELECT @@GLOBAL.gtid_purged")
                .await?
                .unwrap_or_default();
            position.mysql_gtid_set =
                Some(purged.parse().map_err(|e| misconfigured(format!("{e}")))?);
        }
        ServerFlavor::MySqlFilePos => {}
    }
    conn.disconnect().await?;
    Ok(position)
}

#[cfg(test)]
mod tests {
    use super::has_replication_slave;

    #[test]
    fn replication_slave_is_recognised_under_each_name() {
        assert!(has_replication_slave(&["SELECT", "REPLICATION SLAVE"]));
        assert!(has_replication_slave(&["replication replica"]));
        assert!(has_replication_slave(&["ALL PRIVILEGES"]));
        assert!(!has_replication_slave(&["USAGE"]));
        assert!(!has_replication_slave(&[
            "BINLOG MONITOR",
            "REPLICATION CLIENT"
        ]));
    }
}
