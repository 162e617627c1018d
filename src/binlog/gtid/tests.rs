use super::*;
use proptest::prelude::*;

const U1: &str = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
const U2: &str = "4e11fa47-71ca-11e1-9e33-c80aa9429562";

fn src(uuid: &str, tag: Option<&str>) -> MySqlSource {
    MySqlSource {
        uuid: uuid.into(),
        tag: tag.map(Into::into),
    }
}

#[test]
fn mariadb_position_round_trips_and_tracks_each_domain() {
    let mut pos: MariaDbGtidPos = "0-1-100, 1-2-5".parse().unwrap();
    assert_eq!(pos.to_string(), "0-1-100,1-2-5");
    pos.apply("0-1-101".parse().unwrap());
    pos.apply("2-9-1".parse().unwrap());
    assert_eq!(pos.to_string(), "0-1-101,1-2-5,2-9-1");
    assert!(pos.covers(&"0-1-100,1-2-5".parse().unwrap()));
    assert!(!pos.covers(&"0-1-102".parse().unwrap()));
    assert!(!pos.covers(&"3-1-1".parse().unwrap()));
    assert_eq!(
        "".parse::<MariaDbGtidPos>().unwrap(),
        MariaDbGtidPos::default()
    );
}

#[test]
fn mariadb_position_rejects_garbage() {
    for bad in ["0-1", "a-b-c", "0-1-2,0-1-3", "0-1-x", "-1-2-3"] {
        assert!(bad.parse::<MariaDbGtidPos>().is_err(), "{bad}");
    }
}

#[test]
fn mysql_set_parses_merges_and_formats_like_mysql() {
    let set: MySqlGtidSet = format!("{U1}:1-5:7-9:6, {U2}:3").parse().unwrap();
    assert_eq!(set.to_string(), format!("{U1}:1-9,{U2}:3"));
    let mut set = set;
    set.add(src(U2, None), 4);
    set.add(src(U2, None), 2);
    set.add(src(U2, None), 10);
    assert_eq!(set.to_string(), format!("{U1}:1-9,{U2}:2-4:10"));
    assert!(set.contains(&src(U1, None), 9));
    assert!(!set.contains(&src(U1, None), 10));
    let upper = U1.to_uppercase();
    let same: MySqlGtidSet = format!("{upper}:1-9,{U2}:2-4:10").parse().unwrap();
    assert_eq!(same, set, "UUIDs are case-insensitive");
}

#[test]
fn mysql_tagged_gtids_round_trip() {
    let text = format!("{U1}:1-3:Blue:1-2:orange:7");
    let set: MySqlGtidSet = text.parse().unwrap();
    assert!(set.contains(&src(U1, Some("blue")), 2));
    assert!(set.contains(&src(U1, Some("orange")), 7));
    assert!(set.contains(&src(U1, None), 3));
    assert!(!set.contains(&src(U1, Some("blue")), 3));
    assert_eq!(set.to_string(), format!("{U1}:1-3:blue:1-2:orange:7"));
    assert_eq!(set.to_string().parse::<MySqlGtidSet>().unwrap(), set);
}

#[test]
fn mysql_set_rejects_garbage() {
    for bad in [
        "nope:1-2",
        U1,
        &format!("{U1}:0-3"),
        &format!("{U1}:5-3"),
        &format!("{U1}:x"),
    ] {
        assert!(bad.parse::<MySqlGtidSet>().is_err(), "{bad}");
    }
}

#[test]
fn union_merges_sets() {
    let mut a: MySqlGtidSet = format!("{U1}:1-3").parse().unwrap();
    let b: MySqlGtidSet = format!("{U1}:4-6,{U2}:1").parse().unwrap();
    a.union(&b);
    assert_eq!(a.to_string(), format!("{U1}:1-6,{U2}:1"));
}

proptest! {
    #[test]
    fn adding_transactions_in_any_order_gives_the_same_set(mut gnos in proptest::collection::vec(1u64..200, 0..80)) {
        let mut forward = MySqlGtidSet::default();
        for &g in &gnos { forward.add(src(U1, None), g); }
        gnos.reverse();
        let mut backward = MySqlGtidSet::default();
        for &g in &gnos { backward.add(src(U1, None), g); }
        prop_assert_eq!(&forward, &backward);
        for &g in &gnos { prop_assert!(forward.contains(&src(U1, None), g)); }
        let reparsed: MySqlGtidSet = forward.to_string().parse().unwrap();
        prop_assert_eq!(reparsed, forward);
    }

    #[test]
    fn mariadb_positions_round_trip(entries in proptest::collection::btree_map(0u32..5, (1u32..100, 1u64..1_000_000), 0..5)) {
        let mut pos = MariaDbGtidPos::default();
        for (domain, (server, seq)) in entries { pos.apply(MariaDbGtid { domain, server, seq }); }
        let reparsed: MariaDbGtidPos = pos.to_string().parse().unwrap();
        prop_assert_eq!(reparsed, pos);
    }
}
