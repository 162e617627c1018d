//! The binlog file name a rotate event carries.
//!
//! Guarantee: the name returned is the file's whole name, without checksum bytes, on MariaDB
//! and on MySQL, so a checkpoint's file/offset names a file the server has.

use super::ServerFlavor;

/// Whether the stream's first rotate event (the server's artificial one, sent before the format
/// description that announces checksums, so mysql_common leaves them in) has the 4 checksum
/// bytes after the name. MariaDB appends them when the server checksums events; MySQL does not
/// (measured on MySQL 9.7 with mysql_async 0.37: the name arrives bare, and cutting 4 bytes
/// turned `binlog.000001` into `binlog.00`).
pub(super) fn first_has_checksum(flavor: ServerFlavor, server_checksums: bool) -> bool {
    server_checksums && flavor == ServerFlavor::MariaDb
}

/// The file name in a rotate event's `raw` name, its 4 trailing checksum bytes cut when
/// `has_checksum`. File names are `[A-Za-z0-9._-]`: it stops at the first other character, in
/// case a server sent something unexpected.
pub(super) fn file_name(raw: &[u8], has_checksum: bool) -> String {
    let raw = if has_checksum {
        &raw[..raw.len().saturating_sub(4)]
    } else {
        raw
    };
    String::from_utf8_lossy(raw)
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{file_name, first_has_checksum};
    use crate::binlog::ServerFlavor;

    #[test]
    fn rotate_names_lose_trailing_checksum_bytes() {
        // MariaDB 10.11's first rotate, as read (measured).
        let mariadb = b"binlog.000001\xe9\xd2\xca\x6e";
        assert_eq!(file_name(mariadb, true), "binlog.000001");
        // Checksum bytes that happen to be file-name characters are cut too.
        assert_eq!(file_name(b"binlog.000001abcd", true), "binlog.000001");
        assert_eq!(
            file_name(b"binlog.000001\xef\xbf\xbdn", false),
            "binlog.000001"
        );
        assert_eq!(file_name(b"mysql-bin.000042", false), "mysql-bin.000042");
    }

    #[test]
    fn only_mariadb_sends_checksum_bytes_in_the_first_rotate() {
        assert!(first_has_checksum(ServerFlavor::MariaDb, true));
        assert!(!first_has_checksum(ServerFlavor::MariaDb, false));
        // MySQL 9.7's first rotate is `binlog.000001` with nothing after it (measured).
        assert!(!first_has_checksum(ServerFlavor::MySqlGtid, true));
        assert!(!first_has_checksum(ServerFlavor::MySqlFilePos, true));
        assert_eq!(
            file_name(
                b"binlog.000001",
                first_has_checksum(ServerFlavor::MySqlGtid, true)
            ),
            "binlog.000001"
        );
    }
}
