//! The events of the stream that `BinlogReader::handle_event` hands on: each one's meaning
//! for the decoding state and the transaction being read.

use super::super::gtid::MariaDbGtid;
use super::super::position::TxGtid;
use super::super::xid::Xid;
use super::request::StreamFailure;
use super::transaction::{statement_inserts_into, Ending, Statement};
use super::{
    BinlogItem, BinlogReader, KnownTable, ReaderError, StreamState, MARIADB_ANNOTATE_ROWS,
    MARIADB_COMPRESSED_EVENTS, MARIADB_GTID_PREPARED_XA, MARIADB_GTID_STANDALONE,
};
use mysql_async::binlog::events::{Event, EventData, QueryEvent, TableMapEvent};

impl BinlogReader {
    /// MariaDB's GTID event (`body`, written by `server`): a transaction starts, in a body of
    /// its own unless standalone, and XA when flagged so.
    pub(super) fn mariadb_gtid(
        &self,
        state: &mut StreamState,
        body: &[u8],
        server: u32,
        items: &mut Vec<BinlogItem>,
    ) -> Result<(), StreamFailure> {
        if body.len() < 13 {
            return Err(StreamFailure::Transient(
                "truncated MariaDB GTID event".into(),
            ));
        }
        let seq = u64::from_le_bytes(body[0..8].try_into().expect("8 bytes"));
        let domain = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes"));
        let flags = body[12];
        let gtid = TxGtid::MariaDb(MariaDbGtid {
            domain,
            server,
            seq,
        });
        items.extend(self.begin(state, Some(gtid)));
        state.in_body = flags & MARIADB_GTID_STANDALONE == 0;
        if let Some(tx) = &mut state.tx {
            tx.xa = flags & MARIADB_GTID_PREPARED_XA != 0;
        }
        Ok(())
    }

    /// The event's data; `None` for the other MariaDB-specific events, none of which changes a
    /// transaction. Compressed events stop the reader for good.
    pub(super) fn event_data<'e>(
        &self,
        state: &StreamState,
        event: &'e Event,
        raw_type: u8,
    ) -> Result<Option<EventData<'e>>, StreamFailure> {
        if MARIADB_COMPRESSED_EVENTS.contains(&raw_type) {
            return Err(StreamFailure::Permanent(ReaderError::Unsupported(
                "the binlog has compressed events: set log_bin_compress=OFF on the MariaDB server"
                    .into(),
            )));
        }
        match event.read_data() {
            Ok(Some(data)) => Ok(Some(data)),
            Ok(None) => {
                // Other MariaDB-specific events: none changes a transaction.
                if raw_type != MARIADB_ANNOTATE_ROWS {
                    self.not_understood(state, || format!("binlog event type {raw_type}"));
                }
                Ok(None)
            }
            Err(e) => Err(StreamFailure::Transient(format!(
                "undecodable binlog event: {e}"
            ))),
        }
    }

    /// A QUERY event ending at `end_pos`: the statement's meaning for the transaction; an
    /// outbox INSERT in statement format (which the stream cannot decode) is warned about.
    pub(super) fn query(
        &self,
        state: &mut StreamState,
        query: &QueryEvent<'_>,
        end_pos: u64,
        timestamp: u32,
        items: &mut Vec<BinlogItem>,
    ) {
        let sql = query.query();
        let sql = sql.trim();
        if let Some(table) = statement_inserts_into(sql, &query.schema(), &self.tables) {
            let gtid = state.tx.as_ref().and_then(|tx| tx.gtid.clone());
            tracing::warn!(%table, ?gtid,
                "an outbox row was written in binlog_format=STATEMENT: the stream cannot \
                 decode it; the sweeper publishes it after sweeper.min_age (set \
                 binlog_format=ROW for every session that writes the outbox)");
        }
        items.extend(self.statement(state, Statement::of(sql), end_pos, timestamp));
    }

    /// An XA_PREPARE event ending at `end_pos`: the transaction ends prepared, or committed
    /// when it is `XA COMMIT … ONE PHASE`.
    pub(super) fn xa_prepare(
        &self,
        state: &mut StreamState,
        body: &[u8],
        end_pos: u64,
        timestamp: u32,
        items: &mut Vec<BinlogItem>,
    ) -> Result<(), StreamFailure> {
        let (one_phase, xid) = Xid::from_prepare_event(body).map_err(|e| {
            StreamFailure::Permanent(ReaderError::Unsupported(format!(
                "unreadable XA_PREPARE event at {}:{end_pos}: {e}",
                state.file
            )))
        })?;
        let ending = match one_phase {
            true => Ending::Commit, // XA COMMIT … ONE PHASE
            false => Ending::Prepared(xid),
        };
        items.extend(self.finish(state, end_pos, timestamp, ending));
        Ok(())
    }

    /// A table map (`body` its bytes): what is known of its table is learnt again only when the
    /// map is new or changed.
    pub(super) fn table_map(&self, state: &mut StreamState, body: &[u8], tme: &TableMapEvent<'_>) {
        let known = state.tables.get(&tme.table_id());
        if known.is_none_or(|known| known.map != body) {
            // A new or changed map (DDL): learn the table again.
            let outbox = self.outbox_table(tme);
            let map = body.to_vec();
            state
                .tables
                .insert(tme.table_id(), KnownTable { map, outbox });
        }
    }
}
