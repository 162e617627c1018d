//! What the server read from one test database's outbox table, every client's statements
//! together: the database's work per event, isolated from the other tests sharing the server.
//! Oracle MySQL counts it in performance_schema (rows fetched through each index), MariaDB in
//! its user statistics (`userstat`, switched on here: off by default).

use super::TestDb;
use mysql_async::prelude::*;

/// Rows the server has read from `db`'s `outbox_event` so far (a counter: compare two
/// readings); `None` where the server keeps no such count.
pub async fn outbox_rows_read(db: &TestDb) -> Option<u64> {
    let mut conn = db.conn().await;
    let version: String = conn.query_first("SELECT VERSION()").await.ok()??;
    let sql = if version.contains("MariaDB") {
        conn.query_drop("SET GLOBAL userstat = 1").await.ok()?;
        "SELECT ROWS_READ FROM information_schema.TABLE_STATISTICS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_event'"
    } else {
        "SELECT SUM(COUNT_FETCH) FROM performance_schema.table_io_waits_summary_by_index_usage \
         WHERE OBJECT_SCHEMA = DATABASE() AND OBJECT_NAME = 'outbox_event'"
    };
    // No row yet (MariaDB counts a table from its first read after `userstat` is on): none read.
    let read: Option<Option<u64>> = conn.query_first(sql).await.ok()?;
    Some(read.flatten().unwrap_or(0))
}

/// Oracle MySQL: the statements run in `db` so far with the rows each kind examined, most
/// first (performance_schema's digests; empty elsewhere).
pub async fn rows_examined_by_statement(db: &TestDb) -> Vec<(String, u64)> {
    let mut conn = db.conn().await;
    conn.query(
        "SELECT LEFT(DIGEST_TEXT, 90), SUM_ROWS_EXAMINED \
         FROM performance_schema.events_statements_summary_by_digest \
         WHERE SCHEMA_NAME = DATABASE() ORDER BY SUM_ROWS_EXAMINED DESC LIMIT 8",
    )
    .await
    .unwrap_or_default()
}
