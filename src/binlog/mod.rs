//! Reading the binlog: a replica connection to MySQL or MariaDB that yields the outbox INSERTs of
//! each committed transaction, in commit order, with the position just past each transaction.
//!
//! Guarantee: for every committed transaction after the start position, the reader yields
//! `TxBegin`, the transaction's outbox rows in binlog order, then `TxEnd` with its position; other
//! tables and non-INSERT changes are skipped but still move the position. Rows a transaction undid
//! (`ROLLBACK`, `ROLLBACK TO SAVEPOINT`) are never yielded; an XA transaction's rows are yielded at
//! its prepare as [`BinlogItem::Prepared`], to be published only on its outcome's
//! [`BinlogItem::XaOutcome`] (see `reader/transaction.rs`).

pub mod clock;
pub mod decode;
pub mod gtid;
pub mod position;
pub mod reader;
pub mod row_image;
pub mod xid;

pub use clock::StreamClock;
pub use decode::DecodedRow;
pub use gtid::{MariaDbGtid, MySqlGtidSet};
#[cfg(any(test, feature = "test-utils"))]
pub use gtid::{MariaDbGtidPos, MySqlSource};
pub use position::{BinlogPosition, TxEnd, TxGtid};
pub use reader::{BinlogItem, PreparedTx, ServerFlavor};
#[cfg(any(test, feature = "test-utils"))]
pub use reader::{BinlogReader, ReaderOptions};
pub use xid::Xid;
