//! The transaction being read, and what the statements inside a binlog transaction mean for it.
//!
//! Guarantee: a row is handed on only for a transaction whose end said it counts: `COMMIT`/XID,
//! or the outcome of an XA transaction. Rows undone by `ROLLBACK TO <savepoint>` are dropped; a
//! binlogged `ROLLBACK` drops them all; an XA transaction's rows wait for its `XA COMMIT`. The one
//! exception is a transaction whose rows outgrow [`MAX_HELD_BYTES`] (not XA): its rows are handed
//! on as they are read, and undoing any of them afterwards is logged as an error naming it.

use super::super::decode::DecodedRow;
use super::super::position::{TxEnd, TxGtid};
use super::super::xid::Xid;
use super::{BinlogItem, BinlogReader, PreparedTx, StreamState};
use crate::outbox::TableName;
use std::sync::Arc;

/// Most bytes of rows (payloads and headers, roughly) a transaction holds before its end is read;
/// past it, a non-XA transaction's rows are handed on as they come.
pub const MAX_HELD_BYTES: usize = 64 * 1024 * 1024;

/// The transaction being read, from its first event to its end.
#[derive(Debug, Default)]
pub struct OpenTx {
    pub gtid: Option<TxGtid>,
    /// An XA transaction (`XA START`, or MariaDB's GTID event flag): never handed on early.
    pub xa: bool,
    rows: Vec<DecodedRow>,
    bytes: usize,
    /// Savepoint name (lower case) → rows held when it was set (counting rows handed on).
    savepoints: Vec<(String, usize)>,
    /// Rows already handed on because the transaction outgrew the bound.
    handed_on: usize,
    /// The XA transaction's size was warned about.
    warned: bool,
}

impl OpenTx {
    pub fn new(gtid: Option<TxGtid>) -> Self {
        OpenTx {
            gtid,
            ..OpenTx::default()
        }
    }

    /// True once rows of this transaction were handed on before its end.
    pub fn streamed(&self) -> bool {
        self.handed_on > 0
    }

    /// Holds `row`; returns rows to hand on now when the transaction outgrew the bound.
    pub fn push(&mut self, row: DecodedRow) -> Vec<DecodedRow> {
        self.bytes += weight(&row);
        self.rows.push(row);
        if self.xa {
            if self.bytes > MAX_HELD_BYTES && !self.warned {
                self.warned = true;
                tracing::warn!(bytes = self.bytes, gtid = ?self.gtid,
                    "an XA transaction holds more than 64 MiB of outbox rows in memory until its \
                     outcome is read");
            }
            return Vec::new();
        }
        if self.bytes <= MAX_HELD_BYTES {
            return Vec::new();
        }
        if self.handed_on == 0 {
            tracing::warn!(gtid = ?self.gtid,
                "a transaction with more than 64 MiB of outbox rows: its rows are handed on \
                 before its COMMIT is read (a ROLLBACK TO SAVEPOINT inside it can no longer drop \
                 them)");
        }
        self.bytes = 0;
        self.handed_on += self.rows.len();
        std::mem::take(&mut self.rows)
    }

    /// `SAVEPOINT name`.
    pub fn savepoint(&mut self, name: &str) {
        let name = name.to_ascii_lowercase();
        self.savepoints.retain(|(n, _)| *n != name);
        let mark = self.handed_on + self.rows.len();
        self.savepoints.push((name, mark));
    }

    /// `ROLLBACK TO name`: drops the rows since the savepoint (and the savepoints set after it).
    pub fn rollback_to(&mut self, name: &str) {
        let name = name.to_ascii_lowercase();
        let Some(at) = self.savepoints.iter().position(|(n, _)| *n == name) else {
            tracing::warn!(savepoint = %name, gtid = ?self.gtid,
                "ROLLBACK TO a savepoint this transaction did not set in the binlog; nothing dropped");
            return;
        };
        let mark = self.savepoints[at].1;
        self.savepoints.truncate(at + 1);
        if mark < self.handed_on {
            tracing::error!(savepoint = %name, gtid = ?self.gtid, rows = self.handed_on - mark,
                "rows undone by ROLLBACK TO SAVEPOINT were already handed on (the transaction \
                 outgrew 64 MiB): they are published although the database has no such rows");
        }
        self.rows.truncate(mark.saturating_sub(self.handed_on));
        self.bytes = self.rows.iter().map(weight).sum();
    }

    /// The rows held, for a transaction that counts.
    pub fn into_rows(self) -> Vec<DecodedRow> {
        self.rows
    }

    /// Drops the rows: the transaction was rolled back.
    pub fn roll_back(self) {
        if self.handed_on > 0 {
            tracing::error!(gtid = ?self.gtid, rows = self.handed_on,
                "a binlogged ROLLBACK undid rows that were already handed on (the transaction \
                 outgrew 64 MiB): they are published although the database has no such rows");
        }
    }
}

fn weight(row: &DecodedRow) -> usize {
    const OVERHEAD: usize = 256;
    match row {
        DecodedRow::Event(row) => {
            let m = &row.message;
            OVERHEAD
                + m.payload.len()
                + m.event_id.len()
                + m.biz_key.len()
                + m.headers
                    .iter()
                    .map(|(k, v)| k.len() + v.len())
                    .sum::<usize>()
        }
        _ => OVERHEAD,
    }
}

/// What a statement (`QUERY_EVENT`) means for the transaction around it.
#[derive(Debug, PartialEq, Eq)]
pub enum Statement<'a> {
    Begin,
    Commit,
    Rollback,
    Savepoint(&'a str),
    RollbackTo(&'a str),
    /// `XA START` (MySQL writes it; MariaDB flags its GTID event instead).
    XaStart,
    /// `XA END`: the XA transaction's body ends; its `XA_PREPARE` event follows.
    XaEnd,
    XaCommit(Xid),
    XaRollback(Xid),
    /// Anything else (DDL, or a statement-format change), by its first word.
    Other(&'a str),
}

impl<'a> Statement<'a> {
    /// Classifies the text of a binlogged statement (no allocation: it runs for every
    /// `QUERY_EVENT`, the `BEGIN` of each MySQL transaction included).
    pub fn of(sql: &'a str) -> Statement<'a> {
        let mut split = sql.split_whitespace();
        let words = [(); 3].map(|()| split.next().unwrap_or(""));
        let is = |i: usize, w: &str| words[i].eq_ignore_ascii_case(w);
        let rest_after = |n: usize| {
            let mut rest = sql.trim_start();
            for _ in 0..n {
                rest = rest.trim_start();
                rest = &rest[rest.find(char::is_whitespace).unwrap_or(rest.len())..];
            }
            rest.trim()
        };
        let name = |n: usize| rest_after(n).trim_matches('`');
        let alone = words[1].is_empty();
        let other = Statement::Other(words[0]);
        match () {
            _ if alone && is(0, "BEGIN") => Statement::Begin,
            _ if alone && is(0, "COMMIT") => Statement::Commit,
            _ if alone && is(0, "ROLLBACK") => Statement::Rollback,
            _ if is(0, "SAVEPOINT") => Statement::Savepoint(name(1)),
            _ if is(0, "ROLLBACK") && is(1, "TO") && is(2, "SAVEPOINT") => {
                Statement::RollbackTo(name(3))
            }
            _ if is(0, "ROLLBACK") && is(1, "TO") => Statement::RollbackTo(name(2)),
            _ if is(0, "XA") && (is(1, "START") || is(1, "BEGIN")) => Statement::XaStart,
            _ if is(0, "XA") && is(1, "END") => Statement::XaEnd,
            _ if is(0, "XA") && is(1, "COMMIT") => {
                Xid::parse_statement_id(rest_after(2)).map_or(other, Statement::XaCommit)
            }
            _ if is(0, "XA") && is(1, "ROLLBACK") => {
                Xid::parse_statement_id(rest_after(2)).map_or(other, Statement::XaRollback)
            }
            _ => other,
        }
    }

    /// What kind of statement it is, for a log line.
    fn kind(&self) -> &'a str {
        match self {
            Statement::Begin => "BEGIN",
            Statement::Commit => "COMMIT",
            Statement::Rollback => "ROLLBACK",
            Statement::Savepoint(_) => "SAVEPOINT",
            Statement::RollbackTo(_) => "ROLLBACK TO",
            Statement::XaStart => "XA START",
            Statement::XaEnd => "XA END",
            Statement::XaCommit(_) => "XA COMMIT",
            Statement::XaRollback(_) => "XA ROLLBACK",
            Statement::Other(verb) => verb,
        }
    }
}

impl BinlogReader {
    /// A statement ending at `end_pos` (written at `timestamp`): what it means for the
    /// transaction around it.
    pub(super) fn statement(
        &self,
        state: &mut StreamState,
        statement: Statement<'_>,
        end_pos: u64,
        timestamp: u32,
    ) -> Vec<BinlogItem> {
        let mut items = Vec::new();
        let finish =
            |state: &mut StreamState, ending| self.finish(state, end_pos, timestamp, ending);
        match statement {
            Statement::Begin | Statement::XaStart => {
                if state.tx.is_none() {
                    items.extend(self.begin(state, None));
                }
                state.in_body = true;
                if let (Statement::XaStart, Some(tx)) = (&statement, &mut state.tx) {
                    tx.xa = true;
                }
            }
            Statement::Commit => items.extend(finish(state, Ending::Commit)),
            Statement::Rollback => items.extend(finish(state, Ending::Rollback)),
            Statement::Savepoint(name) if state.in_body => {
                state.tx.get_or_insert_default().savepoint(name)
            }
            Statement::RollbackTo(name) if state.in_body => {
                state.tx.get_or_insert_default().rollback_to(name)
            }
            Statement::XaEnd if state.in_body => {}
            Statement::XaCommit(xid) if !state.in_body => {
                items.extend(finish(state, Ending::Outcome(xid, true)));
            }
            Statement::XaRollback(xid) if !state.in_body => {
                items.extend(finish(state, Ending::Outcome(xid, false)));
            }
            Statement::Other(_) if !state.in_body => {
                // A statement on its own (DDL, or a non-transactional change).
                items.extend(finish(state, Ending::Commit));
            }
            other => self.not_understood(state, || format!("statement {}", other.kind())),
        }
        items
    }

    /// Logs, once per kind, something inside a transaction the reader does not understand; it
    /// changes nothing (the transaction goes on).
    pub(super) fn not_understood(&self, state: &StreamState, kind: impl FnOnce() -> String) {
        let Some(tx) = &state.tx else { return };
        let kind = kind();
        let mut seen = self.not_understood.lock().expect("not poisoned");
        if seen.insert(kind.clone()) {
            tracing::warn!(%kind, gtid = ?tx.gtid, file = %state.file,
                "a binlog transaction holds something the reader does not understand; it is \
                 skipped and the transaction goes on (logged once per kind)");
        }
    }

    /// A transaction starts (a GTID event, or `BEGIN` without one).
    pub(super) fn begin(
        &self,
        state: &mut StreamState,
        gtid: Option<TxGtid>,
    ) -> Option<BinlogItem> {
        state.in_body = false;
        let open = state.tx.replace(OpenTx::new(gtid))?;
        // A new transaction while one is open: an event this reader does not know ended it.
        tracing::error!(gtid = ?open.gtid, file = %state.file,
            "a binlog transaction ended without a COMMIT the reader understands: its rows are not \
             streamed (the sweeper publishes those that committed)");
        open.streamed().then_some(BinlogItem::Restart)
    }

    /// The open transaction ends at `end_pos` as `ending` says.
    pub(super) fn finish(
        &self,
        state: &mut StreamState,
        end_pos: u64,
        timestamp: u32,
        ending: Ending,
    ) -> Vec<BinlogItem> {
        state.in_body = false;
        let tx = state.tx.take().unwrap_or_default();
        let end = TxEnd {
            gtid: tx.gtid.clone(),
            file: state.file.clone(),
            end_pos,
            timestamp,
        };
        let mut items = Vec::new();
        if !tx.streamed() {
            items.push(BinlogItem::TxBegin);
        }
        match ending {
            Ending::Commit => items.extend(tx.into_rows().into_iter().map(BinlogItem::Row)),
            Ending::Rollback => tx.roll_back(),
            Ending::Outcome(xid, committed) => {
                items.push(BinlogItem::XaOutcome { xid, committed });
                tx.roll_back(); // an outcome's own transaction has no rows
            }
            Ending::Prepared(xid) if !tx.streamed() => {
                let rows = tx.into_rows();
                return vec![BinlogItem::Prepared(PreparedTx { xid, rows, end })];
            }
            Ending::Prepared(xid) => {
                tracing::error!(%xid, gtid = ?tx.gtid,
                    "an XA transaction's rows were handed on before its prepare was read; they \
                     are published whatever its outcome");
                items.extend(tx.into_rows().into_iter().map(BinlogItem::Row));
            }
        }
        items.push(BinlogItem::TxEnd(end));
        items
    }
}

/// How a transaction ends.
pub(super) enum Ending {
    Commit,
    Rollback,
    /// `XA PREPARE`: its rows wait for the outcome.
    Prepared(Xid),
    /// The transaction of an `XA COMMIT` (true) or `XA ROLLBACK` (false) of `Xid`.
    Outcome(Xid, bool),
}

/// Holds decoded rows in the open transaction (opening one if a rows event came without);
/// whatever it hands on early goes to `items`, after the `TxBegin` it owes.
pub(super) fn hold(state: &mut StreamState, rows: Vec<DecodedRow>, items: &mut Vec<BinlogItem>) {
    let tx = state.tx.get_or_insert_default();
    for row in rows {
        let was_streamed = tx.streamed();
        let early = tx.push(row);
        if !early.is_empty() && !was_streamed {
            items.push(BinlogItem::TxBegin);
        }
        items.extend(early.into_iter().map(BinlogItem::Row));
    }
}

/// The outbox table a statement-format `INSERT`/`REPLACE` writes, if any (`schema` is the
/// session's default database, for an unqualified name). Such rows never reach the decoder.
pub fn statement_inserts_into(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::OutboxRow;

    #[test]
    fn statements_are_classified_as_both_servers_write_them() {
        assert_eq!(Statement::of("BEGIN"), Statement::Begin);
        assert_eq!(Statement::of("COMMIT"), Statement::Commit);
        assert_eq!(Statement::of("ROLLBACK"), Statement::Rollback);
        assert_eq!(Statement::of("SAVEPOINT `s1`"), Statement::Savepoint("s1"));
        assert_eq!(
            Statement::of("ROLLBACK TO `s1`"),
            Statement::RollbackTo("s1")
        );
        assert_eq!(
            Statement::of("ROLLBACK TO SAVEPOINT `S 1`"),
            Statement::RollbackTo("S 1")
        );
        assert_eq!(Statement::of("XA START X'6131',X'',1"), Statement::XaStart);
        assert_eq!(Statement::of("XA END X'6131',X'',1"), Statement::XaEnd);
        let xid = Xid::parse_statement_id("X'6232',X'71',7").unwrap();
        assert_eq!(
            Statement::of("XA COMMIT X'6232',X'71',7"),
            Statement::XaCommit(xid.clone())
        );
        assert_eq!(
            Statement::of("XA ROLLBACK X'6232',X'71',7"),
            Statement::XaRollback(xid)
        );
        assert_eq!(
            Statement::of("CREATE TABLE t (id INT)"),
            Statement::Other("CREATE")
        );
        assert_eq!(Statement::of("XA COMMIT 'x'"), Statement::Other("XA"));
    }

    fn row(id: u64) -> DecodedRow {
        DecodedRow::Event(OutboxRow::sample(id))
    }

    fn ids(rows: Vec<DecodedRow>) -> Vec<u64> {
        rows.into_iter()
            .map(|r| match r {
                DecodedRow::Event(r) => r.id,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn rollback_to_a_savepoint_drops_the_rows_after_it_only() {
        let mut tx = OpenTx::new(None);
        assert!(tx.push(row(1)).is_empty());
        tx.savepoint("S1");
        tx.push(row(2));
        tx.savepoint("s2");
        tx.push(row(3));
        tx.rollback_to("s1");
        tx.push(row(4));
        tx.rollback_to("s2"); // released by the rollback to s1: nothing dropped
        assert_eq!(ids(tx.into_rows()), [1, 4]);
    }

    #[test]
    fn only_a_transaction_over_the_bound_hands_rows_on_early_and_never_an_xa_one() {
        let big = |id| {
            let DecodedRow::Event(mut r) = row(id) else {
                unreachable!()
            };
            r.message.payload = "x".repeat(MAX_HELD_BYTES / 2);
            DecodedRow::Event(r)
        };
        let mut tx = OpenTx::new(None);
        assert!(tx.push(big(1)).is_empty());
        assert_eq!(ids(tx.push(big(2))), [1, 2]);
        assert!(tx.streamed());
        let mut xa = OpenTx::new(None);
        xa.xa = true;
        for id in 0..3 {
            assert!(xa.push(big(id)).is_empty());
        }
        assert_eq!(xa.into_rows().len(), 3);
    }

    fn reader() -> BinlogReader {
        BinlogReader::new(super::super::ReaderOptions {
            opts: mysql_async::Opts::from_url("mysql://relay@127.0.0.1/app").unwrap(),
            server_id: 1,
            heartbeat: std::time::Duration::from_secs(1),
            tables: vec![TableName::parse("app.outbox_event").unwrap()],
            limits: crate::outbox::message::RowLimits {
                max_payload_bytes: 1 << 20,
                max_delay: crate::outbox::DEFAULT_MAX_DELAY,
            },
            flavor: super::super::ServerFlavor::MySqlGtid,
            clock: Default::default(),
        })
    }

    /// Feeds `statement`s, holding `row(id)` where a number is given; the items yielded.
    fn feed(reader: &BinlogReader, script: &[Result<&str, u64>]) -> Vec<BinlogItem> {
        let mut state = StreamState::default();
        let mut items = Vec::new();
        for step in script {
            match step {
                Ok(sql) => items.extend(reader.statement(&mut state, Statement::of(sql), 100, 0)),
                Err(id) => hold(&mut state, vec![row(*id)], &mut items),
            }
        }
        items
    }

    fn shape(items: &[BinlogItem]) -> Vec<String> {
        items
            .iter()
            .map(|item| match item {
                BinlogItem::TxBegin => "begin".to_string(),
                BinlogItem::Row(DecodedRow::Event(r)) => format!("row {}", r.id),
                BinlogItem::Row(other) => format!("{other:?}"),
                BinlogItem::TxEnd(_) => "end".into(),
                BinlogItem::Prepared(p) => format!("prepared {} rows {}", p.xid, p.rows.len()),
                BinlogItem::XaOutcome { xid, committed } => format!("outcome {xid} {committed}"),
                BinlogItem::Restart => "restart".into(),
            })
            .collect()
    }

    #[test]
    fn a_binlogged_rollback_publishes_nothing_and_unknown_statements_change_nothing() {
        let reader = reader();
        let items = feed(
            &reader,
            &[
                Ok("BEGIN"),
                Err(1),
                Ok("SET @x = 1"),
                Err(2),
                Ok("ROLLBACK"),
            ],
        );
        assert_eq!(
            shape(&items),
            ["begin", "end"],
            "position moves, nothing published"
        );
        let items = feed(
            &reader,
            &[Ok("BEGIN"), Err(1), Ok("DO SLEEP(0)"), Err(2), Ok("COMMIT")],
        );
        assert_eq!(shape(&items), ["begin", "row 1", "row 2", "end"]);
    }

    #[test]
    fn an_xa_transaction_is_yielded_at_prepare_and_resolved_by_its_outcome() {
        let reader = reader();
        let mut state = StreamState::default();
        let mut items = reader.statement(&mut state, Statement::of("XA START X'61',X'',1"), 100, 0);
        hold(&mut state, vec![row(1)], &mut items);
        items.extend(reader.statement(&mut state, Statement::of("XA END X'61',X'',1"), 100, 0));
        let xid = Xid::parse_statement_id("X'61',X'',1").unwrap();
        items.extend(reader.finish(&mut state, 100, 0, Ending::Prepared(xid)));
        items.extend(reader.statement(&mut state, Statement::of("XA COMMIT X'61',X'',1"), 100, 0));
        assert_eq!(
            shape(&items),
            [
                "prepared X'61',X'',1 rows 1",
                "begin",
                "outcome X'61',X'',1 true",
                "end"
            ]
        );
    }

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
        let mark = format!(
            "UPDATE outbox_event SET {}",
            crate::outbox::Status::Sent.sql()
        );
        assert!(!hit(&mark, "app"));
        assert!(!hit("BEGIN", "app"));
    }
}
