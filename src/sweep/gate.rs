//! When the sweeper beside the stream may claim, and how old a row must be: it catches what the
//! stream missed and must not race the stream for rows the stream is about to send (a race costs
//! duplicates: both send once the broker is back).
//!
//! - Poll mode: always, rows of any age.
//! - Beside this process's stream (the leader): rows older than `sweeper.min_age` *before the
//!   time the stream is done up to*, which the stream's acknowledgements tell
//!   ([`Acknowledgements::progress`]): the newest commit read ([`StreamClock`]), or now once the
//!   server has nothing more to send, or earlier: the commit of the oldest transaction whose
//!   events are still on their way. So a stream catching up on a backlog is not raced for the
//!   rows it is about to read or still holds. And only while the stream is idle (no event on
//!   its way to the broker) or made progress (an event completed) within the last half
//!   `min_age`: a stream stalled on the
//!   broker holds its rows in memory and sends them when the broker returns; sweeping them
//!   meanwhile would send them twice (and fail the same way while the broker is down). Events
//!   the stream's key-order guard holds back ([`HeldForOrder`]) do not count as a stall: they
//!   wait for this sweeper (for older rows of their keys), so closing the gate for them would
//!   make every other row the sweeper owns wait for the slowest of those keys. Never while the
//!   dispatcher holds a batch back to read the broker's tails ([`StreamClock::hold_sweeps`]): the
//!   reader reads on meanwhile, so the time read says nothing of that batch's rows.
//! - A standby: rows older than `min_age` before the time the leader's stream had read up to at
//!   its last mirrored checkpoint (`stream_at` in `outbox_relay_state`, or `checkpoint_at`
//!   before migration 0011). While the leader is live that is a few seconds ago; while it
//!   catches up, the commit time it has reached; while it is stalled (broker down) the mirror
//!   stays behind. In each case the standby leaves the leader's rows alone. Rows the stream never
//!   saw are still swept: by the leader, or, older than the bound, by a standby.

use crate::binlog::StreamClock;
use crate::checkpoint::Acknowledgements;
use mysql_async::prelude::*;
use mysql_async::Pool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many streamed events the stream's key-order guard holds back now, waiting for the sweeper
/// to send older rows of their keys (shared by the guard, which sets it, and the gate).
#[derive(Debug, Clone, Default)]
pub struct HeldForOrder(Arc<AtomicUsize>);

impl HeldForOrder {
    /// `events` more are held back.
    pub fn add(&self, events: usize) {
        self.0.fetch_add(events, Ordering::Relaxed);
    }

    /// `events` held back are let go (handed on or parked).
    pub fn remove(&self, events: usize) {
        self.0.fetch_sub(events, Ordering::Relaxed);
    }

    /// How many events are held back now.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// The rule a sweeper applies before each claim round.
pub enum SweepGate {
    /// Poll mode.
    Always,
    /// Beside this process's stream.
    BesideStream {
        /// The stream's acknowledgements, asked how far it is done.
        acks: Acknowledgements,
        /// How far the stream has read.
        clock: StreamClock,
        /// The stream's events held back for key order: in flight, but waiting for us.
        held: HeldForOrder,
        /// The stream's progress count, and when it was last seen to change.
        seen: Option<(u64, Instant)>,
    },
    /// A standby of deployment `relay_name`.
    BehindMirror { relay_name: String },
}

impl SweepGate {
    /// Beside this process's stream, whose key-order guard reports what it holds in `held`.
    pub fn beside_stream(acks: Acknowledgements, clock: StreamClock, held: HeldForOrder) -> Self {
        SweepGate::BesideStream {
            acks,
            clock,
            held,
            seen: None,
        }
    }

    /// The minimum age of the rows to claim this round (`base` is `sweeper.min_age`, zero in
    /// poll mode), or `None` to skip the round.
    pub async fn min_age(&mut self, base: Duration, pool: &Pool) -> Option<Duration> {
        match self {
            SweepGate::Always => Some(base),
            SweepGate::BesideStream {
                acks,
                clock,
                held,
                seen,
            } => {
                // Before the stream read anything, it may be about to read every PENDING row;
                // while the dispatcher holds a batch back (reading back the broker's tails), the
                // time read says nothing of that batch's rows.
                if clock.sweeps_held() {
                    return None;
                }
                let read_behind = clock.behind()?;
                let progress = acks.progress();
                // Rows the stream read but has not finished (a backlog after a broker stall) are
                // on their way: the bound counts from the oldest of them.
                let held_behind = progress
                    .oldest_unfinished_commit
                    .map_or(Duration::ZERO, StreamClock::since);
                // Held events wait for this sweeper, not for the broker.
                let sending = (progress.events_outstanding).saturating_sub(held.get() as u64);
                stream_allows(sending, progress.count, seen, base)
                    .then_some(base + read_behind.max(held_behind))
            }
            SweepGate::BehindMirror { relay_name } => {
                let behind = mirror_behind(pool, relay_name).await?;
                Some(base + behind)
            }
        }
    }
}

/// How long ago the leader's stream had read up to, at its last mirrored checkpoint; `None`
/// (skip the round) when nothing is mirrored or the mirror cannot be read.
async fn mirror_behind(pool: &Pool, relay_name: &str) -> Option<Duration> {
    let sql = |column: &str| {
        format!(
            "SELECT TIMESTAMPDIFF(MICROSECOND, {column}, NOW(3)) FROM outbox_relay_state \
             WHERE name = ?"
        )
    };
    let mut conn = pool.get_conn().await.ok()?;
    let behind: Option<Option<i64>> = match conn
        .exec_first(sql("COALESCE(stream_at, checkpoint_at)"), (relay_name,))
        .await
    {
        Err(e) if crate::db::is_unknown_column(&e) => conn
            .exec_first(sql("checkpoint_at"), (relay_name,))
            .await
            .ok()?,
        other => other.ok()?,
    };
    let micros = behind.flatten()?.max(0) as u64;
    Some(Duration::from_micros(micros))
}

/// True when the stream is idle (no event on its way to the broker: `sending` is 0) or made
/// progress within `base / 2`; `seen` remembers the last `progress` count and when it changed.
fn stream_allows(
    sending: u64,
    progress: u64,
    seen: &mut Option<(u64, Instant)>,
    base: Duration,
) -> bool {
    let now = Instant::now();
    match seen {
        Some((count, at)) if *count == progress => {
            sending == 0 || now.duration_since(*at) < base / 2
        }
        _ => {
            *seen = Some((progress, now));
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stalled_stream_closes_the_gate_an_idle_or_moving_one_does_not() {
        let base = Duration::from_millis(200);
        let mut seen = None;
        assert!(stream_allows(5, 10, &mut seen, base), "first look");
        assert!(stream_allows(5, 10, &mut seen, base), "within base/2");
        std::thread::sleep(Duration::from_millis(120));
        assert!(
            !stream_allows(5, 10, &mut seen, base),
            "stalled with events in flight"
        );
        assert!(
            stream_allows(0, 10, &mut seen, base),
            "idle: nothing in flight"
        );
        assert!(stream_allows(5, 11, &mut seen, base), "moving again");
    }

    #[tokio::test]
    async fn events_held_for_key_order_are_not_a_stalled_stream() {
        let acks = Acknowledgements::new(crate::binlog::BinlogPosition::default());
        let seq = acks.begin();
        let (_held, sending) = (acks.event(seq), acks.event(seq));
        let clock = StreamClock::default();
        clock.arm();
        clock.heartbeat();
        let held = HeldForOrder::default();
        let mut gate = SweepGate::beside_stream(acks, clock, held.clone());
        // Never connected: the gate beside a stream asks the server nothing.
        let pool = Pool::new("mysql://nobody@127.0.0.1:9/none");
        let base = Duration::from_millis(200);
        assert!(gate.min_age(base, &pool).await.is_some(), "first look");
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(
            gate.min_age(base, &pool).await,
            None,
            "an event in flight to the broker with no progress: a stalled stream"
        );
        held.add(1);
        assert_eq!(
            gate.min_age(base, &pool).await,
            None,
            "one of the two events is held for key order, the other still on its way"
        );
        sending.acknowledge(); // e.g. released: given back
        assert!(gate.min_age(base, &pool).await.is_some(), "progress");
        std::thread::sleep(Duration::from_millis(120));
        assert!(
            gate.min_age(base, &pool).await.is_some(),
            "the one event left waits for the sweeper (held for key order), not for the broker"
        );
        held.remove(1);
        assert_eq!(
            gate.min_age(base, &pool).await,
            None,
            "the same event on its way to the broker, no progress: stalled"
        );
    }

    #[tokio::test]
    async fn the_gate_stays_shut_while_the_dispatcher_reads_back_the_brokers_tails() {
        let acks = Acknowledgements::new(crate::binlog::BinlogPosition::default());
        let clock = StreamClock::default();
        clock.arm();
        clock.heartbeat();
        let mut gate = SweepGate::beside_stream(acks, clock.clone(), HeldForOrder::default());
        let pool = Pool::new("mysql://nobody@127.0.0.1:9/none");
        let base = Duration::from_millis(200);
        assert!(gate.min_age(base, &pool).await.is_some(), "caught up, idle");
        clock.hold_sweeps(true);
        assert_eq!(gate.min_age(base, &pool).await, None, "a batch held back");
        clock.hold_sweeps(false);
        assert!(gate.min_age(base, &pool).await.is_some(), "handed on");
    }
}
