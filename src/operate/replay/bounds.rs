//! Where a replay starts and ends: GTID and time arguments, and the checkpoint history in the
//! relay's sled directory.

use crate::binlog::BinlogPosition;
use crate::checkpoint::history::{CheckpointHistory, HistoryEntry};
use crate::checkpoint::store::StoreError;
use crate::checkpoint::SledStore;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Parses `--from-gtid` / `--to-gtid`: a MariaDB GTID position (`0-1-100[,1-2-7]`) or a MySQL
/// GTID set (`uuid:1-100[,…]`).
pub fn parse_gtid_position(text: &str) -> Result<BinlogPosition, String> {
    let mut position = BinlogPosition::default();
    if text.contains(':') {
        position.mysql_gtid_set = Some(text.parse().map_err(|e| format!("{e}"))?);
    } else {
        position.mariadb_gtid = Some(text.parse().map_err(|e| format!("{e}"))?);
    }
    if position.is_unknown() {
        return Err(format!("{text:?} is an empty GTID position"));
    }
    Ok(position)
}

/// Parses `--from-time` / `--to-time`: a UTC time (`2025-06-01 13:00:00`, or RFC 3339 ending
/// in `Z`; other offsets are refused) or a duration ago (`90m`).
pub fn parse_time(text: &str) -> Result<SystemTime, String> {
    if let Ok(time) = humantime::parse_rfc3339_weak(text.trim()) {
        return Ok(time);
    }
    match humantime::parse_duration(text.trim()) {
        Ok(ago) => Ok(SystemTime::now() - ago),
        Err(_) => Err(format!(
            "{text:?} is neither a UTC time (2025-06-01 13:00:00, or …T13:00:00Z) nor a duration ago (90m)"
        )),
    }
}

/// Unix seconds of `time` (for `Replay::to_time`).
pub fn unix_seconds(time: SystemTime) -> u32 {
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    u32::try_from(secs).unwrap_or(u32::MAX)
}

pub(super) fn format_unix(secs: u32) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs.into())).to_string()
}

/// The newest saved checkpoint at or before `time` (where `--from-time` starts).
pub fn checkpoint_at_or_before(
    history: &CheckpointHistory,
    time: SystemTime,
) -> anyhow::Result<HistoryEntry> {
    let millis = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    if let Some(entry) = history.at_or_before(millis)? {
        return Ok(entry);
    }
    let oldest = history.list()?.into_iter().next();
    match oldest {
        Some(oldest) => anyhow::bail!(
            "no checkpoint was saved at or before {}: the oldest in the history is #{} at {}; \
             use --from-checkpoint {} or --from-gtid",
            humantime::format_rfc3339_seconds(time),
            oldest.number,
            format_millis(oldest.at_millis),
            oldest.number
        ),
        None => anyhow::bail!(
            "the checkpoint history is empty (the relay records one entry per minute while it \
             runs): use --from-gtid"
        ),
    }
}

/// Opens the sled store in `dir` to read its checkpoint history; a directory locked by a
/// running relay is an error that says what to do.
pub fn open_history_store(dir: &Path) -> anyhow::Result<SledStore> {
    if !dir.is_dir() {
        anyhow::bail!(
            "no checkpoint directory at {}: the history is kept in the relay's relay.checkpoint_dir \
             (pass the relay's config with -c, or --checkpoint-dir)",
            dir.display()
        );
    }
    SledStore::open(dir).map_err(|e| match e {
        StoreError::Sled {
            source: sled::Error::Io(io),
            ..
        } if is_lock_conflict(&io) => anyhow::anyhow!(
            "the checkpoint directory {0} is locked by a running relay: stop the relay or copy \
             the directory (cp -r {0} /tmp/relay-state-copy) and pass \
             --checkpoint-dir /tmp/relay-state-copy",
            dir.display()
        ),
        other => other.into(),
    })
}

/// sled reports a directory locked by another process as an `Other` error whose text says so
/// (wrapping the `WouldBlock` of the file lock).
fn is_lock_conflict(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::WouldBlock
        || error.to_string().contains("could not acquire lock")
}

/// A history time for people: `2025-06-01T13:00:00.123Z`.
pub fn format_millis(millis: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(millis)).to_string()
}
