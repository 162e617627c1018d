//! The replica connection: start-up checks, the dump request, and the event loop that turns
//! binlog events into [`BinlogItem`]s.
//!
//! Guarantees: see the module above. In addition, a lost connection (or a silent one: no event
//! or heartbeat for `3 × heartbeat`) is re-opened with backoff from the end of the last
//! transaction read in full; a transaction cut in the middle is announced with
//! [`BinlogItem::Restart`] and read again from its start.

use super::decode::{decode_row, ColumnLayout, DecodedRow, RowLimits};
use super::gtid::{MariaDbGtid, MariaDbGtidPos, MySqlGtidSet, MySqlSource};
use super::position::{BinlogPosition, TxEnd, TxGtid};
use super::row_image::TableShape;
use crate::config::TableName;
use crate::retry::RetryPolicy;
use futures_util::StreamExt;
use mysql_async::binlog::events::{Event, EventData, RowsEventData, TableMapEvent};
use mysql_async::prelude::*;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn, GnoInterval, Opts, Sid};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod checks;
mod rotate;

pub use checks::{check_server, oldest_position, server_position, ServerInfo, StartupError};

/// What the reader yields, in binlog order.
#[derive(Debug)]
pub enum BinlogItem {
    /// A transaction starts.
    TxBegin,
    /// An INSERT into an outbox table, inside the current transaction.
    Row(DecodedRow),
    /// The current transaction committed and ends at this position.
    TxEnd(TxEnd),
    /// The connection was lost inside a transaction; it will be read again from its start.
    Restart,
}

/// Which server the relay reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerFlavor {
    /// MariaDB: resumes by GTID position (`@slave_connect_state`).
    MariaDb,
    /// MySQL with `gtid_mode=ON`: resumes by GTID set (COM_BINLOG_DUMP_GTID).
    MySqlGtid,
    /// MySQL without GTIDs: resumes by file and offset.
    MySqlFilePos,
}

/// How to read.
#[derive(Debug, Clone)]
pub struct ReaderOptions {
    pub opts: Opts,
    pub server_id: u32,
    pub heartbeat: Duration,
    /// Outbox tables, schema-qualified.
    pub tables: Vec<TableName>,
    pub limits: RowLimits,
    pub flavor: ServerFlavor,
}

/// Reads the binlog from a position until cancelled. Build with [`BinlogReader::new`].
pub struct BinlogReader {
    options: ReaderOptions,
    tables: Vec<Arc<TableName>>,
}

/// The per-connection decoding state.
#[derive(Default)]
struct StreamState {
    file: String,
    in_tx: bool,
    /// After a BEGIN (or a MariaDB transactional GTID event) until the commit.
    in_body: bool,
    gtid: Option<TxGtid>,
    /// Until the stream's format description: a rotate event's name is followed by the 4
    /// checksum bytes (see [`rotate::first_has_checksum`]).
    rotate_has_checksum: bool,
    /// table_id → what its last table map said. Every transaction repeats its tables' maps;
    /// what was learnt from one (the row shape) is kept while the map's bytes are unchanged, not
    /// rebuilt per transaction (one-event transactions would pay it per event).
    tables: HashMap<u64, KnownTable>,
}

/// One table_id's last table map, and the outbox table it maps, if any.
struct KnownTable {
    map: Vec<u8>,
    outbox: Option<MappedTable>,
}

/// An outbox table seen in a table map, with how to read its rows (or why they cannot be read).
struct MappedTable {
    table: Arc<TableName>,
    shape: Result<(TableShape, ColumnLayout), String>,
}

/// A reason to stop reading for good (the caller reports it).
#[derive(Debug, thiserror::Error)]
pub enum ReaderError {
    #[error("the binlog position {position} is no longer on the server (purged?): {message}")]
    PositionGone { position: String, message: String },
    #[error("the server refused the replication request: {0}; grant REPLICATION SLAVE to the relay's user")]
    NotAllowed(String),
    #[error("{0}")]
    Unsupported(String),
}

const MARIADB_GTID_EVENT: u8 = 162;
const MARIADB_GTID_STANDALONE: u8 = 1;
const MARIADB_COMPRESSED_EVENTS: std::ops::RangeInclusive<u8> = 165..=171;

impl BinlogReader {
    pub fn new(options: ReaderOptions) -> Self {
        let tables = options.tables.iter().cloned().map(Arc::new).collect();
        BinlogReader { options, tables }
    }

    /// Reads from `start` and sends items to `out` until `cancel` fires, `out` closes, or a
    /// permanent error. Connection errors are retried for ever with backoff.
    pub async fn run(
        self,
        start: BinlogPosition,
        out: mpsc::Sender<BinlogItem>,
        cancel: CancellationToken,
    ) -> Result<(), ReaderError> {
        let mut position = start;
        let policy = RetryPolicy::reconnect();
        let mut failures = 0u32;
        loop {
            let mut state = StreamState::default();
            let result = tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                r = self.stream_once(&mut position, &mut state, &out, &mut failures) => r,
            };
            if state.in_tx && out.send(BinlogItem::Restart).await.is_err() {
                return Ok(());
            }
            match result {
                Ok(()) => return Ok(()), // the consumer side hung up
                Err(StreamFailure::Permanent(e)) => return Err(e),
                Err(StreamFailure::Transient(e)) => {
                    failures += 1;
                    let delay = policy.delay(failures).unwrap_or(policy.max);
                    tracing::warn!(error = %e, retry_in = ?delay, position = %position,
                        "binlog connection lost; reconnecting");
                    tokio::select! {
                        _ = cancel.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    async fn stream_once(
        &self,
        position: &mut BinlogPosition,
        state: &mut StreamState,
        out: &mpsc::Sender<BinlogItem>,
        failures: &mut u32,
    ) -> Result<(), StreamFailure> {
        let silence = self.options.heartbeat * 3;
        // Opening (connect, session variables, dump request) gets the same bound as a silent
        // stream: a connection killed or cut mid-handshake must not hang the reader.
        let open_limit = silence.max(Duration::from_secs(10));
        let mut stream = match tokio::time::timeout(open_limit, self.open(position)).await {
            Ok(opened) => {
                let (stream, checksums) = opened?;
                state.rotate_has_checksum =
                    rotate::first_has_checksum(self.options.flavor, checksums);
                stream
            }
            Err(_) => {
                return Err(StreamFailure::Transient(format!(
                    "opening the binlog stream took longer than {open_limit:?}"
                )))
            }
        };
        loop {
            let event = match tokio::time::timeout(silence, stream.next()).await {
                Err(_) => {
                    return Err(StreamFailure::Transient(format!(
                        "no event or heartbeat for {silence:?}"
                    )))
                }
                Ok(None) => {
                    return Err(StreamFailure::Transient(
                        "the server closed the stream".into(),
                    ))
                }
                Ok(Some(Err(e))) => return Err(classify_stream_error(e, position)),
                Ok(Some(Ok(event))) => event,
            };
            *failures = 0;
            record_lag(&event);
            for item in self.handle_event(&stream, state, &event)? {
                if let BinlogItem::TxEnd(end) = &item {
                    position.advance(end);
                }
                if out.send(item).await.is_err() {
                    return Ok(());
                }
            }
        }
    }

    /// Opens the stream at `position`; also says whether the server checksums binlog events.
    async fn open(&self, position: &BinlogPosition) -> Result<(BinlogStream, bool), StreamFailure> {
        let transient = |e: mysql_async::Error| StreamFailure::Transient(e.to_string());
        let mut conn = Conn::new(self.options.opts.clone())
            .await
            .map_err(transient)?;
        let period_ns = self
            .options
            .heartbeat
            .as_nanos()
            .min(u128::from(u32::MAX) * 1_000_000);
        conn.query_drop(format!("SET @master_heartbeat_period = {period_ns}"))
            .await
            .map_err(transient)?;
        let mut request = BinlogStreamRequest::new(self.options.server_id);
        match self.options.flavor {
            ServerFlavor::MariaDb => {
                let gtid = position
                    .mariadb_gtid
                    .as_ref()
                    .map(MariaDbGtidPos::to_string)
                    .unwrap_or_default();
                conn.query_drop("SET @mariadb_slave_capability = 4")
                    .await
                    .map_err(transient)?;
                conn.exec_drop("SET @slave_connect_state = ?", (gtid,))
                    .await
                    .map_err(transient)?;
                conn.query_drop("SET @slave_gtid_strict_mode = 1")
                    .await
                    .map_err(transient)?;
            }
            ServerFlavor::MySqlGtid => {
                request = request.with_gtid().with_gtid_set(sids(
                    position
                        .mysql_gtid_set
                        .as_ref()
                        .unwrap_or(&MySqlGtidSet::default()),
                )?);
            }
            ServerFlavor::MySqlFilePos => {}
        }
        let file = position.file.clone().unwrap_or_default();
        if self.options.flavor == ServerFlavor::MySqlFilePos {
            request = request
                .with_filename(file.as_bytes())
                .with_pos(position.pos.max(4));
        }
        let checksum: Option<String> = conn
            .query_first("SELECT @@GLOBAL.binlog_checksum")
            .await
            .map_err(transient)?;
        let checksums = checksum.is_some_and(|c| !c.eq_ignore_ascii_case("NONE"));
        tracing::info!(position = %position, flavor = ?self.options.flavor, "reading the binlog");
        let stream = conn
            .get_binlog_stream(request)
            .await
            .map_err(|e| classify_stream_error(e, position))?;
        Ok((stream, checksums))
    }

    fn handle_event(
        &self,
        stream: &BinlogStream,
        state: &mut StreamState,
        event: &Event,
    ) -> Result<Vec<BinlogItem>, StreamFailure> {
        let header = event.header();
        let raw_type = header.event_type_raw();
        let end_pos = u64::from(header.log_pos());
        let mut items = Vec::new();
        if raw_type == MARIADB_GTID_EVENT {
            let body = event.data();
            if body.len() < 13 {
                return Err(StreamFailure::Transient(
                    "truncated MariaDB GTID event".into(),
                ));
            }
            let seq = u64::from_le_bytes(body[0..8].try_into().expect("8 bytes"));
            let domain = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes"));
            let flags = body[12];
            items.extend(self.begin(
                state,
                Some(TxGtid::MariaDb(MariaDbGtid {
                    domain,
                    server: header.server_id(),
                    seq,
                })),
            ));
            state.in_body = flags & MARIADB_GTID_STANDALONE == 0;
            return Ok(items);
        }
        if MARIADB_COMPRESSED_EVENTS.contains(&raw_type) {
            return Err(StreamFailure::Permanent(ReaderError::Unsupported(
                "the binlog has compressed events: set log_bin_compress=OFF on the MariaDB server"
                    .into(),
            )));
        }
        let data = match event.read_data() {
            Ok(Some(data)) => data,
            Ok(None) => return Ok(items), // other MariaDB-specific events: nothing to do
            Err(e) => {
                return Err(StreamFailure::Transient(format!(
                    "undecodable binlog event: {e}"
                )))
            }
        };
        match data {
            EventData::RotateEvent(rotate) => {
                state.file = rotate::file_name(rotate.name_raw(), state.rotate_has_checksum);
            }
            EventData::FormatDescriptionEvent(_) => state.rotate_has_checksum = false,
            EventData::GtidEvent(gtid) => {
                let source = MySqlSource::from_uuid_bytes(
                    gtid.sid(),
                    gtid.tag().map(|t| t.to_string().to_ascii_lowercase()),
                );
                items.extend(self.begin(state, Some(TxGtid::MySql(source, gtid.gno()))));
            }
            EventData::QueryEvent(query) => {
                let sql = query.query();
                let sql = sql.trim();
                if let Some(table) = statement_inserts_into(sql, &query.schema(), &self.tables) {
                    tracing::warn!(%table, gtid = ?state.gtid,
                        "an outbox row was written in binlog_format=STATEMENT: the stream cannot \
                         decode it; the sweeper publishes it after sweeper.min_age (set \
                         binlog_format=ROW for every session that writes the outbox)");
                }
                if sql.eq_ignore_ascii_case("BEGIN") {
                    if !state.in_tx {
                        items.extend(self.begin(state, None));
                    }
                    state.in_body = true;
                } else if sql.eq_ignore_ascii_case("COMMIT") || sql.eq_ignore_ascii_case("ROLLBACK")
                {
                    items.extend(self.end(state, end_pos, header.timestamp()));
                } else if !state.in_body {
                    // A statement on its own (DDL, or a non-transactional change).
                    if !state.in_tx {
                        items.extend(self.begin(state, None));
                    }
                    items.extend(self.end(state, end_pos, header.timestamp()));
                }
            }
            EventData::XidEvent(_) => items.extend(self.end(state, end_pos, header.timestamp())),
            EventData::TableMapEvent(tme) => {
                let body = event.data();
                let known = state.tables.get(&tme.table_id());
                if known.is_none_or(|known| known.map != body) {
                    // A new or changed map (DDL): learn the table again.
                    let outbox = self.outbox_table(&tme);
                    let map = body.to_vec();
                    state
                        .tables
                        .insert(tme.table_id(), KnownTable { map, outbox });
                }
            }
            EventData::RowsEvent(rows) => self.rows(stream, state, &rows, &mut items),
            _ => {}
        }
        Ok(items)
    }

    fn begin(&self, state: &mut StreamState, gtid: Option<TxGtid>) -> Option<BinlogItem> {
        state.gtid = gtid;
        state.in_body = false;
        if state.in_tx {
            return None;
        }
        state.in_tx = true;
        Some(BinlogItem::TxBegin)
    }

    fn end(&self, state: &mut StreamState, end_pos: u64, timestamp: u32) -> Option<BinlogItem> {
        if !state.in_tx {
            return None;
        }
        state.in_tx = false;
        state.in_body = false;
        Some(BinlogItem::TxEnd(TxEnd {
            gtid: state.gtid.take(),
            file: state.file.clone(),
            end_pos,
            timestamp,
        }))
    }

    /// The outbox table `tme` maps, if any, with how to read its rows.
    fn outbox_table(&self, tme: &TableMapEvent<'_>) -> Option<MappedTable> {
        let (db, name) = (tme.database_name(), tme.table_name());
        let table = self
            .tables
            .iter()
            .find(|t| t.schema.as_deref() == Some(&*db) && t.table == name)?;
        let shape = TableShape::of(tme)
            .map_err(|e| format!("unreadable table map: {e}"))
            .and_then(|shape| {
                let layout = ColumnLayout::from_names(shape.names())?;
                Ok((shape, layout))
            });
        Some(MappedTable {
            table: Arc::clone(table),
            shape,
        })
    }

    fn rows(
        &self,
        stream: &BinlogStream,
        state: &StreamState,
        rows: &RowsEventData<'_>,
        items: &mut Vec<BinlogItem>,
    ) {
        if !matches!(
            rows,
            RowsEventData::WriteRowsEvent(_) | RowsEventData::WriteRowsEventV1(_)
        ) {
            return; // UPDATEs (our own SENT marks included) and DELETEs are not events
        }
        let table_id = rows.table_id();
        let Some(known) = state.tables.get(&table_id) else {
            tracing::warn!(table_id, "rows event without its table map; skipped");
            return;
        };
        let Some(MappedTable { table, shape }) = &known.outbox else {
            return;
        };
        let (shape, layout) = match shape {
            Ok(found) => found,
            Err(reason) => {
                // Every row of the event is reported (counted the slow way: this is rare).
                let count = stream
                    .get_tme(table_id)
                    .map_or(1, |tme| rows.rows(tme).count());
                let reason = format!("{table}: {reason}");
                for _ in 0..count.max(1) {
                    items.push(BinlogItem::Row(DecodedRow::Unidentifiable(reason.clone())));
                }
                return;
            }
        };
        for row in shape.after_images(rows) {
            let decoded = match row {
                Ok(values) => decode_row(table, layout, values, self.options.limits),
                Err(e) => DecodedRow::Unidentifiable(format!("undecodable row of {table}: {e}")),
            };
            items.push(BinlogItem::Row(decoded));
        }
    }
}

/// Sets `outbox_binlog_lag_seconds`: a heartbeat means the server has nothing more to send (0);
/// a commit (XID or QUERY event) carries when it was written (whole seconds, server clock).
fn record_lag(event: &Event) {
    const QUERY: u8 = 2;
    const XID: u8 = 16;
    const HEARTBEAT: u8 = 27;
    let lag = &crate::metrics::relay().binlog_lag_seconds;
    match event.header().event_type_raw() {
        HEARTBEAT => {
            lag.set(0.0);
        }
        QUERY | XID => {
            let written = u64::from(event.header().timestamp());
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            if written > 0 {
                lag.set(now.saturating_sub(written) as f64);
            }
        }
        _ => {}
    }
}

/// Why one streaming attempt ended.
enum StreamFailure {
    Transient(String),
    Permanent(ReaderError),
}

impl From<ReaderError> for StreamFailure {
    fn from(e: ReaderError) -> Self {
        StreamFailure::Permanent(e)
    }
}

fn classify_stream_error(error: mysql_async::Error, position: &BinlogPosition) -> StreamFailure {
    if let mysql_async::Error::Server(server) = &error {
        match server.code {
            // ER_MASTER_FATAL_ERROR_READING_BINLOG: purged file or GTID not in any binlog.
            1236 => {
                return StreamFailure::Permanent(ReaderError::PositionGone {
                    position: position.to_string(),
                    message: server.message.clone(),
                })
            }
            // ER_SPECIFIC_ACCESS_DENIED_ERROR, ER_ACCESS_DENIED_ERROR
            1227 | 1045 => {
                return StreamFailure::Permanent(ReaderError::NotAllowed(server.message.clone()))
            }
            _ => {}
        }
    }
    StreamFailure::Transient(error.to_string())
}

/// The outbox table a statement-format `INSERT`/`REPLACE` writes, if any (`schema` is the
/// session's default database, for an unqualified name). Such rows never reach the decoder.
fn statement_inserts_into(
    sql: &str,
    schema: &str,
    tables: &[Arc<TableName>],
) -> Option<Arc<TableName>> {
    let mut words = sql.split_whitespace();
    let verb = words.next()?;
    if !verb.eq_ignore_ascii_case("INSERT") && !verb.eq_ignore_ascii_case("REPLACE") {
        return None;
    }
    let modifiers = ["LOW_PRIORITY", "DELAYED", "HIGH_PRIORITY", "IGNORE", "INTO"];
    let target = words.find(|w| !modifiers.iter().any(|m| w.eq_ignore_ascii_case(m)))?;
    let target = target
        .split('(')
        .next()
        .unwrap_or_default()
        .replace('`', "");
    let (db, table) = target.rsplit_once('.').unwrap_or((schema, &target));
    tables
        .iter()
        .find(|t| t.table == table && t.schema.as_deref() == Some(db))
        .cloned()
}

fn sids(set: &MySqlGtidSet) -> Result<Vec<Sid<'static>>, StreamFailure> {
    let mut by_source: Vec<(MySqlSource, Vec<GnoInterval>)> = Vec::new();
    for (source, start, end) in set.intervals() {
        match by_source.last_mut() {
            Some((s, ivs)) if s == source => ivs.push(GnoInterval::new(start, end)),
            _ => by_source.push((source.clone(), vec![GnoInterval::new(start, end)])),
        }
    }
    by_source
        .into_iter()
        .map(|(source, intervals)| {
            let uuid = uuid::Uuid::parse_str(&source.uuid).expect("validated UUID");
            let mut sid = Sid::new(*uuid.as_bytes()).with_intervals(intervals);
            if let Some(tag) = source.tag {
                let tag = mysql_common::packets::Tag::new(tag).map_err(|e| {
                    StreamFailure::Permanent(ReaderError::Unsupported(format!("bad GTID tag: {e}")))
                })?;
                sid = sid.with_tag(tag);
            }
            Ok(sid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::statement_inserts_into;
    use crate::config::TableName;
    use std::sync::Arc;

    #[test]
    fn statement_format_inserts_into_the_outbox_are_recognised() {
        let tables = [Arc::new(TableName::parse("app.outbox_event").unwrap())];
        let hit = |sql: &str, schema: &str| statement_inserts_into(sql, schema, &tables).is_some();
        assert!(hit(
            "INSERT INTO outbox_event (event_id) VALUES ('a')",
            "app"
        ));
        assert!(hit(
            "insert ignore into `app`.`outbox_event`(event_id) values ('a')",
            "other"
        ));
        assert!(hit("REPLACE outbox_event SET event_id = 'a'", "app"));
        assert!(!hit(
            "INSERT INTO outbox_event (event_id) VALUES ('a')",
            "other"
        ));
        assert!(!hit(
            "INSERT INTO outbox_event_archive SELECT * FROM outbox_event",
            "app"
        ));
        assert!(!hit("UPDATE outbox_event SET status = 2", "app"));
        assert!(!hit("BEGIN", "app"));
    }
}
