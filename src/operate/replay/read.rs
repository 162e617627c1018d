//! Reading the range: the transactions of the stream, their events handed to the sending side
//! (or only listed in a dry run) when they are inside the range, and the summary of what was read.

use super::{within, Progress, ReplayEvent, ReplaySummary, Sending, Stop};
use crate::binlog::{BinlogItem, BinlogPosition, DecodedRow, TxEnd, Xid};
use crate::event::OutboxRow;
use std::collections::HashMap;

/// A replay while it reads: the range's end, where it is, and what it did so far.
pub(super) struct Run {
    pub(super) to: BinlogPosition,
    pub(super) to_time: Option<u32>,
    pub(super) sending: Option<Sending>,
    pub(super) summary: ReplaySummary,
    pub(super) position: BinlogPosition,
    pub(super) progress: Progress,
    pub(super) open: OpenTransactions,
}

impl Run {
    /// The transaction ending at `end` was read: its events are sent (or only listed in a dry
    /// run) when it is inside `to`, and progress is reported. Returns why reading stops, if it
    /// does: a transaction past `--to-time` sends nothing.
    pub(super) async fn end_transaction(
        &mut self,
        end: TxEnd,
        observer: &mut impl FnMut(ReplayEvent<'_>),
    ) -> anyhow::Result<Option<Stop>> {
        if self.to_time.is_some_and(|t| end.timestamp > t) {
            return Ok(Some(Stop::PassedTime));
        }
        if within(&self.to, &end) {
            self.summary.unpublishable += self.open.unpublishable;
            for row in self.open.buffered.drain(..) {
                observer(ReplayEvent::Event {
                    row: &row,
                    commit: &end,
                });
                self.progress.events += 1;
                if let Some(sending) = &self.sending {
                    sending.send(row).await?;
                }
            }
        } else {
            self.summary.outside_range += 1;
        }
        self.open.buffered.clear();
        self.open.unpublishable = 0;
        self.position.advance(&end);
        self.progress.transactions += 1;
        self.progress.position = self.position.to_string();
        if let Some(sending) = &self.sending {
            (self.progress.sent, self.progress.failed) = sending.counts();
        }
        observer(ReplayEvent::Progress(&self.progress));
        Ok(self.position.covers(&self.to).then_some(Stop::ReachedEnd))
    }

    /// Reading is over: the summary gets what was read, and, in a real run, the outcome of
    /// every event handed over (a short while only when interrupted), reported once more.
    pub(super) async fn conclude(
        self,
        observer: &mut impl FnMut(ReplayEvent<'_>),
    ) -> ReplaySummary {
        let Run {
            sending,
            mut summary,
            position,
            mut progress,
            ..
        } = self;
        summary.transactions = progress.transactions;
        summary.events = progress.events;
        summary.reached = position.to_string();
        if let Some(sending) = sending {
            let interrupted = summary.stopped == Stop::Interrupted;
            sending.finish(&mut summary, interrupted).await;
            (progress.sent, progress.failed) = (summary.sent, summary.failed);
            observer(ReplayEvent::Progress(&progress));
        }
        summary
    }
}

/// The transaction being read and the prepared XA transactions, until their end says whether
/// their events count.
#[derive(Default)]
pub(super) struct OpenTransactions {
    pub(super) buffered: Vec<OutboxRow>,
    /// Rows of the open transaction that cannot become messages.
    pub(super) unpublishable: u64,
    /// Prepared XA transactions: their events and unpublishable rows, until their outcome.
    pub(super) prepared: HashMap<Xid, (Vec<OutboxRow>, u64)>,
}

impl OpenTransactions {
    /// Takes one item of the stream; returns the end of the transaction it ends, if it ends one.
    pub(super) fn take(&mut self, item: BinlogItem) -> Option<TxEnd> {
        match item {
            BinlogItem::TxBegin | BinlogItem::Restart => {
                self.buffered.clear();
                self.unpublishable = 0;
                None
            }
            BinlogItem::Row(DecodedRow::Event(row)) => {
                self.buffered.push(row);
                None
            }
            BinlogItem::Row(DecodedRow::Problem(_)) => {
                self.unpublishable += 1;
                None
            }
            BinlogItem::Row(DecodedRow::NotPending | DecodedRow::Unidentifiable(_)) => None,
            BinlogItem::TxEnd(end) => Some(end),
            BinlogItem::Prepared(tx) => {
                let (mut events, mut problems) = (Vec::new(), 0);
                for row in tx.rows {
                    match row {
                        DecodedRow::Event(row) => events.push(row),
                        DecodedRow::Problem(_) => problems += 1,
                        _ => {}
                    }
                }
                self.prepared.insert(tx.xid, (events, problems));
                Some(tx.end) // a transaction of its own, with nothing to publish yet
            }
            BinlogItem::XaOutcome { xid, committed } => {
                match self.prepared.remove(&xid) {
                    Some((events, problems)) if committed => {
                        self.buffered.extend(events);
                        self.unpublishable += problems;
                    }
                    None if committed => tracing::warn!(%xid,
                        "XA COMMIT of a transaction prepared before the start of the range: \
                         its events are not replayed"),
                    _ => {}
                }
                None
            }
        }
    }
}
