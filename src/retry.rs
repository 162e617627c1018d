//! The retry policy: exponential backoff, 1 s doubling to 5 min by default, then give up.
//!
//! This is the one seam over the `backoff` crate (flagged unmaintained, RUSTSEC-2025-0012): the
//! rest of the code asks [`RetryPolicy::delay`] and never names the crate, so it can be swapped.

use crate::config::RetryConfig;
use backoff::backoff::Backoff;
use std::time::Duration;

/// How long to wait before each retry and when to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub max: Duration,
    /// Retries after the first attempt; `None` retries for ever (connections).
    pub max_retries: Option<u32>,
}

impl RetryPolicy {
    /// The send policy of `[retry]`.
    pub fn from_config(config: &RetryConfig) -> Self {
        RetryPolicy {
            initial: config.initial_backoff,
            max: config.max_backoff,
            max_retries: Some(config.max_retry),
        }
    }

    /// For reconnecting to a server: 100 ms doubling to 10 s, for ever.
    pub fn reconnect() -> Self {
        RetryPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
            max_retries: None,
        }
    }

    /// For re-running a database write that must succeed before anything moves on (marking):
    /// 50 ms doubling to 1 s, for ever. Short, because a killed connection costs one retry per
    /// dead connection left in the pool.
    pub fn database() -> Self {
        RetryPolicy {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(1),
            max_retries: None,
        }
    }

    /// The wait before retry number `retry` (1-based), or `None` when retries are used up.
    pub fn delay(&self, retry: u32) -> Option<Duration> {
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
        }
        Some(delay.min(self.max))
    }

    /// The wait before attempt `n` (1-based) of something retried for ever at this policy's
    /// pace: [`Self::delay`]`(n)`, and once past `max_retries` the policy's last delay (its
    /// initial delay if it allows no retry).
    pub fn delay_without_end(&self, n: u32) -> Duration {
        let last = self.max_retries.unwrap_or(u32::MAX).max(1);
        self.delay(n.clamp(1, last)).unwrap_or(self.initial)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy_doubles_from_one_second_to_five_minutes_then_stops() {
        let p = RetryPolicy::from_config(&RetryConfig::default());
        let delays: Vec<u64> = (1..=8).map(|r| p.delay(r).unwrap().as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 32, 64, 128]);
        assert_eq!(p.delay(9), None, "max_retry 8");
        let long = RetryPolicy {
            max_retries: Some(20),
            ..p
        };
        assert_eq!(
            long.delay(12),
            Some(Duration::from_secs(300)),
            "capped at 5 min"
        );
    }

    #[test]
    fn without_end_the_delays_follow_the_policy_then_stay_at_its_last() {
        let p = RetryPolicy::from_config(&RetryConfig::default());
        let delays: Vec<u64> = (1..=10).map(|n| p.delay_without_end(n).as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 32, 64, 128, 128, 128]);
        let none = RetryPolicy {
            max_retries: Some(0),
            ..p
        };
        assert_eq!(none.delay_without_end(5), Duration::from_secs(1));
    }

    #[test]
    fn reconnect_policy_never_gives_up() {
        let p = RetryPolicy::reconnect();
        assert_eq!(p.delay(1), Some(Duration::from_millis(100)));
        assert_eq!(p.delay(1000), Some(Duration::from_secs(10)));
    }
}
