//! The guard and the send stage's releases (see [`crate::send::released`]).

use super::*;
use crate::send::released::ReleasedRow;

fn guard() -> KeyOrder {
    // Never connected: nothing here asks the database.
    let pool = Pool::new("mysql://root@127.0.0.1:1/none");
    let (nudges, _) = mpsc::channel(1);
    KeyOrder::new(pool, nudges, HeldForOrder::default(), Duration::from_secs(60))
}

#[tokio::test]
async fn a_released_row_is_no_longer_the_streams_and_later_events_carry_the_release() {
    let mut order = guard();
    let table = Arc::new(TableName::parse("outbox_event").unwrap());
    order.carry(1, &table, 7);
    order.carry(1, &table, 8);
    let log = ReleaseLog::default();
    let released = |id| ReleasedRow {
        table: Arc::clone(&table),
        id,
        topic: "t".into(),
    };
    assert_eq!(log.note(released(7)), 1);
    order.learn_released(&log);
    assert_eq!(order.released_seen, 1);
    // Row 7 waits now (asked about, it holds its key's later events); row 8, of the same
    // transaction, is still carried.
    assert!(!order.carried_ids.contains(&(Arc::clone(&table), 7)));
    assert!(order.carried_ids.contains(&(Arc::clone(&table), 8)));
    order.learn_released(&log);
    assert_eq!(order.released_seen, 1, "nothing new");
}
