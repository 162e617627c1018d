//! What the key-order guard knows of one outbox table without asking: whether every waiting row
//! the stream has read past is its own.
//!
//! A table is *clean* when no row other than the ones the stream carries waits (PENDING or
//! SENDING) with an id up to the highest id the stream has read of it (`read_max`). Then a batch
//! whose ids follow on from `read_max` with no gap needs no question at all: an older row of one
//! of its keys that waits would have to be one the stream carries. A gap (ids the stream has not
//! read: a rolled-back insert, a row written with the binlog off, one committed later) is asked
//! about as a range of ids, after the dispatcher read on briefly for them. A waiting row found
//! there (a *suspect*) is mostly another writer's older id committed just after the batch, which
//! the stream reads next; until it does (at most [`SETTLE`]: otherwise it is not in the binlog
//! and the table is no longer clean) the later events of its key are held ([`Known::blocking`]):
//! it is the only waiting row up to `read_max` that is not the stream's.
//!
//! The table becomes clean by a *look*: a query, off the stream's path, for the ids of the
//! waiting rows up to `read_max`; clean when each is the stream's (carried, or read within
//! [`SETTLE`] of the look). It stays clean only while looks
//! keep confirming it ([`FRESH`]), because some changes reach no binlog the stream reads and
//! cannot be seen otherwise: a row put back to PENDING (`retry`, `resend`, or by hand), written
//! with `sql_log_bin = 0` below `read_max`. Anything the stream itself does that leaves a row
//! waiting without carrying it (parking a stalled topic's events or an XA transaction, catching
//! up past rows someone else claimed, a failed question) ends it at once ([`Known::spoil`]).

use crate::outbox::TableName;
use crate::sweep::waiting::{waiting_ids, OrderKey, WaitingRow};
use mysql_async::Pool;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// How often a clean table is looked at again while batches flow.
pub const LOOK_EVERY: Duration = Duration::from_millis(100);

/// How long a look's answer counts: after this without a newer confirming look the table is
/// asked about by key again (a look that takes longer is no use).
pub const FRESH: Duration = Duration::from_millis(300);

/// How long a waiting row the stream has not read may take to reach it: a row committed just
/// before a look or a gap question, behind the stream's position (another writer's commit of an
/// older id), is read within this; one still unread after it is not in the binlog the stream
/// reads (written with the binlog off), and the table is no longer clean. A look is judged this
/// long after it was issued.
pub const SETTLE: Duration = Duration::from_millis(50);

/// A look reads at most this many waiting ids (more: not clean).
const LOOK_LIMIT: usize = 20_000;

/// A look in flight.
struct Look {
    task: JoinHandle<Result<Vec<u64>, mysql_async::Error>>,
    issued: Instant,
    /// `read_max` when it was issued: what it asked about.
    up_to: u64,
    generation: u64,
    limit: usize,
    /// The table's rows the stream carried when it was issued: one done since (recorded, so no
    /// longer carried) may still have been waiting when the look read.
    carried: HashSet<u64>,
    /// The table's rows up to `up_to` the stream read since it was issued (see [`SETTLE`]).
    read: HashSet<u64>,
}

/// See the module docs.
#[derive(Default)]
pub struct Known {
    /// The highest id the stream has read of the table.
    read_max: u64,
    /// When the look that last confirmed the table clean was issued; `None`: not clean.
    clean_since: Option<Instant>,
    /// Moves on at every [`Known::spoil`]: a look issued before answers nothing.
    generation: u64,
    look: Option<Look>,
    last_look: Option<Instant>,
    /// Waiting rows found in a gap that the stream has not read yet: their keys, and since when
    /// ([`SETTLE`]).
    suspects: HashMap<u64, (OrderKey, Instant)>,
}

/// What to ask before a batch of the table is handed on.
#[derive(Debug, PartialEq, Eq)]
pub enum Question {
    /// Nothing: the table is clean and the batch's ids follow on from what was read.
    None,
    /// The waiting rows with ids in this range (inclusive): the ids the stream skipped.
    Gap(u64, u64),
    /// Each key's older waiting rows (the table is not known to be clean).
    Keys,
}

impl Question {
    /// Its `asked` label on `/metrics`.
    pub fn label(&self) -> &'static str {
        use crate::metrics::KeyOrderAsked;
        match self {
            Question::None => KeyOrderAsked::NONE,
            Question::Gap(..) => KeyOrderAsked::GAP,
            Question::Keys => KeyOrderAsked::KEYS,
        }
    }
}

impl Known {
    /// Whether the table is clean now.
    pub fn is_clean(&self) -> bool {
        self.clean_since.is_some_and(|at| at.elapsed() < FRESH)
    }

    /// Something may have left a row waiting that the stream does not carry: ask by key until a
    /// look finds the table clean again.
    pub fn spoil(&mut self) {
        self.clean_since = None;
        self.generation += 1;
        self.suspects.clear();
    }

    /// Waiting rows found in a gap, not the stream's: expected in the binlog shortly (see
    /// [`SETTLE`]).
    pub fn suspect(&mut self, rows: impl IntoIterator<Item = WaitingRow>) {
        let now = Instant::now();
        for row in rows {
            self.suspects.entry(row.id).or_insert((row.key, now));
        }
    }

    /// Of `keys` (each with the newest id of its events in a batch), those an older suspect
    /// waits for, with the oldest such suspect's id. In a clean table the suspects are the only
    /// waiting rows up to `read_max` that are not the stream's, so this is what asking by key
    /// would answer.
    pub fn blocking(&self, keys: &[(OrderKey, u64)]) -> HashMap<OrderKey, u64> {
        let mut oldest: HashMap<OrderKey, u64> = HashMap::new();
        if self.suspects.is_empty() {
            return oldest;
        }
        let newest: HashMap<&OrderKey, u64> = keys.iter().map(|(key, id)| (key, *id)).collect();
        for (&id, (key, _)) in &self.suspects {
            if newest.get(key).is_some_and(|&newest| id < newest) {
                let bound = oldest.entry(key.clone()).or_insert(id);
                *bound = (*bound).min(id);
            }
        }
        oldest
    }

    /// Whether a batch of the table with row ids `ids` would be asked about ids the stream has
    /// not read: the table is clean, and the batch skips ids after `read_max` or leaves rows
    /// found in an earlier gap unread. Those are mostly other writers' older ids committed a
    /// moment later, next in the binlog: the dispatcher reads on for up to
    /// [`crate::pipeline::key_order::GAP_WAIT`] before it asks ([`Question::Gap`] is a round
    /// trip on the stream's path, and rows it finds make batches ask by key for up to
    /// [`SETTLE`]).
    pub fn skips(&self, ids: &HashSet<u64>) -> bool {
        if !self.is_clean() {
            return false;
        }
        let mut sorted: Vec<u64> = ids.iter().copied().collect();
        sorted.sort_unstable();
        gap(self.read_max, &sorted).is_some() || self.suspects.keys().any(|id| !ids.contains(id))
    }

    /// The question for a batch of the table with row ids `ids`, which the stream then counts as
    /// read; and whether the batch brought a suspect (a key held for it may go on).
    pub fn question(&mut self, ids: impl IntoIterator<Item = u64>) -> (Question, bool) {
        let mut ids: Vec<u64> = ids.into_iter().collect();
        ids.sort_unstable();
        let mut arrived = false;
        if !self.suspects.is_empty() {
            for id in &ids {
                arrived |= self.suspects.remove(id).is_some();
            }
        }
        if let Some(look) = &mut self.look {
            // Only ids it asked about can be in its answer: the late commits below `up_to`.
            look.read
                .extend(ids.iter().copied().filter(|&id| id <= look.up_to));
        }
        if self.suspects.values().any(|(_, at)| at.elapsed() >= SETTLE) {
            self.spoil(); // a row the stream will not read waits
        }
        let question = match (self.is_clean(), gap(self.read_max, &ids)) {
            (true, Some((from, to))) => Question::Gap(from, to),
            (true, None) => Question::None,
            (false, _) => Question::Keys,
        };
        self.read_max = self.read_max.max(ids.last().copied().unwrap_or(0));
        (question, arrived)
    }

    /// Takes the answer of a look finished and [`SETTLE`]d: clean when every waiting id it read
    /// is the stream's (carried then or now, `carried`, or read since), no spoil came since it
    /// was issued, and it read fewer than its limit.
    pub fn take_look(&mut self, carried: impl Fn(u64) -> bool) {
        let settled = |look: &Look| look.task.is_finished() && look.issued.elapsed() >= SETTLE;
        if !self.look.as_ref().is_some_and(settled) {
            return;
        }
        let look = self.look.take().expect("finished");
        let answer = match futures_util::FutureExt::now_or_never(look.task) {
            Some(Ok(Ok(ids))) => ids,
            Some(Ok(Err(e))) => {
                tracing::debug!(error = %e, "a look for waiting rows failed; asking by key");
                return;
            }
            _ => return,
        };
        if look.generation != self.generation {
            return;
        }
        let own = |id: &u64| look.carried.contains(id) || look.read.contains(id) || carried(*id);
        let clean = answer.len() < look.limit && answer.iter().all(own);
        if !clean {
            self.spoil();
            return;
        }
        // Clean all along (no spoil, no lapse): what was read since was asked about by gap.
        // Otherwise only what the look asked about is known; later ids count as a gap.
        if !self.is_clean() {
            self.read_max = look.up_to;
        }
        self.clean_since = Some(look.issued);
    }

    /// Issues a look at `table` when one is due ([`LOOK_EVERY`]; none in flight; something
    /// read). `carried` are the table's rows the stream carries: more waiting ids than those, and
    /// some are not its own.
    pub fn look_if_due(
        &mut self,
        pool: &Pool,
        table: &Arc<TableName>,
        carried: impl Iterator<Item = u64>,
    ) {
        let due = self.look.is_none()
            && self.read_max > 0
            && self.last_look.is_none_or(|at| at.elapsed() >= LOOK_EVERY);
        if !due {
            return;
        }
        let carried: HashSet<u64> = carried.collect();
        let (pool, table_name) = (pool.clone(), Arc::clone(table));
        let (up_to, limit) = (self.read_max, (carried.len() + 1).min(LOOK_LIMIT));
        let task = tokio::spawn(crate::db::bounded(async move {
            let mut conn = pool.get_conn().await?;
            waiting_ids(&mut conn, &table_name, (0, up_to), limit).await
        }));
        let issued = Instant::now();
        self.last_look = Some(issued);
        self.look = Some(Look {
            task,
            issued,
            up_to,
            generation: self.generation,
            limit,
            carried,
            read: HashSet::new(),
        });
    }
}

/// The range from the first to the last id after `read_max` missing from `ids` (sorted), if any.
fn gap(read_max: u64, ids: &[u64]) -> Option<(u64, u64)> {
    let mut expected = read_max + 1;
    let mut range: Option<(u64, u64)> = None;
    for &id in ids.iter().filter(|&&id| id > read_max) {
        if id > expected {
            let from = range.map_or(expected, |(from, _)| from);
            range = Some((from, id - 1));
        }
        expected = expected.max(id + 1);
    }
    range
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_follow_on_leave_no_gap() {
        assert_eq!(gap(10, &[11, 12, 13]), None);
        // Late commits below what was read are the stream's own now: no gap either.
        assert_eq!(gap(10, &[4, 11, 12]), None);
        assert_eq!(gap(10, &[]), None);
    }

    #[test]
    fn skipped_ids_are_one_range_from_the_first_to_the_last() {
        assert_eq!(gap(10, &[13]), Some((11, 12)));
        assert_eq!(gap(10, &[11, 13, 14, 17]), Some((12, 16)));
        assert_eq!(gap(0, &[5, 6]), Some((1, 4)));
    }

    /// A row of key `key` (topic "t") waiting with id `id`.
    fn row(id: u64, key: &str) -> WaitingRow {
        WaitingRow {
            id,
            key: OrderKey::new("t", key),
            sending: false,
        }
    }

    fn asked(known: &mut Known, ids: impl IntoIterator<Item = u64>) -> Question {
        known.question(ids).0
    }

    #[test]
    fn a_table_not_known_clean_is_asked_by_key_and_its_ids_count_as_read() {
        let mut known = Known::default();
        assert_eq!(asked(&mut known, [7, 5]), Question::Keys);
        assert_eq!(known.read_max, 7);
        known.clean_since = Some(Instant::now());
        assert_eq!(asked(&mut known, [8, 9]), Question::None);
        assert_eq!(asked(&mut known, [12]), Question::Gap(10, 11));
        known.spoil();
        assert_eq!(asked(&mut known, [13]), Question::Keys);
    }

    #[test]
    fn rows_found_in_a_gap_hold_their_keys_until_the_stream_reads_them() {
        let mut known = Known {
            clean_since: Some(Instant::now()),
            read_max: 10,
            ..Known::default()
        };
        assert_eq!(asked(&mut known, [12]), Question::Gap(11, 11));
        known.suspect([row(11, "a")]);
        // Nothing to ask: the suspect is the only row that may wait, and it holds only its key's
        // later events.
        assert_eq!(asked(&mut known, [13]), Question::None);
        let (a, b) = (OrderKey::new("t", "a"), OrderKey::new("t", "b"));
        let blocking = known.blocking(&[(a.clone(), 13), (b.clone(), 13)]);
        assert_eq!(blocking, HashMap::from([(a.clone(), 11)]));
        assert!(known.blocking(&[(a.clone(), 11)]).is_empty(), "not older");
        assert_eq!(
            known.question([11, 14]),
            (Question::None, true),
            "11 was a late commit"
        );
        assert!(known.blocking(&[(a, 15)]).is_empty());
        // One never read: after SETTLE the table is no longer known clean.
        known.suspect([row(9, "b")]);
        known.suspects.get_mut(&9).unwrap().1 = Instant::now() - SETTLE;
        assert_eq!(asked(&mut known, [15]), Question::Keys);
        assert!(!known.is_clean() && known.suspects.is_empty());
    }

    #[test]
    fn a_clean_table_skips_what_a_batch_leaves_unread() {
        let ids = |ids: &[u64]| ids.iter().copied().collect::<HashSet<u64>>();
        let mut known = Known {
            clean_since: Some(Instant::now()),
            read_max: 10,
            ..Known::default()
        };
        assert!(!known.skips(&ids(&[11, 12])));
        assert!(known.skips(&ids(&[11, 13])), "12 is not read yet");
        known.suspect([row(12, "a")]);
        assert!(known.skips(&ids(&[11])), "12 was found waiting and is not read yet");
        assert!(!known.skips(&ids(&[11, 12])));
        known.spoil();
        assert!(!known.skips(&ids(&[11, 13])), "asked by key whatever comes next");
    }

    #[test]
    fn a_confirmation_lapses() {
        let mut known = Known {
            clean_since: Some(Instant::now() - FRESH),
            read_max: 3,
            ..Known::default()
        };
        assert_eq!(asked(&mut known, [4]), Question::Keys);
    }
}
