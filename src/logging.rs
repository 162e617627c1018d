//! Logs to stderr, as every binary of the workspace writes them: `RUST_LOG` when set, else a
//! default filter that keeps the RocketMQ client's chatter out.

/// The relay's default filter: `info`, the RocketMQ client at `warn` (it is chatty at `info`)
/// and its route refreshes at `error`.
pub const DEFAULT_FILTER: &str =
    "info,rocketmq_client_rust=warn,rocketmq_transport=warn,rocketmq_runtime=warn,rocketmq_remoting=warn,\
     rocketmq_client_rust::factory::route_update=error";

/// Installs the process's subscriber: `RUST_LOG` if set, else `default_filter`, to stderr.
pub fn init(default_filter: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// One log line per key per period for a condition that repeats (a topic refused at every
/// attempt of every lane): [`Throttle::admit`] says when to write the line, and how many
/// occurrences since the last line it stands for. Nothing is lost from view: the counters of
/// `/metrics` still count each one.
pub(crate) struct Throttle {
    every: std::time::Duration,
    /// Per key: when its last line was written, and the occurrences since.
    keys: std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, u64)>>,
}

impl Throttle {
    /// A throttle writing a key's line at most once per `every`.
    pub(crate) fn new(every: std::time::Duration) -> Self {
        Throttle {
            every,
            keys: Default::default(),
        }
    }

    /// Counts an occurrence of `key`: `Some(n)` when its line is due (the first, or the first
    /// after `every`), `n` the occurrences it stands for (this one included); `None` when it is
    /// counted for the next line.
    pub(crate) fn admit(&self, key: &str) -> Option<u64> {
        self.admit_at(key, std::time::Instant::now())
    }

    fn admit_at(&self, key: &str, now: std::time::Instant) -> Option<u64> {
        let mut keys = self.keys.lock().expect("not poisoned");
        match keys.get_mut(key) {
            Some((logged, count)) => {
                *count += 1;
                if now.duration_since(*logged) < self.every {
                    return None;
                }
                let stands_for = *count;
                (*logged, *count) = (now, 0);
                Some(stands_for)
            }
            None => {
                keys.insert(key.to_string(), (now, 0));
                Some(1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Throttle;
    use std::time::{Duration, Instant};

    #[test]
    fn a_key_gets_one_line_per_period_standing_for_what_it_counted() {
        let throttle = Throttle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(
            throttle.admit_at("a", at(0)),
            Some(1),
            "the first is written"
        );
        assert_eq!(throttle.admit_at("a", at(1)), None);
        assert_eq!(throttle.admit_at("b", at(2)), Some(1), "keys are apart");
        assert_eq!(throttle.admit_at("a", at(9)), None);
        assert_eq!(
            throttle.admit_at("a", at(10)),
            Some(3),
            "two held back, and this one"
        );
        assert_eq!(throttle.admit_at("a", at(11)), None);
        assert_eq!(throttle.admit_at("a", at(30)), Some(2));
        assert_eq!(
            throttle.admit_at("a", at(45)),
            Some(1),
            "a quiet period: just this one"
        );
    }
}
