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
        waiting: vec![],
    }
}

/// A relay with a leader (elected by lock) and a checkpoint of that age (`None`: none yet).
fn relay(checkpoint_age: Option<f64>) -> RelayState {
    RelayState {
        name: "default".into(),
        found: true,
        checkpoint: None,
        checkpoint_at: None,
        checkpoint_age_seconds: checkpoint_age,
        leader: Some("relay-a-1".into()),
        leader_epoch: 3,
        lease_left_seconds: None,
        lock_held: None,
        position: None,
    }
}

fn verdict(t: TableStatus, checkpoint_age: Option<f64>, mode: RelayMode) -> Verdict {
    judge(
        &[t],
        &relay(checkpoint_age),
        None,
        mode,
        &StatusOptions::default(),
    )
    .0
}

/// The server's distance from the checkpoint, in transactions.
fn behind(transactions: Option<u64>) -> BinlogLag {
    BinlogLag {
        server_version: "10.11".into(),
        server_position: "gtid 0-1-9000".into(),
        domains: vec![],
        transactions_behind: transactions,
        bytes_behind: None,
    }
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
        None,
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
        lock_held: None,
        ..relay(Some(1.0))
    };
    let judged = |left| {
        judge(
            &[table(0.0, 0, 0)],
            &with_lease(left),
            None,
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

/// The case reported in issue 31: every instance stopped 16 minutes earlier (no leader), the
/// checkpoint 5,221 transactions behind, no row waiting yet. It was `healthy`.
#[test]
fn no_instance_streaming_a_cdc_deployment_is_stuck() {
    let stopped = RelayState {
        leader: None,
        leader_epoch: 7,
        ..relay(Some(960.0))
    };
    let judged = |relay: &RelayState, mode, options: &StatusOptions| {
        judge(
            &[table(0.0, 0, 0)],
            relay,
            Some(&behind(Some(5_221))),
            mode,
            options,
        )
    };
    let (verdict, reasons) = judged(&stopped, RelayMode::Cdc, &StatusOptions::default());
    assert_eq!(verdict, Verdict::Stuck);
    assert_eq!(
        reasons.len(),
        1,
        "5,221 is within the default threshold: {reasons:?}"
    );
    assert!(
        reasons[0].contains("no instance streams: no leader (last epoch 7)"),
        "{reasons:?}"
    );

    // With a lower threshold, the distance is named too; the verdict stays the most severe.
    let strict = StatusOptions {
        behind_threshold: 1_000,
        ..StatusOptions::default()
    };
    let (verdict, reasons) = judged(&stopped, RelayMode::Cdc, &strict);
    assert_eq!(verdict, Verdict::Stuck);
    assert!(
        reasons[1]
            .contains("the checkpoint is 5,221 transactions behind the server (threshold 1,000)"),
        "{reasons:?}"
    );

    // A relay that never ran here is not streaming either.
    let never = RelayState {
        found: false,
        checkpoint_age_seconds: None,
        leader: None,
        leader_epoch: 0,
        ..relay(None)
    };
    let (verdict, reasons) = judge(
        &[table(0.0, 0, 0)],
        &never,
        None,
        RelayMode::Cdc,
        &StatusOptions::default(),
    );
    assert_eq!(verdict, Verdict::Stuck);
    assert!(
        reasons[0].contains("no relay named `default` has run here"),
        "{reasons:?}"
    );

    // Poll mode has no leader: nothing to say.
    let (verdict, reasons) = judged(&stopped, RelayMode::Poll, &StatusOptions::default());
    assert_eq!(
        (verdict, reasons.len()),
        (Verdict::Healthy, 0),
        "{reasons:?}"
    );
}

#[test]
fn a_checkpoint_far_behind_the_server_is_lagging() {
    let judged = |t: TableStatus, lag: Option<BinlogLag>| {
        judge(
            &[t],
            &relay(Some(1.0)),
            lag.as_ref(),
            RelayMode::Cdc,
            &StatusOptions::default(),
        )
    };
    let at_limit = judged(
        table(0.0, 0, 0),
        Some(behind(Some(DEFAULT_BEHIND_THRESHOLD))),
    );
    assert_eq!(at_limit.0, Verdict::Healthy, "{:?}", at_limit.1);
    assert_eq!(
        judged(table(0.0, 0, 0), None).0,
        Verdict::Healthy,
        "no binlog read"
    );
    assert_eq!(
        judged(table(0.0, 0, 0), Some(behind(None))).0,
        Verdict::Healthy,
        "distance unknown"
    );
    let (verdict, reasons) = judged(table(0.0, 0, 0), Some(behind(Some(10_001))));
    assert_eq!(verdict, Verdict::Lagging);
    assert_eq!(
        reasons,
        vec!["the checkpoint is 10,001 transactions behind the server (threshold 10,000)"]
    );
    let (verdict, reasons) = judged(table(0.0, 0, 2), Some(behind(Some(50_000))));
    assert_eq!(
        (verdict, reasons.len()),
        (Verdict::Failing, 2),
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

#[test]
fn a_topic_that_waits_is_named_with_its_oldest_keys() {
    let mut t = table(95.0, 0, 0);
    t.waiting = vec![
        WaitingTopic {
            topic: "stuck".into(),
            pending: 1_200,
            oldest_seconds: 95.0,
            oldest_keys: vec!["k3".into(), "k1".into()],
        },
        WaitingTopic {
            topic: "healthy".into(),
            pending: 3,
            oldest_seconds: 0.2,
            oldest_keys: vec![],
        },
    ];
    let (verdict, reasons) = judge(
        &[t],
        &relay(Some(1.0)),
        None,
        RelayMode::Cdc,
        &StatusOptions::default(),
    );
    assert_eq!(verdict, Verdict::Lagging);
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(
        reasons[0].contains("topic stuck has 1,200 PENDING")
            && reasons[0].contains("its oldest keys: k3, k1"),
        "{reasons:?}"
    );
}

#[test]
fn a_leader_elected_by_lock_whose_lock_is_free_means_no_instance_streams() {
    let free = RelayState {
        leader: Some("vm-1".into()),
        lock_held: Some(false),
        ..relay(Some(1.0))
    };
    let (v, reasons) = judge(
        &[table(0.0, 0, 0)],
        &free,
        None,
        RelayMode::Cdc,
        &StatusOptions::default(),
    );
    assert_eq!(v, Verdict::Stuck);
    assert!(
        reasons[0].contains("no longer holds the election lock"),
        "{reasons:?}"
    );
    let held = RelayState {
        lock_held: Some(true),
        ..free
    };
    let (v, _) = judge(
        &[table(0.0, 0, 0)],
        &held,
        None,
        RelayMode::Cdc,
        &StatusOptions::default(),
    );
    assert_eq!(v, Verdict::Healthy);
}
