//! How a claimed row is read: its columns as text, in the order the claim selects them, then
//! checked exactly like a row the binlog decoder reads ([`message_from_text`]), so a row is
//! FAILED for the same reasons whichever way it is sent.

use super::Claimed;
use crate::event::{OutboxRow, RowProblem};
use crate::outbox::message::{message_from_text, RowLimits, RowText};
use crate::outbox::TableName;
use mysql_async::{Row, Value};
use std::sync::Arc;

/// The columns a claim selects, in the order [`read_row`] reads them. `deliver_at` as Unix
/// seconds (a TIMESTAMP's instant, whatever the session's time zone).
pub(super) const ROW_COLUMNS: &str =
    "id, event_id, biz_key, topic, tags, headers, payload, UNIX_TIMESTAMP(deliver_at)";

/// Marker put in a [`RowText`] field when the column was not valid UTF-8.
const NOT_UTF8: &str = "\u{0}not-utf8";

/// The first column of `text` that could not be read as text.
fn text_problem(text: &RowText) -> Option<String> {
    let columns = [
        ("event_id", Some(&text.event_id)),
        ("biz_key", text.biz_key.as_ref()),
        ("topic", text.topic.as_ref()),
        ("tags", text.tags.as_ref()),
        ("headers", text.headers.as_ref()),
        ("payload", text.payload.as_ref()),
    ];
    columns
        .into_iter()
        .find(|(_, v)| v.is_some_and(|v| v == NOT_UTF8))
        .map(|(name, _)| format!("`{name}` is not valid UTF-8"))
}

/// The id and text columns of a selected row (in the order of [`Claimer::select_sql`]).
pub(super) fn read_row(row: Row) -> (u64, RowText) {
    let values = row.unwrap();
    let mut values = values.into_iter();
    let id = match values.next() {
        Some(Value::Int(i)) => i as u64,
        Some(Value::UInt(u)) => u,
        Some(Value::Bytes(b)) => String::from_utf8_lossy(&b).parse().unwrap_or(0),
        _ => 0,
    };
    let mut next = || match values.next() {
        None | Some(Value::NULL) => None,
        Some(Value::Bytes(bytes)) => {
            Some(String::from_utf8(bytes).unwrap_or_else(|_| NOT_UTF8.to_string()))
        }
        Some(other) => Some(other.as_sql(true)),
    };
    let event_id = next().unwrap_or_default();
    let text = RowText {
        event_id,
        biz_key: next(),
        topic: next(),
        tags: next(),
        headers: next(),
        payload: next(),
        deliver_at: next(),
    };
    (id, text)
}

/// The claimed row `id` of `table` as an event to send, or as the problem it is FAILED with.
pub(super) fn build(table: &Arc<TableName>, limits: RowLimits, (id, text): (u64, RowText)) -> Claimed {
    let event_id = text.event_id.clone();
    let message = if let Some(reason) = text_problem(&text) {
        Err(reason)
    } else {
        message_from_text(text, limits)
    };
    match message {
        Ok(message) => Claimed::Event(OutboxRow {
            table: Arc::clone(table),
            id,
            message,
            stamps: crate::event::Stamps::read_now(),
        }),
        Err(reason) => Claimed::Problem(RowProblem {
            table: Arc::clone(table),
            id,
            event_id: (!event_id.is_empty()).then_some(event_id),
            reason,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claimed_rows_are_checked_like_binlog_rows() {
        let table = Arc::new(TableName::parse("app.outbox_event").unwrap());
        let limits = RowLimits {
            max_payload_bytes: 1024,
            max_delay: crate::outbox::DEFAULT_MAX_DELAY,
        };
        let c = |row| build(&table, limits, row);
        let good = RowText {
            event_id: "e1".into(),
            biz_key: Some("k".into()),
            topic: Some("t".into()),
            tags: None,
            headers: Some(r#"{"a":"b"}"#.into()),
            payload: Some("{}".into()),
            deliver_at: None,
        };
        match c((7, good.clone())) {
            Claimed::Event(row) => {
                assert_eq!(row.id, 7);
                assert_eq!(row.message.headers, vec![("a".into(), "b".into())]);
            }
            other => panic!("{other:?}"),
        }
        let bad = RowText {
            payload: Some("not json".into()),
            ..good.clone()
        };
        assert!(matches!(c((8, bad)), Claimed::Problem(p) if p.reason.contains("JSON")));
        let garbled = RowText {
            topic: Some(NOT_UTF8.into()),
            ..good
        };
        assert!(
            matches!(c((9, garbled)), Claimed::Problem(p) if p.reason.contains("`topic` is not valid UTF-8"))
        );
    }
}
