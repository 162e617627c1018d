//! Checkpointing: the acknowledged low-watermark over transactions, reached only through the
//! stream's [`Acknowledgements`], persisted in sled and mirrored into MySQL so another instance
//! can take over.
//!
//! Guarantee: a stored checkpoint never passes an event that is not SENT or terminally FAILED
//! and recorded in the outbox table.

mod acks;
mod checkpointer;
pub mod history;
pub mod store;
mod watermark;

pub use acks::Acknowledgements;
#[cfg(any(test, feature = "test-utils"))]
pub use acks::Progress;
pub use checkpointer::{run_checkpointer, CheckpointError, CheckpointSettings};
pub use store::{CheckpointStore, MysqlMirror, SledStore};
#[cfg(any(test, feature = "test-utils"))]
pub use store::MemoryStore;
pub use watermark::TxSeq;
