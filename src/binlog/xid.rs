//! XA transaction ids as the binlog carries them: in the `XA_PREPARE` event (binary) and in the
//! `XA END` / `XA COMMIT` / `XA ROLLBACK` statements (text, `X'<gtrid>',X'<bqual>',<formatID>`).
//!
//! Guarantee: the id read from a prepare event equals the id parsed from the statement that
//! resolves it, on MySQL and MariaDB alike, so a prepared transaction is matched with its outcome.

use std::fmt;

/// One XA transaction id: global transaction id, branch qualifier and format id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Xid {
    pub format_id: i64,
    pub gtrid: Vec<u8>,
    pub bqual: Vec<u8>,
}

impl Xid {
    /// Reads an `XA_PREPARE_LOG_EVENT` body: `one_phase` (1 byte), `formatID` (4), gtrid length
    /// (4), bqual length (4), then gtrid and bqual. Returns `(one_phase, xid)`.
    pub fn from_prepare_event(body: &[u8]) -> Result<(bool, Xid), String> {
        let word = |at: usize| -> Result<u32, String> {
            body.get(at..at + 4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                .ok_or_else(|| format!("XA_PREPARE event of {} bytes is truncated", body.len()))
        };
        let one_phase = *body.first().ok_or("empty XA_PREPARE event")? != 0;
        let format_id = i64::from(word(1)? as i32);
        let (gtrid_len, bqual_len) = (word(5)? as usize, word(9)? as usize);
        let data = body
            .get(13..13 + gtrid_len + bqual_len)
            .ok_or_else(|| format!("XA_PREPARE event of {} bytes is truncated", body.len()))?;
        let xid = Xid {
            format_id,
            gtrid: data[..gtrid_len].to_vec(),
            bqual: data[gtrid_len..].to_vec(),
        };
        Ok((one_phase, xid))
    }

    /// Parses the id the server writes after `XA END`, `XA COMMIT` or `XA ROLLBACK`:
    /// `X'6131',X'',1` (a trailing `ONE PHASE` is ignored). `None` if it is not in that form.
    pub fn parse_statement_id(text: &str) -> Option<Xid> {
        let mut parts = text.trim().splitn(3, ',');
        let gtrid = hex_literal(parts.next()?)?;
        let bqual = hex_literal(parts.next()?)?;
        let format = parts.next()?.split_whitespace().next()?;
        Some(Xid {
            format_id: format.parse().ok()?,
            gtrid,
            bqual,
        })
    }
}

/// `X'…'` → bytes.
fn hex_literal(text: &str) -> Option<Vec<u8>> {
    let text = text.trim();
    let inner = text
        .strip_prefix("X'")
        .or_else(|| text.strip_prefix("x'"))?
        .strip_suffix('\'')?;
    if inner.len() % 2 != 0 {
        return None;
    }
    (0..inner.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(inner.get(i..i + 2)?, 16).ok())
        .collect()
}

impl fmt::Display for Xid {
    /// The server's own form, e.g. `X'6131',X'',1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        write!(
            f,
            "X'{}',X'{}',{}",
            hex(&self.gtrid),
            hex(&self.bqual),
            self.format_id
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepare_event(one_phase: bool, format_id: i32, gtrid: &[u8], bqual: &[u8]) -> Vec<u8> {
        let mut body = vec![u8::from(one_phase)];
        body.extend(format_id.to_le_bytes());
        body.extend((gtrid.len() as u32).to_le_bytes());
        body.extend((bqual.len() as u32).to_le_bytes());
        body.extend(gtrid);
        body.extend(bqual);
        body
    }

    #[test]
    fn the_prepare_event_and_the_resolving_statement_name_the_same_xid() {
        let (one_phase, xid) =
            Xid::from_prepare_event(&prepare_event(false, 7, b"b2", b"q")).unwrap();
        assert!(!one_phase);
        assert_eq!(
            Xid::parse_statement_id("X'6232',X'71',7"),
            Some(xid.clone())
        );
        assert_eq!(xid.to_string(), "X'6232',X'71',7");
        let (one_phase, xid) =
            Xid::from_prepare_event(&prepare_event(true, 1, b"a1", b"")).unwrap();
        assert!(one_phase);
        assert_eq!(
            Xid::parse_statement_id(" X'6131',X'',1 ONE PHASE"),
            Some(xid)
        );
    }

    #[test]
    fn malformed_ids_are_refused_not_guessed() {
        assert!(Xid::from_prepare_event(&[]).is_err());
        assert!(Xid::from_prepare_event(&prepare_event(false, 1, b"abc", b"")[..15]).is_err());
        for text in [
            "'a1'",
            "X'6',X'',1",
            "X'6131',X''",
            "X'zz',X'',1",
            "X'6131',X'',x",
        ] {
            assert_eq!(Xid::parse_statement_id(text), None, "{text}");
        }
    }
}
