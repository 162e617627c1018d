//! Reading the after images of an INSERT's rows event column by column, with each column's type,
//! metadata, signedness and name taken once per table map.
//!
//! mysql_common's row iterator builds a full `Column` description (schema, table, name, charset:
//! several allocations) for every column of every row and copies every value into an owned row;
//! at tens of thousands of outbox rows per second that was a third of the relay's reading cost.
//! Here each value is parsed by mysql_common's own value decoder straight from the event's bytes.
//!
//! Guarantee: values are indexed by the column's position in the table (not in the image), so a
//! row image that omits columns (a producer session with `binlog_row_image=MINIMAL`) cannot shift
//! one column's value into another's place: an omitted column reads as `None`.
//!
//! Guarantee: one undecodable row never hides its neighbours. A value whose byte length is known
//! but whose content cannot be decoded (binary JSON, length-prefixed, that mysql_common cannot
//! parse) makes only its row a [`RowImage::BadValue`]: the other values (the id among them) are
//! still read, and reading goes on with the next row. Where the length of a value cannot be
//! known (the data ends inside a row, a type this decoder cannot size, more columns than the table
//! map) nothing after it can be located: the event ends with one [`RowImage::Unreadable`], and
//! the rows from there on are neither located nor counted. They stay PENDING in the table, and the
//! sweeper publishes them (late, and after newer rows of their keys); the caller reports it
//! loudly. A real server writes neither, short of corruption or a type newer than this decoder.

use mysql_async::binlog::events::{OptionalMetaExtractor, RowsEventData, TableMapEvent};
use mysql_async::binlog::value::BinlogValue;
use mysql_async::consts::ColumnType;
use mysql_async::Value;
use mysql_common::io::ParseBuf;
use std::io;

/// One column of a table map.
#[derive(Debug, Clone)]
struct ColumnShape {
    name: String,
    ty: ColumnType,
    meta: Vec<u8>,
    unsigned: bool,
}

/// How to read the row images of one table map.
#[derive(Debug, Clone)]
pub struct TableShape {
    columns: Vec<ColumnShape>,
}

/// One row image: each table column's value by position; `None` when the image omits it.
pub type RowValues<'a> = Vec<Option<BinlogValue<'a>>>;

/// One after image of a rows event, as far as it could be read.
#[derive(Debug)]
pub enum RowImage<'a> {
    /// Every present value decoded.
    Read(RowValues<'a>),
    /// The row was located but a value could not be decoded; that column reads as `None`, the
    /// others as decoded. `reason` names the column.
    BadValue {
        values: RowValues<'a>,
        reason: String,
    },
    /// Nothing from here to the end of the event can be located (see the module documentation).
    Unreadable(String),
}

/// Why one value could not be read.
enum ValueError {
    /// Its length is known and skipped: the row's other values, and the next rows, can be read.
    Located(io::Error),
    /// Its length is unknown: nothing after it can be located.
    Lost(io::Error),
}

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

impl TableShape {
    /// The shape of `tme`'s table. Without column names in the binlog (`binlog_row_metadata`
    /// not FULL) columns are named `@0`, `@1`, … like mysql_common does.
    pub fn of(tme: &TableMapEvent<'_>) -> io::Result<Self> {
        let optional = OptionalMetaExtractor::new(tme.iter_optional_meta())?;
        let mut signedness = optional.iter_signedness();
        let mut names = optional.iter_column_name();
        let count = usize::try_from(tme.columns_count()).map_err(|_| invalid("column count"))?;
        let mut columns = Vec::with_capacity(count);
        for i in 0..count {
            let ty = tme
                .get_column_type(i)
                .map_err(|e| invalid(e.to_string()))?
                .ok_or_else(|| invalid(format!("no type for column {i}")))?;
            let unsigned = ty.is_numeric_type() && signedness.next().unwrap_or(false);
            let name = match names.next().transpose()? {
                Some(name) => name.name().into_owned(),
                None => format!("@{i}"),
            };
            columns.push(ColumnShape {
                name,
                ty,
                meta: tme.get_column_metadata(i).unwrap_or_default().to_vec(),
                unsigned,
            });
        }
        Ok(TableShape { columns })
    }

    /// The column names, in table order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.columns.iter().map(|c| c.name.as_str())
    }

    /// Reads every after image of `rows` (a WRITE_ROWS event of this table map); see the
    /// module documentation for what an undecodable value does.
    pub fn after_images<'a>(&'a self, rows: &'a RowsEventData<'a>) -> Vec<RowImage<'a>> {
        match rows.columns_after_image() {
            Some(present) => self.images(present.iter_ones().collect(), rows.rows_data()),
            None => Vec::new(),
        }
    }

    /// The row images of `data`, each holding the `present` columns.
    fn images<'a>(&'a self, present: Vec<usize>, data: &'a [u8]) -> Vec<RowImage<'a>> {
        if present.iter().any(|&i| i >= self.columns.len()) {
            let reason = "the rows event has more columns than its table map";
            return vec![RowImage::Unreadable(reason.into())];
        }
        let mut images = Vec::new();
        let mut buf = ParseBuf(data);
        while !buf.is_empty() {
            let image = self.read_row(&present, &mut buf);
            let lost = matches!(image, RowImage::Unreadable(_));
            images.push(image);
            if lost {
                break;
            }
        }
        images
    }

    /// One row image: the NULL bitmap over the present columns, then each non-NULL value.
    fn read_row<'a>(&'a self, present: &[usize], buf: &mut ParseBuf<'a>) -> RowImage<'a> {
        let Some(nulls) = buf.checked_eat(present.len().div_ceil(8)) else {
            return RowImage::Unreadable("row image truncated in its NULL bitmap".into());
        };
        let mut values: RowValues<'a> = vec![None; self.columns.len()];
        let mut bad = Vec::new();
        for (n, &i) in present.iter().enumerate() {
            let column = &self.columns[i];
            if nulls[n / 8] & (1 << (n % 8)) != 0 {
                values[i] = Some(BinlogValue::Value(Value::NULL));
                continue;
            }
            match column.read(buf) {
                Ok(value) => values[i] = Some(value),
                Err(ValueError::Located(e)) => bad.push(format!("`{}`: {e}", column.name)),
                Err(ValueError::Lost(e)) => {
                    return RowImage::Unreadable(format!(
                        "column `{}` of a row cannot be read: {e}",
                        column.name
                    ))
                }
            }
        }
        match bad.is_empty() {
            true => RowImage::Read(values),
            false => RowImage::BadValue {
                values,
                reason: bad.join("; "),
            },
        }
    }
}

impl ColumnShape {
    /// One non-NULL value, decoded from a copy of `buf` that replaces it only on success. On a
    /// failure, a value whose length is known apart from its content ([`Self::skip`]) is skipped
    /// ([`ValueError::Located`]); any other failure leaves the rest unlocated.
    fn read<'a>(&'a self, buf: &mut ParseBuf<'a>) -> Result<BinlogValue<'a>, ValueError> {
        let mut attempt = ParseBuf(buf.0);
        match attempt.parse((self.ty, self.meta.as_slice(), self.unsigned, false)) {
            Ok(value) => {
                *buf = attempt;
                injected(&value)?;
                Ok(value)
            }
            Err(e) if self.skip(buf) => Err(ValueError::Located(e)),
            Err(e) => Err(ValueError::Lost(e)),
        }
    }

    /// Moves `buf` past a value whose content could not be decoded, when its length can be read
    /// without its content: binary JSON (a 4-byte length, then the document). Other types'
    /// decoders fail only where the data ends (or on a type they cannot size): false.
    fn skip(&self, buf: &mut ParseBuf<'_>) -> bool {
        if self.ty != ColumnType::MYSQL_TYPE_JSON {
            return false;
        }
        let mut attempt = ParseBuf(buf.0);
        let skipped = attempt
            .checked_eat_u32_le()
            .and_then(|len| attempt.checked_eat(usize::try_from(len).ok()?))
            .is_some();
        if skipped {
            *buf = attempt;
        }
        skipped
    }
}

/// Test hook (`FAILPOINTS=undecodable_binlog_value=return`, see [`crate::failpoint`]): a text value
/// holding `failpoint:undecodable` reads as a located undecodable value, one holding
/// `failpoint:truncated` as the end of the event's readable data.
#[cfg(feature = "failpoints")]
fn injected(value: &BinlogValue<'_>) -> Result<(), ValueError> {
    let BinlogValue::Value(Value::Bytes(bytes)) = value else {
        return Ok(());
    };
    if !crate::failpoint::is_on(crate::failpoint::UNDECODABLE_BINLOG_VALUE) {
        return Ok(());
    }
    let holds = |marker: &[u8]| bytes.windows(marker.len()).any(|w| w == marker);
    if holds(b"failpoint:undecodable") {
        return Err(ValueError::Located(invalid("undecodable (failpoint)")));
    }
    if holds(b"failpoint:truncated") {
        return Err(ValueError::Lost(invalid("truncated (failpoint)")));
    }
    Ok(())
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
fn injected(_value: &BinlogValue<'_>) -> Result<(), ValueError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `id BIGINT, payload JSON, biz_key VARCHAR(64)`, as a table map gives them.
    fn shape() -> TableShape {
        let column = |name: &str, ty, meta: &[u8]| ColumnShape {
            name: name.into(),
            ty,
            meta: meta.to_vec(),
            unsigned: false,
        };
        TableShape {
            columns: vec![
                column("id", ColumnType::MYSQL_TYPE_LONGLONG, &[]),
                column("payload", ColumnType::MYSQL_TYPE_JSON, &[4]),
                column("biz_key", ColumnType::MYSQL_TYPE_VARCHAR, &[64, 0]),
            ],
        }
    }

    /// One row image: no NULLs, `id`, a binary JSON document, `key`.
    fn row(id: i64, jsonb: &[u8], key: &str) -> Vec<u8> {
        let mut bytes = vec![0];
        bytes.extend_from_slice(&id.to_le_bytes());
        bytes.extend_from_slice(&(jsonb.len() as u32).to_le_bytes());
        bytes.extend_from_slice(jsonb);
        bytes.push(key.len() as u8);
        bytes.extend_from_slice(key.as_bytes());
        bytes
    }

    /// The JSON string "hi", and a document of an unknown type.
    const GOOD: &[u8] = &[0x0C, 2, b'h', b'i'];
    const BAD: &[u8] = &[0xFF];

    fn id(values: &RowValues<'_>) -> Option<i64> {
        match values[0] {
            Some(BinlogValue::Value(Value::Int(id))) => Some(id),
            _ => None,
        }
    }

    #[test]
    fn an_undecodable_value_fails_its_row_alone() {
        let shape = shape();
        let data = [
            row(1, GOOD, "a"),
            row(2, BAD, "b"),
            row(3, GOOD, "c"),
            row(4, GOOD, "d"),
        ]
        .concat();
        let images = shape.images(vec![0, 1, 2], &data);
        assert_eq!(images.len(), 4, "every row is located: {images:?}");
        let read: Vec<Option<i64>> = images
            .iter()
            .map(|image| match image {
                RowImage::Read(values) => id(values),
                _ => None,
            })
            .collect();
        assert_eq!(read, [Some(1), None, Some(3), Some(4)]);
        let RowImage::BadValue { values, reason } = &images[1] else {
            panic!("{images:?}");
        };
        assert_eq!(id(values), Some(2), "the bad row keeps its id");
        assert!(values[1].is_none(), "the bad value is not guessed");
        assert!(
            matches!(&values[2], Some(BinlogValue::Value(Value::Bytes(b))) if b == b"b"),
            "the values after it are read: {values:?}"
        );
        assert!(reason.starts_with("`payload`: "), "{reason}");
    }

    #[test]
    fn where_a_length_is_unknown_the_rest_of_the_event_is_reported_unreadable() {
        let shape = shape();
        let mut data = [row(1, GOOD, "a"), row(2, GOOD, "b")].concat();
        let first = row(1, GOOD, "a").len();
        data.truncate(first + 5); // the second row ends inside its id
        let images = shape.images(vec![0, 1, 2], &data);
        assert!(matches!(&images[0], RowImage::Read(v) if id(v) == Some(1)));
        assert!(
            matches!(&images[1], RowImage::Unreadable(r) if r.contains("`id`")),
            "{images:?}"
        );
        assert_eq!(images.len(), 2);

        // A JSON length past the end of the data cannot be skipped either.
        let mut cut = row(1, GOOD, "a");
        cut.truncate(12);
        let images = shape.images(vec![0, 1, 2], &cut);
        assert!(matches!(&images[..], [RowImage::Unreadable(r)] if r.contains("`payload`")));

        let wider = shape.images(vec![0, 1, 2, 3], &data);
        assert!(matches!(&wider[..], [RowImage::Unreadable(r)] if r.contains("more columns")));
    }
}
