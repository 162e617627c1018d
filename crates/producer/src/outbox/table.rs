//! Validated table names (they are spliced into SQL, so they must be plain identifiers).

use std::fmt;

/// `schema.table` or `table`; each part 1–64 characters of `[A-Za-z0-9_$]`.
///
/// Guarantee: a `TableName` is safe to splice into SQL inside backquotes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableName {
    pub schema: Option<String>,
    pub table: String,
}

impl TableName {
    /// Parses `table` or `schema.table`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (schema, table) = match text.split_once('.') {
            Some((schema, table)) => (Some(schema), table),
            None => (None, text),
        };
        if let Some(schema) = schema {
            check_identifier(schema, text)?;
        }
        check_identifier(table, text)?;
        Ok(Self {
            schema: schema.map(str::to_string),
            table: table.to_string(),
        })
    }

    /// `outbox_event` of the connection's database: the default outbox table, the one the
    /// migrations create and change.
    pub fn default_outbox() -> Self {
        Self {
            schema: None,
            table: super::DEFAULT_TABLE.to_string(),
        }
    }

    /// Whether this is [`TableName::default_outbox`] (other outbox tables are only adopted).
    pub fn is_default_outbox(&self) -> bool {
        self.schema.is_none() && self.table == super::DEFAULT_TABLE
    }

    /// The name as SQL: `` `schema`.`table` `` or `` `table` ``.
    pub fn sql(&self) -> String {
        match &self.schema {
            Some(schema) => format!("`{schema}`.`{}`", self.table),
            None => format!("`{}`", self.table),
        }
    }

    /// The same table in `schema` when no schema was given.
    pub fn in_schema(&self, schema: &str) -> TableName {
        TableName {
            schema: Some(self.schema.clone().unwrap_or_else(|| schema.to_string())),
            table: self.table.clone(),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(schema) => write!(f, "{schema}.{}", self.table),
            None => f.write_str(&self.table),
        }
    }
}

fn check_identifier(part: &str, whole: &str) -> Result<(), String> {
    let ok = !part.is_empty()
        && part.len() <= 64
        && part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{whole}` is not a table name: use `table` or `schema.table` with 1 to 64 \
             letters, digits, `_` or `$` in each part"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_qualified_names() {
        let t = TableName::parse("outbox_event").unwrap();
        assert_eq!(t.schema, None);
        assert_eq!(t.sql(), "`outbox_event`");
        let t = TableName::parse("app.outbox_event").unwrap();
        assert_eq!(t.schema.as_deref(), Some("app"));
        assert_eq!(t.sql(), "`app`.`outbox_event`");
        assert_eq!(t.to_string(), "app.outbox_event");
    }

    #[test]
    fn rejects_anything_that_could_escape_quoting() {
        for bad in [
            "",
            "a.",
            ".a",
            "a.b.c",
            "a`b",
            "a b",
            "a;drop",
            &"x".repeat(65),
        ] {
            assert!(TableName::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn in_schema_keeps_an_explicit_schema() {
        let t = TableName::parse("other.t").unwrap().in_schema("app");
        assert_eq!(t.to_string(), "other.t");
        let t = TableName::parse("t").unwrap().in_schema("app");
        assert_eq!(t.to_string(), "app.t");
    }
}
