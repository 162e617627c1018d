//! GTID positions: MariaDB's `domain-server-seq` lists and MySQL's GTID sets.
//!
//! Guarantee: `parse(format(x)) == x` for both kinds, and adding a transaction's GTID never
//! loses one already recorded.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// A malformed GTID text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid GTID {text:?}: {reason}")]
pub struct GtidParseError {
    pub text: String,
    pub reason: &'static str,
}

fn bad(text: &str, reason: &'static str) -> GtidParseError {
    GtidParseError {
        text: text.to_string(),
        reason,
    }
}

/// One MariaDB GTID: `domain-server-seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MariaDbGtid {
    pub domain: u32,
    pub server: u32,
    pub seq: u64,
}

impl fmt::Display for MariaDbGtid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.domain, self.server, self.seq)
    }
}

impl FromStr for MariaDbGtid {
    type Err = GtidParseError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut parts = text.trim().splitn(3, '-');
        let mut next = |what| {
            parts
                .next()
                .ok_or_else(|| bad(text, what))?
                .parse()
                .map_err(|_| bad(text, what))
        };
        let domain = next("domain id is not a number")? as u32;
        let server = next("server id is not a number")? as u32;
        let seq = next("sequence number is not a number")?;
        Ok(MariaDbGtid {
            domain,
            server,
            seq,
        })
    }
}

/// A MariaDB GTID position (`gtid_slave_pos` format): the last GTID of each replication domain.
/// Resuming with `@slave_connect_state` set to it starts right after those transactions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MariaDbGtidPos {
    by_domain: BTreeMap<u32, MariaDbGtid>,
}

impl MariaDbGtidPos {
    /// Records a committed transaction: it becomes its domain's position.
    pub fn apply(&mut self, gtid: MariaDbGtid) {
        self.by_domain.insert(gtid.domain, gtid);
    }

    pub fn is_empty(&self) -> bool {
        self.by_domain.is_empty()
    }

    /// The GTID recorded for `domain`.
    pub fn get(&self, domain: u32) -> Option<MariaDbGtid> {
        self.by_domain.get(&domain).copied()
    }

    /// True when every domain of `self` is at or past `other`'s position.
    pub fn covers(&self, other: &MariaDbGtidPos) -> bool {
        other
            .by_domain
            .values()
            .all(|g| self.get(g.domain).is_some_and(|mine| mine.seq >= g.seq))
    }
}

impl fmt::Display for MariaDbGtidPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.by_domain.values().map(ToString::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

impl FromStr for MariaDbGtidPos {
    type Err = GtidParseError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut pos = MariaDbGtidPos::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let gtid: MariaDbGtid = part.parse()?;
            if pos.by_domain.contains_key(&gtid.domain) {
                return Err(bad(text, "a domain appears twice"));
            }
            pos.apply(gtid);
        }
        Ok(pos)
    }
}

/// A MySQL source id: the server UUID, with an optional tag (MySQL 8.4 `uuid:tag:n`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MySqlSource {
    /// Lower-case canonical UUID text.
    pub uuid: String,
    /// Lower-case tag, if any.
    pub tag: Option<String>,
}

impl MySqlSource {
    /// A source from 16 raw UUID bytes (as in a binlog GTID event).
    pub fn from_uuid_bytes(bytes: [u8; 16], tag: Option<String>) -> Self {
        MySqlSource {
            uuid: uuid::Uuid::from_bytes(bytes).hyphenated().to_string(),
            tag,
        }
    }
}

fn parse_uuid(text: &str, whole: &str) -> Result<String, GtidParseError> {
    uuid::Uuid::parse_str(text.trim())
        .map(|u| u.hyphenated().to_string())
        .map_err(|_| bad(whole, "source is not a UUID"))
}

fn is_tag(text: &str) -> bool {
    let mut chars = text.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && text.len() <= 32
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A MySQL GTID set: for each source, sorted disjoint intervals of transaction numbers.
/// Text form: `uuid:1-5:7,uuid2:1-3` (and `uuid:tag:1-4` on MySQL 8.4).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MySqlGtidSet {
    /// Half-open `[start, end)` intervals, sorted, disjoint, not adjacent.
    sources: BTreeMap<MySqlSource, Vec<(u64, u64)>>,
}

impl MySqlGtidSet {
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// True when transaction `gno` of `source` is in the set.
    pub fn contains(&self, source: &MySqlSource, gno: u64) -> bool {
        self.sources
            .get(source)
            .is_some_and(|ivs| ivs.iter().any(|&(s, e)| s <= gno && gno < e))
    }

    /// Adds one transaction.
    pub fn add(&mut self, source: MySqlSource, gno: u64) {
        self.add_interval(source, gno, gno + 1);
    }

    /// Adds `[start, end)` for `source`, merging with what is there.
    pub fn add_interval(&mut self, source: MySqlSource, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let ivs = self.sources.entry(source).or_default();
        ivs.push((start, end));
        ivs.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ivs.len());
        for &(s, e) in ivs.iter() {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        *ivs = merged;
    }

    /// True when every transaction of `other` is in `self`.
    pub fn covers(&self, other: &MySqlGtidSet) -> bool {
        other.sources.iter().all(|(source, ivs)| {
            let mine = self.sources.get(source).map(Vec::as_slice).unwrap_or(&[]);
            ivs.iter()
                .all(|&(s, e)| mine.iter().any(|&(ms, me)| ms <= s && e <= me))
        })
    }

    /// Adds every transaction of `other`.
    pub fn union(&mut self, other: &MySqlGtidSet) {
        for (source, ivs) in &other.sources {
            for &(s, e) in ivs {
                self.add_interval(source.clone(), s, e);
            }
        }
    }

    /// `(source, [start, end))` for every interval, for COM_BINLOG_DUMP_GTID.
    pub fn intervals(&self) -> impl Iterator<Item = (&MySqlSource, u64, u64)> {
        self.sources
            .iter()
            .flat_map(|(src, ivs)| ivs.iter().map(move |&(s, e)| (src, s, e)))
    }
}

impl fmt::Display for MySqlGtidSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // MySQL prints one entry per UUID, with `:tag:intervals` groups inside it.
        let mut by_uuid: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (source, ivs) in &self.sources {
            let ranges: Vec<String> = ivs
                .iter()
                .map(|&(s, e)| {
                    if e - s == 1 {
                        s.to_string()
                    } else {
                        format!("{s}-{}", e - 1)
                    }
                })
                .collect();
            let group = match &source.tag {
                Some(tag) => format!("{tag}:{}", ranges.join(":")),
                None => ranges.join(":"),
            };
            by_uuid.entry(source.uuid.as_str()).or_default().push(group);
        }
        let entries: Vec<String> = by_uuid
            .into_iter()
            .map(|(uuid, mut groups)| {
                // Untagged intervals come first, as MySQL prints them.
                groups
                    .sort_by_key(|g| g.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'));
                format!("{uuid}:{}", groups.join(":"))
            })
            .collect();
        f.write_str(&entries.join(","))
    }
}

impl FromStr for MySqlGtidSet {
    type Err = GtidParseError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut set = MySqlGtidSet::default();
        let cleaned: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        for entry in cleaned.split(',').filter(|e| !e.is_empty()) {
            let mut parts = entry.split(':');
            let uuid = parse_uuid(parts.next().unwrap_or_default(), text)?;
            let mut tag: Option<String> = None;
            let mut saw_interval = false;
            for part in parts {
                if is_tag(part) {
                    tag = Some(part.to_ascii_lowercase());
                    continue;
                }
                let (s, e) = match part.split_once('-') {
                    Some((s, e)) => (s, e),
                    None => (part, part),
                };
                let s: u64 = s
                    .parse()
                    .map_err(|_| bad(text, "interval is not a number"))?;
                let e: u64 = e
                    .parse()
                    .map_err(|_| bad(text, "interval is not a number"))?;
                if s == 0 || e < s {
                    return Err(bad(text, "interval must be 1-based and ascending"));
                }
                let source = MySqlSource {
                    uuid: uuid.clone(),
                    tag: tag.clone(),
                };
                set.add_interval(source, s, e + 1);
                saw_interval = true;
            }
            if !saw_interval {
                return Err(bad(text, "a source has no interval"));
            }
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests;
