//! The checkpointer when saves fail: readiness and the error counter within one save period,
//! retries, recovery, and the stop once saves have failed for too long; on a store that fails by
//! itself (a full file system), when this machine lets the test mount one.

use super::*;
use crate::binlog::{MariaDbGtid, TxEnd, TxGtid};
use crate::checkpoint::MemoryStore;
use crate::metrics::Role;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// A store whose saves fail with ENOSPC while `fail` is set; it counts the attempts.
#[derive(Default)]
struct FlakyStore {
    inner: MemoryStore,
    fail: AtomicBool,
    attempts: AtomicU32,
}

impl CheckpointStore for FlakyStore {
    fn load(&self) -> Result<Option<BinlogPosition>, StoreError> {
        self.inner.load()
    }

    fn save(&self, position: &BinlogPosition) -> Result<(), StoreError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        if self.fail.load(Ordering::SeqCst) {
            return Err(StoreError::Sled {
                path: "/var/lib/outbox-relay".into(),
                source: sled::Error::Io(std::io::Error::from_raw_os_error(28)),
            });
        }
        self.inner.save(position)
    }
}

/// One transaction more, closed with nothing to send: the watermark moves at once.
fn commit_one(acks: &Acknowledgements) {
    let seq = acks.begin();
    acks.end(
        seq,
        TxEnd {
            gtid: Some(TxGtid::MariaDb(MariaDbGtid {
                domain: 0,
                server: 1,
                seq: seq + 1,
            })),
            file: "binlog.000001".into(),
            end_pos: 100 * (seq + 1),
            timestamp: 0,
        },
    );
}

fn parts<'h>(
    acks: &Acknowledgements,
    store: Arc<dyn CheckpointStore>,
    settings: CheckpointSettings,
    health: &'h Health,
) -> Parts<'h> {
    Parts {
        acks: acks.clone(),
        store,
        mirror: MysqlMirror::new("checkpointer-test"),
        // Nothing listens there: the final mirror fails with a WARN, which these tests accept.
        pool: mysql_async::Pool::new("mysql://root@127.0.0.1:1/none"),
        settings,
        clock: StreamClock::default(),
        health,
    }
}

fn streaming_health() -> Health {
    let health = Health::new(true);
    health.set_role(Role::Streaming);
    assert!(health.readiness().ready);
    health
}

/// Polls `done` every 5 ms for up to `limit`; returns how long it took.
async fn within(limit: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    start.elapsed()
}

fn save_errors() -> u64 {
    crate::metrics::relay().checkpoint_save_errors.get()
}

#[tokio::test]
async fn a_failing_save_turns_readiness_off_within_one_period_and_a_working_one_back_on() {
    let save_every = Duration::from_millis(200);
    let settings = CheckpointSettings {
        save_every,
        mirror_every: Duration::from_secs(3600),
        give_up_after: Duration::from_secs(3600),
        stop_relay: None,
    };
    let store = Arc::new(FlakyStore::default());
    store.fail.store(true, Ordering::SeqCst);
    let acks = Acknowledgements::new(BinlogPosition::default());
    let health = streaming_health();
    let stop = CancellationToken::new();
    let checkpointer = parts(&acks, store.clone(), settings, &health).run(stop.clone());
    let test = async {
        let errors_before = save_errors();
        commit_one(&acks);
        // Scheduling slack on a shared 2-core machine; the attempt count below is the proof
        // that the very first save attempt after the move turned readiness off.
        let took = within(save_every * 3, "unready after a failed save", || {
            !health.readiness().ready
        })
        .await;
        let r = health.readiness();
        assert!(!r.checkpoint && r.mysql && r.broker, "{r:?}");
        assert_eq!(store.attempts.load(Ordering::SeqCst), 1, "after {took:?}");
        assert!(save_errors() > errors_before, "the failure is counted");

        // It keeps trying, every period, and stays unready meanwhile.
        within(save_every * 6, "two more attempts", || {
            store.attempts.load(Ordering::SeqCst) >= 3
        })
        .await;
        assert!(!health.readiness().ready);
        assert!(save_errors() >= errors_before + 2);
        assert_eq!(store.inner.load().unwrap(), None, "nothing saved");

        // The disk has room again: the next save works and readiness comes back.
        store.fail.store(false, Ordering::SeqCst);
        within(save_every * 3, "ready after a working save", || {
            health.readiness().ready
        })
        .await;
        assert_eq!(store.inner.load().unwrap(), Some(acks.position()));
        stop.cancel();
    };
    let (result, ()) = tokio::join!(checkpointer, test);
    assert_eq!(result.unwrap(), acks.position());
}

#[tokio::test]
async fn saves_failing_for_longer_than_the_limit_stop_the_relay_with_the_reason() {
    let give_up_after = Duration::from_millis(400);
    let stop_relay = CancellationToken::new();
    let settings = CheckpointSettings {
        save_every: Duration::from_millis(50),
        mirror_every: Duration::from_secs(3600),
        give_up_after,
        stop_relay: Some(stop_relay.clone()),
    };
    let store = Arc::new(FlakyStore::default());
    store.fail.store(true, Ordering::SeqCst);
    let acks = Acknowledgements::new(BinlogPosition::default());
    let health = streaming_health();
    let started = Instant::now();
    let checkpointer = parts(&acks, store.clone(), settings, &health).run(CancellationToken::new());
    // Polled first, the checkpointer reads its start before the watermark moves.
    let (result, ()) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(20), checkpointer),
        async { commit_one(&acks) }
    );
    let result = result.expect("the checkpointer gives up by itself");
    let error = result.expect_err("saves never worked");
    assert!(started.elapsed() > give_up_after);
    assert!(store.attempts.load(Ordering::SeqCst) >= SAVE_FAILURES_BEFORE_STOP);
    assert!(stop_relay.is_cancelled(), "the relay is told to stop");
    assert!(!health.readiness().ready);
    let text = crate::error::Report(&error).to_string();
    assert!(
        text.contains("the checkpoint could not be saved for")
            && text.contains("stopping the relay")
            && text.contains("relay.checkpoint_dir")
            && text.contains("No space left on device"),
        "{text}"
    );
    // The store's error stays in the chain: the instance classifies it as permanent.
    assert!(
        matches!(
            &error,
            super::CheckpointError::NotSaved {
                source: StoreError::Sled { .. },
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(
        crate::error::PipelineError::from(error).class(),
        crate::error::ErrorClass::Permanent
    );
}

/// A tmpfs of `size` mounted on a new directory; unmounted on drop. `None` (with the reason)
/// where this process may not mount.
struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    fn mount(size: &str) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(SmallFs { dir })
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.dir.path())
            .status();
    }
}

/// Fills `dir` with a file until the file system is full.
fn fill(path: &std::path::Path) {
    use std::io::Write;
    let mut file = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 4096];
    while file.write_all(&block).is_ok() {}
    let _ = file.sync_all();
}

/// sled 0.34 keeps its first write error: once a save failed for lack of space, every later
/// one fails too, even after space is freed, until the store is opened again. So on a real full
/// disk the relay turns unready, then stops with the reason; started again with room, it saves.
#[tokio::test]
async fn a_sled_store_on_a_full_file_system_turns_readiness_off_then_stops_the_relay() {
    let fs = match SmallFs::mount("4m") {
        Ok(fs) => fs,
        Err(why) => {
            eprintln!(
                "SKIPPED a_sled_store_on_a_full_file_system_…: cannot mount a tmpfs here ({why})"
            );
            return;
        }
    };
    let dir = fs.dir.path().join("checkpoint");
    let store = Arc::new(crate::checkpoint::SledStore::open(&dir).unwrap());
    let acks = Acknowledgements::new(BinlogPosition::default());
    // One save made durable while there is room (what the restart below loads).
    commit_one(&acks);
    store.save(&acks.position()).unwrap();
    let filler = fs.dir.path().join("filler");
    fill(&filler);
    let stop_relay = CancellationToken::new();
    let settings = CheckpointSettings {
        save_every: Duration::from_millis(20),
        mirror_every: Duration::from_secs(3600),
        give_up_after: Duration::from_millis(500),
        stop_relay: Some(stop_relay.clone()),
    };
    let health = streaming_health();
    let checkpointer = parts(&acks, store.clone(), settings, &health).run(CancellationToken::new());
    let test = async {
        let errors_before = save_errors();
        // Each transaction moves the watermark; sled's log grows until the disk refuses it.
        let start = Instant::now();
        while health.readiness().ready {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "sled never hit the full disk"
            );
            commit_one(&acks);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!health.readiness().checkpoint);
        assert!(save_errors() > errors_before);
        std::fs::remove_file(&filler).unwrap();
    };
    let (result, ()) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(60), checkpointer),
        test
    );
    let error = result
        .expect("the checkpointer gives up by itself")
        .expect_err("sled keeps failing");
    assert!(stop_relay.is_cancelled());
    let text = crate::error::Report(&error).to_string();
    assert!(text.contains("No space left on device"), "{text}");
    assert!(!health.readiness().ready, "never ready again while it runs");

    // The relay started again, with room on the disk: it loads what was durable and saves.
    drop(store);
    let store = crate::checkpoint::SledStore::open(&dir).unwrap();
    let durable = store
        .load()
        .unwrap()
        .expect("saves worked before the disk filled");
    assert!(acks.position().covers(&durable) && durable != acks.position());
    store.save(&acks.position()).unwrap();
    assert_eq!(store.load().unwrap(), Some(acks.position()));
}
