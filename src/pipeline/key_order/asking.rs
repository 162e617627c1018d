//! What the key-order guard asks the database: the oldest waiting row of each key it checks,
//! and the waiting rows among the ids the stream skipped.

use super::{KeyOrder, GAP_LIMIT, LOOK_ROWS};
use crate::outbox::TableName;
use crate::sweep::waiting::{waiting_rows_between, waiting_rows_of_keys_at_most, OrderKey, WaitingRow};
use crate::sweep::Nudge;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

impl KeyOrder {
    /// For each of `keys` (of `table`, each with the newest id of its events asked about) that
    /// an older row waits for, other than the rows this stream carries and those `exclude`
    /// names: the oldest such row's id. Asks the sweeper for the PENDING ones.
    /// `batch` rows of the stream, not carried yet, are being asked about (`exclude` names
    /// them).
    pub(super) async fn oldest_waiting(
        &self,
        table: &Arc<TableName>,
        keys: &[(OrderKey, u64)],
        batch: usize,
        exclude: impl Fn(u64) -> bool,
    ) -> Result<HashMap<OrderKey, u64>, mysql_async::Error> {
        let mut asked: Vec<(&OrderKey, u64)> = keys.iter().map(|(key, id)| (key, *id)).collect();
        // Room for the stream's own rows of these keys (the batch, those it carries or holds),
        // then for LOOK_ROWS of others'.
        let limit = batch + self.carried_ids.len() + LOOK_ROWS;
        let mut waiting = Vec::new();
        // Keys a look read rows of but not all of them: they wait, their oldest row unknown.
        let mut unread: HashSet<OrderKey> = HashSet::new();
        while !asked.is_empty() {
            let (rows, complete) = crate::db::bounded(async {
                let mut conn = self.pool.get_conn().await?;
                waiting_rows_of_keys_at_most(&mut conn, table, &asked, limit).await
            })
            .await?;
            if complete {
                waiting.extend(rows);
                break;
            }
            // More rows wait than a look reads. The keys it read rows of are held; the others are
            // asked again on their own, so a key with a backlog (a stuck topic's parked rows)
            // holds back no other key. The sweeper is sent the rows read; as it sends them, the
            // next looks read on.
            let before = unread.len();
            unread.extend(rows.iter().map(|row| row.key.clone()));
            waiting.extend(rows);
            if unread.len() == before {
                // Only rows at or above their own key's bound were read: no way to narrow.
                unread.extend(asked.iter().map(|(key, _)| (*key).clone()));
                break;
            }
            asked.retain(|(key, _)| !unread.contains(*key));
        }
        let mut oldest = self.oldest_foreign(table, waiting, exclude);
        for key in unread {
            oldest.insert(key, 0);
        }
        Ok(oldest)
    }

    /// Asks, for a table with a clean topic, for the waiting rows among the ids the stream
    /// skipped (`from`..=`to`). Those not its own are *suspects* (mostly another writer's older
    /// id committed just now, which the stream reads next; see [`super::known::SETTLE`]): until the
    /// stream reads one, it holds the later events of its key in a clean topic
    /// ([`super::Known::blocking`]). Many: no topic is clean any more, every key is asked by key.
    pub(super) async fn ask_gap(
        &mut self,
        table: &Arc<TableName>,
        (from, to): (u64, u64),
        exclude: impl Fn(u64) -> bool,
    ) -> Result<(), mysql_async::Error> {
        let waiting = crate::db::bounded(async {
            let mut conn = self.pool.get_conn().await?;
            waiting_rows_between(&mut conn, table, (from, to), GAP_LIMIT).await
        })
        .await?;
        if waiting.len() >= GAP_LIMIT {
            self.known_of(table).spoil_all();
            return Ok(());
        }
        let carried = &self.carried_ids;
        let own = |id: u64| exclude(id) || carried.contains(&(Arc::clone(table), id));
        let suspects = waiting.into_iter().filter(|row| !own(row.id));
        self.known.entry(Arc::clone(table)).or_default().suspect(suspects);
        Ok(())
    }

    /// Of `waiting` (rows of `table`), those neither this stream's nor named by `exclude`: the
    /// oldest id of each of their keys. Asks the sweeper for the PENDING ones.
    fn oldest_foreign(
        &self,
        table: &Arc<TableName>,
        waiting: Vec<WaitingRow>,
        exclude: impl Fn(u64) -> bool,
    ) -> HashMap<OrderKey, u64> {
        let foreign: Vec<_> = waiting
            .into_iter()
            .filter(|row| !exclude(row.id))
            .filter(|row| !self.carried_ids.contains(&(Arc::clone(table), row.id)))
            .collect();
        let pending: Vec<u64> = foreign
            .iter()
            .filter(|r| !r.sending)
            .map(|r| r.id)
            .collect();
        if !pending.is_empty() {
            // Full: the sweeper is busy with earlier requests; the next recheck asks again.
            let _ = self.nudges.try_send(Nudge {
                table: (**table).clone(),
                ids: pending,
            });
        }
        let mut oldest: HashMap<OrderKey, u64> = HashMap::new();
        for row in foreign {
            let id = oldest.entry(row.key).or_insert(row.id);
            *id = (*id).min(row.id);
        }
        oldest
    }
}
