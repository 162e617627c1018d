//! Checkpointing: the acknowledged low-watermark over transactions, persisted in sled and
//! mirrored into MySQL so another instance can take over.
//!
//! Guarantee: a stored checkpoint never passes an event that is not SENT or terminally FAILED
//! and recorded in the outbox table.

mod checkpointer;
pub mod history;
pub mod store;
pub mod watermark;

pub use checkpointer::{run_checkpointer, CheckpointSettings};
pub use store::{CheckpointStore, MemoryStore, MysqlMirror, SledStore};
pub use watermark::{TxSeq, Watermark};
