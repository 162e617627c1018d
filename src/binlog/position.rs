//! Where in the binlog a transaction ends, and the resumable position built from those ends.

use super::gtid::{MariaDbGtid, MariaDbGtidPos, MySqlGtidSet, MySqlSource};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The GTID of one transaction, by server flavour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxGtid {
    MariaDb(MariaDbGtid),
    MySql(MySqlSource, u64),
}

/// The end of one committed transaction in the binlog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxEnd {
    pub gtid: Option<TxGtid>,
    /// Binlog file the transaction's commit event is in.
    pub file: String,
    /// Offset just past the commit event.
    pub end_pos: u64,
    /// The commit event's header timestamp: seconds since the Unix epoch, the server's clock
    /// (`replay --to-time` stops at the first transaction past its bound).
    pub timestamp: u32,
}

#[cfg(test)]
impl TxEnd {
    /// The end of a transaction without GTID at `end_pos` of `binlog.000001`, committed at
    /// `timestamp` (Unix seconds), for tests.
    pub(crate) fn sample(end_pos: u64, timestamp: u32) -> Self {
        TxEnd {
            gtid: None,
            file: "binlog.000001".into(),
            end_pos,
            timestamp,
        }
    }
}

/// A resumable binlog position: everything up to and including it has been handled.
///
/// It keeps the GTID form (MariaDB position or MySQL set) and the file/offset form side by side;
/// the reader resumes by GTID when the server has GTIDs and by file/offset otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "PositionText", into = "PositionText")]
pub struct BinlogPosition {
    pub mariadb_gtid: Option<MariaDbGtidPos>,
    pub mysql_gtid_set: Option<MySqlGtidSet>,
    pub file: Option<String>,
    pub pos: u64,
}

impl BinlogPosition {
    /// Moves the position past `tx`.
    pub fn advance(&mut self, tx: &TxEnd) {
        match &tx.gtid {
            Some(TxGtid::MariaDb(gtid)) => self
                .mariadb_gtid
                .get_or_insert_with(Default::default)
                .apply(*gtid),
            Some(TxGtid::MySql(source, gno)) => self
                .mysql_gtid_set
                .get_or_insert_with(Default::default)
                .add(source.clone(), *gno),
            None => {}
        }
        if !tx.file.is_empty() && tx.end_pos > 0 {
            self.file = Some(tx.file.clone());
            self.pos = tx.end_pos;
        }
    }

    /// True when nothing is known (resume must pick a start).
    pub fn is_unknown(&self) -> bool {
        self.mariadb_gtid
            .as_ref()
            .is_none_or(MariaDbGtidPos::is_empty)
            && self
                .mysql_gtid_set
                .as_ref()
                .is_none_or(MySqlGtidSet::is_empty)
            && self.file.is_none()
    }

    /// True when `self` is at or past `other` in every form `other` has (GTID position, GTID
    /// set, file/offset). Used to pick the furthest of two checkpoints (each is safe on its own:
    /// everything before it was recorded).
    pub fn covers(&self, other: &BinlogPosition) -> bool {
        let mariadb = match (&self.mariadb_gtid, &other.mariadb_gtid) {
            (_, None) => true,
            (Some(mine), Some(theirs)) => mine.covers(theirs),
            (None, Some(theirs)) => theirs.is_empty(),
        };
        let mysql = match (&self.mysql_gtid_set, &other.mysql_gtid_set) {
            (_, None) => true,
            (Some(mine), Some(theirs)) => mine.covers(theirs),
            (None, Some(theirs)) => theirs.is_empty(),
        };
        let file = match (&self.file, &other.file) {
            (_, None) => true,
            // Binlog names share a base and a zero-padded counter: text order is file order.
            (Some(mine), Some(theirs)) => (mine, self.pos) >= (theirs, other.pos),
            (None, Some(_)) => false,
        };
        mariadb && mysql && file
    }

    /// JSON text, as stored in sled and the MySQL mirror.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("position serialises")
    }

    /// Parses [`BinlogPosition::to_json`] output.
    pub fn from_json(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| format!("unreadable checkpoint {text:?}: {e}"))
    }
}

impl fmt::Display for BinlogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(g) = self.mariadb_gtid.as_ref().filter(|g| !g.is_empty()) {
            parts.push(format!("gtid {g}"));
        }
        if let Some(g) = self.mysql_gtid_set.as_ref().filter(|g| !g.is_empty()) {
            parts.push(format!("gtid set {g}"));
        }
        if let Some(file) = &self.file {
            parts.push(format!("{file}:{}", self.pos));
        }
        if parts.is_empty() {
            f.write_str("(none)")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// The stored form: plain strings, readable by operators.
#[derive(Serialize, Deserialize, Default)]
struct PositionText {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mariadb_gtid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mysql_gtid_set: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    #[serde(default)]
    pos: u64,
}

impl From<BinlogPosition> for PositionText {
    fn from(p: BinlogPosition) -> Self {
        PositionText {
            mariadb_gtid: p.mariadb_gtid.map(|g| g.to_string()),
            mysql_gtid_set: p.mysql_gtid_set.map(|g| g.to_string()),
            file: p.file,
            pos: p.pos,
        }
    }
}

impl TryFrom<PositionText> for BinlogPosition {
    type Error = String;
    fn try_from(t: PositionText) -> Result<Self, String> {
        Ok(BinlogPosition {
            mariadb_gtid: t
                .mariadb_gtid
                .map(|g| g.parse())
                .transpose()
                .map_err(|e| format!("{e}"))?,
            mysql_gtid_set: t
                .mysql_gtid_set
                .map(|g| g.parse())
                .transpose()
                .map_err(|e| format!("{e}"))?,
            file: t.file,
            pos: t.pos,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_compares_every_form() {
        let maria = |gtid: &str, file: &str, pos| BinlogPosition {
            mariadb_gtid: Some(gtid.parse().unwrap()),
            file: Some(file.into()),
            pos,
            ..BinlogPosition::default()
        };
        let a = maria("0-1-10", "binlog.000002", 500);
        let b = maria("0-1-12", "binlog.000003", 4);
        assert!(b.covers(&a) && !a.covers(&b));
        assert!(a.covers(&a));
        assert!(a.covers(&BinlogPosition::default()));
        assert!(!BinlogPosition::default().covers(&a));
        let mysql = |set: &str| BinlogPosition {
            mysql_gtid_set: Some(set.parse().unwrap()),
            ..BinlogPosition::default()
        };
        let uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        let small = mysql(&format!("{uuid}:1-5"));
        let big = mysql(&format!("{uuid}:1-9:11"));
        assert!(big.covers(&small) && !small.covers(&big));
        assert!(!mysql(&format!("{uuid}:1-3:5")).covers(&small));
    }

    #[test]
    fn advancing_tracks_gtids_and_file_offsets() {
        let mut p = BinlogPosition::default();
        assert!(p.is_unknown());
        p.advance(&TxEnd {
            gtid: Some(TxGtid::MariaDb("0-1-7".parse().unwrap())),
            file: "binlog.000002".into(),
            end_pos: 900,
            timestamp: 0,
        });
        p.advance(&TxEnd {
            gtid: Some(TxGtid::MariaDb("0-1-8".parse().unwrap())),
            file: "binlog.000002".into(),
            end_pos: 1200,
            timestamp: 0,
        });
        assert_eq!(p.mariadb_gtid.as_ref().unwrap().to_string(), "0-1-8");
        assert_eq!((p.file.as_deref(), p.pos), (Some("binlog.000002"), 1200));
        assert_eq!(p.to_string(), "gtid 0-1-8, binlog.000002:1200");
        let json = p.to_json();
        assert_eq!(BinlogPosition::from_json(&json).unwrap(), p);
    }

    #[test]
    fn mysql_positions_round_trip_through_json() {
        let mut p = BinlogPosition::default();
        let source = MySqlSource {
            uuid: "3e11fa47-71ca-11e1-9e33-c80aa9429562".into(),
            tag: None,
        };
        for gno in [1, 2, 3, 5] {
            p.advance(&TxEnd {
                gtid: Some(TxGtid::MySql(source.clone(), gno)),
                file: "binlog.000001".into(),
                end_pos: 100 * gno,
                timestamp: 0,
            });
        }
        assert_eq!(
            p.mysql_gtid_set.as_ref().unwrap().to_string(),
            "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-3:5"
        );
        assert_eq!(BinlogPosition::from_json(&p.to_json()).unwrap(), p);
        assert!(BinlogPosition::from_json("{\"mariadb_gtid\":\"x\"}").is_err());
    }
}
