use super::*;

fn table(oldest: f64, expired: u64, failed_recently: u64) -> TableStatus {
    TableStatus {
        table: "outbox_event".into(),
        pending: u64::from(oldest > 0.0),
        sending: expired,
        sent: 0,
        failed: failed_recently,
        oldest_pending_seconds: oldest,
        oldest_pending: None,
        expired_leases: expired,
        failed_recently,
        failed_reasons: vec![],
    }
}

fn relay(checkpoint_age: Option<f64>) -> RelayState {
    RelayState {
        name: "default".into(),
        found: checkpoint_age.is_some(),
        checkpoint: None,
        checkpoint_at: None,
        checkpoint_age_seconds: checkpoint_age,
        leader: None,
        leader_epoch: 0,
        lease_left_seconds: None,
        position: None,
    }
}

fn verdict(t: TableStatus, checkpoint_age: Option<f64>, mode: RelayMode) -> Verdict {
    judge(
        &[t],
        &relay(checkpoint_age),
        mode,
        &StatusOptions::default(),
    )
    .0
}

#[test]
fn verdict_rules() {
    use RelayMode::{Cdc, Poll};
    assert_eq!(verdict(table(0.0, 0, 0), None, Cdc), Verdict::Healthy);
    assert_eq!(verdict(table(29.0, 0, 0), None, Cdc), Verdict::Healthy);
    assert_eq!(verdict(table(31.0, 0, 0), Some(5.0), Cdc), Verdict::Lagging);
    assert_eq!(verdict(table(31.0, 0, 0), Some(61.0), Cdc), Verdict::Stuck);
    assert_eq!(verdict(table(31.0, 0, 0), None, Cdc), Verdict::Stuck);
    assert_eq!(verdict(table(31.0, 0, 0), None, Poll), Verdict::Lagging);
    assert_eq!(verdict(table(0.0, 1, 0), Some(1.0), Poll), Verdict::Stuck);
    assert_eq!(
        verdict(table(0.0, 0, 2), Some(900.0), Cdc),
        Verdict::Failing
    );
    assert_eq!(verdict(table(31.0, 0, 2), Some(1.0), Cdc), Verdict::Failing);
    let (_, reasons) = judge(
        &[table(31.0, 0, 2)],
        &relay(Some(1.0)),
        Cdc,
        &StatusOptions::default(),
    );
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons[0].contains("2 row(s) FAILED in the last 1h"),
        "{reasons:?}"
    );
}

#[test]
fn a_lease_that_ran_out_long_ago_means_no_instance_streams() {
    let with_lease = |left: f64| RelayState {
        leader: Some("relay-b".into()),
        lease_left_seconds: Some(left),
        ..relay(Some(1.0))
    };
    let judged = |left| {
        judge(
            &[table(0.0, 0, 0)],
            &with_lease(left),
            RelayMode::Cdc,
            &StatusOptions::default(),
        )
    };
    assert_eq!(judged(6.5).0, Verdict::Healthy, "a lease being renewed");
    assert_eq!(judged(-5.0).0, Verdict::Healthy, "a takeover under way");
    let (verdict, reasons) = judged(-120.0);
    assert_eq!(verdict, Verdict::Stuck);
    assert!(
        reasons[0].contains("lease of leader relay-b ran out 120 s ago"),
        "{reasons:?}"
    );
}

#[test]
fn lag_per_mariadb_domain_and_bytes_in_the_same_file() {
    let at = |gtid: &str, file: &str, pos| BinlogPosition {
        mariadb_gtid: Some(gtid.parse().unwrap()),
        file: Some(file.into()),
        pos,
        ..BinlogPosition::default()
    };
    let server = at("0-1-120,1-2-7", "binlog.000003", 5000);
    let lag = binlog_lag(
        "10.11".into(),
        &server,
        Some(&at("0-1-100", "binlog.000003", 1000)),
    );
    assert_eq!(lag.transactions_behind, Some(27));
    assert_eq!(lag.domains[0].behind, 20);
    assert_eq!(lag.domains[1].checkpoint_seq, None);
    assert_eq!(lag.bytes_behind, Some(4000));
    let other_file = binlog_lag(
        "10.11".into(),
        &server,
        Some(&at("0-1-100", "binlog.000002", 1000)),
    );
    assert_eq!(other_file.bytes_behind, None);
    assert_eq!(
        binlog_lag("x".into(), &server, None).transactions_behind,
        None
    );
}

#[test]
fn lag_as_a_mysql_gtid_set_difference() {
    let uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
    let set = |s: &str| BinlogPosition {
        mysql_gtid_set: Some(s.parse().unwrap()),
        ..BinlogPosition::default()
    };
    let lag = binlog_lag(
        "8.0".into(),
        &set(&format!("{uuid}:1-100")),
        Some(&set(&format!("{uuid}:1-90:95"))),
    );
    assert_eq!(lag.transactions_behind, Some(9));
}

#[test]
fn reasons_are_one_line_and_cut() {
    assert_eq!(truncate_reason("no route\nfor topic"), "no route for topic");
    let long = "x".repeat(500);
    let cut = truncate_reason(&long);
    assert_eq!(cut.chars().count(), MAX_REASON_DISPLAY);
    assert!(cut.ends_with('…'));
}
