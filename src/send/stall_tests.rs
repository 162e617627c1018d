//! Tests of [`super`]: when stalled topics and queues park.

use super::*;

#[test]
fn a_topic_is_stalled_while_any_shard_holds_a_lane_for_it() {
    let stalls = Stalls::new(Duration::ZERO);
    stalls.holding("t", whole(0), 3);
    stalls.holding("t", whole(1), 2);
    assert!(stalls.is_stalled("t"));
    assert!(!stalls.is_stalled("u"));
    assert_eq!(stalls.held("t"), 5);
    stalls.closed("t", whole(0));
    assert!(stalls.is_stalled("t"), "shard 1 still holds it");
    stalls.closed("t", whole(1));
    assert!(!stalls.is_stalled("t"));
    assert!(stalls.stalled().is_empty());
}

#[test]
fn new_events_are_parked_only_after_the_hold() {
    let stalls = Stalls::new(Duration::from_secs(3600));
    stalls.holding("t", whole(0), 1);
    assert!(stalls.parking().is_empty(), "not stalled for an hour yet");
    stalls.holding("t", whole(1), LANE_LIMIT);
    assert!(
        stalls.parking().contains("t", "any"),
        "a full lane parks at once"
    );
    let stalls = Stalls::without_parking();
    stalls.holding("t", whole(0), LANE_LIMIT);
    assert!(
        stalls.parking().is_empty(),
        "nothing parks without a sweeper"
    );
    let stalls = Stalls::new(Duration::ZERO);
    stalls.holding("t", whole(0), 1);
    assert_eq!(stalls.parking().whole_topics(), ["t"]);
}

#[test]
fn a_stalled_queue_holds_back_only_the_keys_hashed_to_it() {
    let stalls = Stalls::new(Duration::ZERO);
    // "order-1" hashes to queue 6 of 8 (see `route`); "order-2" elsewhere.
    let queue = QueueIndex { index: 6, count: 8 };
    assert_ne!(index_for(java_string_hash("order-2"), 8), 6);
    let lane = LaneId::new(3, Some(queue));
    stalls.holding("t", lane, 2);
    let stalled = stalls.stalled();
    assert!(stalled.contains("t", "order-1"));
    assert!(
        !stalled.contains("t", "order-2"),
        "another queue's key goes on"
    );
    assert!(!stalled.contains("u", "order-1"));
    assert!(
        stalled.whole_topics().is_empty(),
        "the sweeper still claims t's rows"
    );
    assert!(stalls.parking().contains("t", "order-1"));
    assert!(!stalls.parking().contains("t", "order-2"));
    // A lane of the whole topic in another shard holds back every key.
    stalls.holding("t", whole(0), 1);
    assert!(stalls.stalled().contains("t", "order-2"));
    assert_eq!(stalls.stalled().whole_topics(), ["t"]);
    stalls.closed("t", whole(0));
    stalls.closed("t", lane);
    assert!(stalls.stalled().is_empty());
}

#[test]
fn a_queue_parks_park_after_into_its_own_stall_not_its_topics() {
    let park_after = Duration::from_millis(300);
    let stalls = Stalls::new(park_after);
    // "order-1" hashes to queue 6 of 8; "order-2" to another queue.
    let (six, other) = (
        QueueIndex { index: 6, count: 8 },
        QueueIndex {
            index: index_for(java_string_hash("order-2"), 8),
            count: 8,
        },
    );
    let first = LaneId::new(0, Some(six));
    stalls.holding("t", first, 1);
    std::thread::sleep(park_after);
    assert!(stalls.parking().contains("t", "order-1"));
    assert!(stalls.releases("t", "order-1"));
    // Another queue fails now: its events are held (not parked) for its own park_after.
    let late = LaneId::new(1, Some(other));
    stalls.holding("t", late, 1);
    assert!(!stalls.parking().contains("t", "order-2"));
    assert!(!stalls.releases("t", "order-2"));
    let due = stalls.release_due("t", Some(other)).unwrap();
    assert!(due > Instant::now(), "the late queue's lane keeps what it holds for now");
    assert!(stalls.release_due("t", Some(six)).unwrap() <= Instant::now());
    // Queue 6 accepts events again (its lane closes), then fails anew while the other
    // queue is still stalled: a stall of its own, not parked at once.
    stalls.closed("t", first);
    stalls.holding("t", LaneId::new(0, Some(six)), 1);
    assert!(!stalls.parking().contains("t", "order-1"));
    std::thread::sleep(park_after);
    let parking = stalls.parking();
    assert!(parking.contains("t", "order-1") && parking.contains("t", "order-2"));
    // A lane of the whole topic (its route could not be looked up) parks with the topic's
    // oldest stall: every key of the topic at once.
    stalls.holding("t", whole(2), 1);
    assert!(stalls.release_due("t", None).unwrap() <= Instant::now());
    assert_eq!(stalls.parking().whole_topics(), ["t"]);
}

fn whole(shard: u32) -> LaneId {
    LaneId {
        shard,
        queue: None,
        serial: 0,
    }
}
