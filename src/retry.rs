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
//! This is the one seam over the `backoff` crate (flagged unmaintained, RUSTSEC-2025-0012): it
//! computes the ceilings, the rest of the code asks [`RetryPolicy::delay`] and never names the
//! crate, so it can be swapped. The jitter's random source is std's randomly seeded hasher
//! ([`random_unit`]), injectable in tests ([`RetryPolicy::delay_drawn`]).

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
    pub fn without_jitter(self) -> Self {
        RetryPolicy {
            jitter: Jitter::None,
            ..self
        }
    }

    /// The wait before retry number `retry` (1-based), or `None` when retries are used up.
    pub fn delay(&self, retry: u32) -> Option<Duration> {
        self.delay_drawn(retry, random_unit)
    }

    /// [`Self::delay`], with the jitter's random source given: `unit` draws a number in [0, 1)
    /// (0 gives the ceiling, towards 1 half of it).
    pub fn delay_drawn(&self, retry: u32, unit: impl FnOnce() -> f64) -> Option<Duration> {
        Some(self.jittered(self.ceiling(retry)?, unit))
    }

    /// The longest wait before retry number `retry` (1-based): `initial` doubled `retry - 1`
    /// times, at most `max`; `None` when retries are used up.
    pub fn ceiling(&self, retry: u32) -> Option<Duration> {
        if retry == 0 || self.max_retries.is_some_and(|max| retry > max) {
            return None;
        }
        let mut backoff = backoff::ExponentialBackoff {
            current_interval: self.initial,
            initial_interval: self.initial,
            randomization_factor: 0.0,
            multiplier: 2.0,
            max_interval: self.max,
            max_elapsed_time: None,
            ..Default::default()
        };
        let mut delay = self.initial;
        for _ in 0..retry {
            delay = backoff.next_backoff().unwrap_or(self.max);
            if delay >= self.max {
                break;
            }
        }
        Some(delay.min(self.max))
    }

    /// The wait before attempt `n` (1-based) of something retried for ever at this policy's
    /// pace: [`Self::delay`]`(n)`, and once past `max_retries` the policy's last delay (its
    /// initial delay if it allows no retry), jittered alike.
    pub fn delay_without_end(&self, n: u32) -> Duration {
        let last = self.max_retries.unwrap_or(u32::MAX).max(1);
        let ceiling = self.ceiling(n.clamp(1, last)).unwrap_or(self.initial);
        self.jittered(ceiling, random_unit)
    }

    fn jittered(&self, ceiling: Duration, unit: impl FnOnce() -> f64) -> Duration {
        match self.jitter {
            Jitter::None => ceiling,
            Jitter::Equal => ceiling - ceiling.mul_f64(unit().clamp(0.0, 1.0) / 2.0),
        }
    }
}

/// A number drawn uniformly from [0, 1). std's `RandomState` is seeded at random per thread
/// (from the OS) and moves on at every call, so every draw differs, in every process, without a
/// dependency for it. Not cryptographic, and it need not be.
fn random_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u8(0);
    // The top 53 bits: every f64 in [0, 1) with that precision, equally likely.
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // The random source injected: its ends give the ends of the range.
        assert_eq!(p.delay_drawn(3, || 0.0), Some(Duration::from_secs(4)));
        assert_eq!(p.delay_drawn(3, || 0.5), Some(Duration::from_secs(3)));
        let lowest = p.delay_drawn(3, || 1.0 - f64::EPSILON).unwrap();
        assert!(secs(lowest) >= 2.0 && secs(lowest) < 2.001, "{lowest:?}");
        // Out-of-range draws cannot leave the range.
        assert_eq!(p.delay_drawn(3, || 7.0), Some(Duration::from_secs(2)));
        assert_eq!(p.delay_drawn(3, || -1.0), Some(Duration::from_secs(4)));
        assert_eq!(p.delay_drawn(9, || 0.0), None, "used up, whatever the draw");
        // Without jitter, the ceiling.
        let exact = p.clone().without_jitter();
        assert_eq!(exact.delay_drawn(3, || 0.9), Some(Duration::from_secs(4)));
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
}
