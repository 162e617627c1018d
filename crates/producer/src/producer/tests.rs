use super::*;
use serde_json::json;

fn outbox(limit: usize) -> Outbox {
    Outbox::new(TableName::parse("outbox_event").unwrap(), limit)
}

fn prepare(event: NewEvent) -> Result<Row, EnqueueError> {
    outbox(DEFAULT_MAX_PAYLOAD_BYTES).prepare(event)
}

fn ok_event() -> NewEvent {
    NewEvent::new("order-events", "order-1", json!({"a": 1}))
}

#[test]
fn a_valid_event_gets_a_uuid_v7_id_and_its_columns() {
    let row = prepare(ok_event().with_tags("Paid").with_header("trace", "t-1")).unwrap();
    let id = uuid::Uuid::parse_str(row.event_id.as_str()).unwrap();
    assert_eq!(id.get_version_num(), 7);
    assert_eq!(row.params[1], Value::from("order-1"));
    assert_eq!(row.params[2], Value::from("order-events"));
    assert_eq!(row.params[3], Value::from("Paid"));
    assert_eq!(row.params[4], Value::from(r#"{"trace":"t-1"}"#));
    assert_eq!(row.params[5], Value::from(r#"{"a":1}"#));
}

#[test]
fn generated_ids_increase() {
    let a = EventId::generate();
    let b = EventId::generate();
    assert!(a < b, "{a} then {b}");
}

#[test]
fn caller_supplied_event_id_is_kept() {
    let row = prepare(ok_event().with_event_id("evt-0001")).unwrap();
    assert_eq!(row.event_id.as_str(), "evt-0001");
}

#[test]
fn topic_rules() {
    for bad in [
        "",
        "has space",
        "dot.ted",
        "ünïcode",
        "%RETRY%group",
        "%DLQ%g",
        "TBW102",
        "rmq_sys_x",
    ] {
        let err = prepare(NewEvent::new(bad, "k", json!({}))).unwrap_err();
        assert!(
            matches!(
                err,
                EnqueueError::Invalid(crate::outbox::RuleViolation::InvalidTopic { .. })
            ),
            "{bad:?}: {err}"
        );
    }
    let long = "t".repeat(128);
    assert!(matches!(
        prepare(NewEvent::new(long, "k", json!({}))).unwrap_err(),
        EnqueueError::Invalid(crate::outbox::RuleViolation::InvalidTopic { .. })
    ));
    prepare(NewEvent::new("t".repeat(127), "k", json!({}))).unwrap();
    prepare(NewEvent::new("Order_Events-2", "k", json!({}))).unwrap();
}

#[test]
fn biz_key_rules() {
    let err = prepare(NewEvent::new("t", "k".repeat(65), json!({}))).unwrap_err();
    assert!(
        matches!(
            err,
            EnqueueError::Invalid(crate::outbox::RuleViolation::BizKeyTooLong { len: 65, max: 64 })
        ),
        "{err}"
    );
    // 64 characters of multi-byte text fit VARCHAR(64).
    prepare(NewEvent::new("t", "订".repeat(64), json!({}))).unwrap();
    assert!(matches!(
        prepare(NewEvent::new("t", "", json!({}))).unwrap_err(),
        EnqueueError::Invalid(crate::outbox::RuleViolation::InvalidBizKey { .. })
    ));
    assert!(matches!(
        prepare(NewEvent::new("t", "a\nb", json!({}))).unwrap_err(),
        EnqueueError::Invalid(crate::outbox::RuleViolation::InvalidBizKey { .. })
    ));
}

#[test]
fn payload_rules() {
    let err = prepare(NewEvent::new("t", "k", Payload::raw("{not json"))).unwrap_err();
    assert!(matches!(err, EnqueueError::InvalidJson(_)), "{err}");
    let err = prepare(NewEvent::new("t", "k", Payload::raw(""))).unwrap_err();
    assert!(matches!(err, EnqueueError::InvalidJson(_)), "{err}");
    let row = prepare(NewEvent::new(
        "t",
        "k",
        Payload::raw(r#" {"raw": [1, 2]} "#),
    ))
    .unwrap();
    assert_eq!(
        row.params[5],
        Value::from(r#" {"raw": [1, 2]} "#),
        "raw text kept as is"
    );

    let small = outbox(16);
    let err = small
        .prepare(NewEvent::new("t", "k", json!({"payload": "too large"})))
        .unwrap_err();
    assert!(
        matches!(
            err,
            EnqueueError::PayloadTooLarge {
                size: 23,
                limit: 16
            }
        ),
        "{err}"
    );
    small
        .prepare(NewEvent::new("t", "k", json!({"a": 1})))
        .unwrap();
}

#[test]
fn default_payload_limit_is_4_mib() {
    let just_over = format!("\"{}\"", "x".repeat(DEFAULT_MAX_PAYLOAD_BYTES - 1));
    let err = prepare(NewEvent::new("t", "k", Payload::raw(just_over))).unwrap_err();
    assert!(matches!(err, EnqueueError::PayloadTooLarge { .. }), "{err}");
}

#[test]
fn event_id_tags_and_header_rules() {
    for bad in ["", "has space", "tab\tid", &"e".repeat(65)] {
        let err = prepare(ok_event().with_event_id(bad)).unwrap_err();
        assert!(
            matches!(
                err,
                EnqueueError::Invalid(crate::outbox::RuleViolation::InvalidEventId { .. })
            ),
            "{bad:?}: {err}"
        );
    }
    for bad in ["", "a||b", &"g".repeat(129)] {
        let err = prepare(ok_event().with_tags(bad)).unwrap_err();
        assert!(
            matches!(
                err,
                EnqueueError::Invalid(crate::outbox::RuleViolation::InvalidTags { .. })
            ),
            "{bad:?}: {err}"
        );
    }
    for (name, value) in [
        ("", "v"),
        ("KEYS", "v"),
        ("event_id", "v"),
        ("n", "a\u{1}b"),
    ] {
        let err = prepare(ok_event().with_header(name, value)).unwrap_err();
        assert!(
            matches!(
                err,
                EnqueueError::Invalid(crate::outbox::RuleViolation::InvalidHeader { .. })
            ),
            "{name:?}: {err}"
        );
    }
}

#[test]
fn duplicate_key_errors_are_recognised() {
    let server = mysql_async::ServerError {
        code: 1062,
        message: "Duplicate entry 'evt-1' for key 'uk_event_id'".into(),
        state: "23000".into(),
    };
    match classify_insert_error(mysql_async::Error::Server(server)) {
        EnqueueError::DuplicateEventId { event_id } => assert_eq!(event_id, "evt-1"),
        other => panic!("{other}"),
    }
    let other_key = mysql_async::ServerError {
        code: 1062,
        message: "Duplicate entry '7' for key 'PRIMARY'".into(),
        state: "23000".into(),
    };
    assert!(matches!(
        classify_insert_error(mysql_async::Error::Server(other_key)),
        EnqueueError::Database(_)
    ));
}

#[test]
fn deliver_at_is_bound_as_unix_seconds_within_a_timestamps_range() {
    use std::time::{Duration, UNIX_EPOCH};
    let at = UNIX_EPOCH + Duration::from_millis(1_767_225_600_250);
    let row = prepare(ok_event().deliver_at(at)).unwrap();
    assert_eq!(row.deliver_at.as_deref(), Some("1767225600.250"));
    assert_eq!(prepare(ok_event()).unwrap().deliver_at, None);
    for bad in [
        UNIX_EPOCH - Duration::from_secs(1),
        UNIX_EPOCH + Duration::from_secs(i32::MAX as u64),
    ] {
        assert!(matches!(
            prepare(ok_event().deliver_at(bad)),
            Err(EnqueueError::Invalid(
                crate::outbox::RuleViolation::InvalidDeliverAt { .. }
            ))
        ));
    }
}
