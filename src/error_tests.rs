//! Each class decision the instance made before the typed error (by looking for known types in
//! an `anyhow` chain) is still made, now by [`PipelineError::class`].

use super::*;
use crate::db::PermanentFault;

fn lost() -> mysql_async::Error {
    mysql_async::Error::Driver(mysql_async::DriverError::PoolDisconnected)
}

fn sled_error() -> StoreError {
    StoreError::Sled {
        path: "/var/lib/relay".into(),
        source: sled::Error::Io(std::io::Error::other("No space left on device")),
    }
}

async fn panicked() -> tokio::task::JoinError {
    tokio::spawn(async { panic!("a bug") }).await.unwrap_err()
}

#[tokio::test]
async fn every_kind_keeps_the_class_the_instance_gave_it() {
    use ErrorClass::*;
    let cases: Vec<(PipelineError, ErrorClass)> = vec![
        // Start-up checks: the user fixes the server or the grants; an unreachable server
        // stops only before the first round; a query failing mid-check is retried.
        (
            StartupError::Misconfigured("binlog_format".into()).into(),
            Permanent,
        ),
        (
            StartupError::Privilege("REPLICATION CLIENT".into()).into(),
            Permanent,
        ),
        (StartupError::Connect(lost()).into(), Unreachable),
        (StartupError::Database(lost()).into(), Retryable),
        // The reader: a refused or unsupported binlog stops; a purged position falls back.
        (ReaderError::NotAllowed("denied".into()).into(), Permanent),
        (
            ReaderError::Unsupported("binlog checksum".into()).into(),
            Permanent,
        ),
        (
            ReaderError::PositionGone {
                position: "0-1-5".into(),
                message: "purged".into(),
            }
            .into(),
            Retryable,
        ),
        // The checkpoint store: a broken local store stops; the mirror's faults are retried.
        (sled_error().into(), Permanent),
        (StoreError::Corrupt("bad".into()).into(), Permanent),
        (StoreError::Mysql(lost()).into(), Retryable),
        (StoreError::Fenced(3).into(), Retryable),
        // The checkpointer: classified by the store error it gave up on.
        (
            CheckpointError::NotSaved {
                message: "gave up".into(),
                source: sled_error(),
            }
            .into(),
            Permanent,
        ),
        (
            CheckpointError::NotSaved {
                message: "final save".into(),
                source: StoreError::Fenced(3),
            }
            .into(),
            Retryable,
        ),
        // Lost connections (before: a mysql_async error in the chain) are retried.
        (PipelineError::Election(lost()), Retryable),
        (
            DbError::new("cannot read outbox table t", lost()).into(),
            Retryable,
        ),
        // A panicked task (before: an error of no known type) is retried, and reported.
        (
            CheckpointError::Panicked(panicked().await).into(),
            Unexpected,
        ),
        (
            PipelineError::task("binlog reader")(panicked().await),
            Unexpected,
        ),
    ];
    for (error, class) in cases {
        assert_eq!(error.class(), class, "{}", error.report());
    }
}

#[test]
fn a_marking_error_always_stops_the_relay() {
    for fault in [
        PermanentFault::Privilege,
        PermanentFault::Schema,
        PermanentFault::Data,
    ] {
        let error = PipelineError::Mark(MarkError::for_test(fault));
        assert_eq!(error.class(), ErrorClass::Permanent);
    }
}

#[test]
fn what_each_class_makes_the_instance_do() {
    // (class, stops before the first round, stops after it, reported)
    let table = [
        (ErrorClass::Retryable, false, false, false),
        (ErrorClass::Permanent, true, true, false),
        (ErrorClass::Unreachable, true, false, false),
        (ErrorClass::Unexpected, false, false, true),
    ];
    for (class, before, after, reported) in table {
        assert_eq!(
            class.stops(false),
            before,
            "{class:?} before the first round"
        );
        assert_eq!(class.stops(true), after, "{class:?} after it");
        assert_eq!(class.reported(), reported, "{class:?}");
    }
}

#[test]
fn the_report_names_each_cause() {
    let error = PipelineError::from(DbError::new(
        "cannot read outbox table db.outbox_event (run `outbox-relay migrate`?)",
        lost(),
    ));
    let text = error.report().to_string();
    assert!(
        text.starts_with("cannot read outbox table db.outbox_event")
            && text.contains(&lost().to_string()),
        "{text}"
    );
    // A stage's own error reads as before (the variant adds nothing to its message).
    let refused = PipelineError::from(ReaderError::NotAllowed("denied".into()));
    assert_eq!(
        refused.to_string(),
        ReaderError::NotAllowed("denied".into()).to_string()
    );
}
