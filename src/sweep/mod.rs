//! Sweeping: claiming outbox rows from the table itself instead of reading the binlog. It runs
//! as **poll mode** ([`crate::pipeline::run_poll`], `relay.mode = "poll"`: the polling relay on its own, for
//! servers without binlog access and as the benchmark baseline) and as the **sweeper** beside the
//! CDC stream ([`Sweeper`]): every `sweeper.interval` it claims rows still PENDING after
//! `sweeper.min_age` (far behind the stream, so the two do not race in normal operation): rows
//! whose binlog event the stream never saw (a purged binlog, a filtered session, a gap while no
//! leader streamed), and rows put back to PENDING by hand. Standby instances run it too.
//!
//! Stages: [`claim`] (PENDING → SENDING under a lease, `FOR UPDATE SKIP LOCKED` where the server
//! has it, else an optimistic per-row claim) → the send stage's router and ordered shard senders ([`crate::send::SendInputs`]) →
//! the [marker](crate::mark), which marks a claimed row only while it is still SENDING under
//! this instance's `owner` (a row whose lease ran out and was claimed again is left alone); beside them [`lease`]
//! renews the leases of the rows this process holds ([`lease::HeldRows`]) and returns expired
//! ones to PENDING. Beside a stream, the stream's key-order guard asks the sweeper ([`Nudge`])
//! for the older rows of a key it holds; they are claimed at once, whatever their age.
//!
//! Guarantees:
//! - **Nothing committed is lost.** A row is PENDING until claimed; a claimed row ends SENT (with
//!   its `msg_id`) or FAILED (with `last_error`), or goes back to PENDING: released on graceful
//!   shutdown, or by lease recovery when its owner crashed or stalled past its lease. The relay
//!   never deletes a row, FAILED ones included.
//! - **At-least-once.** The marker only updates rows this instance still owns
//!   (SENDING with its `owner`); a row taken back after its lease expired is sent again by its
//!   next owner. Duplicates happen only after a crash, a stall longer than the lease, or a lost
//!   SENT mark; consumers de-duplicate by `event_id`.
//! - **Per-`biz_key` order.** A row is claimed only when no older row of its key waits
//!   ([`waiting`]) except the rows this process holds; rows are claimed in `id` order and one key
//!   always goes to one shard, which sends in order and retries in place (holding the shard), so
//!   a key's events are published in id order. Retryable errors back off per `[retry]` and then
//!   end FAILED with an alert; non-retryable ones (bad row, no such topic, too large) end FAILED
//!   at once. This holds across instances too; what can come after a key's newer events is a
//!   second copy only: a row recovered after an expired lease whose first send had in fact
//!   succeeded is sent again (a duplicate).
//! - **Claim conflicts.** With SKIP LOCKED, concurrent instances claim disjoint batches without
//!   waiting; with the optimistic claim, a row is claimed only if its `UPDATE … AND <PENDING>`
//!   affected it.

pub mod claim;
pub mod cursor;
pub mod gate;
pub mod lease;
mod sweeper;
pub mod waiting;

pub use claim::ClaimStrategy;
#[cfg(any(test, feature = "test-utils"))]
pub use claim::{Claimed, Claimer};
pub use gate::{HeldForOrder, SweepGate};
pub use sweeper::{Nudge, RunningSweeper, SweepSettings, Sweeper};
