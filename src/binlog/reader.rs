//! The replica connection: start-up checks, the dump request, and the event loop that turns
//! binlog events into [`BinlogItem`]s.
//!
//! Guarantees: see the module above. In addition, a lost connection (or a silent one: no event
//! or heartbeat for `3 × heartbeat`) is re-opened with backoff from the end of the last
//! transaction read in full; a transaction cut in the middle is announced with
//! [`BinlogItem::Restart`] and read again from its start.

use super::clock::StreamClock;
use super::decode::{decode_bad_row, decode_row, ColumnLayout, DecodedRow};
use super::gtid::{MariaDbGtidPos, MySqlGtidSet, MySqlSource};
use super::position::{BinlogPosition, TxEnd, TxGtid};
use super::row_image::{RowImage, TableShape};
use super::xid::Xid;
use crate::outbox::message::RowLimits;
use crate::outbox::TableName;
use crate::retry::RetryPolicy;
use futures_util::StreamExt;
use mysql_async::binlog::events::{Event, EventData, RowsEventData, TableMapEvent};
use mysql_async::prelude::*;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn, Opts};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod checks;
mod events;
mod request;
mod rotate;
mod transaction;

pub use checks::{check_server, oldest_position, server_position, ServerInfo, StartupError};
use request::{classify_stream_error, sids, StreamFailure};
use transaction::{hold, Ending, OpenTx};

/// What the reader yields, in binlog order.
#[derive(Debug)]
pub enum BinlogItem {
    /// A transaction starts.
    TxBegin,
    /// An INSERT into an outbox table, inside the current transaction.
    Row(DecodedRow),
    /// The current transaction committed and ends at this position.
    TxEnd(TxEnd),
    /// An XA transaction was prepared: a transaction of its own (no `TxBegin`/`TxEnd` around
    /// it) whose rows wait for its outcome, which a later transaction carries.
    Prepared(PreparedTx),
    /// Inside the transaction of an `XA COMMIT` or `XA ROLLBACK`: the outcome of the prepared
    /// transaction `xid`.
    XaOutcome { xid: Xid, committed: bool },
    /// The connection was lost inside a transaction; it will be read again from its start.
    Restart,
}

/// A prepared XA transaction: its rows count only if `XA COMMIT` follows; a resumable position
/// must not pass `end` before that.
#[derive(Debug)]
pub struct PreparedTx {
    pub xid: Xid,
    pub rows: Vec<DecodedRow>,
    pub end: TxEnd,
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
    /// Told how far the stream has read (see [`StreamClock`]).
    pub clock: StreamClock,
}

impl ReaderOptions {
    /// The relay's reader of `tables` over `opts`, as `config` sets it (`mysql.server_id`,
    /// `mysql.heartbeat`, `outbox.max_payload_bytes`).
    pub fn from_config(
        config: &crate::config::Config,
        opts: Opts,
        tables: Vec<TableName>,
        flavor: ServerFlavor,
        clock: StreamClock,
    ) -> Self {
        ReaderOptions {
            opts,
            server_id: config.mysql.server_id,
            heartbeat: config.mysql.heartbeat,
            tables,
            limits: config.outbox.row_limits(),
            flavor,
            clock,
        }
    }
}

/// Reads the binlog from a position until cancelled. Build with [`BinlogReader::new`].
pub struct BinlogReader {
    options: ReaderOptions,
    tables: Vec<Arc<TableName>>,
    /// Kinds of event or statement inside a transaction that the reader does not understand,
    /// already logged (each is logged once).
    not_understood: Mutex<HashSet<String>>,
}

/// The per-connection decoding state.
#[derive(Default)]
struct StreamState {
    file: String,
    /// The transaction being read, from its first event to its end.
    tx: Option<OpenTx>,
    /// After a BEGIN (or a MariaDB transactional GTID event) until the commit.
    in_body: bool,
    /// The end of the `TRANSACTION_PAYLOAD` event (compressed transaction) being read: the
    /// events inside it carry no position of their own.
    payload_end: u64,
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

/// A reason to stop reading for good (the caller reports it). What the relay does with each
/// kind: [`crate::error::PipelineError::class`].
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
/// MariaDB's GTID event flag of the first part of an XA transaction (up to `XA PREPARE`).
const MARIADB_GTID_PREPARED_XA: u8 = 64;
const MARIADB_ANNOTATE_ROWS: u8 = 160;
const TRANSACTION_PAYLOAD: u8 = 40;
const MARIADB_COMPRESSED_EVENTS: std::ops::RangeInclusive<u8> = 165..=171;

impl BinlogReader {
    pub fn new(options: ReaderOptions) -> Self {
        let tables = options.tables.iter().cloned().map(Arc::new).collect();
        BinlogReader {
            options,
            tables,
            not_understood: Mutex::default(),
        }
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
            // Only a transaction that handed rows on early needs reading again as such; the rows
            // of any other were held here and are dropped with the state.
            let streamed = state.tx.as_ref().is_some_and(OpenTx::streamed);
            if streamed && out.send(BinlogItem::Restart).await.is_err() {
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
            record_lag(&event, &self.options.clock);
            for item in self.handle_event(&stream, state, &event)? {
                match &item {
                    BinlogItem::TxEnd(end) => position.advance(end),
                    // Held by the dispatcher from now on: a reconnect need not read it again.
                    BinlogItem::Prepared(prepared) => position.advance(&prepared.end),
                    _ => {}
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

    /// What one event means: the items it yields, in order (most events yield none).
    fn handle_event(
        &self,
        stream: &BinlogStream,
        state: &mut StreamState,
        event: &Event,
    ) -> Result<Vec<BinlogItem>, StreamFailure> {
        let header = event.header();
        let raw_type = header.event_type_raw();
        let end_pos = match u64::from(header.log_pos()) {
            0 => state.payload_end, // inside a compressed transaction
            pos => pos,
        };
        let timestamp = header.timestamp();
        let mut items = Vec::new();
        if raw_type == MARIADB_GTID_EVENT {
            self.mariadb_gtid(state, event.data(), header.server_id(), &mut items)?;
            return Ok(items);
        }
        let Some(data) = self.event_data(state, event, raw_type)? else {
            return Ok(items);
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
                self.query(state, &query, end_pos, timestamp, &mut items)
            }
            EventData::XidEvent(_) => {
                items.extend(self.finish(state, end_pos, timestamp, Ending::Commit))
            }
            EventData::XaPrepareLogEvent(body) => {
                self.xa_prepare(state, &body, end_pos, timestamp, &mut items)?
            }
            EventData::TableMapEvent(tme) => self.table_map(state, event.data(), &tme),
            EventData::RowsEvent(rows) => self.rows(stream, state, &rows, &mut items),
            _ if raw_type == TRANSACTION_PAYLOAD => state.payload_end = end_pos,
            EventData::RowsQueryEvent(_)
            | EventData::IntvarEvent(_)
            | EventData::RandEvent(_)
            | EventData::UserVarEvent(_)
            | EventData::HeartbeatEvent
            | EventData::PreviousGtidsEvent(_)
            | EventData::AnonymousGtidEvent(_) => {}
            _ => self.not_understood(state, || format!("binlog event {:?}", header.event_type())),
        }
        Ok(items)
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
        state: &mut StreamState,
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
                let decoded = (0..count.max(1)).map(|_| DecodedRow::Unidentifiable(reason.clone()));
                let decoded: Vec<DecodedRow> = decoded.collect();
                hold(state, decoded, items);
                return;
            }
        };
        let decoded: Vec<DecodedRow> = shape
            .after_images(rows)
            .into_iter()
            .map(|row| match row {
                RowImage::Read(values) => decode_row(table, layout, values, self.options.limits),
                RowImage::BadValue { values, reason } => {
                    decode_bad_row(table, layout, values, &reason)
                }
                RowImage::Unreadable(reason) => DecodedRow::Unidentifiable(format!(
                    "{table}: the rest of a rows event cannot be read ({reason}); its rows from \
                     here on are neither located nor counted: they stay PENDING and the sweeper \
                     publishes them, late (with sweeper.enabled = false they stay PENDING)"
                )),
            })
            .collect();
        hold(state, decoded, items);
    }
}

/// Sets `outbox_binlog_lag_seconds` and the stream clock: a heartbeat means the server has
/// nothing more to send (0); a commit (XID or QUERY event) carries when it was written (whole
/// seconds, server clock).
fn record_lag(event: &Event, clock: &StreamClock) {
    const QUERY: u8 = 2;
    const XID: u8 = 16;
    const HEARTBEAT: u8 = 27;
    // MySQL 8.0.26+ (HEARTBEAT_LOG_EVENT_V2; mysql_common has no variant for it yet).
    const HEARTBEAT_V2: u8 = 41;
    let lag = &crate::metrics::relay().binlog_lag_seconds;
    match event.header().event_type_raw() {
        HEARTBEAT | HEARTBEAT_V2 => {
            lag.set(0.0);
            clock.heartbeat();
        }
        QUERY | XID => {
            let written = u64::from(event.header().timestamp());
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            if written > 0 {
                lag.set(now.saturating_sub(written) as f64);
                clock.read_commit(written);
            }
        }
        _ => {}
    }
}
