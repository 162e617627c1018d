//! The database server's own account of a run: `SHOW GLOBAL STATUS` counters read before and
//! after it, per event. Statements by kind, commits, rows and index entries read and written,
//! redo and binlog bytes: where the server's CPU per event goes, on both servers, with no
//! profiler. The counters are server-wide: they include the bench's own progress queries (one
//! small SELECT every 20 ms), which are negligible per event in runs of thousands of events.

use mysql_async::prelude::*;
use std::collections::BTreeMap;

/// The counters read, with the short name the report prints. A counter one server lacks
/// (`Binlog_bytes_written` is MariaDB's) is left out of that server's report.
const COUNTERS: &[(&str, &str)] = &[
    ("Com_insert", "INSERT"),
    ("Com_update", "UPDATE"),
    ("Com_select", "SELECT"),
    ("Com_delete", "DELETE"),
    ("Com_commit", "COMMIT"),
    ("Handler_read_key", "index look-ups"),
    ("Handler_read_next", "index next"),
    ("Handler_read_rnd_next", "table scan rows"),
    ("Handler_update", "rows updated"),
    ("Handler_write", "rows written"),
    ("Innodb_os_log_written", "redo bytes"),
    ("Binlog_bytes_written", "binlog bytes"),
];

/// One reading of the counters.
#[derive(Debug, Clone, Default)]
pub struct Counters(BTreeMap<String, f64>);

impl Counters {
    pub async fn read(pool: &mysql_async::Pool) -> Self {
        let mut conn = pool.get_conn().await.unwrap();
        let rows: Vec<(String, String)> = conn.query("SHOW GLOBAL STATUS").await.unwrap();
        Counters(
            rows.into_iter()
                .filter(|(name, _)| COUNTERS.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)))
                .filter_map(|(name, value)| Some((name.to_ascii_lowercase(), value.parse().ok()?)))
                .collect(),
        )
    }

    /// Each counter's growth from `self` to `later`, per event: (short name, value).
    pub fn per_event(&self, later: &Counters, events: usize) -> Vec<(&'static str, f64)> {
        COUNTERS
            .iter()
            .filter_map(|(name, short)| {
                let key = name.to_ascii_lowercase();
                let grown = later.0.get(&key)? - self.0.get(&key)?;
                Some((*short, grown / events.max(1) as f64))
            })
            .collect()
    }
}

/// A table of per-event counters, one row per run.
pub fn table(runs: &[(String, Vec<(&'static str, f64)>)]) -> String {
    use std::fmt::Write as _;
    let Some((_, first)) = runs.first() else {
        return String::new();
    };
    let mut s = String::from("| run |");
    for (name, _) in first {
        let _ = write!(s, " {name} |");
    }
    let _ = writeln!(s, "\n|{}", " --- |".repeat(first.len() + 1));
    for (label, values) in runs {
        let _ = write!(s, "| {label} |");
        for (_, value) in values {
            let _ = write!(s, " {} |", short(*value));
        }
        s.push('\n');
    }
    s
}

/// A per-event figure with the digits that matter.
fn short(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    }
}
