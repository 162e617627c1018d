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

    /// Reads every after image of `rows` (a WRITE_ROWS event of this table map); stops at the
    /// first undecodable row (the rest of the event cannot be located after it).
    pub fn after_images<'a>(
        &'a self,
        rows: &'a RowsEventData<'a>,
    ) -> Vec<io::Result<RowValues<'a>>> {
        let mut images = Vec::new();
        let Some(present) = rows.columns_after_image() else {
            return images;
        };
        let present: Vec<usize> = present.iter_ones().collect();
        if present.iter().any(|&i| i >= self.columns.len()) {
            images.push(Err(invalid(
                "the rows event has more columns than its table map",
            )));
            return images;
        }
        let mut buf = ParseBuf(rows.rows_data());
        while !buf.is_empty() {
            let row = self.read_row(&present, &mut buf);
            let failed = row.is_err();
            images.push(row);
            if failed {
                break;
            }
        }
        images
    }

    /// One row image: the NULL bitmap over the present columns, then each non-NULL value.
    fn read_row<'a>(
        &'a self,
        present: &[usize],
        buf: &mut ParseBuf<'a>,
    ) -> io::Result<RowValues<'a>> {
        let nulls = buf
            .checked_eat(present.len().div_ceil(8))
            .ok_or_else(|| invalid("row image truncated in its NULL bitmap"))?;
        let mut values: RowValues<'a> = vec![None; self.columns.len()];
        for (n, &i) in present.iter().enumerate() {
            let column = &self.columns[i];
            let is_null = nulls[n / 8] & (1 << (n % 8)) != 0;
            values[i] = Some(if is_null {
                BinlogValue::Value(Value::NULL)
            } else {
                buf.parse((column.ty, column.meta.as_slice(), column.unsigned, false))?
            });
        }
        Ok(values)
    }
}
