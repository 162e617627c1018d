use super::*;
use crate::checkpoint::history::CheckpointHistory;
use std::time::SystemTime;

fn end_maria(seq: u64) -> TxEnd {
    TxEnd {
        gtid: Some(TxGtid::MariaDb(format!("0-1-{seq}").parse().unwrap())),
        file: "binlog.000001".into(),
        end_pos: 100 * seq,
        timestamp: 0,
    }
}

#[test]
fn the_range_ends_at_the_bound_inclusive() {
    let to = parse_gtid_position("0-1-20").unwrap();
    assert!(within(&to, &end_maria(20)));
    assert!(!within(&to, &end_maria(21)));
    let other_domain = TxEnd {
        gtid: Some(TxGtid::MariaDb("1-1-5".parse().unwrap())),
        ..end_maria(5)
    };
    assert!(!within(&to, &other_domain), "a domain the bound lacks");
    let by_file = BinlogPosition {
        file: Some("binlog.000001".into()),
        pos: 2000,
        ..BinlogPosition::default()
    };
    let no_gtid = |pos| TxEnd {
        gtid: None,
        end_pos: pos,
        ..end_maria(1)
    };
    assert!(within(&by_file, &no_gtid(2000)));
    assert!(!within(&by_file, &no_gtid(2001)));
    let uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
    let set = parse_gtid_position(&format!("{uuid}:1-10")).unwrap();
    let source = crate::binlog::MySqlSource {
        uuid: uuid.into(),
        tag: None,
    };
    let mysql = |gno| TxEnd {
        gtid: Some(TxGtid::MySql(source.clone(), gno)),
        ..end_maria(1)
    };
    assert!(within(&set, &mysql(10)) && !within(&set, &mysql(11)));
}

#[test]
fn gtid_and_time_arguments() {
    assert_eq!(
        parse_gtid_position("0-1-100").unwrap().to_string(),
        "gtid 0-1-100"
    );
    assert!(parse_gtid_position("").is_err());
    assert!(parse_gtid_position("x-y").is_err());
    let t = parse_time("2025-06-01 13:00:00").unwrap();
    assert_eq!(unix_seconds(t), 1_748_782_800);
    assert_eq!(parse_time("2025-06-01T13:00:00Z").unwrap(), t);
    assert!(parse_time("2025-06-01T15:00:00+02:00").is_err(), "UTC only");
    let ago = parse_time("10m").unwrap();
    let diff = SystemTime::now().duration_since(ago).unwrap();
    assert!(diff >= Duration::from_secs(600) && diff < Duration::from_secs(660));
    assert!(parse_time("yesterday-ish").is_err());
    assert_eq!(format_unix(1_748_782_800), "2025-06-01T13:00:00Z");
}

#[test]
fn a_real_run_needs_operator_and_reason() {
    let config = Config::default();
    let replay = Replay {
        from: parse_gtid_position("0-1-1").unwrap(),
        to: None,
        to_time: None,
        operator: String::new(),
        reason: "why".into(),
        server_id: config.mysql.server_id + 1,
    };
    assert!(replay.validate(&config, true).is_ok());
    let err = replay.validate(&config, false).unwrap_err();
    assert!(err
        .to_string()
        .contains("--operator and --reason are required"));
    let own_id = Replay {
        server_id: config.mysql.server_id,
        ..replay.clone()
    };
    assert!(matches!(
        own_id.validate(&config, true),
        Err(ReplayError::RelayServerId(_))
    ));
    let no_start = Replay {
        from: BinlogPosition::default(),
        ..replay
    };
    assert!(matches!(
        no_start.validate(&config, true),
        Err(ReplayError::NoStart)
    ));
}

#[test]
fn a_time_maps_to_the_newest_checkpoint_before_it() {
    let db = sled::Config::new().temporary(true).open().unwrap();
    let history = CheckpointHistory::new(db.open_tree("h").unwrap());
    let err = checkpoint_at_or_before(&history, SystemTime::now()).unwrap_err();
    assert!(err.to_string().contains("history is empty"), "{err}");
    history
        .record_at(1_748_782_800_000, &parse_gtid_position("0-1-5").unwrap())
        .unwrap();
    let entry =
        checkpoint_at_or_before(&history, parse_time("2025-06-01 13:30:00").unwrap()).unwrap();
    assert_eq!(entry.position.to_string(), "gtid 0-1-5");
    let err =
        checkpoint_at_or_before(&history, parse_time("2025-06-01 12:00:00").unwrap()).unwrap_err();
    assert!(err.to_string().contains("--from-checkpoint 1"), "{err}");
}
