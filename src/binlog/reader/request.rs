//! The dump request's GTID set, and what a failed stream means (retry, or stop for good).

use super::super::gtid::{MySqlGtidSet, MySqlSource};
use super::super::position::BinlogPosition;
use super::ReaderError;
use mysql_async::{GnoInterval, Sid};

/// Why one streaming attempt ended.
pub(super) enum StreamFailure {
    Transient(String),
    Permanent(ReaderError),
}

impl From<ReaderError> for StreamFailure {
    fn from(e: ReaderError) -> Self {
        StreamFailure::Permanent(e)
    }
}

pub(super) fn classify_stream_error(
    error: mysql_async::Error,
    position: &BinlogPosition,
) -> StreamFailure {
    if let mysql_async::Error::Server(server) = &error {
        match server.code {
            // ER_MASTER_FATAL_ERROR_READING_BINLOG: purged file or GTID not in any binlog.
            1236 => {
                return StreamFailure::Permanent(ReaderError::PositionGone {
                    position: position.to_string(),
                    message: server.message.clone(),
                })
            }
            // ER_SPECIFIC_ACCESS_DENIED_ERROR, ER_ACCESS_DENIED_ERROR
            1227 | 1045 => {
                return StreamFailure::Permanent(ReaderError::NotAllowed(server.message.clone()))
            }
            _ => {}
        }
    }
    StreamFailure::Transient(error.to_string())
}

pub(super) fn sids(set: &MySqlGtidSet) -> Result<Vec<Sid<'static>>, StreamFailure> {
    let mut by_source: Vec<(MySqlSource, Vec<GnoInterval>)> = Vec::new();
    for (source, start, end) in set.intervals() {
        match by_source.last_mut() {
            Some((s, ivs)) if s == source => ivs.push(GnoInterval::new(start, end)),
            _ => by_source.push((source.clone(), vec![GnoInterval::new(start, end)])),
        }
    }
    by_source
        .into_iter()
        .map(|(source, intervals)| {
            let uuid = uuid::Uuid::parse_str(&source.uuid).expect("validated UUID");
            let mut sid = Sid::new(*uuid.as_bytes()).with_intervals(intervals);
            if let Some(tag) = source.tag {
                let tag = mysql_common::packets::Tag::new(tag).map_err(|e| {
                    StreamFailure::Permanent(ReaderError::Unsupported(format!("bad GTID tag: {e}")))
                })?;
                sid = sid.with_tag(tag);
            }
            Ok(sid)
        })
        .collect()
}
