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
//! Points: `after_send_ok` (`send::shard`), `after_checkpoint_save` (`relay::checkpointer`).

/// The exit status of an `exit` action, so a test can tell the hook from another crash.
pub const EXIT_CODE: i32 = 86;

/// Reached the point `name`: does what `FAILPOINTS` says for it, if anything.
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    struct Point {
        panic: bool,
        at: u64,
        hits: AtomicU64,
    }
    static POINTS: OnceLock<HashMap<String, Point>> = OnceLock::new();
    let points = POINTS.get_or_init(|| {
        let spec = std::env::var("FAILPOINTS").unwrap_or_default();
        parse(&spec)
            .into_iter()
            .map(|(name, panic, at)| {
                let hits = AtomicU64::new(0);
                (name, Point { panic, at, hits })
            })
            .collect()
    });
    let Some(point) = points.get(name) else {
        return;
    };
    if point.hits.fetch_add(1, Ordering::SeqCst) + 1 != point.at {
        return;
    }
    if point.panic {
        panic!("failpoint {name}");
    }
    eprintln!("failpoint {name}: exiting with status {EXIT_CODE}");
    // SAFETY: _exit has no preconditions; it ends the process without running any Rust code.
    unsafe { libc::_exit(EXIT_CODE) }
}

/// Without the `failpoints` feature a hook is nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}

/// `name=exit|panic[@n]` entries separated by `;`: (name, panic?, n). Bad entries panic, so a
/// typo in a test cannot silently disable its fault.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
fn parse(spec: &str) -> Vec<(String, bool, u64)> {
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
            let panic = match action {
                "panic" => true,
                "exit" => false,
                other => panic!("FAILPOINTS entry {entry:?}: unknown action {other:?}"),
            };
            (name.trim().to_string(), panic, at)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn parses_actions_and_counts() {
        assert_eq!(
            parse("after_send_ok=exit@20; after_checkpoint_save=panic"),
            vec![
                ("after_send_ok".to_string(), false, 20),
                ("after_checkpoint_save".to_string(), true, 1)
            ]
        );
        assert!(parse("").is_empty());
    }

    #[test]
    #[should_panic(expected = "unknown action")]
    fn a_typo_is_loud() {
        parse("after_send_ok=exitt");
    }
}
