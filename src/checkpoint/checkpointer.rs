//! The checkpointer: persists the watermark to the local store in small groups (never per
//! event) and mirrors it into MySQL at a lower rate.

use super::{Acknowledgements, CheckpointStore, MysqlMirror};
use crate::binlog::{BinlogPosition, StreamClock};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How often the checkpoint is saved.
#[derive(Debug, Clone)]
pub struct CheckpointSettings {
    /// Local (sled, fsync'd) save interval, when the watermark moved.
    pub save_every: Duration,
    /// MySQL mirror interval, when the watermark moved.
    pub mirror_every: Duration,
}

impl Default for CheckpointSettings {
    fn default() -> Self {
        CheckpointSettings {
            save_every: Duration::from_millis(200),
            mirror_every: Duration::from_secs(2),
        }
    }
}

/// Saves until `stop`, then saves and mirrors the final position and returns it. The mirror
/// also records how far the stream is done ([`Acknowledgements::done_up_to`]: read, and nothing
/// older still on its way) for the standbys' sweepers.
pub async fn run_checkpointer(
    acks: Acknowledgements,
    store: Arc<dyn CheckpointStore>,
    mirror: MysqlMirror,
    pool: mysql_async::Pool,
    settings: CheckpointSettings,
    clock: StreamClock,
    stop: CancellationToken,
) -> anyhow::Result<BinlogPosition> {
    let mut saved = acks.position();
    let mut mirrored = saved.clone();
    let mut last_mirror = Instant::now();
    let mut last_moved = Instant::now();
    let age = &crate::metrics::relay().checkpoint_age_seconds;
    loop {
        let stopping = tokio::select! {
            _ = stop.cancelled() => true,
            _ = tokio::time::sleep(settings.save_every) => false,
        };
        let position = acks.position();
        let in_flight = acks.in_flight();
        if position != saved || in_flight == 0 {
            last_moved = Instant::now();
        }
        age.set(last_moved.elapsed().as_secs_f64());
        if position != saved {
            let (s, p) = (Arc::clone(&store), position.clone());
            tokio::task::spawn_blocking(move || s.save(&p).map(|()| s.record_history(&p)))
                .await??;
            saved = position;
            // Saved locally (fsync'd), not yet mirrored into MySQL.
            crate::failpoint::hit(crate::failpoint::AFTER_CHECKPOINT_SAVE);
        }
        if saved != mirrored && (stopping || last_mirror.elapsed() >= settings.mirror_every) {
            // The standbys' sweepers count their age bound from here (sweep::gate).
            let done_up_to = acks.done_up_to(clock.read_up_to());
            match mirror_once(&mirror, &pool, &saved, done_up_to).await {
                Ok(()) => mirrored = saved.clone(),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot mirror the checkpoint into MySQL; will retry")
                }
            }
            last_mirror = Instant::now();
        }
        if stopping {
            tracing::info!(checkpoint = %saved, "final checkpoint written");
            return Ok(saved);
        }
    }
}

async fn mirror_once(
    mirror: &MysqlMirror,
    pool: &mysql_async::Pool,
    position: &BinlogPosition,
    stream_at: Option<u64>,
) -> anyhow::Result<()> {
    let mut conn = pool.get_conn().await?;
    mirror.save(&mut conn, position, stream_at).await?;
    Ok(())
}
