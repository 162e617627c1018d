use super::*;
use mysql_async::binlog::jsonb::{self, JsonbString};

const COLUMNS: [&str; 8] = [
    "id", "event_id", "biz_key", "topic", "tags", "headers", "payload", "status",
];

fn v(value: Value) -> BinlogValue<'static> {
    BinlogValue::Value(value)
}

fn s(text: &str) -> BinlogValue<'static> {
    v(Value::Bytes(text.as_bytes().to_vec()))
}

fn good() -> Vec<BinlogValue<'static>> {
    vec![
        v(Value::Int(7)),
        s("evt-7"),
        s("order-7"),
        s("order-events"),
        s("Paid"),
        s(r#"{"trace": "t-1", "n": 2}"#),
        s(r#"{"amount": 10}"#),
        v(Value::Int(0)),
    ]
}

fn decode(values: Vec<BinlogValue<'static>>, limit: usize) -> DecodedRow {
    let table = Arc::new(TableName::parse("app.outbox_event").unwrap());
    let layout = ColumnLayout::from_names(COLUMNS).unwrap();
    decode_row(
        &table,
        &layout,
        values.into_iter().map(Some).collect(),
        RowLimits {
            max_payload_bytes: limit,
            max_delay: crate::outbox::DEFAULT_MAX_DELAY,
        },
    )
}

#[test]
fn a_good_row_becomes_an_event() {
    let DecodedRow::Event(row) = decode(good(), 1024) else {
        panic!()
    };
    assert_eq!(row.id, 7);
    let e = row.message;
    assert_eq!(
        (e.event_id.as_str(), e.biz_key.as_str(), e.topic.as_str()),
        ("evt-7", "order-7", "order-events")
    );
    assert_eq!(e.tags.as_deref(), Some("Paid"));
    assert_eq!(
        e.headers,
        vec![("n".into(), "2".into()), ("trace".into(), "t-1".into())]
    );
    assert_eq!(e.payload, r#"{"amount": 10}"#);
}

#[test]
fn binary_json_from_mysql_is_accepted() {
    let mut values = good();
    values[6] = BinlogValue::Jsonb(jsonb::Value::String(JsonbString::new(b"hello".to_vec())));
    let DecodedRow::Event(row) = decode(values, 1024) else {
        panic!()
    };
    assert_eq!(row.message.payload, "\"hello\"");
}

#[test]
fn rows_not_inserted_as_pending_are_skipped() {
    let mut values = good();
    values[7] = v(Value::Int(2));
    assert_eq!(decode(values, 1024), DecodedRow::NotPending);
}

fn reason_of(values: Vec<BinlogValue<'static>>, limit: usize) -> String {
    match decode(values, limit) {
        DecodedRow::Problem(p) => {
            assert_eq!(p.id, 7);
            p.reason
        }
        other => panic!("expected a problem, got {other:?}"),
    }
}

#[test]
fn bad_rows_become_problems_with_reasons() {
    let mut bad_json = good();
    bad_json[6] = s("{not json");
    assert!(reason_of(bad_json, 1024).contains("not valid JSON"));

    let mut empty_topic = good();
    empty_topic[3] = s("");
    assert!(reason_of(empty_topic, 1024).contains("invalid topic"));

    let mut null_topic = good();
    null_topic[3] = v(Value::NULL);
    assert!(reason_of(null_topic, 1024).contains("`topic` is NULL"));

    assert!(reason_of(good(), 5).contains("the limit is 5"));

    let mut bad_headers = good();
    bad_headers[5] = s("[1, 2]");
    assert!(reason_of(bad_headers, 1024).contains("headers must be a JSON object"));

    let mut reserved_header = good();
    reserved_header[5] = s(r#"{"KEYS": "x"}"#);
    assert!(reason_of(reserved_header, 1024).contains("reserved"));

    let mut bad_utf8 = good();
    bad_utf8[2] = v(Value::Bytes(vec![0xff, 0xfe]));
    assert!(reason_of(bad_utf8, 1024).contains("UTF-8"));
}

#[test]
fn a_null_status_is_a_problem_named_plainly() {
    // Found by the bad-input campaign (a hand-made table where `status` may be NULL).
    let mut null_status = good();
    null_status[7] = v(Value::NULL);
    assert_eq!(reason_of(null_status, 1024), "`status` is NULL");
    let mut text_status = good();
    text_status[7] = s("0");
    assert!(reason_of(text_status, 1024).starts_with("`status` is not an integer"));
}

#[test]
fn a_row_without_a_key_is_unidentifiable() {
    let mut values = good();
    values[0] = v(Value::NULL);
    assert!(matches!(
        decode(values, 1024),
        DecodedRow::Unidentifiable(_)
    ));
}

#[test]
fn missing_column_names_say_how_to_fix_the_server() {
    let err = ColumnLayout::from_names(["@0", "@1", "@2"]).unwrap_err();
    assert!(err.contains("binlog_row_metadata=FULL"), "{err}");
    let err = ColumnLayout::from_names(["id", "event_id"]).unwrap_err();
    assert!(err.contains("`biz_key`"), "{err}");
}
