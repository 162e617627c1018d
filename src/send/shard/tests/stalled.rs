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

/// The next completions are `expected`, all SENT at the start (virtual time 0).
async fn sent_at_once(shard: &mut Running, expected: &[&str]) {
    let done = shard.next(expected.len()).await;
    assert_eq!(ids(&done), expected);
    assert!(done.iter().all(|(_, at)| *at == 0), "{done:?}");
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
    // u's events never wait for t's retries.
    sent_at_once(&mut shard, &["e2", "e4", "e6"]).await;
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
    // The topic's other queues never wait for queue 1.
    sent_at_once(&mut shard, &["e2", "e4", "e5", "e6"]).await;
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

/// Two shards sharing their stalls over a sink whose `down` queues time out after 2 s (a
/// frozen broker; queues 0 and 1 are on `broker-a`, 2 and 3 on `broker-b`). Shard one gets
/// `first` (a down queue's event, then a healthy one) and meets the timeout; shard two then gets
/// `second` (the same) and must not: its healthy event is SENT at once, its other one in a
/// lane once the queues answer again.
async fn second_shard_pays_no_timeout(
    down: &[(&str, usize)],
    first: [ShardEvent; 2],
    second: [ShardEvent; 2],
) {
    let sink = Arc::new(ScriptedSink {
        stable: true,
        down_queue_timeout: Duration::from_secs(2),
        ..ScriptedSink::new(vec![])
    });
    for (topic, queue) in down {
        (sink.down_queues.lock().unwrap()).insert((topic.to_string(), *queue));
    }
    let options = ShardOptions::default();
    let other = ShardOptions {
        index: 1,
        stalls: Arc::clone(&options.stalls),
        ..ShardOptions::default()
    };
    let (mut one, mut two) = (running(&sink, options), running(&sink, other));
    let id = |e: &ShardEvent| e.row.message.event_id.clone();
    let late = [id(&first[0]), id(&second[0])];
    let (healthy_one, healthy_two) = (id(&first[1]), id(&second[1]));
    one.feed(first.into()).await;
    assert_eq!(
        one.next(1).await,
        [(healthy_one, 2)],
        "behind the first timeout"
    );
    two.feed(second.into()).await;
    assert_eq!(
        two.next(1).await,
        [(healthy_two, 2)],
        "no timeout in shard two"
    );
    sink.down_queues.lock().unwrap().clear();
    let mut sent = one.next(1).await;
    sent.extend(two.next(1).await);
    let mut ids: Vec<String> = sent.into_iter().map(|(id, _)| id).collect();
    ids.sort();
    assert_eq!(ids, late);
    drop((one.input, two.input));
    one.task.await.unwrap();
    two.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_queue_another_shard_found_stalled_costs_this_shard_no_timeout() {
    // Key "a" → queue 1 (down), "b" → queue 2.
    second_shard_pays_no_timeout(
        &[("t", 1)],
        [event(1, "a", "t"), event(2, "b", "t")],
        [event(3, "a", "t"), event(4, "b", "t")],
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_broker_group_that_timed_out_for_one_topic_costs_the_others_no_timeout() {
    // Key "b" → queue 2 of t, "c" → queue 3 of u (both broker-b), "d" → queue 0 (broker-a):
    // shard two's u event is of another topic, on the group shard one found frozen.
    second_shard_pays_no_timeout(
        &[("t", 2), ("u", 3)],
        [event(1, "b", "t"), event(2, "d", "t")],
        [event(3, "c", "u"), event(4, "d", "u")],
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_key_whose_queue_changes_while_its_lane_retries_never_overtakes_itself() {
    // Four queues: key "a" (hash 97) on queue 1, which fails; then the topic gets five queues
    // ("a" on queue 2, which works).
    let sink = Arc::new(ScriptedSink {
        stable: true,
        ..ScriptedSink::new(vec![])
    });
    sink.down_queues.lock().unwrap().insert(("t".into(), 1));
    let mut shard = running(&sink, ShardOptions::default());
    shard.feed(vec![event(1, "a", "t")]).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    sink.set_queues("t", 5);
    shard
        .feed(vec![event(2, "a", "t"), event(3, "b", "u")])
        .await;
    let first = shard.next(1).await;
    assert_eq!(
        ids(&first),
        ["e3"],
        "another topic flows; e2 waits behind e1"
    );
    // e1's retry goes to the key's queue under the new route, then e2 follows.
    let rest = shard.next(2).await;
    assert_eq!(ids(&rest), ["e1", "e2"]);
    let t_sends: Vec<(usize, Vec<String>)> = (sink.calls().into_iter())
        .filter(|(topic, _, _)| topic == "t")
        .map(|(_, queue, ids)| (queue, ids))
        .collect();
    assert_eq!(
        t_sends,
        [
            (1, vec!["e1".to_string()]),
            (2, vec!["e1".to_string()]),
            (2, vec!["e2".to_string()]),
        ]
    );
}
