//! The checkpointer: persists the watermark to the local store in small groups (never per
//! event) and mirrors it into MySQL at a lower rate.
//!
//! Guarantee: a checkpointer that cannot save is never silent. From the first failed save it
//! logs at ERROR what failed and what to do, counts each failure
//! (`outbox_checkpoint_save_errors_total`), turns `/readyz` unready, and tries again every save
//! period; a save that works makes it ready again. Once saves have failed
//! [`SAVE_FAILURES_BEFORE_STOP`] times in a row over more than [`SAVE_FAILING_BEFORE_STOP`], it
//! stops the relay ([`CheckpointSettings::stop_relay`]) and returns an error that says why.

use super::store::StoreError;
use super::{Acknowledgements, CheckpointStore, MysqlMirror};
use crate::binlog::{BinlogPosition, StreamClock};
use crate::metrics::health::Health;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long checkpoint saves may keep failing before the relay stops (with at least
/// [`SAVE_FAILURES_BEFORE_STOP`] failed attempts): long enough to ride out a moment of a full
/// disk, short enough that a relay without durable progress does not stream on for hours.
pub const SAVE_FAILING_BEFORE_STOP: Duration = Duration::from_secs(60);

/// How many saves in a row must fail before the relay stops (with the failures spanning more
/// than [`SAVE_FAILING_BEFORE_STOP`]), so that a long save period still gets several tries.
pub const SAVE_FAILURES_BEFORE_STOP: u32 = 5;

/// While the position stands still (nothing written, or every transaction read since the last
/// mirror is still on its way) the mirror is written again, for the standbys' `stream_at`,
/// once this many mirror periods have passed and the stream has read further.
const STREAM_AT_EVERY: u32 = 5;

/// While saves keep failing: an ERROR line at the first failure, then one per this period.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(10);

/// Why the checkpointer stopped; the relay stops with it (see [`crate::error::PipelineError`]).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Saves kept failing (or the final save failed): `message` says what to do, `source` is
    /// the store's last error (its kind decides whether the instance retries).
    #[error("{message}")]
    NotSaved {
        message: String,
        #[source]
        source: StoreError,
    },
    /// A save panicked (in the store, on the blocking pool).
    #[error("a checkpoint save panicked")]
    Panicked(#[source] tokio::task::JoinError),
}

/// How often the checkpoint is saved, and what happens when it cannot be.
#[derive(Debug, Clone)]
pub struct CheckpointSettings {
    /// Local (sled, fsync'd) save interval, when the watermark moved.
    pub save_every: Duration,
    /// MySQL mirror interval, when the watermark moved.
    pub mirror_every: Duration,
    /// How long saves may keep failing before the checkpointer gives up
    /// (`SAVE_FAILING_BEFORE_STOP`, 60 s; tests shorten it).
    pub give_up_after: Duration,
    /// Cancelled when the checkpointer gives up, so that the relay stops (drains, then returns
    /// the checkpointer's error). [`crate::relay::RelayHandle`] sets it to the relay's stop.
    /// `None`: only the checkpointer ends, and its error is returned when the pipeline stops.
    pub stop_relay: Option<CancellationToken>,
}

impl Default for CheckpointSettings {
    fn default() -> Self {
        CheckpointSettings {
            save_every: Duration::from_millis(200),
            mirror_every: Duration::from_secs(2),
            give_up_after: SAVE_FAILING_BEFORE_STOP,
            stop_relay: None,
        }
    }
}

/// Saves until `stop`, then saves and mirrors the final position and returns it. The mirror
/// also records how far the stream is done ([`Acknowledgements::done_up_to`]: read, and nothing
/// older still on its way) for the standbys' sweepers; that moves on without the position too
/// (an idle server's heartbeats), and is mirrored every `STREAM_AT_EVERY` (5) mirror periods then. See the module guarantee for failed saves.
pub async fn run_checkpointer(
    acks: Acknowledgements,
    store: Arc<dyn CheckpointStore>,
    mirror: MysqlMirror,
    pool: mysql_async::Pool,
    settings: CheckpointSettings,
    clock: StreamClock,
    stop: CancellationToken,
) -> Result<BinlogPosition, CheckpointError> {
    let parts = Parts {
        acks,
        store,
        mirror,
        pool,
        settings,
        clock,
        health: crate::metrics::health(),
    };
    parts.run(stop).await
}

struct Parts<'h> {
    acks: Acknowledgements,
    store: Arc<dyn CheckpointStore>,
    mirror: MysqlMirror,
    pool: mysql_async::Pool,
    settings: CheckpointSettings,
    clock: StreamClock,
    health: &'h Health,
}

/// Saves failing in a row.
struct Failing {
    since: Instant,
    attempts: u32,
    logged: Instant,
}

impl Parts<'_> {
    /// The local saves and the mirror, side by side: a slow local disk (a long fsync) never
    /// holds back the mirror, so the standbys' `stream_at` and the sweepers' age bound keep
    /// moving. The mirror writes the acknowledged position ([`Acknowledgements::position`]),
    /// which is safe to resume from wherever it is stored; a restart takes the furthest of the
    /// two.
    async fn run(self, stop: CancellationToken) -> Result<BinlogPosition, CheckpointError> {
        let saver_done = CancellationToken::new();
        let saves = async {
            let saved = self.save_until(&stop).await;
            saver_done.cancel();
            saved
        };
        let ((), saved) = tokio::join!(self.mirror_until(&saver_done), saves);
        saved
    }

    /// Saves the position locally whenever it moved, every `save_every`, until `stop`; then
    /// saves the final position and returns it. See the module guarantee for failed saves.
    async fn save_until(
        &self,
        stop: &CancellationToken,
    ) -> Result<BinlogPosition, CheckpointError> {
        let (acks, settings) = (&self.acks, &self.settings);
        let mut saved = acks.position();
        let mut last_moved = Instant::now();
        let mut failing: Option<Failing> = None;
        let age = &crate::metrics::relay().checkpoint_age_seconds;
        loop {
            let stopping = tokio::select! {
                _ = stop.cancelled() => true,
                _ = tokio::time::sleep(settings.save_every) => false,
            };
            let position = acks.position();
            if position != saved || acks.in_flight() == 0 {
                last_moved = Instant::now();
            }
            age.set(last_moved.elapsed().as_secs_f64());
            if position != saved {
                match self.save(&position).await? {
                    Ok(()) => {
                        if let Some(f) = failing.take() {
                            tracing::info!(checkpoint = %position, failed_attempts = f.attempts,
                                failing_for = ?f.since.elapsed(), "the checkpoint is saved again");
                            self.health.set_checkpoint(true);
                        }
                        saved = position;
                        // Saved locally (fsync'd), not yet mirrored into MySQL.
                        crate::failpoint::hit(crate::failpoint::AFTER_CHECKPOINT_SAVE);
                    }
                    Err(e) => {
                        let f = self.failed(&mut failing, &e, &saved);
                        if stopping {
                            return Err(CheckpointError::NotSaved {
                                message: format!(
                                    "the final checkpoint could not be saved; a restart resumes from {saved} (or the MySQL mirror) and sends again what came after"
                                ),
                                source: e,
                            });
                        }
                        if f.attempts >= SAVE_FAILURES_BEFORE_STOP
                            && f.since.elapsed() > settings.give_up_after
                        {
                            return Err(self.give_up(e, f, &saved));
                        }
                    }
                }
            }
            if stopping {
                tracing::info!(checkpoint = %saved, "final checkpoint written");
                return Ok(saved);
            }
        }
    }

    /// Mirrors the acknowledged position into MySQL every `mirror_every` while it moves, and
    /// how far the stream is done ([`Acknowledgements::done_up_to`]) every [`STREAM_AT_EVERY`]
    /// periods while only that moves; once `saves_ended`, the final position.
    async fn mirror_until(&self, saves_ended: &CancellationToken) {
        let (acks, every) = (&self.acks, self.settings.mirror_every);
        let mut mirrored = acks.position();
        let mut mirrored_done: Option<u64> = None;
        let mut last_mirror = Instant::now();
        loop {
            let stopping = tokio::select! {
                _ = saves_ended.cancelled() => true,
                _ = tokio::time::sleep(every) => false,
            };
            let position = acks.position();
            // The standbys' sweepers count their age bound from here (sweep::gate).
            let done_up_to = acks.done_up_to(self.clock.read_up_to());
            let due = position != mirrored
                || (done_up_to > mirrored_done && last_mirror.elapsed() >= every * STREAM_AT_EVERY);
            if due {
                match mirror_once(&self.mirror, &self.pool, &position, done_up_to).await {
                    Ok(()) => (mirrored, mirrored_done) = (position, done_up_to),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot mirror the checkpoint into MySQL; will retry")
                    }
                }
                last_mirror = Instant::now();
            }
            if stopping {
                return;
            }
        }
    }

    /// Saves `position` (and offers it to the history); the outer error is a panicked save.
    async fn save(
        &self,
        position: &BinlogPosition,
    ) -> Result<Result<(), StoreError>, CheckpointError> {
        let (s, p) = (Arc::clone(&self.store), position.clone());
        tokio::task::spawn_blocking(move || s.save(&p).map(|()| s.record_history(&p)))
            .await
            .map_err(CheckpointError::Panicked)
    }

    /// Counts a failed save, turns readiness off and logs it (the first, then every
    /// [`FAILURE_LOG_EVERY`]).
    fn failed<'f>(
        &self,
        failing: &'f mut Option<Failing>,
        error: &StoreError,
        saved: &BinlogPosition,
    ) -> &'f Failing {
        crate::metrics::relay().checkpoint_save_errors.inc();
        self.health.set_checkpoint(false);
        let now = Instant::now();
        let first = failing.is_none();
        let f = failing.get_or_insert(Failing {
            since: now,
            attempts: 0,
            logged: now,
        });
        f.attempts += 1;
        if first || f.logged.elapsed() >= FAILURE_LOG_EVERY {
            f.logged = now;
            tracing::error!(error = %error, failed_attempts = f.attempts,
                failing_for = ?f.since.elapsed(), durable_checkpoint = %saved,
                "cannot save the checkpoint: the relay streams on, but a restart would send again everything after the durable checkpoint; /readyz is unready. Free disk space in relay.checkpoint_dir or make it writable; the relay stops if saves keep failing for {:?}",
                self.settings.give_up_after);
        }
        f
    }

    /// The error that stops the relay, after stopping it.
    fn give_up(&self, error: StoreError, f: &Failing, saved: &BinlogPosition) -> CheckpointError {
        let message = format!(
            "the checkpoint could not be saved for {:?} ({} attempts in a row): stopping the relay rather than stream on without durable progress. Free disk space in relay.checkpoint_dir or make it writable, then start the relay again: it resumes from {saved} (or the MySQL mirror) and sends again what came after (consumers de-duplicate)",
            f.since.elapsed(),
            f.attempts
        );
        tracing::error!(error = %error, "{message}");
        if let Some(stop_relay) = &self.settings.stop_relay {
            stop_relay.cancel();
        }
        CheckpointError::NotSaved {
            message,
            source: error,
        }
    }
}

async fn mirror_once(
    mirror: &MysqlMirror,
    pool: &mysql_async::Pool,
    position: &BinlogPosition,
    stream_at: Option<u64>,
) -> Result<(), StoreError> {
    let mut conn = pool.get_conn().await?;
    mirror.save(&mut conn, position, stream_at).await
}

#[cfg(test)]
#[path = "checkpointer_tests.rs"]
mod tests;
