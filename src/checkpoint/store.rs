//! Where checkpoints are kept: sled on local disk (primary), MySQL (mirror for takeover), memory
//! (tests).
//!
//! [`CheckpointStore`] is the seam over sled (0.34, beta on-disk format): the pipeline names only
//! the trait, so the store can be swapped without touching it.

use super::history::{self, CheckpointHistory};
use crate::binlog::BinlogPosition;
use mysql_async::prelude::*;
use std::path::Path;

/// A checkpoint store failed; the relay stops rather than run without durable progress (its
/// MySQL mirror's faults are retried: [`crate::error::PipelineError::class`]).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("checkpoint store at {path}: {source}")]
    Sled { path: String, source: sled::Error },
    #[error("stored checkpoint is unreadable: {0}")]
    Corrupt(String),
    #[error("checkpoint mirror in MySQL: {0}")]
    Mysql(#[from] mysql_async::Error),
    #[error(
        "checkpoint mirror not written: leadership epoch {0} is over (another instance leads)"
    )]
    Fenced(u64),
}

/// Durable storage of one checkpoint.
///
/// Guarantee of an implementation: after `save` returns `Ok`, `load` returns that position (or a
/// later one) even after a crash of the process or the machine.
pub trait CheckpointStore: Send + Sync + 'static {
    /// The last saved position, if any.
    fn load(&self) -> Result<Option<BinlogPosition>, StoreError>;
    /// Saves `position` durably (fsync).
    fn save(&self, position: &BinlogPosition) -> Result<(), StoreError>;
    /// Offers a saved `position` to the checkpoint history, if the store keeps one (best
    /// effort: rate-limited inside, failures are logged). The default keeps none.
    fn record_history(&self, _position: &BinlogPosition) {}
}

const CHECKPOINT_KEY: &[u8] = b"checkpoint";

/// The sled-backed store in `relay.checkpoint_dir`.
pub struct SledStore {
    db: sled::Db,
    path: String,
    history: CheckpointHistory,
}

impl SledStore {
    /// Opens (or creates) the store in `dir`. sled locks its directory; a store closed a moment
    /// ago (its flusher thread still ending) is waited for up to 5 s.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let path = dir.display().to_string();
        let sled_err = |source| StoreError::Sled {
            path: path.clone(),
            source,
        };
        let db = open_sled(dir).map_err(sled_err)?;
        let tree = db.open_tree(history::TREE).map_err(sled_err)?;
        let history = CheckpointHistory::new(tree);
        Ok(SledStore { db, path, history })
    }

    /// The checkpoint history kept beside the checkpoint (for `replay`).
    pub fn history(&self) -> &CheckpointHistory {
        &self.history
    }

    fn err(&self, source: sled::Error) -> StoreError {
        StoreError::Sled {
            path: self.path.clone(),
            source,
        }
    }
}

impl CheckpointStore for SledStore {
    fn load(&self) -> Result<Option<BinlogPosition>, StoreError> {
        let Some(bytes) = self.db.get(CHECKPOINT_KEY).map_err(|e| self.err(e))? else {
            return Ok(None);
        };
        let text =
            String::from_utf8(bytes.to_vec()).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        BinlogPosition::from_json(&text)
            .map(Some)
            .map_err(StoreError::Corrupt)
    }

    fn save(&self, position: &BinlogPosition) -> Result<(), StoreError> {
        self.db
            .insert(CHECKPOINT_KEY, position.to_json().as_bytes())
            .map_err(|e| self.err(e))?;
        self.db.flush().map_err(|e| self.err(e))?;
        Ok(())
    }

    fn record_history(&self, position: &BinlogPosition) {
        if let Err(e) = self.history.record(position) {
            tracing::warn!(error = %e, "cannot record the checkpoint history (replay by time may start earlier)");
        }
    }
}

/// Opens the sled database in `dir`, waiting up to 5 s while it is still locked by a database
/// closed a moment ago (sled's flusher thread outlives the handle briefly).
pub(crate) fn open_sled(dir: &Path) -> Result<sled::Db, sled::Error> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match sled::Config::new()
            .path(dir)
            .mode(sled::Mode::LowSpace)
            .open()
        {
            Err(sled::Error::Io(e)) if is_locked(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            opened => return opened,
        }
    }
}

/// True for sled's "another process (or a store not yet closed) holds this directory": sled
/// 0.34 reports it as an `Other` error with this text, not as `WouldBlock`.
fn is_locked(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::WouldBlock
        || error.to_string().contains("could not acquire lock")
}

/// An in-memory store, for tests of pure pipeline logic. It tells waiting tests about each save
/// ([`MemoryStore::saves`]), so a test waits for the checkpoint it expects instead of polling.
#[cfg(any(test, feature = "test-utils"))]
pub struct MemoryStore {
    position: tokio::sync::watch::Sender<Option<BinlogPosition>>,
}

#[cfg(any(test, feature = "test-utils"))]
impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            position: tokio::sync::watch::Sender::new(None),
        }
    }
}

#[cfg(any(test, feature = "test-utils"))]
impl MemoryStore {
    /// The saved position, woken at every save (see `test_utils::wait_notified`).
    pub fn saves(&self) -> tokio::sync::watch::Receiver<Option<BinlogPosition>> {
        self.position.subscribe()
    }
}

#[cfg(any(test, feature = "test-utils"))]
impl CheckpointStore for MemoryStore {
    fn load(&self) -> Result<Option<BinlogPosition>, StoreError> {
        Ok(self.position.borrow().clone())
    }

    fn save(&self, position: &BinlogPosition) -> Result<(), StoreError> {
        self.position.send_replace(Some(position.clone()));
        Ok(())
    }
}

/// The copy of the checkpoint in `outbox_relay_state`, one row per `relay.name`, so that another
/// instance (or a replacement machine without the sled directory) can resume.
///
/// A fenced mirror ([`MysqlMirror::fenced`] with a leadership's fence) writes only while that
/// leadership's epoch is the current one, so a deposed leader cannot move the shared checkpoint;
/// a write refused for that reason ends the fence (the leader stops sending too).
#[derive(Debug, Clone)]
pub struct MysqlMirror {
    name: String,
    fence: crate::leader::Fence,
}

impl MysqlMirror {
    pub fn new(name: impl Into<String>) -> Self {
        MysqlMirror {
            name: name.into(),
            fence: crate::leader::Fence::open(),
        }
    }

    /// This mirror, writing only while `leader_epoch` is `fence`'s epoch (and ending `fence` when
    /// it is not); an open fence (no election) leaves it unfenced.
    pub fn fenced(self, fence: crate::leader::Fence) -> Self {
        MysqlMirror { fence, ..self }
    }

    /// The mirrored position, if any.
    pub async fn load(
        &self,
        conn: &mut mysql_async::Conn,
    ) -> Result<Option<BinlogPosition>, StoreError> {
        let text: Option<Option<String>> = conn
            .exec_first(
                "SELECT checkpoint FROM outbox_relay_state WHERE name = ?",
                (&self.name,),
            )
            .await?;
        match text.flatten() {
            Some(text) => BinlogPosition::from_json(&text)
                .map(Some)
                .map_err(StoreError::Corrupt),
            None => Ok(None),
        }
    }

    /// Writes `position` to the mirror row, and `stream_at` (unix seconds: how far the stream
    /// had read, see [`crate::binlog::StreamClock`]) when given: the standbys' sweepers stay
    /// behind it.
    pub async fn save(
        &self,
        conn: &mut mysql_async::Conn,
        position: &BinlogPosition,
        stream_at: Option<u64>,
    ) -> Result<(), StoreError> {
        self.save_position(conn, position).await?;
        if let Some(secs) = stream_at {
            self.save_stream_at(conn, secs).await?;
        }
        Ok(())
    }

    async fn save_position(
        &self,
        conn: &mut mysql_async::Conn,
        position: &BinlogPosition,
    ) -> Result<(), StoreError> {
        if let Some(epoch) = self.fence.epoch() {
            conn.exec_drop(
                "UPDATE outbox_relay_state SET checkpoint = ?, checkpoint_at = NOW(3) \
                 WHERE name = ? AND leader_epoch = ?",
                (position.to_json(), &self.name, epoch),
            )
            .await?;
            if conn.affected_rows() == 0 {
                self.fence.end(
                    crate::metrics::LeadershipEnd::MIRROR_REFUSED,
                    format_args!(
                        "the checkpoint mirror refused epoch {epoch} (another instance took over)"
                    ),
                );
                return Err(StoreError::Fenced(epoch));
            }
            return Ok(());
        }
        conn.exec_drop(
            "INSERT INTO outbox_relay_state (name, checkpoint, checkpoint_at) VALUES (?, ?, NOW(3)) \
             ON DUPLICATE KEY UPDATE checkpoint = VALUES(checkpoint), checkpoint_at = VALUES(checkpoint_at)",
            (&self.name, position.to_json()),
        )
        .await?;
        Ok(())
    }

    /// Writes `stream_at`; a table without the column (migration 0011 not applied) is warned
    /// about once: the standbys then stay behind `checkpoint_at`, as before it.
    async fn save_stream_at(
        &self,
        conn: &mut mysql_async::Conn,
        secs: u64,
    ) -> Result<(), StoreError> {
        static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let written = conn
            .exec_drop(
                "UPDATE outbox_relay_state SET stream_at = FROM_UNIXTIME(?) WHERE name = ?",
                (secs, &self.name),
            )
            .await;
        match written {
            Err(e) if crate::db::is_unknown_column(&e) => {
                if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        "outbox_relay_state has no stream_at column (run `outbox-relay migrate`): \
                        standby sweepers may race a leader that catches up on a backlog"
                    );
                }
                Ok(())
            }
            other => Ok(other?),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_waits_for_a_store_closed_a_moment_later() {
        let dir = tempfile::tempdir().unwrap();
        let first = SledStore::open(dir.path()).unwrap();
        let path = dir.path().to_path_buf();
        let second = std::thread::spawn(move || SledStore::open(&path).map(|_| ()));
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(first);
        second
            .join()
            .unwrap()
            .expect("opened once the first store closed");
    }

    #[test]
    fn sled_store_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let position = BinlogPosition {
            mariadb_gtid: Some("0-1-42".parse().unwrap()),
            ..BinlogPosition::default()
        };
        {
            let store = SledStore::open(dir.path()).unwrap();
            assert_eq!(store.load().unwrap(), None);
            store.save(&position).unwrap();
        }
        let store = SledStore::open(dir.path()).unwrap();
        assert_eq!(store.load().unwrap(), Some(position));
    }
}
