//! Where an event's latency goes: the wall-clock moments it passed each stage of the pipeline
//! (read → dispatched → sent → SEND_OK → marked), carried with the event, recorded once its
//! outcome is marked.
//!
//! Every marked SENT event is observed in `outbox_stage_seconds{stage=…}`, one series per step:
//! - `read_to_dispatched`: decoded from the binlog (or claimed from the table) until handed to its
//!   ordered sender;
//! - `dispatched_to_sent`: waiting in the sender's input until the attempt that succeeded began
//!   (earlier failed attempts and their retry delays count here);
//! - `sent_to_ack`: the broker's round trip of that attempt, until `SEND_OK`;
//! - `ack_to_marked`: waiting for the marker and its UPDATE, until the row is SENT.
//!
//! With `OUTBOX_STAGE_TRACE=<file>` in its environment the relay also appends one line per marked
//! SENT event to that file: `event_id read dispatched sent ack marked`, each in microseconds since
//! the Unix epoch (the same clock as the writer's, on one machine, so a benchmark joins them with
//! its commit times). It is a diagnostic: the file grows by ~70 bytes per event.
//!
//! Stamps are taken with the system clock; a clock step makes one event's steps wrong, never
//! negative (differences saturate at 0).

use crate::event::{now_us, Stamps};
use prometheus_client::encoding::EncodeLabelSet;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

/// The environment variable naming the stage trace file.
pub const TRACE_ENV: &str = "OUTBOX_STAGE_TRACE";

/// One step between two stages (the `stage` label of `outbox_stage_seconds`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    pub stage: &'static str,
}

impl StageLabel {
    /// Every step, in pipeline order.
    pub const ALL: [&'static str; 4] = [
        "read_to_dispatched",
        "dispatched_to_sent",
        "sent_to_ack",
        "ack_to_marked",
    ];
}

/// Records the marked SENT events `(event_id, stamps)` of one marking batch, all marked now:
/// observes each step in `outbox_stage_seconds` and appends them to the trace file, if any.
pub fn record<'a>(marked: impl IntoIterator<Item = (&'a str, &'a Stamps)>) {
    let now = now_us();
    let histograms = &super::relay().stage_seconds;
    let steps: [_; 4] = std::array::from_fn(|i| {
        histograms
            .get_or_create(&StageLabel {
                stage: StageLabel::ALL[i],
            })
            .clone()
    });
    let mut trace = trace().map(|t| t.lock().expect("not poisoned"));
    for (event_id, stamps) in marked {
        let Some(durations) = stamps.steps(now) else {
            continue;
        };
        for (histogram, micros) in steps.iter().zip(durations) {
            histogram.observe(micros as f64 / 1e6);
        }
        if let Some(out) = trace.as_deref_mut() {
            let _ = writeln!(
                out,
                "{event_id} {} {} {} {} {now}",
                stamps.read, stamps.dispatched, stamps.sent, stamps.ack
            );
        }
    }
    if let Some(out) = trace.as_deref_mut() {
        let _ = out.flush();
    }
}

/// The trace file named by [`TRACE_ENV`], opened for appending at first use.
fn trace() -> Option<&'static Mutex<std::io::BufWriter<std::fs::File>>> {
    static TRACE: OnceLock<Option<Mutex<std::io::BufWriter<std::fs::File>>>> = OnceLock::new();
    TRACE
        .get_or_init(|| {
            let path = std::env::var_os(TRACE_ENV)?;
            match std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
            {
                Ok(file) => Some(Mutex::new(std::io::BufWriter::new(file))),
                Err(error) => {
                    tracing::warn!(%error, path = ?path, "cannot open {TRACE_ENV}; no stage trace");
                    None
                }
            }
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_the_differences_between_consecutive_stages() {
        let stamps = Stamps {
            read: 100,
            dispatched: 130,
            sent: 200,
            ack: 1200,
        };
        assert_eq!(stamps.steps(1500), Some([30, 70, 1000, 300]));
        // A clock step backwards: that step is 0, never negative.
        assert_eq!(stamps.steps(1000), Some([30, 70, 1000, 0]));
        // Never sent (a row that cannot become a message): no steps.
        assert_eq!(Stamps::read_now().steps(now_us()), None);
    }

    #[test]
    fn recorded_events_appear_in_each_steps_histogram() {
        let stamps = Stamps {
            read: 1,
            dispatched: 2,
            sent: 3,
            ack: 4,
        };
        record([("e1", &stamps)]);
        let text = super::super::relay().render();
        for stage in StageLabel::ALL {
            let count = format!("outbox_stage_seconds_count{{stage=\"{stage}\"}}");
            assert!(text.contains(&count), "{count} in {text}");
        }
    }
}
