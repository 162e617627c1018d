//! Fault hooks for tests: crash the relay at a precise point that no process-level fault can
//! reach (after the broker said SEND_OK but before the SENT mark; after the local checkpoint was
//! saved but before its MySQL mirror).
//!
//! Compiled only with the cargo feature `failpoints` (off by default: a release build has no
//! hook and pays nothing). With the feature, a process reads `FAILPOINTS` once, e.g.
//!
//! ```text
//! FAILPOINTS="after_send_ok=exit@20;after_checkpoint_save=panic"
//! ```
//!
//! `name=action[@n]`: on the `n`th time (1 by default) the point is reached, `exit` ends the
//! process at once with status [`EXIT_CODE`] (`_exit`: no unwinding, no destructors, no
//! flush — a crash, as with SIGKILL), and `panic` panics in the calling task. A hand-written
//! equivalent of the `fail` crate's `fail_point!`, small enough not to need it.
//!
//! Points: [`AFTER_SEND_OK`] (`send::shard`), [`AFTER_CHECKPOINT_SAVE`]
//! (`checkpoint::checkpointer`). The code and the tests name them by these constants; `FAILPOINTS`
//! naming any other point panics, so a typo cannot silently disable a test's fault.
//!
//! A third action, `on`, arms a condition instead of a crash: [`is_on`] is true for an armed
//! name. Conditions: [`UNDECODABLE_BINLOG_VALUE`] (`binlog::row_image`: a row image value whose
//! bytes contain `failpoint:undecodable` reads as undecodable, one containing
//! `failpoint:truncated` as the end of the event's readable data), for what a real server writes
//! only when something is corrupt or unsupported.

/// After the broker answered `SEND_OK` for a batch, before its outcome goes to the marker.
pub const AFTER_SEND_OK: &str = "after_send_ok";
/// After the local checkpoint was saved (fsync'd), before its MySQL mirror.
pub const AFTER_CHECKPOINT_SAVE: &str = "after_checkpoint_save";
/// A condition: row image values carrying a marker read as undecodable or truncated.
pub const UNDECODABLE_BINLOG_VALUE: &str = "undecodable_binlog_value";
/// Every name `FAILPOINTS` may use.
pub const ALL: [&str; 3] = [
    AFTER_SEND_OK,
    AFTER_CHECKPOINT_SAVE,
    UNDECODABLE_BINLOG_VALUE,
];

/// The exit status of an `exit` action, so a test can tell the hook from another crash.
pub const EXIT_CODE: i32 = 86;

/// What an entry of `FAILPOINTS` does when its point is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
enum Action {
    Exit,
    Panic,
    /// A condition for [`is_on`]; reaching it does nothing.
    On,
}

#[cfg(feature = "failpoints")]
struct Point {
    action: Action,
    at: u64,
    hits: std::sync::atomic::AtomicU64,
}

/// The points `FAILPOINTS` names, read once per process.
#[cfg(feature = "failpoints")]
fn points() -> &'static std::collections::HashMap<String, Point> {
    static POINTS: std::sync::OnceLock<std::collections::HashMap<String, Point>> =
        std::sync::OnceLock::new();
    POINTS.get_or_init(|| {
        let spec = std::env::var("FAILPOINTS").unwrap_or_default();
        parse(&spec)
            .into_iter()
            .map(|(name, action, at)| {
                let hits = std::sync::atomic::AtomicU64::new(0);
                (name, Point { action, at, hits })
            })
            .collect()
    })
}

/// Whether the condition `name` is armed (`name=on`).
#[cfg(feature = "failpoints")]
pub fn is_on(name: &str) -> bool {
    points().get(name).is_some_and(|p| p.action == Action::On)
}

/// Without the `failpoints` feature no condition is ever armed.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn is_on(_name: &str) -> bool {
    false
}

/// Reached the point `name`: does what `FAILPOINTS` says for it, if anything.
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    use std::sync::atomic::Ordering;
    let Some(point) = points().get(name) else {
        return;
    };
    if point.hits.fetch_add(1, Ordering::SeqCst) + 1 != point.at {
        return;
    }
    match point.action {
        Action::On => return,
        Action::Panic => panic!("failpoint {name}"),
        Action::Exit => {}
    }
    eprintln!("failpoint {name}: exiting with status {EXIT_CODE}");
    // SAFETY: _exit has no preconditions; it ends the process without running any Rust code.
    unsafe { libc::_exit(EXIT_CODE) }
}

/// Without the `failpoints` feature a hook is nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}

/// `name=action[@n]` entries separated by `;`: (name, action, n). Bad entries panic, so a
/// typo in a test cannot silently disable its fault.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
fn parse(spec: &str) -> Vec<(String, Action, u64)> {
    spec.split(';')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let (name, action) = entry
                .split_once('=')
                .unwrap_or_else(|| panic!("FAILPOINTS entry {entry:?}: expected name=action"));
            let (action, at) = match action.split_once('@') {
                Some((action, n)) => (action, n.parse().expect("FAILPOINTS: @n is a number")),
                None => (action, 1),
            };
            let action = match action {
                "panic" => Action::Panic,
                "exit" => Action::Exit,
                "on" => Action::On,
                other => panic!("FAILPOINTS entry {entry:?}: unknown action {other:?}"),
            };
            let name = name.trim();
            if !ALL.contains(&name) {
                panic!("FAILPOINTS entry {entry:?}: unknown point {name:?} (known: {ALL:?})");
            }
            (name.to_string(), action, at)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{parse, Action};

    #[test]
    fn parses_actions_and_counts() {
        assert_eq!(
            parse(
                "after_send_ok=exit@20; after_checkpoint_save=panic; undecodable_binlog_value=on"
            ),
            vec![
                ("after_send_ok".to_string(), Action::Exit, 20),
                ("after_checkpoint_save".to_string(), Action::Panic, 1),
                ("undecodable_binlog_value".to_string(), Action::On, 1)
            ]
        );
        assert!(parse("").is_empty());
    }

    #[test]
    #[should_panic(expected = "unknown action")]
    fn a_typo_is_loud() {
        parse("after_send_ok=exitt");
    }

    #[test]
    #[should_panic(expected = "unknown point")]
    fn an_unknown_point_is_loud() {
        parse("after_send=exit");
    }
}
