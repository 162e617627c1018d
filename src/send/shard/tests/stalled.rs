//! A topic that does not accept events holds back only its own events: the shard moves them to
//! a lane and goes on with the other topics; the lane sends them in order once it accepts
//! events again, and the shard then sends that topic itself again, after the lane.

use super::*;

/// A shard fed through `input`, its completions (with when each came, virtual time) collected.
struct Running {
    input: mpsc::Sender<ShardEvent>,
    done: mpsc::Receiver<Completion>,
    task: tokio::task::JoinHandle<()>,
    started: tokio::time::Instant,
}

fn running(sink: &Arc<ScriptedSink>, options: ShardOptions) -> Running {
    let (input, rx) = mpsc::channel(100);
    let (completions, done) = mpsc::channel(100);
    let task = tokio::spawn(run_shard(
        Arc::clone(sink),
        rx,
        completions,
        options,
        CancellationToken::new(),
    ));
    Running {
        input,
        done,
        task,
        started: tokio::time::Instant::now(),
    }
}

impl Running {
    async fn feed(&self, events: Vec<ShardEvent>) {
        for event in events {
            self.input.send(event).await.unwrap();
        }
    }

    /// The next `n` completions: (event id, seconds since the start).
    async fn next(&mut self, n: usize) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for _ in 0..n {
            let c = self.done.recv().await.expect("a completion");
            assert!(matches!(c.outcome, SendOutcome::Sent { .. }), "{c:?}");
            out.push((c.event_id, self.started.elapsed().as_secs()));
        }
        out
    }
}

fn ids(done: &[(String, u64)]) -> Vec<&str> {
    done.iter().map(|(id, _)| id.as_str()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_topic_that_does_not_accept_events_holds_back_only_its_own_events() {
    let sink = Arc::new(ScriptedSink::new(vec![]));
    sink.down_topics.lock().unwrap().insert("t".into());
    let options = ShardOptions::default();
    let stalls = Arc::clone(&options.stalls);
    let mut shard = running(&sink, options);
    // Keys of both topics interleaved, as one shard receives them.
    shard
        .feed(vec![
            event(1, "a", "t"),
            event(2, "b", "u"),
            event(3, "a", "t"),
            event(4, "c", "u"),
            event(5, "d", "t"),
            event(6, "b", "u"),
        ])
        .await;
    let healthy = shard.next(3).await;
    assert_eq!(ids(&healthy), ["e2", "e4", "e6"]);
    assert!(
        healthy.iter().all(|(_, at)| *at == 0),
        "u's events never wait for t's retries: {healthy:?}"
    );
    assert!(stalls.is_stalled("t") && !stalls.is_stalled("u"));
    assert_eq!(stalls.held("t"), 3, "t's three events wait in its lane");

    // More of both while t still refuses: u's flow at once, t's queue behind its lane.
    tokio::time::sleep(Duration::from_secs(20)).await;
    shard
        .feed(vec![event(7, "a", "t"), event(8, "c", "u")])
        .await;
    let more = shard.next(1).await;
    assert_eq!(more, [("e8".to_string(), 20)]);

    // t accepts events again: its lane sends them in the shard's order at its next retry.
    sink.down_topics.lock().unwrap().clear();
    let recovered = shard.next(4).await;
    assert_eq!(ids(&recovered), ["e1", "e3", "e5", "e7"]);
    assert!(
        recovered.iter().all(|(_, at)| *at <= 20 + 16),
        "sent at the lane's next retry: {recovered:?}"
    );
    // Give the lane its moment to close; then the shard sends t's events itself.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!stalls.is_stalled("t"), "the lane closed once it was done");
    shard
        .feed(vec![event(9, "a", "t"), event(10, "b", "u")])
        .await;
    assert_eq!(ids(&shard.next(2).await), ["e9", "e10"]);
    drop(shard.input);
    shard.task.await.unwrap();
    // Every send of t after the first went through its lane in id order, then e9.
    let t_sent: Vec<String> = sink
        .calls()
        .into_iter()
        .filter(|(topic, _, _)| topic == "t")
        .flat_map(|(_, _, ids)| ids)
        .collect();
    let last_of_each: Vec<&String> = {
        let mut seen = Vec::new();
        for id in t_sent.iter().rev() {
            if !seen.contains(&id) {
                seen.push(id);
            }
        }
        seen.into_iter().rev().collect()
    };
    assert_eq!(last_of_each, ["e1", "e3", "e5", "e7", "e9"]);
}

#[tokio::test(start_paused = true)]
async fn a_stalled_batch_keeps_its_retries_in_the_lane_and_fails_per_the_policy() {
    let sink = Arc::new(ScriptedSink::new(vec![]));
    sink.down_topics.lock().unwrap().insert("t".into());
    let options = small_policy();
    let total = total_delay(&options.retry);
    let stalls = Arc::clone(&options.stalls);
    let started = tokio::time::Instant::now();
    let done = run(
        Arc::clone(&sink),
        vec![event(1, "a", "t"), event(2, "b", "u")],
        options,
    )
    .await;
    assert_eq!(done[0].outcome, sent("e2"), "u goes first");
    assert!(
        matches!(&done[1].outcome, SendOutcome::Failed { attempts: 5, .. }),
        "{:?}",
        done[1]
    );
    let waited = started.elapsed();
    assert!(
        waited >= total && waited < total + Duration::from_secs(1),
        "{waited:?}"
    );
    assert!(!stalls.is_stalled("t"), "a lane with nothing left closes");
}

#[tokio::test(start_paused = true)]
async fn a_healthy_topic_s_successes_do_not_wake_a_stalled_topic_s_lane() {
    let sink = Arc::new(ScriptedSink::new(vec![]));
    sink.down_topics.lock().unwrap().insert("t".into());
    let mut shard = running(&sink, ShardOptions::default());
    shard.feed(vec![event(1, "a", "t")]).await;
    // u's events succeed every 10 ms for 6 s: a SEND_OK each, on another topic.
    for n in 0..600 {
        shard.feed(vec![event(100 + n, "b", "u")]).await;
        shard.next(1).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t_attempts = sink
        .calls()
        .iter()
        .filter(|(topic, _, _)| topic == "t")
        .count();
    // The first attempt, then retries after 1, 2 and 4 s (the default policy): 3 in 6 s.
    assert_eq!(t_attempts, 3, "t is tried at its own retry pace only");
}

#[tokio::test(start_paused = true)]
async fn where_keys_keep_their_queue_a_lost_queue_holds_back_only_its_keys() {
    // Four queues: key "d" hashes to queue 0, "a" to 1, "b" to 2, "c" to 3.
    let sink = Arc::new(ScriptedSink {
        stable: true,
        ..ScriptedSink::new(vec![])
    });
    sink.down_queues.lock().unwrap().insert(("t".into(), 1));
    let options = ShardOptions::default();
    let stalls = Arc::clone(&options.stalls);
    let mut shard = running(&sink, options);
    shard
        .feed(vec![
            event(1, "a", "t"),
            event(2, "b", "t"),
            event(3, "a", "t"),
            event(4, "c", "t"),
            event(5, "d", "u"),
            event(6, "d", "t"),
        ])
        .await;
    let healthy = shard.next(4).await;
    assert_eq!(ids(&healthy), ["e2", "e4", "e5", "e6"]);
    assert!(
        healthy.iter().all(|(_, at)| *at == 0),
        "the topic's other queues never wait for queue 1: {healthy:?}"
    );
    let stalled = stalls.stalled();
    assert!(stalled.contains("t", "a") && !stalled.contains("t", "b"));
    assert!(stalled.whole_topics().is_empty());
    assert_eq!(stalls.held("t"), 2);

    // Later events: queue 1's join its lane, the others go at once.
    tokio::time::sleep(Duration::from_secs(10)).await;
    shard
        .feed(vec![event(7, "a", "t"), event(8, "b", "t")])
        .await;
    assert_eq!(shard.next(1).await, [("e8".to_string(), 10)]);

    // The group is back: queue 1's events go in order, then the shard sends them itself again.
    sink.down_queues.lock().unwrap().clear();
    assert_eq!(ids(&shard.next(3).await), ["e1", "e3", "e7"]);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        stalls.stalled().is_empty(),
        "the lane closed once it was done"
    );
    shard.feed(vec![event(9, "a", "t")]).await;
    assert_eq!(ids(&shard.next(1).await), ["e9"]);
    drop(shard.input);
    shard.task.await.unwrap();
    // Every send to queue 1 carried only key a's events, in order.
    let queue_1: Vec<String> = sink
        .calls()
        .into_iter()
        .filter(|(topic, queue, _)| topic == "t" && *queue == 1)
        .flat_map(|(_, _, ids)| ids)
        .collect();
    assert!(queue_1
        .iter()
        .all(|id| ["e1", "e3", "e7", "e9"].contains(&id.as_str())));
}

#[tokio::test(start_paused = true)]
async fn a_lost_route_holds_the_whole_topic_behind_its_queue_lanes() {
    let sink = Arc::new(ScriptedSink {
        stable: true,
        ..ScriptedSink::new(vec![])
    });
    sink.down_queues.lock().unwrap().insert(("t".into(), 1));
    let options = ShardOptions::default();
    let stalls = Arc::clone(&options.stalls);
    let mut shard = running(&sink, options);
    shard.feed(vec![event(1, "a", "t")]).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(stalls.stalled().contains("t", "a"));
    // t's route cannot be looked up for a moment (within queue 1's retry delay): the queue of
    // a new event is unknown, so the whole topic waits, behind queue 1's lane.
    sink.queues.lock().unwrap().remove("t");
    shard
        .feed(vec![event(2, "a", "t"), event(3, "b", "t")])
        .await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(stalls.stalled().whole_topics(), ["t"], "b waits too");
    sink.down_queues.lock().unwrap().clear();
    sink.queues.lock().unwrap().insert("t".into(), 4);
    let all = shard.next(3).await;
    assert_eq!(ids(&all), ["e1", "e2", "e3"], "in the shard's order");
    drop(shard.input);
    shard.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_queue_another_shard_found_stalled_costs_this_shard_no_timeout() {
    // Sends to queue 1 (key "a") time out after 2 s, as to a frozen broker.
    let sink = Arc::new(ScriptedSink {
        stable: true,
        down_queue_timeout: Duration::from_secs(2),
        ..ScriptedSink::new(vec![])
    });
    sink.down_queues.lock().unwrap().insert(("t".into(), 1));
    let first = ShardOptions::default();
    let second = ShardOptions {
        index: 1,
        stalls: Arc::clone(&first.stalls),
        ..ShardOptions::default()
    };
    let stalls = Arc::clone(&first.stalls);
    let mut one = running(&sink, first);
    let mut two = running(&sink, second);
    // Shard one meets the timeout and opens a lane for queue 1.
    one.feed(vec![event(1, "a", "t"), event(2, "b", "t")]).await;
    assert_eq!(
        one.next(1).await,
        [("e2".to_string(), 2)],
        "behind the first timeout"
    );
    assert!(stalls.stalled().contains("t", "a"));
    // Shard two's event for queue 1 goes to a lane of its own at once: "b" does not wait.
    two.feed(vec![event(3, "a", "t"), event(4, "b", "t")]).await;
    assert_eq!(
        two.next(1).await,
        [("e4".to_string(), 2)],
        "no timeout in shard two"
    );
    sink.down_queues.lock().unwrap().clear();
    let mut late = one.next(1).await;
    late.extend(two.next(1).await);
    let mut ids: Vec<String> = late.into_iter().map(|(id, _)| id).collect();
    ids.sort();
    assert_eq!(ids, ["e1", "e3"]);
    drop((one.input, two.input));
    one.task.await.unwrap();
    two.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_broker_group_that_timed_out_for_one_topic_costs_the_others_no_timeout() {
    // Four queues per topic, 0 and 1 on broker-a, 2 and 3 on broker-b; broker-b is frozen:
    // sends to its queues time out after 2 s. Key "b" → queue 2, "c" → 3, "d" → 0.
    let sink = Arc::new(ScriptedSink {
        stable: true,
        down_queue_timeout: Duration::from_secs(2),
        ..ScriptedSink::new(vec![])
    });
    for down in [("t", 2), ("u", 3)] {
        sink.down_queues
            .lock()
            .unwrap()
            .insert((down.0.into(), down.1));
    }
    let first = ShardOptions::default();
    let second = ShardOptions {
        index: 1,
        stalls: Arc::clone(&first.stalls),
        ..ShardOptions::default()
    };
    let mut one = running(&sink, first);
    let mut two = running(&sink, second);
    one.feed(vec![event(1, "b", "t"), event(2, "d", "t")]).await;
    assert_eq!(
        one.next(1).await,
        [("e2".to_string(), 2)],
        "behind the first timeout"
    );
    // Another topic's queue on the same group: to a lane at once, so "d" of u does not wait.
    two.feed(vec![event(3, "c", "u"), event(4, "d", "u")]).await;
    assert_eq!(
        two.next(1).await,
        [("e4".to_string(), 2)],
        "no timeout in shard two"
    );
    sink.down_queues.lock().unwrap().clear();
    let mut late = one.next(1).await;
    late.extend(two.next(1).await);
    let mut ids: Vec<String> = late.into_iter().map(|(id, _)| id).collect();
    ids.sort();
    assert_eq!(ids, ["e1", "e3"]);
    drop((one.input, two.input));
    one.task.await.unwrap();
    two.task.await.unwrap();
}
