//! Which outbox rows a compensation command applies to: ids, event_ids and filters.

use super::{db_time_ago, placeholders};
use crate::outbox::Status;
use mysql_async::{Conn, Value};
use std::str::FromStr;
use std::time::Duration;

/// A `--created-before` / `--created-after` bound: a duration ago (`2h`, `7d`) or a database
/// time (`2024-05-01`, `2024-05-01 13:00`, `2024-05-01T13:00:00.5`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimeBound {
    Ago(Duration),
    At(String),
}

impl FromStr for TimeBound {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if let Ok(ago) = humantime::parse_duration(text) {
            return Ok(TimeBound::Ago(ago));
        }
        let normalized = text.replacen('T', " ", 1);
        if is_datetime(&normalized) {
            return Ok(TimeBound::At(normalized));
        }
        Err(format!(
            "`{text}` is neither a duration (e.g. 2h, 7d) nor a time like 2024-05-01 or \
             2024-05-01 13:00:00 (database time zone)"
        ))
    }
}

/// `YYYY-MM-DD[ HH:MM[:SS[.f…]]]`.
fn is_datetime(text: &str) -> bool {
    let shape = |part: &str, pattern: &str| {
        part.len() == pattern.len()
            && part.chars().zip(pattern.chars()).all(|(c, p)| match p {
                'd' => c.is_ascii_digit(),
                _ => c == p,
            })
    };
    let (date, time) = match text.split_once(' ') {
        Some((date, time)) => (date, Some(time)),
        None => (text, None),
    };
    if !shape(date, "dddd-dd-dd") {
        return false;
    }
    let Some(time) = time else { return true };
    let (hms, fraction) = match time.split_once('.') {
        Some((hms, f)) => (hms, Some(f)),
        None => (time, None),
    };
    (shape(hms, "dd:dd") || shape(hms, "dd:dd:dd"))
        && fraction.is_none_or(|f| {
            hms.len() == 8 && (1..=6).contains(&f.len()) && f.chars().all(|c| c.is_ascii_digit())
        })
}

/// Which rows a command applies to. Ids and event_ids are a list (any of them); every filter
/// given narrows further. With no id and no event_id, only rows in the action's source status
/// are selected (so `--limit` counts rows to change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub ids: Vec<i64>,
    pub event_ids: Vec<String>,
    pub topic: Option<String>,
    /// `last_error LIKE` this pattern.
    pub error_like: Option<String>,
    pub created_before: Option<TimeBound>,
    pub created_after: Option<TimeBound>,
    /// Most rows selected over all tables.
    pub limit: usize,
}

impl Default for Selection {
    fn default() -> Self {
        Selection {
            ids: Vec::new(),
            event_ids: Vec::new(),
            topic: None,
            error_like: None,
            created_before: None,
            created_after: None,
            limit: 1000,
        }
    }
}

impl Selection {
    /// Any `--id` or `--event-id` given.
    pub fn by_key(&self) -> bool {
        !self.ids.is_empty() || !self.event_ids.is_empty()
    }

    /// Any filter given.
    pub fn has_filter(&self) -> bool {
        self.topic.is_some()
            || self.error_like.is_some()
            || self.created_before.is_some()
            || self.created_after.is_some()
    }

    /// The time bounds as database times (durations are taken from the database clock).
    pub async fn bounds(&self, conn: &mut Conn) -> Result<Bounds, mysql_async::Error> {
        Ok(Bounds {
            created_before: bound(conn, &self.created_before).await?,
            created_after: bound(conn, &self.created_after).await?,
        })
    }

    /// The WHERE condition selecting these rows, and its values. Without ids and event_ids,
    /// only rows in `source` status are selected.
    pub fn condition(&self, source: Status, bounds: &Bounds) -> (String, Vec<Value>) {
        let mut conditions = Vec::new();
        let mut params: Vec<Value> = Vec::new();
        if self.by_key() {
            let mut keys = Vec::new();
            if !self.ids.is_empty() {
                keys.push(format!("id IN ({})", placeholders(self.ids.len())));
                params.extend(self.ids.iter().map(|id| Value::from(*id)));
            }
            if !self.event_ids.is_empty() {
                keys.push(format!(
                    "event_id IN ({})",
                    placeholders(self.event_ids.len())
                ));
                params.extend(self.event_ids.iter().map(|e| Value::from(e.as_str())));
            }
            conditions.push(format!("({})", keys.join(" OR ")));
        } else {
            conditions.push("status = ?".to_string());
            params.push(source.code().into());
        }
        if let Some(topic) = &self.topic {
            conditions.push("topic = ?".to_string());
            params.push(topic.as_str().into());
        }
        if let Some(pattern) = &self.error_like {
            conditions.push("last_error LIKE ?".to_string());
            params.push(pattern.as_str().into());
        }
        if let Some(time) = &bounds.created_before {
            conditions.push("created_at < ?".to_string());
            params.push(time.as_str().into());
        }
        if let Some(time) = &bounds.created_after {
            conditions.push("created_at >= ?".to_string());
            params.push(time.as_str().into());
        }
        (conditions.join(" AND "), params)
    }
}

/// A [`Selection`]'s time bounds as database times.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bounds {
    pub created_before: Option<String>,
    pub created_after: Option<String>,
}

async fn bound(
    conn: &mut Conn,
    bound: &Option<TimeBound>,
) -> Result<Option<String>, mysql_async::Error> {
    Ok(match bound {
        None => None,
        Some(TimeBound::At(time)) => Some(time.clone()),
        Some(TimeBound::Ago(ago)) => Some(db_time_ago(conn, *ago).await?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_bounds_are_durations_or_database_times() {
        assert_eq!(
            "2h".parse::<TimeBound>(),
            Ok(TimeBound::Ago(Duration::from_secs(7200)))
        );
        for ok in [
            "2024-05-01",
            "2024-05-01 13:00",
            "2024-05-01 13:00:59",
            "2024-05-01T13:00:59.123",
        ] {
            assert!(
                matches!(ok.parse::<TimeBound>(), Ok(TimeBound::At(_))),
                "{ok}"
            );
        }
        assert_eq!(
            "2024-05-01T13:00".parse::<TimeBound>(),
            Ok(TimeBound::At("2024-05-01 13:00".into()))
        );
        for bad in [
            "yesterday",
            "2024-5-1",
            "2024-05-01 13",
            "2024-05-01 13:00.5",
            "1; DROP",
        ] {
            assert!(bad.parse::<TimeBound>().is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_are_any_of_and_filters_narrow() {
        let selection = Selection {
            ids: vec![1, 2],
            event_ids: vec!["e".into()],
            topic: Some("t".into()),
            ..Selection::default()
        };
        let bounds = Bounds {
            created_before: Some("2024-05-01".into()),
            created_after: None,
        };
        let (sql, params) = selection.condition(Status::Failed, &bounds);
        assert_eq!(
            sql,
            "(id IN (?, ?) OR event_id IN (?)) AND topic = ? AND created_at < ?"
        );
        assert_eq!(params.len(), 5);
        let by_filter = Selection {
            error_like: Some("%x%".into()),
            ..Selection::default()
        };
        let (sql, params) = by_filter.condition(Status::Failed, &Bounds::default());
        assert_eq!(sql, "status = ? AND last_error LIKE ?");
        assert_eq!(params[0], Value::from(3i8));
    }
}
