//! Prepared XA transactions in the dispatcher: held in binlog order until their outcome, parked
//! after `relay.park_prepared_after` (the checkpoint then passes them; the sweeper sends their
//! events at XA COMMIT), logged while held for long, and shown on `/metrics` by xid from the
//! prepare to the outcome.

use super::{Dispatcher, Held, LONG_PREPARED};
use crate::binlog::{DecodedRow, Xid};
use crate::metrics::XidLabel;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tokio::time::Instant;

impl Dispatcher {
    /// A prepared XA transaction: its entry opens (and stays open) in binlog order; its rows
    /// wait. Rows already recorded (a previous run saw its outcome) are dropped now.
    pub(super) fn hold(
        &mut self,
        prepared: crate::binlog::PreparedTx,
        recorded: &super::Recorded,
    ) {
        let seq = self.begin();
        let rows: Vec<DecodedRow> = prepared
            .rows
            .into_iter()
            .filter(|row| match row {
                DecodedRow::Event(row) => !recorded.in_outbox(&row.table, row.id),
                _ => true,
            })
            .collect();
        tracing::info!(xid = %prepared.xid, rows = rows.len(), prepare = ?prepared.end.gtid,
            "XA transaction prepared: its events wait for XA COMMIT (the checkpoint holds here)");
        let held = Held {
            seq,
            rows,
            end: prepared.end,
            since: Instant::now(),
        };
        prepared_since(&prepared.xid).set(unix_now());
        if let Some(old) = self.held.insert(prepared.xid.clone(), held) {
            // The same xid prepared again before an outcome: the server cannot do that; keep the
            // newer and let the older pass without publishing.
            tracing::error!(xid = %prepared.xid, "XA transaction prepared twice; the first prepare is dropped");
            self.acks.end(old.seq, old.end);
        }
        self.publish_held_count();
    }

    /// The outcome of prepared `xid`: its rows are handed on (commit) or dropped (rollback), and
    /// its entry closes at its prepare's end. False once the receivers are gone.
    pub(super) async fn resolve(&mut self, xid: &Xid, committed: bool) -> bool {
        crate::metrics::relay()
            .xa_prepared_since
            .remove(&xid_label(xid));
        if let Some(since) = self.parked_xa.remove(xid) {
            let outcome = if committed {
                "XA COMMIT: the sweeper sends its events"
            } else {
                "XA ROLLBACK: nothing to send"
            };
            tracing::info!(%xid, prepared_for = ?since.elapsed(), "parked XA transaction ended with {outcome}");
            if committed {
                self.let_go(None); // its rows are PENDING now, for the sweeper
            }
            return true;
        }
        let Some(held) = self.held.remove(xid) else {
            if committed {
                self.let_go(None);
                tracing::warn!(%xid,
                    "XA COMMIT of a transaction prepared before the relay's start position: its \
                     events are left to the sweeper");
            }
            return true;
        };
        self.publish_held_count();
        if committed {
            self.stats.xa_committed += 1;
            self.check_key_order(held.rows.iter()).await;
            for row in held.rows {
                if !self.hand_on(held.seq, row, &super::Recorded::default(), false).await {
                    return false;
                }
            }
        } else {
            self.stats.xa_rolled_back += 1;
            tracing::info!(%xid, rows = held.rows.len(), "XA transaction rolled back: its events are not published");
        }
        self.acks.end(held.seq, held.end);
        true
    }

    fn publish_held_count(&self) {
        crate::metrics::relay()
            .xa_prepared_transactions
            .set(self.held.len() as i64);
    }

    /// How long the dispatcher may wait for the reader while XA transactions are held: until
    /// the next one is due to be parked or warned about.
    pub(super) fn prepared_timer(&self) -> Duration {
        match self.park_prepared_after {
            Some(after) => after.min(LONG_PREPARED).max(Duration::from_millis(100)),
            None => LONG_PREPARED,
        }
    }

    /// Parks the prepared XA transactions held for `park_prepared_after` (with a sweeper), then
    /// logs those still held for long, at most once per [`LONG_PREPARED`].
    ///
    /// Parking one closes its transaction at its prepare's end, so the checkpoint passes it and
    /// a restart does not read everything since again, and drops its rows from memory: they
    /// become PENDING rows at `XA COMMIT` (the reader sees that outcome, or, after a restart,
    /// finds it prepared before its start), and the sweeper sends them, in key order; at
    /// `XA ROLLBACK` there is nothing to send. Nothing is lost: the rows are the record.
    pub(super) fn look_at_prepared(&mut self) {
        if let Some(after) = self.park_prepared_after {
            let due: Vec<Xid> = (self.held.iter())
                .filter(|(_, held)| held.since.elapsed() >= after)
                .map(|(xid, _)| xid.clone())
                .collect();
            for xid in due {
                let held = self.held.remove(&xid).expect("present");
                tracing::warn!(%xid, prepared_for = ?held.since.elapsed(), rows = held.rows.len(),
                    prepare = ?held.end.gtid,
                    "XA transaction {xid} is still prepared: parked — the checkpoint passes its \
                     prepare and its events are no longer held in memory; at XA COMMIT the \
                     sweeper sends them, at XA ROLLBACK nothing is sent (XA RECOVER lists it)");
                crate::metrics::relay().xa_parked.inc();
                self.acks.end(held.seq, held.end);
                self.parked_xa.insert(xid, held.since);
            }
            self.publish_held_count();
        }
        self.warn_long_prepared();
    }

    /// Logs the prepared XA transactions held for long, at most once per [`LONG_PREPARED`].
    fn warn_long_prepared(&mut self) {
        if self.last_long_warning.elapsed() < LONG_PREPARED {
            return;
        }
        for (xid, held) in &self.held {
            let age = held.since.elapsed();
            if age >= LONG_PREPARED {
                tracing::warn!(%xid, held_for = ?age, prepare = ?held.end.gtid,
                    "an XA transaction is still prepared: the checkpoint cannot pass it until \
                     XA COMMIT or XA ROLLBACK (XA RECOVER lists it); other events flow meanwhile");
            }
        }
        self.last_long_warning = Instant::now();
    }
}

fn xid_label(xid: &Xid) -> XidLabel {
    XidLabel {
        xid: xid.to_string(),
    }
}

/// The `/metrics` series of prepared `xid`: when the stream read its prepare.
fn prepared_since(xid: &Xid) -> Gauge<f64, AtomicU64> {
    crate::metrics::relay()
        .xa_prepared_since
        .get_or_create(&xid_label(xid))
        .clone()
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
