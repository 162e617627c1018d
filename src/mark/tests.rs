use super::*;
use crate::event::{Ack, Acknowledge};
use std::sync::Arc;
use crate::config::DEFAULT_MARK_LINGER as LINGER;

struct Nobody;

impl Acknowledge for Nobody {
    fn acknowledge(&self, _: u64) {}
}

/// A completion of a streamed event (`streamed`) or of a claimed one.
fn completion(streamed: bool) -> Completion {
    Completion {
        origin: match streamed {
            true => Origin::Stream(Ack::new(Arc::new(Nobody), 0)),
            false => Origin::Claimed,
        },
        table: Arc::new(TableName::parse("outbox_event").unwrap()),
        id: 1,
        event_id: "e".into(),
        outcome: SendOutcome::Failed {
            reason: "`status` unusable".into(),
            attempts: 0,
        },
        stamps: Default::default(),
    }
}

#[test]
fn the_inline_sent_update_binds_nothing_unsafe() {
    let table = TableName::parse("outbox_event").unwrap();
    let rows = [(7, "C0A8000100002A9F"), (9, "C0A8000100002AA0")];
    let sending = Status::Sending.sql();
    let claimed = format!("{sending} AND owner = ?");
    let sql = inline_sent_update(&table, &claimed, Some("host-1"), &rows).unwrap();
    assert!(sql.contains("WHEN 7 THEN 'C0A8000100002A9F' WHEN 9 THEN 'C0A8000100002AA0'"));
    assert!(
        sql.contains(&format!(
            "WHERE id IN (7, 9) AND {sending} AND owner = 'host-1'"
        )),
        "{sql}"
    );
    // Anything that would need escaping goes through the prepared statement instead.
    assert!(inline_sent_update(&table, sending, None, &[(1, "a'b")]).is_none());
    assert!(inline_sent_update(&table, "owner = ?", Some("x\\"), &[(1, "A")]).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_batch_takes_the_outcomes_that_follow_its_first_within_the_linger() {
    let (tx, mut rx) = mpsc::channel(4);
    let late = tx.clone();
    tokio::spawn(async move {
        // Arrives while the batch waits (Tokio's timers tick in milliseconds).
        tokio::task::yield_now().await;
        tx.send(completion(true)).await.unwrap();
        tokio::time::sleep(LINGER * 3).await;
        late.send(completion(false)).await.unwrap();
    });
    let began = tokio::time::Instant::now();
    let batch = gather(completion(true), &mut rx, LINGER).await;
    assert_eq!(
        batch.len(),
        2,
        "the outcome after the linger waits for the next batch"
    );
    assert_eq!(began.elapsed(), LINGER, "written when the linger ends");
    let next = gather(rx.recv().await.unwrap(), &mut rx, LINGER).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].origin, Origin::Claimed);
}

#[tokio::test(start_paused = true)]
async fn a_full_batch_is_written_without_waiting() {
    let (tx, mut rx) = mpsc::channel(MAX_BATCH + 1);
    for _ in 0..=MAX_BATCH {
        tx.try_send(completion(true)).unwrap();
    }
    let began = tokio::time::Instant::now();
    let first = rx.recv().await.unwrap();
    assert_eq!(gather(first, &mut rx, LINGER).await.len(), MAX_BATCH);
    assert_eq!(began.elapsed(), std::time::Duration::ZERO);
    assert_eq!(rx.len(), 1, "the rest starts the next batch");
}

#[test]
fn a_streamed_row_with_a_null_status_can_be_marked() {
    // Found by the bad-input campaign: a row whose status is NULL (a table without the NOT
    // NULL) was "marked FAILED" by an UPDATE that matched nothing.
    let rule = MarkerContext::new("me");
    let (streamed, owner) = rule.condition(&completion(true));
    assert!(streamed.contains("status IS NULL"), "{streamed}");
    assert_eq!(owner, None);
    let (claimed, owner) = rule.condition(&completion(false));
    assert!(
        !claimed.contains("NULL"),
        "a claimed row is SENDING: {claimed}"
    );
    assert_eq!(owner, Some("me"));
}

#[test]
fn a_streamed_failure_spares_rows_under_a_live_lease_and_a_streamed_send_does_not() {
    let rule = MarkerContext::new("me");
    let (failed, owner) = rule.condition(&completion(true));
    assert!(
        failed.contains(&format!(
            "{} AND (lease_until IS NULL OR lease_until < NOW(3))",
            Status::Sending.sql()
        )),
        "{failed}"
    );
    let undelivered = Status::sql_in(&Status::UNDELIVERED);
    assert!(!failed.contains(&undelivered), "{failed}");
    assert_eq!(
        owner, None,
        "whoever holds the lease, this instance included"
    );
    let mut sent = completion(true);
    sent.outcome = SendOutcome::Sent {
        msg_id: "C0A8000100002A9F".into(),
    };
    let (sent, _) = rule.condition(&sent);
    assert!(sent.contains(&undelivered), "delivered: {sent}");
}
