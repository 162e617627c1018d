//! The shard sender against a scripted sink: what counts as sent, retries, order, batching.

use super::*;
use crate::outbox::TableName;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

mod refused;
mod released;
mod stalled;

type Answer = Result<(), SendError>;

/// A sink whose answers are scripted; records every send.
#[derive(Default)]
struct ScriptedSink {
    /// The write queues of each topic (the current route); a send to an index past the end is
    /// answered `Retryable`, as `RocketMqSink` does.
    queues: Mutex<HashMap<String, usize>>,
    answers: Mutex<VecDeque<Answer>>,
    /// (topic, queue, event ids) of every send.
    calls: Mutex<Vec<(String, usize, Vec<String>)>>,
    /// Event ids rejected whenever they are in a send.
    poison: Vec<String>,
    /// When set, every send after the scripted answers answers `Retryable` with this reason
    /// (a broker that stays down); otherwise they answer `SEND_OK`.
    down: Option<String>,
    /// When set, every route look-up answers `Retryable` with this reason.
    route_down: Option<String>,
    /// The next this many route look-ups (a send looks its route up too) answer
    /// `Unauthorized`.
    route_refusals: AtomicU32,
    /// Topics whose sends answer `Retryable` (made read-only, say) until taken out.
    down_topics: Mutex<std::collections::HashSet<String>>,
    /// Queues (topic, index) whose sends answer `Retryable` (their broker group lost) until
    /// taken out.
    down_queues: Mutex<std::collections::HashSet<(String, usize)>>,
    /// What [`Sink::stable_queues`] answers.
    stable: bool,
    /// How long a send to a down queue takes to fail (a frozen broker's timeout).
    down_queue_timeout: Duration,
    /// The next send stores this many of its messages, then fails with this error (a batch of
    /// several requests, a later one refused).
    partial: Mutex<Option<(usize, SendError)>>,
}

impl ScriptedSink {
    fn new(answers: Vec<Answer>) -> Self {
        ScriptedSink {
            queues: Mutex::new(HashMap::from([("t".to_string(), 4), ("u".to_string(), 4)])),
            answers: Mutex::new(answers.into()),
            ..Default::default()
        }
    }

    /// The route of `topic` changes to `queues` write queues.
    fn set_queues(&self, topic: &str, queues: usize) {
        self.queues.lock().unwrap().insert(topic.into(), queues);
    }

    fn calls(&self) -> Vec<(String, usize, Vec<String>)> {
        self.calls.lock().unwrap().clone()
    }
}

impl Sink for ScriptedSink {
    fn stable_queues(&self) -> bool {
        self.stable
    }

    /// Queues 0 and 1 on `broker-a`, the others on `broker-b`.
    fn queue_group(&self, _topic: &str, queue: usize) -> Option<String> {
        Some(if queue < 2 { "broker-a" } else { "broker-b" }.to_string())
    }

    async fn queue_count(&self, topic: &str) -> Result<usize, SendError> {
        if let Some(reason) = &self.route_down {
            return Err(SendError::Retryable(reason.clone()));
        }
        let refuse = |left: u32| left.checked_sub(1);
        if let Ok(left) =
            self.route_refusals
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, refuse)
        {
            return Err(SendError::Unauthorized(format!(
                "NO_PERMISSION (16), {} more to come",
                left - 1
            )));
        }
        self.queues
            .lock()
            .unwrap()
            .get(topic)
            .copied()
            .ok_or_else(|| SendError::Rejected(format!("no such topic {topic}")))
    }

    async fn send(
        &self,
        topic: &str,
        queue: usize,
        messages: &[&OutboundMessage],
        _fence: &Fence,
    ) -> Result<Vec<String>, SendFailure> {
        let ids: Vec<String> = messages.iter().map(|m| m.event_id.clone()).collect();
        self.calls
            .lock()
            .unwrap()
            .push((topic.into(), queue, ids.clone()));
        if queue >= self.queue_count(topic).await? {
            return Err(SendError::Retryable(format!(
                "topic {topic} has fewer queues than before; re-routing"
            ))
            .into());
        }
        if (self.down_queues.lock().unwrap()).contains(&(topic.to_string(), queue)) {
            tokio::time::sleep(self.down_queue_timeout).await;
            return Err(SendError::Retryable(format!(
                "queue {queue} of topic {topic} is on a broker group that is unavailable"
            ))
            .into());
        }
        if self.down_topics.lock().unwrap().contains(topic) {
            return Err(
                SendError::Retryable(format!("topic {topic} is not writable (code 16)")).into(),
            );
        }
        if let Some((stored, error)) = self.partial.lock().unwrap().take() {
            let stored = ids[..stored].iter().map(|id| format!("msg-{id}")).collect();
            return Err(SendFailure { stored, error });
        }
        if ids.iter().any(|id| self.poison.contains(id)) {
            return Err(SendError::Rejected("message too large".into()).into());
        }
        let next = self.answers.lock().unwrap().pop_front();
        let answer = next.unwrap_or_else(|| match &self.down {
            Some(reason) => Err(SendError::Retryable(reason.clone())),
            None => Ok(()),
        });
        match answer {
            Ok(()) => Ok(ids.iter().map(|id| format!("msg-{id}")).collect()),
            Err(e) => Err(e.into()),
        }
    }
}

fn event(id: u64, key: &str, topic: &str) -> ShardEvent {
    ShardEvent::claimed(OutboxRow {
        table: Arc::new(TableName::parse("outbox_event").unwrap()),
        id,
        message: OutboundMessage {
            event_id: format!("e{id}"),
            biz_key: key.into(),
            topic: topic.into(),
            tags: None,
            headers: vec![],
            payload: "{}".into(),
            deliver_at_ms: None,
        },
        stamps: Default::default(),
    })
}

/// Starts a shard fed `events` (all queued before it starts); the task ends with its
/// completions once it has sent them all.
fn start(
    sink: Arc<ScriptedSink>,
    events: Vec<ShardEvent>,
    options: ShardOptions,
) -> tokio::task::JoinHandle<Vec<Completion>> {
    tokio::spawn(async move {
        let (tx, rx) = mpsc::channel(100);
        let (completions_tx, mut completions_rx) = mpsc::channel(100);
        for e in events {
            tx.send(e).await.unwrap();
        }
        drop(tx);
        run_shard(sink, rx, completions_tx, options, CancellationToken::new()).await;
        let mut out = Vec::new();
        while let Some(c) = completions_rx.recv().await {
            out.push(c);
        }
        out
    })
}

/// Feeds `events` (all queued before the shard starts) and collects the completions.
async fn run(
    sink: Arc<ScriptedSink>,
    events: Vec<ShardEvent>,
    options: ShardOptions,
) -> Vec<Completion> {
    start(sink, events, options).await.unwrap()
}

fn outcomes(done: &[Completion]) -> Vec<(String, SendOutcome)> {
    done.iter()
        .map(|c| (c.event_id.clone(), c.outcome.clone()))
        .collect()
}

fn sent(id: &str) -> SendOutcome {
    SendOutcome::Sent {
        msg_id: format!("msg-{id}"),
    }
}

#[tokio::test(start_paused = true)]
async fn flush_slave_timeout_and_timeouts_are_retried_never_taken_as_sent() {
    let sink = Arc::new(ScriptedSink::new(vec![
        Err(SendError::Retryable(
            "broker answered FlushSlaveTimeout, not SEND_OK".into(),
        )),
        Err(SendError::Retryable(
            "transport.response.timeout (timeout)".into(),
        )),
        Ok(()),
    ]));
    let started = tokio::time::Instant::now();
    let done = run(
        Arc::clone(&sink),
        vec![event(1, "k", "t")],
        ShardOptions::default(),
    )
    .await;
    assert_eq!(outcomes(&done), vec![("e1".into(), sent("e1"))]);
    assert_eq!(
        sink.calls().len(),
        3,
        "sent again after each unacknowledged answer"
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(1 + 2),
        "backoff 1 s then 2 s"
    );
}

#[tokio::test(start_paused = true)]
async fn retryable_errors_end_failed_after_max_retry() {
    let answers = (0..20)
        .map(|_| Err(SendError::Retryable("broker unavailable".into())))
        .collect();
    let sink = Arc::new(ScriptedSink::new(answers));
    let done = run(
        Arc::clone(&sink),
        vec![event(1, "k", "t")],
        ShardOptions::default(),
    )
    .await;
    match &done[0].outcome {
        SendOutcome::Failed { reason, attempts } => {
            assert_eq!(*attempts, 9, "the first attempt and 8 retries");
            assert!(
                reason.contains("gave up after 8 retries") && reason.contains("broker unavailable"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(sink.calls().len(), 9, "the first attempt and 8 retries");
}

#[tokio::test(start_paused = true)]
async fn a_rejected_batch_is_split_so_only_the_poison_event_fails_and_order_holds() {
    let mut sink = ScriptedSink::new(vec![]);
    sink.poison = vec!["e2".into()];
    let sink = Arc::new(sink);
    let events = vec![event(1, "k", "t"), event(2, "k", "t"), event(3, "k", "t")];
    let done = run(Arc::clone(&sink), events, ShardOptions::default()).await;
    let got = outcomes(&done);
    assert_eq!(got[0], ("e1".into(), sent("e1")));
    assert!(
        matches!(&got[1].1, SendOutcome::Failed { reason, .. } if reason.contains("too large"))
    );
    assert_eq!(got[2], ("e3".into(), sent("e3")));
    assert_eq!(
        sink.calls()[0].2,
        vec!["e1", "e2", "e3"],
        "first tried as one batch"
    );
}

#[tokio::test]
async fn consecutive_events_for_one_queue_are_batched_and_others_keep_their_turn() {
    let sink = Arc::new(ScriptedSink::new(vec![]));
    // "a" and "b" hash to different queues of 4; "u" is another topic.
    let qa = index_for(java_string_hash("a"), 4);
    let qb = index_for(java_string_hash("b"), 4);
    assert_ne!(qa, qb);
    let events = vec![
        event(1, "a", "t"),
        event(2, "a", "t"),
        event(3, "b", "t"),
        event(4, "a", "u"),
        event(5, "a", "u"),
    ];
    let done = run(Arc::clone(&sink), events, ShardOptions::default()).await;
    let ids: Vec<String> = done.iter().map(|c| c.event_id.clone()).collect();
    assert_eq!(
        ids,
        vec!["e1", "e2", "e3", "e4", "e5"],
        "reported in shard order"
    );
    let calls = sink.calls();
    assert_eq!(
        calls,
        vec![
            ("t".into(), qa, vec!["e1".into(), "e2".into()]),
            ("t".into(), qb, vec!["e3".into()]),
            ("u".into(), qa, vec!["e4".into(), "e5".into()]),
        ]
    );
}

#[tokio::test]
async fn an_unknown_topic_fails_its_event_and_the_next_one_flows() {
    let sink = Arc::new(ScriptedSink::new(vec![]));
    let done = run(
        Arc::clone(&sink),
        vec![event(1, "k", "nope"), event(2, "k", "t")],
        ShardOptions::default(),
    )
    .await;
    assert!(
        matches!(&done[0].outcome, SendOutcome::Failed { reason, .. } if reason.contains("no such topic"))
    );
    assert_eq!(done[1].outcome, sent("e2"));
}

#[tokio::test]
async fn batches_respect_the_size_limits() {
    let sink = Arc::new(ScriptedSink::new(vec![]));
    let events = (1..=10).map(|i| event(i, "a", "t")).collect();
    let options = ShardOptions {
        max_batch: 4,
        ..ShardOptions::default()
    };
    run(Arc::clone(&sink), events, options).await;
    let sizes: Vec<usize> = sink.calls().iter().map(|c| c.2.len()).collect();
    assert_eq!(sizes, vec![4, 4, 2]);
}

#[tokio::test(start_paused = true)]
async fn cancellation_during_backoff_reports_nothing_for_the_unsent_event() {
    let answers = (0..20)
        .map(|_| Err(SendError::Retryable("down".into())))
        .collect();
    let sink = Arc::new(ScriptedSink::new(answers));
    let (tx, rx) = mpsc::channel(10);
    let (completions_tx, mut completions_rx) = mpsc::channel(10);
    tx.send(event(1, "k", "t")).await.unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(run_shard(
        sink,
        rx,
        completions_tx,
        ShardOptions::default(),
        cancel.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cancel.cancel();
    task.await.unwrap();
    assert!(
        completions_rx.recv().await.is_none(),
        "an unacknowledged event is never reported"
    );
}

/// A small policy: retries after 1, 2, 4 and 8 s (no jitter), so FAILED comes 15 s after the
/// first attempt.
fn small_policy() -> ShardOptions {
    ShardOptions {
        retry: RetryPolicy {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(8),
            max_retries: Some(4),
            jitter: crate::retry::Jitter::None,
        },
        ..ShardOptions::default()
    }
}

/// The policy's total wait before FAILED: the sum of its delays.
fn total_delay(policy: &RetryPolicy) -> Duration {
    (1..).map_while(|retry| policy.delay(retry)).sum()
}

/// Runs one event through `sink`, which never succeeds, with the small policy while other
/// shards keep getting `SEND_OK` (a wake-up every 10 ms); checks that it goes FAILED after the
/// policy's 4 retries, no sooner than the policy's total delay (and not much later).
async fn fails_only_after_the_total_delay_despite_wake_ups(sink: Arc<ScriptedSink>, reason: &str) {
    let options = small_policy();
    let total = total_delay(&options.retry);
    assert_eq!(total, Duration::from_secs(1 + 2 + 4 + 8));
    let wake = Arc::clone(&options.wake);
    let waker = tokio::spawn(async move {
        loop {
            wake.broker_answered_at("t", None);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let started = tokio::time::Instant::now();
    let done = run(sink, vec![event(1, "k", "t")], options).await;
    let elapsed = started.elapsed();
    waker.abort();
    match &done[0].outcome {
        SendOutcome::Failed {
            reason: got,
            attempts,
        } => {
            assert_eq!(*attempts, 5, "the first attempt and 4 retries");
            assert!(
                got.contains("gave up after 4 retries") && got.contains(reason),
                "{got}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        elapsed >= total,
        "FAILED after {elapsed:?}, before the policy's {total:?}"
    );
    assert!(elapsed < total + Duration::from_secs(1), "{elapsed:?}");
}

#[tokio::test(start_paused = true)]
async fn wake_ups_do_not_use_up_send_retries_so_failed_comes_after_the_policy_s_total_delay() {
    let mut sink = ScriptedSink::new(vec![]);
    sink.down = Some("broker-b unavailable".into());
    let sink = Arc::new(sink);
    fails_only_after_the_total_delay_despite_wake_ups(Arc::clone(&sink), "broker-b").await;
    assert!(
        sink.calls().len() > 5,
        "the wake-ups still made early attempts"
    );
}

#[tokio::test(start_paused = true)]
async fn wake_ups_do_not_use_up_route_look_up_retries_either() {
    let mut sink = ScriptedSink::new(vec![]);
    sink.route_down = Some("name server unavailable".into());
    fails_only_after_the_total_delay_despite_wake_ups(Arc::new(sink), "name server").await;
}

#[tokio::test(start_paused = true)]
async fn a_wake_up_ends_a_retry_delay_at_once_when_the_broker_is_back() {
    let sink = Arc::new(ScriptedSink::new(vec![Err(SendError::Retryable(
        "broker unavailable".into(),
    ))]));
    let options = ShardOptions::default();
    let wake = Arc::clone(&options.wake);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        wake.broker_answered_at("t", None);
    });
    let started = tokio::time::Instant::now();
    let done = run(Arc::clone(&sink), vec![event(1, "k", "t")], options).await;
    assert_eq!(outcomes(&done), vec![("e1".into(), sent("e1"))]);
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(100),
        "sent at the wake-up, not after the 1 s delay"
    );
}

/// One broker of the cluster dies while the shard waits out its first retry delay: the route
/// of topic "t" goes from `before` to `after` write queues half-way through the 1 s delay.
async fn run_through_a_route_change(
    sink: &Arc<ScriptedSink>,
    events: Vec<ShardEvent>,
    options: ShardOptions,
    (before, after): (usize, usize),
) -> Vec<Completion> {
    sink.set_queues("t", before);
    let shard = start(Arc::clone(sink), events, options);
    tokio::time::sleep(Duration::from_millis(500)).await;
    sink.set_queues("t", after);
    shard.await.unwrap()
}

fn ids(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|id| id.to_string()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_the_route_shrinks_sends_to_the_key_s_queue_under_the_new_route() {
    let hash = java_string_hash("g");
    let (stale, now) = (index_for(hash, 8), index_for(hash, 4));
    assert!(stale >= 4, "the old queue is gone after the change");
    let sink = Arc::new(ScriptedSink::new(vec![Err(SendError::Retryable(
        "broker-b unavailable".into(),
    ))]));
    let events = vec![event(1, "g", "t"), event(2, "g", "t")];
    let started = tokio::time::Instant::now();
    let done = run_through_a_route_change(&sink, events, ShardOptions::default(), (8, 4)).await;
    assert_eq!(
        outcomes(&done),
        vec![("e1".into(), sent("e1")), ("e2".into(), sent("e2"))]
    );
    assert_eq!(
        sink.calls(),
        vec![
            ("t".into(), stale, ids(&["e1", "e2"])),
            ("t".into(), now, ids(&["e1", "e2"])),
        ],
        "the retry goes to the key's queue among 4"
    );
    assert_eq!(started.elapsed(), Duration::from_secs(1), "one retry");
}

/// Keys "h" and "t" share a queue among 12 but not among 8 (a 4-queue broker of three died):
/// `[e1 h, e2 h, e3 t, e4 h]`, one batch before the change, is split by the new route.
fn a_batch_the_new_route_splits() -> (Vec<ShardEvent>, usize, usize, usize) {
    let (h, t) = (java_string_hash("h"), java_string_hash("t"));
    let stale = index_for(h, 12);
    assert_eq!(stale, index_for(t, 12));
    assert!(stale >= 8, "the old queue is gone after the change");
    let (qh, qt) = (index_for(h, 8), index_for(t, 8));
    assert_ne!(qh, qt);
    let events = vec![
        event(1, "h", "t"),
        event(2, "h", "t"),
        event(3, "t", "t"),
        event(4, "h", "t"),
    ];
    (events, stale, qh, qt)
}

#[tokio::test(start_paused = true)]
async fn a_batch_the_new_route_splits_is_sent_as_consecutive_sub_batches_in_shard_order() {
    let (events, stale, qh, qt) = a_batch_the_new_route_splits();
    let sink = Arc::new(ScriptedSink::new(vec![Err(SendError::Retryable(
        "broker-c unavailable".into(),
    ))]));
    let done = run_through_a_route_change(&sink, events, ShardOptions::default(), (12, 8)).await;
    assert_eq!(
        outcomes(&done),
        ["e1", "e2", "e3", "e4"].map(|id| (id.to_string(), sent(id))),
        "every event Sent, reported in shard order"
    );
    assert_eq!(
        sink.calls(),
        vec![
            ("t".into(), stale, ids(&["e1", "e2", "e3", "e4"])),
            ("t".into(), qh, ids(&["e1", "e2"])),
            ("t".into(), qt, ids(&["e3"])),
            ("t".into(), qh, ids(&["e4"])),
        ],
        "one sub-batch per run of one queue, in the batch's order"
    );
}

#[tokio::test(start_paused = true)]
async fn the_sub_batches_of_a_split_batch_keep_its_retries() {
    let (events, _, _, _) = a_batch_the_new_route_splits();
    // The batch fails once (retry 1); after the split e1+e2 go through, e3 fails for good, e4
    // goes through.
    let down = || Err(SendError::Retryable("broker-a unavailable".into()));
    let sink = Arc::new(ScriptedSink::new(vec![
        down(),
        Ok(()),
        down(),
        down(),
        down(),
        down(),
    ]));
    let options = small_policy();
    let total = total_delay(&options.retry);
    let started = tokio::time::Instant::now();
    let done = run_through_a_route_change(&sink, events, options, (12, 8)).await;
    let got = outcomes(&done);
    assert_eq!(
        got[..2],
        [("e1".into(), sent("e1")), ("e2".into(), sent("e2"))]
    );
    match &got[2] {
        (id, SendOutcome::Failed { reason, attempts }) if id == "e3" => {
            assert_eq!(
                *attempts, 5,
                "the batch's first attempt and 4 retries in all"
            );
            assert!(reason.contains("gave up after 4 retries"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(got[3], ("e4".into(), sent("e4")));
    assert_eq!(
        sink.calls().len(),
        1 + 1 + 4 + 1,
        "e3 alone has the retries its batch had left, not a fresh 4"
    );
    assert_eq!(
        started.elapsed(),
        total,
        "FAILED at the end of the policy's delays"
    );
}
