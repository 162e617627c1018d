//! Turning a binlog row image of an outbox table into an event.
//!
//! Guarantee: a row becomes either an [`OutboxRow`] that satisfies every producer rule, a
//! [`RowProblem`] naming the row and the reason (the relay marks it FAILED), or is skipped because
//! it was not inserted as PENDING. Decoding never panics on bad data.

use super::row_image::RowValues;
use crate::event::{OutboxRow, RowProblem, Stamps};
use crate::outbox::message::{message_from_text, RowLimits, RowText};
use crate::outbox::TableName;
use mysql_async::binlog::value::BinlogValue;
use mysql_async::Value;
use std::sync::Arc;

/// What one inserted row turned into.
#[derive(Debug, Clone, PartialEq)]
pub enum DecodedRow {
    Event(OutboxRow),
    Problem(RowProblem),
    /// Inserted with a status other than PENDING (e.g. a row copied in as SENT).
    NotPending,
    /// No usable primary key: nothing can be marked. Logged and counted by the caller.
    Unidentifiable(String),
}

/// Where each needed column is in the table's row image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnLayout {
    id: usize,
    event_id: usize,
    biz_key: usize,
    topic: usize,
    payload: usize,
    status: usize,
    tags: Option<usize>,
    headers: Option<usize>,
    deliver_at: Option<usize>,
}

impl ColumnLayout {
    /// Finds the columns by name (binlog row metadata FULL gives names; without it mysql_common
    /// names them `@0`, `@1`…, and this fails with a message saying what to change).
    pub fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let names: Vec<&str> = names.into_iter().collect();
        let find = |wanted: &str| names.iter().position(|n| n.eq_ignore_ascii_case(wanted));
        let need = |wanted: &'static str| {
            find(wanted).ok_or_else(|| {
                if names.first().is_some_and(|n| n.starts_with('@')) {
                    "the binlog has no column names: set binlog_row_metadata=FULL on the server"
                        .to_string()
                } else {
                    format!(
                        "the outbox table has no `{wanted}` column (columns: {})",
                        names.join(", ")
                    )
                }
            })
        };
        Ok(ColumnLayout {
            id: need("id")?,
            event_id: need("event_id")?,
            biz_key: need("biz_key")?,
            topic: need("topic")?,
            payload: need("payload")?,
            status: need("status")?,
            tags: find("tags"),
            headers: find("headers"),
            deliver_at: find("deliver_at"),
        })
    }
}

/// The primary key of a row inserted as PENDING, or what the row is instead: unidentifiable
/// (no usable id), not an event (another status), or a problem (an unusable status).
fn pending_id(
    table: &Arc<TableName>,
    layout: &ColumnLayout,
    row: &mut RowValues<'_>,
) -> Result<u64, Box<DecodedRow>> {
    let mut take = |i: usize| row.get_mut(i).and_then(Option::take);
    let id = match take(layout.id).as_ref().map(integer) {
        Some(Ok(id)) if id >= 0 => id as u64,
        other => {
            let reason = format!("primary key `id` unusable: {other:?}");
            return Err(Box::new(DecodedRow::Unidentifiable(reason)));
        }
    };
    match take(layout.status).as_ref().map(integer) {
        // Omitted from the image (a producer session with binlog_row_image=MINIMAL logs only
        // the columns it set): the column's default, PENDING.
        Some(Ok(0)) | None => Ok(id),
        Some(Ok(_)) => Err(Box::new(DecodedRow::NotPending)),
        Some(Err(e)) => Err(Box::new(DecodedRow::Problem(RowProblem {
            table: Arc::clone(table),
            id,
            event_id: None,
            reason: format!("`status` is {e}"),
        }))),
    }
}

/// A row whose binlog image has values that cannot be decoded (`reason` names them): FAILED by
/// its id with the reason, alone (its neighbours are decoded as usual); unidentifiable when the
/// id itself is what failed. The row in the table may well be readable: `outbox-relay retry`
/// hands it to the sweeper, which reads it with SELECT.
pub fn decode_bad_row(
    table: &Arc<TableName>,
    layout: &ColumnLayout,
    mut row: RowValues<'_>,
    reason: &str,
) -> DecodedRow {
    let id = match pending_id(table, layout, &mut row).map_err(|not| *not) {
        Ok(id) => id,
        Err(DecodedRow::Unidentifiable(why)) => {
            return DecodedRow::Unidentifiable(format!("{why}; undecodable binlog value {reason}"))
        }
        Err(other) => return other,
    };
    let event_id = row.get_mut(layout.event_id).and_then(Option::take);
    DecodedRow::Problem(RowProblem {
        table: Arc::clone(table),
        id,
        event_id: text(event_id, "event_id").ok().flatten(),
        reason: format!(
            "the binlog image of the row has an undecodable value, {reason} (the row itself may \
             be fine: `outbox-relay retry` sends it through the sweeper)"
        ),
    })
}

/// Decodes one after-image of an INSERT into `table` (its values are moved out, not copied).
pub fn decode_row(
    table: &Arc<TableName>,
    layout: &ColumnLayout,
    mut row: RowValues<'_>,
    limits: RowLimits,
) -> DecodedRow {
    let id = match pending_id(table, layout, &mut row) {
        Ok(id) => id,
        Err(not_an_event) => return *not_an_event,
    };
    let mut take = |i: usize| row.get_mut(i).and_then(Option::take);
    let problem = |event_id: Option<String>, reason: String| {
        DecodedRow::Problem(RowProblem {
            table: Arc::clone(table),
            id,
            event_id,
            reason,
        })
    };
    let event_id = match text(take(layout.event_id), "event_id") {
        Ok(Some(v)) => v,
        Ok(None) => return problem(None, "`event_id` is NULL".into()),
        Err(e) => return problem(None, e),
    };
    let fields = (|| -> Result<OutboxRow, String> {
        let text_fields = RowText {
            event_id: event_id.clone(),
            biz_key: text(take(layout.biz_key), "biz_key")?,
            topic: text(take(layout.topic), "topic")?,
            tags: match layout.tags {
                Some(i) => text(take(i), "tags")?,
                None => None,
            },
            headers: match layout.headers {
                Some(i) => json_text(take(i), "headers")?,
                None => None,
            },
            payload: json_text(take(layout.payload), "payload")?,
            deliver_at: match layout.deliver_at {
                Some(i) => text(take(i), "deliver_at")?,
                None => None,
            },
        };
        Ok(OutboxRow {
            table: Arc::clone(table),
            id,
            message: message_from_text(text_fields, limits)?,
            stamps: Stamps::read_now(),
        })
    })();
    match fields {
        Ok(row) => DecodedRow::Event(row),
        Err(reason) => problem(Some(event_id), reason),
    }
}

fn integer(value: &BinlogValue<'_>) -> Result<i64, String> {
    match value {
        BinlogValue::Value(Value::NULL) => Err("NULL".into()),
        BinlogValue::Value(Value::Int(i)) => Ok(*i),
        BinlogValue::Value(Value::UInt(u)) => {
            i64::try_from(*u).map_err(|_| format!("{u} too large"))
        }
        other => Err(format!("not an integer: {other:?}")),
    }
}

fn text(value: Option<BinlogValue<'_>>, column: &str) -> Result<Option<String>, String> {
    match value {
        None | Some(BinlogValue::Value(Value::NULL)) => Ok(None),
        Some(BinlogValue::Value(Value::Bytes(bytes))) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| format!("`{column}` is not valid UTF-8")),
        Some(other) => Err(format!("`{column}` has an unexpected type: {other:?}")),
    }
}

/// JSON column text: MariaDB stores JSON as text, MySQL as binary JSON (converted here).
fn json_text(value: Option<BinlogValue<'_>>, column: &str) -> Result<Option<String>, String> {
    match value {
        Some(BinlogValue::Jsonb(jsonb)) => {
            let json = serde_json::Value::try_from(jsonb)
                .map_err(|e| format!("`{column}` binary JSON cannot be converted: {e}"))?;
            Ok(Some(json.to_string()))
        }
        Some(BinlogValue::JsonDiff(_)) => Err(format!(
            "`{column}` arrived as a partial JSON update: set binlog_row_value_options='' on the server"
        )),
        other => text(other, column),
    }
}

#[cfg(test)]
mod tests;
