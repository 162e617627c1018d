//! The retry policy: exponential backoff with jitter, then give up. By default (`[retry]`) a
//! failed send waits about 1 s, 2 s, 4 s, … (doubling, never more than 5 min), each wait drawn
//! at random between half its ceiling and its ceiling, and the event is FAILED after 8 retries.
//!
//! Guarantees: retry `n` (1-based) waits at most its ceiling `min(initial × 2^(n-1), max)` and,
//! with [`Jitter::Equal`], at least half of it; so no wait exceeds `max`, and after
//! `max_retries` retries [`RetryPolicy::delay`] answers `None` (the caller gives up: a send goes
//! FAILED). The jitter spreads the retries of many events, shards and relays that failed
//! together (a broker restart) instead of sending them again in lockstep.
//!
//! This is the one seam over the `backoff` crate (flagged unmaintained, RUSTSEC-2025-0012): its
//! `ExponentialBackoff` computes both the doubling and the random draw (from `rand`'s thread
//! generator), the rest of the code asks [`RetryPolicy::delay`] and never names the crate, so it
//! can be swapped.

use crate::config::RetryConfig;
use backoff::backoff::Backoff;
use std::time::Duration;

/// How long to wait before each retry and when to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    pub initial: Duration,
    /// The longest wait (the ceilings stop doubling here).
    pub max: Duration,
    /// Retries after the first attempt; `None` retries for ever (connections).
    pub max_retries: Option<u32>,
    /// How each wait is drawn under its ceiling.
    pub jitter: Jitter,
}

/// How a wait is drawn under its ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// Uniformly between half the ceiling and the ceiling ("equal jitter"): what every policy of
    /// the relay uses.
    Equal,
    /// The ceiling itself: for tests that add up the waits exactly.
    None,
}

impl RetryPolicy {
    /// When an event that keeps failing under the send policy of `config` is FAILED, counted
    /// from its first attempt: at the earliest after every wait drawn at its shortest (half its
    /// ceiling) with attempts that fail at once; at the latest after every wait at its ceiling
    /// with each of the `max_retry + 1` attempts taking the whole `send_timeout`. (Not once its
    /// topic parks: see `relay.park_after`.)
    #[cfg(any(test, feature = "test-utils"))]
    pub fn failed_within(config: &RetryConfig, send_timeout: Duration) -> (Duration, Duration) {
        let policy = Self::from_config(config);
        let ceilings: Duration = (1..=config.max_retry)
            .map_while(|retry| policy.ceiling(retry))
            .sum();
        let attempts = send_timeout * (config.max_retry + 1);
        (ceilings / 2, ceilings + attempts)
    }

    /// The send policy of `[retry]`.
    pub fn from_config(config: &RetryConfig) -> Self {
        RetryPolicy {
            initial: config.initial_backoff,
            max: config.max_backoff,
            max_retries: Some(config.max_retry),
            jitter: Jitter::Equal,
        }
    }

    /// For reconnecting to a server: 100 ms doubling to 10 s (jittered), for ever.
    pub fn reconnect() -> Self {
        RetryPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
            max_retries: None,
            jitter: Jitter::Equal,
        }
    }

    /// For re-running a database write that must succeed before anything moves on (marking):
    /// 50 ms doubling to 1 s (jittered), for ever. Short, because a killed connection costs one
    /// retry per dead connection left in the pool.
    pub fn database() -> Self {
        RetryPolicy {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(1),
            max_retries: None,
            jitter: Jitter::Equal,
        }
    }

    /// The same policy without jitter (each wait is its ceiling).
    #[cfg(any(test, feature = "test-utils"))]
    pub fn without_jitter(self) -> Self {
        RetryPolicy {
            jitter: Jitter::None,
            ..self
        }
    }

    /// The wait before retry number `retry` (1-based), or `None` when retries are used up.
    pub fn delay(&self, retry: u32) -> Option<Duration> {
        Some(self.jittered(retry, self.ceiling(retry)?))
    }

    /// The longest wait before retry number `retry` (1-based): `initial` doubled `retry - 1`
    /// times, at most `max`; `None` when retries are used up.
    pub fn ceiling(&self, retry: u32) -> Option<Duration> {
        if retry == 0 || self.max_retries.is_some_and(|max| retry > max) {
            return None;
        }
        let intervals = exponential(self.initial, self.max, 0.0);
        Some(at_interval(intervals, retry).current_interval)
    }

    /// The wait before attempt `n` (1-based) of something retried for ever at this policy's
    /// pace: [`Self::delay`]`(n)`, and once past `max_retries` the policy's last delay (its
    /// initial delay if it allows no retry), jittered alike.
    pub fn delay_without_end(&self, n: u32) -> Duration {
        let n = n.clamp(1, self.max_retries.unwrap_or(u32::MAX).max(1));
        let ceiling = self.ceiling(n).unwrap_or(self.initial);
        self.jittered(n, ceiling)
    }

    /// The wait before the `n`th attempt whose ceiling is `ceiling`.
    ///
    /// [`Jitter::Equal`] asks `backoff` for a wait randomized around three quarters of the
    /// ceiling by a factor of one third, i.e. uniformly in `0.75 × ceiling × (1 ± 1/3)` =
    /// `[ceiling / 2, ceiling]`, the intervals doubling from `0.75 × initial` up to
    /// `0.75 × max`. `backoff` 0.4 draws `low + r × (high - low + 1 ns)` for `r` in [0, 1) over
    /// nanoseconds in `f64`, and three quarters of a duration is rounded to the nanosecond, so a
    /// draw can pass the ceiling by a nanosecond or so (by a fifth of it for ceilings of a few
    /// nanoseconds): the clamp puts it back, and the guarantee holds exactly.
    fn jittered(&self, n: u32, ceiling: Duration) -> Duration {
        match self.jitter {
            Jitter::None => ceiling,
            Jitter::Equal => {
                let (initial, max) = (three_quarters(self.initial), three_quarters(self.max));
                let mut jittered = at_interval(exponential(initial, max, EQUAL_JITTER_FACTOR), n);
                let wait = jittered
                    .next_backoff()
                    .expect("no max_elapsed_time: never `None`");
                wait.clamp(ceiling / 2, ceiling)
            }
        }
    }
}

/// [`Jitter::Equal`]'s randomization factor: around three quarters of a ceiling it spans
/// `0.75 × (1 - 1/3) = 1/2` to `0.75 × (1 + 1/3) = 1` of it.
const EQUAL_JITTER_FACTOR: f64 = 1.0 / 3.0;

/// Three quarters of `d` (to the nanosecond below), in integers: no overflow, no rounding
/// through `f64`.
fn three_quarters(d: Duration) -> Duration {
    d - d / 4
}

/// `backoff`'s intervals doubling from `initial` (at most `max`) to `max`, each wait drawn around
/// its interval within `± factor` of it, for ever.
fn exponential(initial: Duration, max: Duration, factor: f64) -> backoff::ExponentialBackoff {
    let initial = initial.min(max);
    backoff::ExponentialBackoff {
        current_interval: initial,
        initial_interval: initial,
        randomization_factor: factor,
        multiplier: 2.0,
        max_interval: max,
        max_elapsed_time: None,
        ..Default::default()
    }
}

/// `backoff` moved on to its `n`th (1-based) interval (`current_interval`), the one its next
/// wait is drawn around. Once the interval stops growing (capped at its maximum) every later one
/// is the same, so it stops there: `n` may be `u32::MAX`.
fn at_interval(mut backoff: backoff::ExponentialBackoff, n: u32) -> backoff::ExponentialBackoff {
    for _ in 1..n {
        let interval = backoff.current_interval;
        // Moves the interval on (doubled, at most the maximum); the wait drawn is not needed.
        let _ = backoff.next_backoff();
        if backoff.current_interval == interval {
            break;
        }
    }
    backoff
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secs(d: Duration) -> f64 {
        d.as_secs_f64()
    }

    #[test]
    fn default_ceilings_double_from_one_second_to_five_minutes_then_stop() {
        let p = RetryPolicy::from_config(&RetryConfig::default());
        let ceilings: Vec<u64> = (1..=8).map(|r| p.ceiling(r).unwrap().as_secs()).collect();
        assert_eq!(ceilings, vec![1, 2, 4, 8, 16, 32, 64, 128]);
        assert_eq!(p.ceiling(9), None, "max_retry 8");
        assert_eq!(p.delay(9), None, "max_retry 8: then FAILED");
        let long = RetryPolicy {
            max_retries: Some(20),
            ..p
        };
        assert_eq!(
            long.ceiling(12),
            Some(Duration::from_secs(300)),
            "capped at 5 min"
        );
        assert_eq!(long.ceiling(20), Some(Duration::from_secs(300)));
        assert_eq!(long.delay(21), None);
    }

    #[test]
    fn a_wait_is_drawn_between_half_its_ceiling_and_its_ceiling() {
        let p = RetryPolicy::from_config(&RetryConfig::default());
        // `backoff` draws from `rand` (no source to inject): 2000 draws for retry 3 (ceiling 4 s)
        // stay in [2 s, 4 s], reach both ends (a miss of either 5 % has odds of 0.95^2000, about
        // 3e-45) and average the middle (3 s; the mean of 2000 draws deviates by 0.013 s).
        let waits: Vec<f64> = (0..2000).map(|_| secs(p.delay(3).unwrap())).collect();
        assert!(waits.iter().all(|w| (2.0..=4.0).contains(w)), "{waits:?}");
        let low = waits.iter().copied().fold(f64::INFINITY, f64::min);
        let high = waits.iter().copied().fold(0.0, f64::max);
        assert!(low < 2.1 && high > 3.9, "{low}..{high}");
        let mean = waits.iter().sum::<f64>() / waits.len() as f64;
        assert!((mean - 3.0).abs() < 0.1, "mean {mean}");
        // `backoff` draws within the range itself: the clamp (`jittered`) trims nanoseconds, it
        // does not pile draws onto the ends.
        let on_an_end = waits.iter().filter(|&&w| w == 2.0 || w == 4.0).count();
        assert!(on_an_end <= 2, "{on_an_end} draws on an end");
        assert_eq!(p.delay(9), None, "used up, whatever the draw");
        // Without jitter, the ceiling.
        let exact = p.clone().without_jitter();
        assert_eq!(exact.delay(3), Some(Duration::from_secs(4)));
        assert_eq!(exact.delay(8), Some(Duration::from_secs(128)));
    }

    #[test]
    fn random_waits_stay_in_their_range_and_are_spread() {
        let p = RetryPolicy {
            max_retries: Some(12),
            ..RetryPolicy::from_config(&RetryConfig::default())
        };
        for retry in 1..=12 {
            let ceiling = p.ceiling(retry).unwrap();
            let waits: Vec<Duration> = (0..200).map(|_| p.delay(retry).unwrap()).collect();
            for wait in &waits {
                assert!(
                    *wait <= ceiling && *wait <= p.max,
                    "retry {retry}: {wait:?}"
                );
                assert!(*wait >= ceiling / 2, "retry {retry}: {wait:?}");
            }
            // Not in lockstep: 200 draws are (nearly) all different, over most of the range.
            let mut distinct = waits.clone();
            distinct.sort();
            distinct.dedup();
            assert!(
                distinct.len() > 190,
                "retry {retry}: {} distinct",
                distinct.len()
            );
            let (low, high) = (distinct[0], distinct[distinct.len() - 1]);
            assert!(high - low > ceiling / 4, "retry {retry}: {low:?}..{high:?}");
        }
    }

    #[test]
    fn without_end_the_waits_follow_the_policy_then_stay_under_its_last() {
        let p = RetryPolicy::from_config(&RetryConfig::default());
        let exact = p.clone().without_jitter();
        let ceilings: Vec<u64> = (1..=10)
            .map(|n| exact.delay_without_end(n).as_secs())
            .collect();
        assert_eq!(ceilings, vec![1, 2, 4, 8, 16, 32, 64, 128, 128, 128]);
        for n in 1..=10 {
            let (wait, ceiling) = (p.delay_without_end(n), exact.delay_without_end(n));
            assert!(wait <= ceiling && wait >= ceiling / 2, "{n}: {wait:?}");
        }
        let none = RetryPolicy {
            max_retries: Some(0),
            ..exact
        };
        assert_eq!(none.delay_without_end(5), Duration::from_secs(1));
    }

    #[test]
    fn reconnect_policy_never_gives_up_and_stays_under_its_cap() {
        let p = RetryPolicy::reconnect();
        assert_eq!(p.ceiling(1), Some(Duration::from_millis(100)));
        assert_eq!(p.ceiling(1000), Some(Duration::from_secs(10)));
        let wait = p.delay(1000).unwrap();
        assert!(wait <= Duration::from_secs(10) && wait >= Duration::from_secs(5));
        assert!(p.delay(u32::MAX).is_some());
    }

    proptest! {
        /// For any policy: the ceiling of retry `n` is `initial` doubled `n - 1` times, at most
        /// `max` (computed here in integers), and every wait drawn lies in [ceiling / 2, ceiling].
        #[test]
        fn every_wait_lies_between_half_its_ceiling_and_its_ceiling(
            // Nanoseconds too, where `backoff`'s rounding shows (the clamp in `jittered`).
            initial_ns in prop_oneof![1u64..=1_000, 1u64..=60_000_000_000],
            extra_ns in 0u64..=3_600_000_000_000,
            max_retries in proptest::option::of(0u32..=64),
            retry in prop_oneof![1u32..=80, Just(u32::MAX)],
        ) {
            let max_ns = initial_ns + extra_ns;
            let p = RetryPolicy {
                initial: Duration::from_nanos(initial_ns),
                max: Duration::from_nanos(max_ns),
                max_retries,
                jitter: Jitter::Equal,
            };
            let doubled = u128::from(initial_ns) << (retry - 1).min(64);
            let expected = doubled.min(u128::from(max_ns));
            match p.ceiling(retry) {
                None => prop_assert!(max_retries.is_some_and(|max| retry > max)),
                Some(ceiling) => {
                    prop_assert_eq!(ceiling.as_nanos(), expected);
                    assert_waits_in_range(|| p.delay(retry).unwrap(), ceiling)?;
                }
            }
            let ceiling = p.clone().without_jitter().delay_without_end(retry);
            assert_waits_in_range(|| p.delay_without_end(retry), ceiling)?;
        }
    }

    /// 50 draws of `wait`, each in [ceiling / 2, ceiling].
    fn assert_waits_in_range(
        wait: impl Fn() -> Duration,
        ceiling: Duration,
    ) -> Result<(), TestCaseError> {
        for _ in 0..50 {
            let wait = wait();
            prop_assert!(
                ceiling / 2 <= wait && wait <= ceiling,
                "{wait:?} of {ceiling:?}"
            );
        }
        Ok(())
    }
}
