//! Fault hooks for tests, on the `fail` crate: crash the relay at a precise point that no
//! process-level fault can reach (after the broker said SEND_OK but before the SENT mark; after
//! the local checkpoint was saved but before its MySQL mirror), or arm a condition.
//!
//! Compiled only with the cargo feature `failpoints` (off by default: a release build has no
//! hook, no `fail` dependency, and pays nothing). With the feature, a process reads `FAILPOINTS`
//! once, when it first reaches a hook, in `fail`'s syntax (`name=actions;…`, each action
//! `[p%][cnt*]task[(arg)]`, chained with `->`; see `fail::cfg`), e.g.
//!
//! ```text
//! FAILPOINTS="after_send_ok=19*off->return;after_checkpoint_save=1*panic"
//! ```
//!
//! What a task does here: `return` at a crash point ([`AFTER_SEND_OK`], [`AFTER_CHECKPOINT_SAVE`])
//! ends the process at once with status [`EXIT_CODE`] (`_exit`: no unwinding, no destructors,
//! no flush — a crash, as with SIGKILL); at a condition ([`UNDECODABLE_BINLOG_VALUE`]) it arms
//! the condition ([`is_on`]). `panic` panics in the calling task; `off` does nothing, so
//! `n*off->return` crashes on the `n + 1`th hit ([`crash_on_hit`] writes that), and `1*panic`
//! panics once. `fail`'s other tasks (`sleep(ms)`, `print`, `pause`, `yield`, `delay(ms)`,
//! `p%` probabilities) work as `fail` documents them.
//!
//! `FAILPOINTS` naming a point that is not in [`ALL`] panics (`fail` itself would accept it and
//! do nothing), so a typo cannot silently disable a test's fault; so does a malformed action
//! (`fail`'s own check).
//!
//! Why `fail` and a module still: `fail` has no "exit the process" task, so the crash points
//! turn its `return` into `_exit`, and it does not check names; both are the few lines below.
//!
//! Conditions: [`UNDECODABLE_BINLOG_VALUE`] (`binlog::row_image`: a row image value whose bytes
//! contain `failpoint:undecodable` reads as undecodable, one containing `failpoint:truncated` as
//! the end of the event's readable data), for what a real server writes only when something is
//! corrupt or unsupported.

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

/// The exit status of a crash point's `return`, so a test can tell the hook from another crash.
#[cfg(any(test, feature = "test-utils"))]
pub const EXIT_CODE: i32 = 86;

/// The `FAILPOINTS` entry that crashes the process the `n`th time (1-based) it reaches the crash
/// point `point`: `point=(n-1)*off->return`.
#[cfg(any(test, feature = "test-utils"))]
pub fn crash_on_hit(point: &str, n: u32) -> String {
    assert!(n >= 1, "hits are counted from 1");
    format!("{point}={}*off->return", n - 1)
}

/// The `FAILPOINTS` entry that arms the condition `point`: `point=return`.
#[cfg(any(test, feature = "test-utils"))]
pub fn arm(point: &str) -> String {
    format!("{point}=return")
}

/// Configures `fail` from `FAILPOINTS`, once per process (before the first hook is evaluated).
#[cfg(feature = "failpoints")]
fn configure() {
    static CONFIGURED: std::sync::Once = std::sync::Once::new();
    CONFIGURED.call_once(|| {
        let spec = std::env::var("FAILPOINTS").unwrap_or_default();
        for (name, actions) in parse(&spec) {
            if let Err(e) = fail::cfg(name, actions) {
                panic!("FAILPOINTS entry {name}={actions}: {e}");
            }
        }
    });
}

/// Whether the condition `name` is armed (`name=return`).
#[cfg(feature = "failpoints")]
pub fn is_on(name: &str) -> bool {
    configure();
    fail::eval(name, |_| ()).is_some()
}

/// Without the `failpoints` feature no condition is ever armed.
#[cfg(any(test, feature = "test-utils"))]
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn is_on(_name: &str) -> bool {
    false
}

/// Reached the crash point `name`: does what `FAILPOINTS` says for it, if anything (`return`
/// exits the process with [`EXIT_CODE`]).
#[cfg(feature = "failpoints")]
pub fn hit(name: &str) {
    configure();
    if fail::eval(name, |_| ()).is_none() {
        return;
    }
    eprintln!("failpoint {name}: exiting with status {EXIT_CODE}");
    // SAFETY: _exit has no preconditions; it ends the process without running any Rust code.
    unsafe { libc::_exit(EXIT_CODE) }
}

/// Without the `failpoints` feature a hook is nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}

/// `name=actions` entries separated by `;` (as `fail::FailScenario::setup` splits them), each
/// name one of [`ALL`]: (name, actions). A bad entry panics, so a typo in a test cannot silently
/// disable its fault.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
fn parse(spec: &str) -> Vec<(&str, &str)> {
    spec.split(';')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let (name, actions) = entry
                .split_once('=')
                .unwrap_or_else(|| panic!("FAILPOINTS entry {entry:?}: expected name=actions"));
            let name = name.trim();
            if !ALL.contains(&name) {
                panic!("FAILPOINTS entry {entry:?}: unknown point {name:?} (known: {ALL:?})");
            }
            (name, actions.trim())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_actions() {
        assert_eq!(
            parse("after_send_ok=19*off->return; after_checkpoint_save=1*panic; undecodable_binlog_value=return"),
            vec![
                ("after_send_ok", "19*off->return"),
                ("after_checkpoint_save", "1*panic"),
                ("undecodable_binlog_value", "return")
            ]
        );
        assert!(parse("").is_empty());
        assert_eq!(
            crash_on_hit(AFTER_SEND_OK, 30),
            "after_send_ok=29*off->return"
        );
        assert_eq!(
            crash_on_hit(AFTER_SEND_OK, 1),
            "after_send_ok=0*off->return"
        );
        assert_eq!(
            arm(UNDECODABLE_BINLOG_VALUE),
            "undecodable_binlog_value=return"
        );
    }

    #[test]
    #[should_panic(expected = "unknown point")]
    fn an_unknown_point_is_loud() {
        parse("after_send=return");
    }

    /// The entries the tests write behave in `fail` as the hand-written hooks did: a crash on
    /// the `n`th hit only, a one-off panic, an armed condition. (Names of their own: `fail`'s
    /// registry is global, and other tests run beside.)
    #[cfg(feature = "failpoints")]
    #[test]
    fn the_entries_the_tests_use_behave_in_fail_as_before() {
        let fires = |name: &str| fail::eval(name, |_| ()).is_some();
        let (point, actions) = crash_on_hit("test_crash_on_hit", 3)
            .split_once('=')
            .map(|(p, a)| (p.to_string(), a.to_string()))
            .unwrap();
        fail::cfg(point.as_str(), &actions).unwrap();
        assert_eq!(
            (0..3).map(|_| fires(&point)).collect::<Vec<_>>(),
            [false, false, true],
            "the 3rd hit"
        );
        fail::cfg("test_crash_on_first_hit", "0*off->return").unwrap();
        assert!(fires("test_crash_on_first_hit"));
        fail::cfg("test_armed", "return").unwrap();
        assert!((0..5).all(|_| fires("test_armed")), "armed for good");
        assert!(!fires("test_never_configured"));
        fail::cfg("test_panic_once", "1*off->1*panic").unwrap();
        assert!(!fires("test_panic_once"));
        let panicked = std::panic::catch_unwind(|| fires("test_panic_once"));
        assert!(panicked.is_err(), "the 2nd hit panics");
        assert!(!fires("test_panic_once"), "once");
        assert!(
            fail::cfg("test_typo", "exitt").is_err(),
            "a bad action is refused"
        );
    }
}
