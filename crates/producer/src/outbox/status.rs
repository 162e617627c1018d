//! The outbox `status` column: the one place its numeric codes are written down.
//!
//! Guarantee: every SQL text that reads or writes `status` gets the code from here
//! ([`Status::sql`], [`Status::sql_in`], [`Status::code`]), so the codes cannot drift apart
//! between the producer, the relay, the sweeper and the operator commands.

/// A row's place in its life: written PENDING, claimed SENDING by a sweeper, then SENT (with the
/// broker's `msg_id`) or FAILED (with `last_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    /// Written by the business transaction, not yet published.
    Pending,
    /// Claimed by a sweeper (`owner`, `lease_until`) and being published.
    Sending,
    /// Stored by the broker (`SEND_OK`); `msg_id` is the broker's id.
    Sent,
    /// Given up on; `last_error` says why.
    Failed,
}

impl Status {
    /// Every status, in code order.
    pub const ALL: [Status; 4] = [
        Status::Pending,
        Status::Sending,
        Status::Sent,
        Status::Failed,
    ];

    /// The column value (`TINYINT`).
    pub const fn code(self) -> i8 {
        match self {
            Status::Pending => 0,
            Status::Sending => 1,
            Status::Sent => 2,
            Status::Failed => 3,
        }
    }

    /// The status a column value stands for, if any.
    pub fn from_code(code: i64) -> Option<Self> {
        Self::ALL.into_iter().find(|s| i64::from(s.code()) == code)
    }

    /// `status = <code>`: a condition after `WHERE` or an assignment after `SET`.
    pub const fn sql(self) -> &'static str {
        match self {
            Status::Pending => "status = 0",
            Status::Sending => "status = 1",
            Status::Sent => "status = 2",
            Status::Failed => "status = 3",
        }
    }

    /// `status IN (<codes>)` for `statuses`.
    pub fn sql_in(statuses: &[Status]) -> String {
        let codes: Vec<String> = statuses.iter().map(|s| s.code().to_string()).collect();
        format!("status IN ({})", codes.join(", "))
    }

    /// Not yet delivered or given up on: PENDING or SENDING.
    pub const UNDELIVERED: [Status; 2] = [Status::Pending, Status::Sending];

    /// The upper-case name operators and JSON output use.
    pub const fn name(self) -> &'static str {
        match self {
            Status::Pending => "PENDING",
            Status::Sending => "SENDING",
            Status::Sent => "SENT",
            Status::Failed => "FAILED",
        }
    }
}

/// The codes as constants, for SQL written by hand in tests and tools:
/// `format!("SELECT … WHERE status = {SENT}")`.
pub mod codes {
    use super::Status;

    pub const PENDING: i8 = Status::Pending.code();
    pub const SENDING: i8 = Status::Sending.code();
    pub const SENT: i8 = Status::Sent.code();
    pub const FAILED: i8 = Status::Failed.code();
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_sql_agrees_with_them() {
        for s in Status::ALL {
            assert_eq!(Status::from_code(s.code().into()), Some(s));
            assert_eq!(s.sql(), format!("status = {}", s.code()));
        }
        assert_eq!(Status::from_code(9), None);
        assert_eq!(Status::sql_in(&Status::UNDELIVERED), "status IN (0, 1)");
        assert_eq!(Status::Sent.to_string(), "SENT");
    }
}
