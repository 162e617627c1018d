//! What the key-order guard knows of one outbox table without asking: for each topic, whether
//! every waiting row of that topic the stream has read past is its own.
//!
//! A topic is *clean* when no row of it other than the ones the stream carries waits (PENDING or
//! SENDING) with an id up to the highest id the stream has read of the table (`read_max`). Then a
//! batch's events of that topic whose ids follow on from `read_max` with no gap need no question
//! at all: an older row of one of their keys that waits would have to be one the stream carries.
//! Each topic is known on its own, so a stalled topic's parked rows (PENDING, not the stream's)
//! make only that topic's keys asked about: the healthy topics' go on without a question.
//!
//! A gap (ids the stream has not read: a rolled-back insert, a row written with the binlog off,
//! one committed later) is asked about as a range of ids while some topic is clean, after the
//! dispatcher read on briefly for them. A waiting row found there (a *suspect*) is mostly
//! another writer's older id committed just after the batch, which the stream reads next; until
//! it does (at most [`SETTLE`]: otherwise it is not in the binlog and its topic is no longer
//! clean) the later events of its key are held ([`Known::blocking`]): it is the only waiting row
//! of its topic up to `read_max` that is not the stream's.
//!
//! A topic becomes clean by a *look*: a query, off the stream's path, for the ids of the topic's
//! waiting rows up to `read_max` (one range of `idx_pending (status, topic)` per status, never
//! another topic's rows); clean when each is the stream's (carried, or read within [`SETTLE`]
//! of the look). It stays clean only while looks keep confirming it ([`FRESH`]), because some
//! changes reach no binlog the stream reads and cannot be seen otherwise: a row put back to
//! PENDING (`retry`, `resend`, or by hand), written with `sql_log_bin = 0` below `read_max`.
//! Anything the stream itself does that leaves a row waiting without carrying it (parking a
//! stalled topic's events, an XA transaction, catching up past rows someone else claimed, a
//! failed question) ends it at once ([`Known::spoil`] for the row's topic, or
//! [`Known::spoil_all`]).

use crate::outbox::TableName;
use crate::sweep::waiting::{waiting_ids_of_topics, OrderKey, WaitingRow};
use mysql_async::Pool;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// How often the topics of a table are looked at again while batches flow.
pub const LOOK_EVERY: Duration = Duration::from_millis(100);

/// How long a look's answer counts: after this without a newer confirming look the topic is
/// asked about by key again (a look that takes longer is no use).
pub const FRESH: Duration = Duration::from_millis(300);

/// How long a waiting row the stream has not read may take to reach it: a row committed just
/// before a look or a gap question, behind the stream's position (another writer's commit of an
/// older id), is read within this; one still unread after it is not in the binlog the stream
/// reads (written with the binlog off), and its topic is no longer clean. A look is judged this
/// long after it was issued.
pub const SETTLE: Duration = Duration::from_millis(50);

/// A look reads at most this many waiting ids of a topic (more: not clean).
const LOOK_LIMIT: usize = 20_000;

/// A look asks about at most this many topics, the ones the stream read most recently; the
/// others are asked about by key.
const LOOK_TOPICS: usize = 64;

/// A topic the stream has not read for this long is forgotten (it starts again not clean).
const TOPIC_KEPT: Duration = Duration::from_secs(60);

/// A look in flight.
struct Look {
    task: JoinHandle<Result<Vec<(String, u64)>, mysql_async::Error>>,
    issued: Instant,
    /// `read_max` when it was issued: what it asked about.
    up_to: u64,
    /// The topics it asked about, each with its generation then.
    topics: HashMap<String, u64>,
    /// The most ids it reads of each topic.
    limit: usize,
    /// The table's rows the stream carried when it was issued: one done since (recorded, so no
    /// longer carried) may still have been waiting when the look read.
    carried: HashSet<u64>,
    /// The table's rows up to `up_to` the stream read since it was issued (see [`SETTLE`]).
    read: HashSet<u64>,
}

/// What the guard knows of one topic of the table.
#[derive(Default)]
struct Topic {
    /// When the look that last confirmed it clean was issued; `None`: not clean.
    clean_since: Option<Instant>,
    /// Moves on at every spoil: a look issued before answers nothing for it.
    generation: u64,
    /// When a batch last brought one of its rows.
    read_at: Option<Instant>,
}

impl Topic {
    fn is_clean(&self) -> bool {
        self.clean_since.is_some_and(|at| at.elapsed() < FRESH)
    }

    fn spoil(&mut self) {
        self.clean_since = None;
        self.generation += 1;
    }
}

/// See the module docs.
#[derive(Default)]
pub struct Known {
    /// The highest id the stream has read of the table.
    read_max: u64,
    topics: HashMap<String, Topic>,
    look: Option<Look>,
    last_look: Option<Instant>,
    /// Waiting rows found in a gap that the stream has not read yet: their keys, and since when
    /// ([`SETTLE`]).
    suspects: HashMap<u64, (OrderKey, Instant)>,
    /// The waiting rows not the stream's that the last look found.
    foreign: HashSet<u64>,
}

impl Known {
    /// Whether `topic` is clean now.
    pub fn is_clean(&self, topic: &str) -> bool {
        self.topics.get(topic).is_some_and(Topic::is_clean)
    }

    /// Whether some topic is clean now: gaps are then asked about.
    pub fn any_clean(&self) -> bool {
        self.topics.values().any(Topic::is_clean)
    }

    /// Something may have left a row of `topic` waiting that the stream does not carry: its keys
    /// are asked about by key until a look finds it clean again.
    pub fn spoil(&mut self, topic: &str) {
        if let Some(state) = self.topics.get_mut(topic) {
            state.spoil();
        }
        self.suspects.retain(|_, (key, _)| key.topic != topic);
    }

    /// [`Known::spoil`] for every topic (a row of any topic may wait).
    pub fn spoil_all(&mut self) {
        self.topics.values_mut().for_each(Topic::spoil);
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
    /// waits for, with the oldest such suspect's id. In a clean topic the suspects are the only
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
    /// not read: some topic is clean, and the batch skips ids after `read_max` or leaves rows
    /// found in an earlier gap unread. Those are mostly other writers' older ids committed a
    /// moment later, next in the binlog: the dispatcher reads on for up to
    /// [`crate::pipeline::key_order::GAP_WAIT`] before it asks (a gap question is a round trip
    /// on the stream's path, and rows it finds hold their keys for up to [`SETTLE`]).
    pub fn skips(&self, ids: &HashSet<u64>) -> bool {
        if !self.any_clean() {
            return false;
        }
        let mut sorted: Vec<u64> = ids.iter().copied().collect();
        sorted.sort_unstable();
        gap(self.read_max, &sorted).is_some() || self.suspects.keys().any(|id| !ids.contains(id))
    }

    /// For a batch of the table with row ids `ids` and events of `topics`, which the stream then
    /// counts as read: the ids it skipped, to ask about while some topic is clean; and whether
    /// the batch brought a suspect (a key held for it may go on).
    pub fn question<'a>(
        &mut self,
        ids: impl IntoIterator<Item = u64>,
        topics: impl IntoIterator<Item = &'a str>,
    ) -> (Option<(u64, u64)>, bool) {
        let now = Instant::now();
        for topic in topics {
            match self.topics.get_mut(topic) {
                Some(state) => state.read_at = Some(now),
                None => {
                    let state = Topic {
                        read_at: Some(now),
                        ..Topic::default()
                    };
                    self.topics.insert(topic.to_string(), state);
                }
            }
        }
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
        // A row the stream will not read waits: its topic is no longer clean.
        let unread: HashSet<String> = (self.suspects.values())
            .filter(|(_, at)| at.elapsed() >= SETTLE)
            .map(|(key, _)| key.topic.clone())
            .collect();
        for topic in unread {
            self.spoil(&topic);
        }
        let skipped = match self.any_clean() {
            true => gap(self.read_max, &ids),
            false => None,
        };
        self.read_max = self.read_max.max(ids.last().copied().unwrap_or(0));
        (skipped, arrived)
    }

    /// Takes the answer of a look finished and [`SETTLE`]d: a topic it asked about is clean when
    /// every waiting id it read of it is the stream's (carried then or now, `carried`, or read
    /// since), no spoil of it came since it was issued, and it read fewer than its limit.
    /// Returns the ids it and the look before read that are not the stream's: rows outside the
    /// binlog it reads (or put back), unread for two looks (at least [`LOOK_EVERY`] plus
    /// [`SETTLE`]), for the sweeper to claim at once rather than after `sweeper.min_age` (until
    /// they are sent their topic is asked by key, reading each key's rows from the first of them).
    pub fn take_look(&mut self, carried: impl Fn(u64) -> bool) -> Vec<u64> {
        let settled = |look: &Look| look.task.is_finished() && look.issued.elapsed() >= SETTLE;
        if !self.look.as_ref().is_some_and(settled) {
            return Vec::new();
        }
        let look = self.look.take().expect("finished");
        let answer = match futures_util::FutureExt::now_or_never(look.task) {
            Some(Ok(Ok(rows))) => rows,
            Some(Ok(Err(e))) => {
                tracing::debug!(error = %e, "a look for waiting rows failed; asking by key");
                return Vec::new();
            }
            _ => return Vec::new(),
        };
        // Gaps were asked about all along only while some topic was clean; otherwise only what
        // the look asked about is known, and later ids count as a gap.
        if !self.any_clean() {
            self.read_max = self.read_max.min(look.up_to);
        }
        let own = |id: &u64| look.carried.contains(id) || look.read.contains(id) || carried(*id);
        let mut waiting: HashMap<&str, (usize, bool)> = HashMap::new();
        let mut foreign_ids = Vec::new();
        for (topic, id) in &answer {
            let (count, foreign) = waiting.entry(topic.as_str()).or_default();
            *count += 1;
            if !own(id) {
                *foreign = true;
                foreign_ids.push(*id);
            }
        }
        for (topic, generation) in &look.topics {
            let Some(state) = self.topics.get_mut(topic) else {
                continue;
            };
            if state.generation != *generation {
                continue;
            }
            let (count, foreign) = waiting.get(topic.as_str()).copied().unwrap_or_default();
            if foreign || count >= look.limit {
                state.spoil();
            } else {
                state.clean_since = Some(look.issued);
            }
        }
        let foreign: HashSet<u64> = foreign_ids.into_iter().collect();
        let twice = foreign.intersection(&self.foreign).copied().collect();
        self.foreign = foreign;
        twice
    }

    /// Issues a look at the topics of `table` the stream reads when one is due ([`LOOK_EVERY`];
    /// none in flight; something read), but those `parked` says the stream parks (not clean
    /// while it does; their parked rows are no one's to claim now). `carried` are the table's
    /// rows the stream carries: more waiting ids of a topic than those, and some are not its
    /// own. Forgets the topics not read for [`TOPIC_KEPT`].
    pub fn look_if_due(
        &mut self,
        pool: &Pool,
        table: &Arc<TableName>,
        carried: impl Iterator<Item = u64>,
        parked: impl Fn(&str) -> bool,
    ) {
        let due = self.look.is_none()
            && self.read_max > 0
            && self.last_look.is_none_or(|at| at.elapsed() >= LOOK_EVERY);
        if !due {
            return;
        }
        self.topics
            .retain(|_, t| t.read_at.is_some_and(|at| at.elapsed() < TOPIC_KEPT));
        let mut recent: Vec<(&String, &Topic)> =
            (self.topics.iter()).filter(|(topic, _)| !parked(topic)).collect();
        recent.sort_unstable_by_key(|(_, t)| std::cmp::Reverse(t.read_at));
        let topics: HashMap<String, u64> = (recent.into_iter().take(LOOK_TOPICS))
            .map(|(topic, t)| (topic.clone(), t.generation))
            .collect();
        if topics.is_empty() {
            return;
        }
        let carried: HashSet<u64> = carried.collect();
        let (pool, table_name) = (pool.clone(), Arc::clone(table));
        let (up_to, limit) = (self.read_max, (carried.len() + 1).min(LOOK_LIMIT));
        let asked: Vec<String> = topics.keys().cloned().collect();
        let task = tokio::spawn(crate::db::bounded(async move {
            let mut conn = pool.get_conn().await?;
            waiting_ids_of_topics(&mut conn, &table_name, &asked, up_to, limit).await
        }));
        let issued = Instant::now();
        self.last_look = Some(issued);
        self.look = Some(Look {
            task,
            issued,
            up_to,
            topics,
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

    /// A row of key `key` of topic `topic` waiting with id `id`.
    fn row(id: u64, topic: &str, key: &str) -> WaitingRow {
        WaitingRow {
            id,
            key: OrderKey::new(topic, key),
            sending: false,
        }
    }

    /// `known`, with `topics` confirmed clean just now.
    fn clean(mut known: Known, topics: &[&str]) -> Known {
        for topic in topics {
            let state = known.topics.entry(topic.to_string()).or_default();
            state.clean_since = Some(Instant::now());
        }
        known
    }

    /// The gap asked about for a batch of `ids`, all of topic "t".
    fn asked(known: &mut Known, ids: impl IntoIterator<Item = u64>) -> Option<(u64, u64)> {
        known.question(ids, ["t"]).0
    }

    #[test]
    fn a_topic_not_known_clean_is_asked_by_key_and_its_ids_count_as_read() {
        let mut known = Known::default();
        assert_eq!(asked(&mut known, [7, 5]), None, "nothing clean: no gap asked");
        assert!(!known.is_clean("t"));
        assert_eq!(known.read_max, 7);
        let mut known = clean(known, &["t"]);
        assert_eq!(asked(&mut known, [8, 9]), None);
        assert_eq!(asked(&mut known, [12]), Some((10, 11)));
        known.spoil("t");
        assert_eq!(asked(&mut known, [14]), None);
        assert!(!known.is_clean("t"));
    }

    #[test]
    fn a_spoiled_topic_leaves_the_others_clean() {
        let mut known = clean(Known::default(), &["stuck", "healthy"]);
        known.spoil("stuck"); // its events are parked
        assert!(!known.is_clean("stuck"));
        assert!(known.is_clean("healthy"));
        // Gaps are still asked about: the healthy topic stays known.
        assert_eq!(known.question([3], ["healthy"]).0, Some((1, 2)));
        known.spoil_all();
        assert!(!known.any_clean());
    }

    #[test]
    fn rows_found_in_a_gap_hold_their_keys_until_the_stream_reads_them() {
        let mut known = clean(
            Known {
                read_max: 10,
                ..Known::default()
            },
            &["t", "u"],
        );
        assert_eq!(asked(&mut known, [12]), Some((11, 11)));
        known.suspect([row(11, "t", "a")]);
        // Nothing to ask: the suspect is the only row that may wait, and it holds only its key's
        // later events.
        assert_eq!(asked(&mut known, [13]), None);
        let (a, b) = (OrderKey::new("t", "a"), OrderKey::new("t", "b"));
        let blocking = known.blocking(&[(a.clone(), 13), (b.clone(), 13)]);
        assert_eq!(blocking, HashMap::from([(a.clone(), 11)]));
        assert!(known.blocking(&[(a.clone(), 11)]).is_empty(), "not older");
        assert_eq!(
            known.question([11, 14], ["t"]),
            (None, true),
            "11 was a late commit"
        );
        assert!(known.blocking(&[(a, 15)]).is_empty());
        // One never read: after SETTLE its topic is no longer known clean, the others are.
        known.suspect([row(9, "t", "b")]);
        known.suspects.get_mut(&9).unwrap().1 = Instant::now() - SETTLE;
        asked(&mut known, [15]);
        assert!(!known.is_clean("t") && known.suspects.is_empty());
        assert!(known.is_clean("u"));
    }

    #[test]
    fn a_clean_table_skips_what_a_batch_leaves_unread() {
        let ids = |ids: &[u64]| ids.iter().copied().collect::<HashSet<u64>>();
        let mut known = clean(
            Known {
                read_max: 10,
                ..Known::default()
            },
            &["t"],
        );
        assert!(!known.skips(&ids(&[11, 12])));
        assert!(known.skips(&ids(&[11, 13])), "12 is not read yet");
        known.suspect([row(12, "t", "a")]);
        assert!(known.skips(&ids(&[11])), "12 was found waiting and is not read yet");
        assert!(!known.skips(&ids(&[11, 12])));
        known.spoil("t");
        assert!(!known.skips(&ids(&[11, 13])), "asked by key whatever comes next");
    }

    #[test]
    fn a_confirmation_lapses() {
        let mut known = clean(
            Known {
                read_max: 3,
                ..Known::default()
            },
            &["t"],
        );
        known.topics.get_mut("t").unwrap().clean_since = Some(Instant::now() - FRESH);
        assert!(!known.is_clean("t"));
        assert_eq!(asked(&mut known, [5]), None);
    }

    /// `known` with a finished look issued `SETTLE` ago at `topics` (each at its generation
    /// then) up to id 10, that found `waiting`.
    async fn looked(known: &mut Known, topics: &[&str], waiting: Vec<(String, u64)>) {
        let task = tokio::spawn(async move { Ok(waiting) });
        while !task.is_finished() {
            tokio::task::yield_now().await;
        }
        let topics = (topics.iter())
            .map(|t| (t.to_string(), known.topics.entry(t.to_string()).or_default().generation))
            .collect();
        known.look = Some(Look {
            task,
            issued: Instant::now() - SETTLE,
            up_to: 10,
            topics,
            limit: 3,
            carried: HashSet::from([5]),
            read: HashSet::new(),
        });
    }

    #[tokio::test]
    async fn a_look_makes_clean_each_topic_whose_waiting_rows_are_all_the_streams() {
        let mut known = Known {
            read_max: 12,
            ..Known::default()
        };
        let found = |rows: &[(&str, u64)]| rows.iter().map(|(t, id)| (t.to_string(), *id)).collect();
        // 5 is carried; 6 (of "stuck") is not the stream's: a parked row.
        looked(&mut known, &["healthy", "stuck"], found(&[("healthy", 5), ("stuck", 6)])).await;
        assert!(known.take_look(|_| false).is_empty(), "found once: maybe late");
        assert!(known.is_clean("healthy"));
        assert!(!known.is_clean("stuck"));
        assert_eq!(known.read_max, 10, "nothing was clean: gaps from what it asked about");
        // Found again by the next look: for the sweeper to claim at once.
        looked(&mut known, &["stuck"], found(&[("stuck", 6)])).await;
        assert_eq!(known.take_look(|_| false), vec![6]);
        // A spoil after the look was issued: its answer says nothing of that topic.
        looked(&mut known, &["other"], Vec::new()).await;
        known.spoil("other");
        known.take_look(|_| false);
        assert!(!known.is_clean("other"));
        // As many waiting rows as the limit: more may wait.
        looked(&mut known, &["many"], found(&[("many", 5), ("many", 5), ("many", 5)])).await;
        known.take_look(|_| false);
        assert!(!known.is_clean("many"));
    }
}
