//! What a shard does not send again, and what it stops holding: a stalled topic's streamed
//! events leave memory (their acknowledgements given back) once the topic parks, but the batch
//! its lane retries; what the broker stored before a send failed is never sent again.

use super::*;
use crate::event::{Ack, Acknowledge};
use crate::send::Stalls;

/// Records the tokens acknowledged.
#[derive(Default)]
struct Acked(Mutex<Vec<u64>>);

impl Acknowledge for Acked {
    fn acknowledge(&self, token: u64) {
        self.0.lock().unwrap().push(token);
    }
}

impl Acked {
    fn tokens(&self) -> Vec<u64> {
        let mut tokens = self.0.lock().unwrap().clone();
        tokens.sort();
        tokens
    }
}

/// Event `id` read from the binlog, its acknowledgement's token `id`.
fn streamed(acked: &Arc<Acked>, id: u64, key: &str, topic: &str) -> ShardEvent {
    let to: Arc<dyn Acknowledge> = acked.clone();
    let ShardEvent { row, .. } = event(id, key, topic);
    ShardEvent::streamed(Ack::new(to, id), row)
}

/// A shard running with `options`, its sink's topic `t` down: the sink, the shard's input, its
/// outcomes and its task.
fn start_with_t_down(
    options: ShardOptions,
) -> (
    Arc<ScriptedSink>,
    mpsc::Sender<ShardEvent>,
    mpsc::Receiver<Completion>,
    tokio::task::JoinHandle<()>,
) {
    let sink = Arc::new(ScriptedSink::new(vec![]));
    sink.down_topics.lock().unwrap().insert("t".into());
    let (input, rx) = mpsc::channel(100);
    let (completions, done) = mpsc::channel(100);
    let task = tokio::spawn(run_shard(
        Arc::clone(&sink),
        rx,
        completions,
        options,
        CancellationToken::new(),
    ));
    (sink, input, done, task)
}

/// Stalls whose topics park after 2 s, and a shard's options with them.
fn parking_after_two_seconds() -> Arc<Stalls> {
    Arc::new(Stalls::new(Duration::from_secs(2)))
}

fn shard_options(stalls: &Arc<Stalls>) -> ShardOptions {
    ShardOptions {
        stalls: Arc::clone(stalls),
        ..ShardOptions::default()
    }
}

/// Until `t` parks at 2 s its lane holds its events; then it gives back every streamed one's
/// acknowledgement and keeps e1 (the batch it retries), e3 (a claimed row of its key follows) and
/// e4 (that row). An event handed on just before the stream began parking is released at the
/// shard.
async fn assert_t_parks_at_two_seconds(
    input: &mpsc::Sender<ShardEvent>,
    done: &mut mpsc::Receiver<Completion>,
    acked: &Arc<Acked>,
    stalls: &Stalls,
) {
    let first = done.recv().await.unwrap();
    assert_eq!(first.event_id, "e2", "u flows");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        acked.tokens().is_empty(),
        "held, not released, before park_after"
    );
    assert_eq!(stalls.held("t"), 4);

    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        acked.tokens(),
        [1, 3, 5],
        "every streamed event of t given back at 2 s"
    );
    assert_eq!(
        stalls.held("t"),
        3,
        "e5 left memory; e1 (the probe), e3 and e4 stay"
    );
    // An event handed on just before the stream began parking: released at the shard.
    input.send(streamed(acked, 6, "e", "t")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(acked.tokens(), [1, 3, 5, 6]);
    assert_eq!(stalls.held("t"), 3);
}

/// Once `t` takes events again, its lane sends what it kept (e1, e3 released; e4 claimed), then
/// closes.
async fn assert_t_recovers_what_its_lane_kept(
    sink: &ScriptedSink,
    done: &mut mpsc::Receiver<Completion>,
    stalls: &Stalls,
) {
    sink.down_topics.lock().unwrap().clear();
    let mut recovered = Vec::new();
    for _ in 0..3 {
        let c = done.recv().await.unwrap();
        assert!(matches!(c.outcome, SendOutcome::Sent { .. }), "{c:?}");
        recovered.push((c.event_id, c.origin));
    }
    assert_eq!(
        recovered,
        [
            ("e1".to_string(), Origin::Released),
            ("e3".to_string(), Origin::Released),
            ("e4".to_string(), Origin::Claimed),
        ]
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!stalls.is_stalled("t"), "the lane closed");
}

#[tokio::test(start_paused = true)]
async fn a_parked_topic_s_lane_releases_its_streamed_events_but_the_batch_it_retries() {
    let (stalls, acked) = (parking_after_two_seconds(), Arc::new(Acked::default()));
    let (sink, input, mut done, task) = start_with_t_down(shard_options(&stalls));
    // e1 fails and opens t's lane (its probe); e3 (key c) is followed by a claimed row of its
    // key, so it must stay; e5 need not.
    for e in [
        streamed(&acked, 1, "a", "t"),
        streamed(&acked, 2, "b", "u"),
        streamed(&acked, 3, "c", "t"),
        event(4, "c", "t"),
        streamed(&acked, 5, "d", "t"),
    ] {
        input.send(e).await.unwrap();
    }
    assert_t_parks_at_two_seconds(&input, &mut done, &acked, &stalls).await;
    assert_t_recovers_what_its_lane_kept(&sink, &mut done, &stalls).await;
    drop(input);
    task.await.unwrap();
    assert!(
        done.recv().await.is_none(),
        "e5 and e6 are the sweeper's to send"
    );
    assert_eq!(acked.tokens(), [1, 3, 5, 6], "none acknowledged twice");
}

/// A stall that outlasts the retry policy: once the topic parks, its lane's retried batch uses
/// no retry, so it is never FAILED for the topic's state (its neighbours wait as PENDING rows;
/// a FAILED probe would break its key's order), and it goes out within
/// [`retry::PARKED_RETRY_EVERY`] of the topic taking events again.
#[tokio::test(start_paused = true)]
async fn a_parked_topic_s_retried_batch_outlasts_the_retry_policy_and_is_never_failed() {
    let options = ShardOptions {
        // 1 + 2 s of retries: used up within seconds if parking did not stop the count.
        retry: RetryPolicy {
            max_retries: Some(2),
            ..ShardOptions::default().retry
        },
        stalls: Arc::new(Stalls::new(Duration::from_secs(2))),
        ..ShardOptions::default()
    };
    let acked = Arc::new(Acked::default());
    let (sink, input, mut done, task) = start_with_t_down(options);
    input.send(streamed(&acked, 1, "a", "t")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(
        done.try_recv().is_err(),
        "no outcome while t is down for 10 minutes"
    );
    let attempts = sink.calls().len();
    assert!(
        (40..=600).contains(&attempts),
        "tried every few seconds, at most every {:?}: {attempts} attempts",
        retry::PARKED_RETRY_EVERY
    );
    sink.down_topics.lock().unwrap().clear();
    let back = tokio::time::Instant::now();
    let c = done.recv().await.unwrap();
    assert_eq!(c.event_id, "e1");
    assert!(matches!(c.outcome, SendOutcome::Sent { .. }), "{c:?}");
    assert!(back.elapsed() <= retry::PARKED_RETRY_EVERY);
    drop(input);
    task.await.unwrap();
}

/// Three events of one key sent through `sink`, whose first send stores `stored` of them and
/// then fails with `error`: the outcomes, and the event ids of every send.
async fn three_after_a_partial_send(
    sink: ScriptedSink,
    stored: usize,
    error: SendError,
) -> (Vec<Completion>, Vec<Vec<String>>) {
    let sink = Arc::new(sink);
    *sink.partial.lock().unwrap() = Some((stored, error));
    let events = vec![event(1, "a", "t"), event(2, "a", "t"), event(3, "a", "t")];
    let done = run(Arc::clone(&sink), events, ShardOptions::default()).await;
    let sends = sink.calls().into_iter().map(|(_, _, ids)| ids).collect();
    (done, sends)
}

#[tokio::test(start_paused = true)]
async fn what_the_broker_stored_before_a_send_failed_is_reported_and_never_sent_again() {
    let timeout = SendError::Retryable("timeout".into());
    let (done, sends) = three_after_a_partial_send(ScriptedSink::new(vec![]), 2, timeout).await;
    assert_eq!(
        outcomes(&done),
        [
            ("e1".to_string(), sent("e1")),
            ("e2".to_string(), sent("e2")),
            ("e3".to_string(), sent("e3")),
        ]
    );
    assert_eq!(sends, [vec!["e1", "e2", "e3"], vec!["e3"]]);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_after_a_stored_request_fails_only_the_refused_event() {
    let sink = ScriptedSink {
        poison: vec!["e2".into()],
        ..ScriptedSink::new(vec![])
    };
    let refused = SendError::Rejected("code 13".into());
    let (done, sends) = three_after_a_partial_send(sink, 1, refused).await;
    assert_eq!(done[0].outcome, sent("e1"), "stored: SENT, not sent again");
    // e2 and e3 are sent one by one to find which was refused: e2.
    assert!(
        matches!(&done[1].outcome, SendOutcome::Failed { attempts: 1, .. }),
        "{:?}",
        done[1]
    );
    assert_eq!(done[2].outcome, sent("e3"));
    assert_eq!(sends, [vec!["e1", "e2", "e3"], vec!["e2"], vec!["e3"]]);
}

/// A key's event that the dispatcher checked before the send stage let go of an older event of
/// that key (left PENDING for the sweeper) is let go of too, even once the topic takes events
/// again: sent now, it would go before the older one. Checked after the release (the key-order
/// guard then waits for the older row itself), or of another key, it is sent.
#[tokio::test(start_paused = true)]
async fn an_event_checked_before_its_key_was_released_follows_the_released_one() {
    let (stalls, acked) = (parking_after_two_seconds(), Arc::new(Acked::default()));
    let (sink, input, mut done, task) = start_with_t_down(shard_options(&stalls));
    // e1 opens t's lane (its probe); e2 (key d) waits behind it and is let go of at 2 s.
    for e in [streamed(&acked, 1, "a", "t"), streamed(&acked, 2, "d", "t")] {
        input.send(e).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(acked.tokens(), [1, 2]);
    let (generation, rows) = stalls.released.take();
    let ids: Vec<u64> = rows.iter().map(|row| row.id).collect();
    assert_eq!(ids, [2], "the guard learns of the event let go of, not of the probe");

    sink.down_topics.lock().unwrap().clear();
    let probe = done.recv().await.unwrap();
    assert_eq!(probe.event_id, "e1");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!stalls.is_stalled("t"), "t takes events again");
    // e3 of key d was checked before the guard learnt of e2's release; e4 is another key's.
    let checked_at = |mut event: ShardEvent, seen: u64| {
        event.released_seen = seen;
        event
    };
    for e in [
        checked_at(streamed(&acked, 3, "d", "t"), generation - 1),
        checked_at(streamed(&acked, 4, "x", "t"), generation - 1),
    ] {
        input.send(e).await.unwrap();
    }
    let c = done.recv().await.unwrap();
    assert!(matches!(c.outcome, SendOutcome::Sent { .. }), "{c:?}");
    assert_eq!(c.event_id, "e4", "e3 follows e2, through the sweeper");
    assert_eq!(acked.tokens(), [1, 2, 3], "e3 given back; e4 waits for its mark");
    let (generation, rows) = stalls.released.take();
    let ids: Vec<u64> = rows.iter().map(|row| row.id).collect();
    assert_eq!(ids, [3]);
    // Checked knowing of both releases (the guard then waits for e2 and e3 itself): sent.
    input
        .send(checked_at(streamed(&acked, 5, "d", "t"), generation))
        .await
        .unwrap();
    assert_eq!(done.recv().await.unwrap().event_id, "e5");
    drop(input);
    task.await.unwrap();
}
