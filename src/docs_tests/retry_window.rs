//! The retry window (when an event that keeps failing is FAILED) is stated on several pages
//! and in the configuration's doc comment; each statement is the one
//! [`RetryPolicy::failed_within`] computes from the defaults.

use super::repo_root;
use crate::config::{Config, RetryConfig};
use crate::retry::RetryPolicy;
use std::time::Duration;

/// `quarters` of a minute as the pages write them ("2", "4¾").
fn minutes(quarters: f64) -> String {
    let quarters = quarters as u64;
    let fraction = ["", "¼", "½", "¾"][(quarters % 4) as usize];
    format!("{}{fraction}", quarters / 4)
}

/// The text of `path` with comment markers dropped and whitespace collapsed, so a sentence
/// wrapped over lines (or doc-comment lines) reads as one.
fn flowing_text(path: &str) -> String {
    let text = std::fs::read_to_string(repo_root().join(path)).unwrap();
    text.lines()
        .map(|line| line.trim_start().trim_start_matches("///").trim())
        .collect::<Vec<_>>()
        .join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn every_statement_of_the_retry_window_is_the_computed_one() {
    let config = Config::default();
    let (earliest, latest) =
        RetryPolicy::failed_within(&RetryConfig::default(), config.rocketmq.send_timeout);
    // The window widened to whole quarters of a minute, so the pages never promise more.
    let window = format!(
        "between about {} and {} minutes",
        minutes((earliest.as_secs_f64() / 15.0).floor()),
        minutes((latest.as_secs_f64() / 15.0).ceil())
    );
    assert_eq!(
        window, "between about 2 and 4¾ minutes",
        "the defaults' window moved: update the pages below"
    );
    for path in [
        "README.md",
        "docs/reference/configuration.md",
        "docs/concepts/guarantees.md",
        "src/config/mod.rs",
    ] {
        assert!(
            flowing_text(path).contains(&window),
            "{path} does not state the retry window as computed: {window}"
        );
    }
}

#[test]
fn the_window_counts_every_wait_and_attempt() {
    let retry = RetryConfig::default();
    let (earliest, latest) = RetryPolicy::failed_within(&retry, Duration::from_secs(3));
    // Ceilings 1 + 2 + … + 128 s = 255 s; at least half of each; 9 attempts of 3 s at most.
    assert_eq!(earliest, Duration::from_millis(127_500));
    assert_eq!(latest, Duration::from_secs(255 + 27));
    assert_eq!((minutes(8.0), minutes(19.0)), ("2".into(), "4¾".into()));
}
