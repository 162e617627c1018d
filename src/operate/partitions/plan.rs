//! The pure part of partition maintenance: partition names and bounds, the layout read from
//! `information_schema.PARTITIONS`, which days to create, which days may be dropped, and the
//! key changes partitioning needs. No server is asked here.
//!
//! A day partition is named `pYYYYMMDD` and holds `created_at` in `[YYYY-MM-DD, next day)`
//! (`VALUES LESS THAN ('next day')`); the last partition is the catch-all `p_future VALUES
//! LESS THAN (MAXVALUE)`. Partitions with other names or bounds are never dropped.

use chrono::{NaiveDate, NaiveDateTime};

/// The catch-all partition's name.
pub const FUTURE: &str = "p_future";

/// MySQL's limit is 8192 partitions per table; stay clear of it.
pub const MAX_PARTITIONS: usize = 8000;

/// The name of `day`'s partition: `p20250601`.
pub fn day_name(day: NaiveDate) -> String {
    format!("p{}", day.format("%Y%m%d"))
}

/// The day of a partition named `pYYYYMMDD`.
pub fn parse_day_name(name: &str) -> Option<NaiveDate> {
    let digits = name.strip_prefix('p')?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    NaiveDate::parse_from_str(digits, "%Y%m%d").ok()
}

fn next(day: NaiveDate) -> NaiveDate {
    day.succ_opt().expect("a day before year 262143")
}

/// `PARTITION p20250601 VALUES LESS THAN ('2025-06-02')`.
pub fn day_definition(day: NaiveDate) -> String {
    format!(
        "PARTITION {} VALUES LESS THAN ('{}')",
        day_name(day),
        next(day).format("%Y-%m-%d")
    )
}

/// `PARTITION p_future VALUES LESS THAN (MAXVALUE)`.
pub fn future_definition() -> String {
    format!("PARTITION {FUTURE} VALUES LESS THAN (MAXVALUE)")
}

/// The definitions of `days` (in order) and the catch-all, comma-separated.
pub fn definitions(days: &[NaiveDate]) -> String {
    days.iter()
        .map(|d| day_definition(*d))
        .chain([future_definition()])
        .collect::<Vec<_>>()
        .join(", ")
}

/// One partition of a table, in its ordinal position.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Partition {
    pub name: String,
    /// `VALUES LESS THAN` this day's midnight; `None` for `MAXVALUE`.
    pub below: Option<NaiveDate>,
    /// The day it holds, if it is a day partition of ours (name and bound agree).
    pub day: Option<NaiveDate>,
    /// `information_schema.PARTITIONS.TABLE_ROWS`: an estimate.
    pub rows_estimate: u64,
}

impl Partition {
    /// From `PARTITION_NAME`, `PARTITION_DESCRIPTION` (`'2025-06-02'`, `'2025-06-02
    /// 00:00:00'` or `MAXVALUE`) and `TABLE_ROWS`.
    pub fn parse(name: &str, description: &str, rows_estimate: u64) -> Result<Self, String> {
        let description = description.trim();
        let below = if description.eq_ignore_ascii_case("MAXVALUE") {
            None
        } else {
            let text = description.trim_matches('\'');
            let date = text.get(..10).unwrap_or(text);
            let day = NaiveDate::parse_from_str(date, "%Y-%m-%d").map_err(|_| {
                format!("partition {name}: cannot read its bound {description} as a date")
            })?;
            Some(day)
        };
        let day = parse_day_name(name).filter(|d| below == Some(next(*d)));
        Ok(Partition {
            name: name.to_string(),
            below,
            day,
            rows_estimate,
        })
    }
}

/// A partitioned table's partitions, in order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Layout {
    /// `PARTITION_METHOD` and `PARTITION_EXPRESSION`, e.g. `RANGE COLUMNS` and `` `created_at` ``.
    pub method: String,
    pub expression: String,
    pub partitions: Vec<Partition>,
}

impl Layout {
    /// Partitioned the way this module partitions: `RANGE COLUMNS (created_at)`. Only such a
    /// layout is maintained.
    pub fn by_day(&self) -> bool {
        self.method.eq_ignore_ascii_case("RANGE COLUMNS")
            && self
                .expression
                .trim()
                .trim_matches('`')
                .eq_ignore_ascii_case(COLUMN)
    }

    /// The day partitions of ours.
    pub fn days(&self) -> impl Iterator<Item = NaiveDate> + '_ {
        self.partitions.iter().filter_map(|p| p.day)
    }

    /// The `MAXVALUE` partition's name, if there is one.
    pub fn catch_all(&self) -> Option<&str> {
        self.partitions
            .iter()
            .find(|p| p.below.is_none())
            .map(|p| p.name.as_str())
    }

    /// Day partitions starting after `today`: the `outbox_partitions_ahead` gauge.
    pub fn days_ahead(&self, today: NaiveDate) -> u32 {
        self.days().filter(|d| *d > today).count() as u32
    }

    /// The days to add so that every day up to `today + ahead` has its partition: from the
    /// last bounded partition's bound (days are contiguous; days before today are included
    /// when maintenance stopped for a while, and the catch-all's rows of those days move into
    /// them) or from `today` when there is none.
    pub fn to_create(&self, today: NaiveDate, ahead: u32) -> Vec<NaiveDate> {
        let start = self
            .partitions
            .iter()
            .filter_map(|p| p.below)
            .max()
            .unwrap_or(today);
        let room = MAX_PARTITIONS.saturating_sub(self.partitions.len());
        day_range(start, today + chrono::Days::new(ahead.into()))
            .into_iter()
            .take(room)
            .collect()
    }

    /// The day partitions entirely before `cutoff` (their bound, next midnight, is at or
    /// before it): the ones that may be dropped if they hold no unfinished row. Never the last
    /// bounded partition, so a table keeps at least one day besides the catch-all.
    pub fn past(&self, cutoff: NaiveDateTime) -> Vec<&Partition> {
        let last_bounded = self.partitions.iter().rfind(|p| p.below.is_some());
        self.partitions
            .iter()
            .filter(|p| p.day.is_some())
            .filter(|p| {
                p.below
                    .is_some_and(|b| b.and_hms_opt(0, 0, 0).unwrap() <= cutoff)
            })
            .filter(|p| Some(*p) != last_bounded)
            .collect()
    }
}

/// `from..=to`, day by day (empty if `to < from`).
pub fn day_range(from: NaiveDate, to: NaiveDate) -> Vec<NaiveDate> {
    from.iter_days().take_while(|d| *d <= to).collect()
}

/// The days `convert` creates: from the oldest row's day (or today) through `today + ahead`.
pub fn convert_days(oldest: Option<NaiveDate>, today: NaiveDate, ahead: u32) -> Vec<NaiveDate> {
    let from = oldest.map_or(today, |o| o.min(today));
    day_range(from, today + chrono::Days::new(ahead.into()))
}

/// The partitioning column.
pub const COLUMN: &str = "created_at";

/// A unique key of the table as `information_schema.STATISTICS` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UniqueKey {
    pub name: String,
    pub columns: Vec<String>,
}

/// The `ALTER TABLE` clauses that make every unique key contain `created_at` (MySQL and
/// MariaDB require it of a partitioned table): the primary key gets `created_at` appended;
/// `uk_event_id` becomes the non-unique `idx_event_id (event_id)` (global `event_id`
/// uniqueness is then the producer's job; consumers de-duplicate anyway). Any other unique key
/// without `created_at` is refused: its owner must decide.
pub fn key_changes(keys: &[UniqueKey]) -> Result<Vec<String>, String> {
    let mut clauses = Vec::new();
    for key in keys {
        if key.columns.iter().any(|c| c.eq_ignore_ascii_case(COLUMN)) {
            continue;
        }
        let quoted = |cols: &[String]| {
            cols.iter()
                .map(|c| format!("`{}`", c.replace('`', "``")))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if key.name == "PRIMARY" {
            clauses.push(format!(
                "DROP PRIMARY KEY, ADD PRIMARY KEY ({}, `{COLUMN}`)",
                quoted(&key.columns)
            ));
        } else if key.name == "uk_event_id" {
            clauses.push(format!(
                "DROP INDEX `uk_event_id`, ADD INDEX `idx_event_id` ({})",
                quoted(&key.columns)
            ));
        } else {
            return Err(format!(
                "unique key `{}` ({}) does not contain {COLUMN}, which a partitioned table \
                 requires: add {COLUMN} to it or make it non-unique, then run convert again",
                key.name,
                key.columns.join(", ")
            ));
        }
    }
    Ok(clauses)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    fn layout(days: &[&str], future: bool) -> Layout {
        let mut partitions: Vec<Partition> = days
            .iter()
            .map(|d| {
                let d = day(d);
                Partition::parse(&day_name(d), &format!("'{}'", next(d)), 10).unwrap()
            })
            .collect();
        if future {
            partitions.push(Partition::parse(FUTURE, "MAXVALUE", 0).unwrap());
        }
        Layout {
            method: "RANGE COLUMNS".into(),
            expression: "`created_at`".into(),
            partitions,
        }
    }

    #[test]
    fn names_and_definitions() {
        assert_eq!(day_name(day("2025-06-01")), "p20250601");
        assert_eq!(parse_day_name("p20250601"), Some(day("2025-06-01")));
        for bad in ["p2025061", "p20251301", "x20250601", FUTURE, "p2025060a"] {
            assert_eq!(parse_day_name(bad), None, "{bad}");
        }
        assert_eq!(
            day_definition(day("2024-12-31")),
            "PARTITION p20241231 VALUES LESS THAN ('2025-01-01')"
        );
        assert_eq!(
            definitions(&[day("2024-02-28"), day("2024-02-29")]),
            "PARTITION p20240228 VALUES LESS THAN ('2024-02-29'), \
             PARTITION p20240229 VALUES LESS THAN ('2024-03-01'), \
             PARTITION p_future VALUES LESS THAN (MAXVALUE)"
        );
    }

    #[test]
    fn both_servers_descriptions_are_read() {
        let mysql = Partition::parse("p20250601", "'2025-06-02 00:00:00'", 3).unwrap();
        let mariadb = Partition::parse("p20250601", "'2025-06-02'", 3).unwrap();
        assert_eq!(mysql, mariadb);
        assert_eq!(mysql.day, Some(day("2025-06-01")));
        // A hand-made partition whose name and bound disagree is not a day of ours.
        let odd = Partition::parse("p20250601", "'2025-06-05'", 0).unwrap();
        assert_eq!(odd.day, None);
        assert!(Partition::parse("p1", "'soon'", 0).is_err());
    }

    #[test]
    fn creates_the_missing_days_up_to_ahead_and_counts_days_ahead() {
        let today = day("2025-06-10");
        let l = layout(&["2025-06-09", "2025-06-10", "2025-06-11"], true);
        assert_eq!(l.days_ahead(today), 1);
        assert_eq!(
            l.to_create(today, 3),
            vec![day("2025-06-12"), day("2025-06-13")]
        );
        assert!(l.to_create(today, 1).is_empty(), "already one day ahead");
        // Maintenance stopped for days: the gap is filled, past days included.
        let stale = layout(&["2025-06-01"], true);
        assert_eq!(stale.days_ahead(today), 0);
        assert_eq!(stale.to_create(today, 1).first(), Some(&day("2025-06-02")));
        assert_eq!(stale.to_create(today, 1).last(), Some(&day("2025-06-11")));
        assert_eq!(layout(&[], true).to_create(today, 0), vec![today]);
        assert!(l.by_day());
        let hashed = Layout {
            method: "HASH".into(),
            expression: "`id`".into(),
            ..l.clone()
        };
        assert!(!hashed.by_day());
    }

    #[test]
    fn only_whole_days_before_the_cutoff_are_past_and_never_the_last_day() {
        let l = layout(&["2025-06-01", "2025-06-02", "2025-06-03"], true);
        let at = |s: &str| NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f").unwrap();
        let names = |c: &str| {
            l.past(at(c))
                .iter()
                .map(|p| p.name.clone())
                .collect::<Vec<_>>()
        };
        assert!(names("2025-06-01 23:59:59.999").is_empty());
        assert_eq!(names("2025-06-02 00:00:00.000"), vec!["p20250601"]);
        assert_eq!(
            names("2025-06-03 12:00:00.000"),
            vec!["p20250601", "p20250602"]
        );
        assert_eq!(
            names("2025-07-01 00:00:00.000"),
            vec!["p20250601", "p20250602"]
        );
    }

    #[test]
    fn convert_covers_the_oldest_row_through_ahead() {
        let today = day("2025-06-10");
        let days = convert_days(Some(day("2025-06-08")), today, 2);
        assert_eq!(days.len(), 5);
        assert_eq!(days[0], day("2025-06-08"));
        assert_eq!(days[4], day("2025-06-12"));
        assert_eq!(convert_days(None, today, 0), vec![today]);
        assert_eq!(convert_days(Some(day("2025-07-01")), today, 0), vec![today]);
    }

    #[test]
    fn unique_keys_get_created_at_or_stop_being_unique() {
        let key = |name: &str, cols: &[&str]| UniqueKey {
            name: name.into(),
            columns: cols.iter().map(|c| c.to_string()).collect(),
        };
        let clauses = key_changes(&[
            key("PRIMARY", &["id"]),
            key("uk_event_id", &["event_id"]),
            key("uk_done", &["event_id", "created_at"]),
        ])
        .unwrap();
        assert_eq!(
            clauses,
            vec![
                "DROP PRIMARY KEY, ADD PRIMARY KEY (`id`, `created_at`)",
                "DROP INDEX `uk_event_id`, ADD INDEX `idx_event_id` (`event_id`)",
            ]
        );
        let err = key_changes(&[key("uk_order", &["biz_key"])]).unwrap_err();
        assert!(
            err.contains("uk_order") && err.contains("created_at"),
            "{err}"
        );
        assert!(key_changes(&[key("PRIMARY", &["id", "created_at"])])
            .unwrap()
            .is_empty());
    }
}
