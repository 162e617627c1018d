//! The shard against a sink that refuses the relay's account (`SendError::Unauthorized`): the
//! events wait at the retry policy's pace, never FAILED for it, and are sent once it accepts.

use super::*;

// Each test has a topic of its own: `/readyz`'s refused topics are process-wide (the other
// tests send to "t" and "u").

fn refusal() -> Answer {
    Err(SendError::Unauthorized("NO_PERMISSION (16)".into()))
}

/// A sink whose first `refusals` sends are refused, then accepted; `topic` has 4 queues.
fn refusing(topic: &str, refusals: usize) -> Arc<ScriptedSink> {
    let sink = ScriptedSink::new((0..refusals).map(|_| refusal()).collect());
    sink.set_queues(topic, 4);
    Arc::new(sink)
}

/// The waits of `n` refusals in a row: the policy's delays, then its last one over and over.
fn refusal_delays(policy: &RetryPolicy, n: u32) -> Duration {
    (1..=n).map(|i| policy.delay_without_end(i)).sum()
}

fn refused_topics() -> Vec<String> {
    crate::metrics::health().readiness().refused_topics
}

#[tokio::test(start_paused = true)]
async fn a_refused_account_never_fails_the_event_and_it_is_sent_once_accepted() {
    // 20 refusals: 1 + 2 + 4 + 8 s, then 8 s × 16 = 143 s, ten times the policy's 15 s before
    // FAILED.
    let options = small_policy();
    let waited = refusal_delays(&options.retry, 20);
    assert_eq!(waited, Duration::from_secs(15 + 8 * 16));
    assert!(waited > total_delay(&options.retry) * 9);
    const TOPIC: &str = "refused-then-accepted";
    let sink = refusing(TOPIC, 20);
    let started = tokio::time::Instant::now();
    let shard = start(Arc::clone(&sink), vec![event(1, "k", TOPIC)], options);

    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!shard.is_finished(), "no outcome while refused");
    assert!(
        refused_topics().contains(&TOPIC.to_string()),
        "/readyz names the refused topic: {:?}",
        refused_topics()
    );
    let done = shard.await.unwrap();
    assert_eq!(outcomes(&done), vec![("e1".into(), sent("e1"))]);
    assert_eq!(started.elapsed(), waited, "one attempt per delay");
    assert_eq!(sink.calls().len(), 21, "20 refused, then accepted");
    assert!(
        !refused_topics().contains(&TOPIC.to_string()),
        "the SEND_OK ends the refusal"
    );
}

#[tokio::test(start_paused = true)]
async fn refusals_use_none_of_the_retries_of_an_event_that_then_fails_for_another_reason() {
    let down = || Err(SendError::Retryable("broker-a unavailable".into()));
    let mut answers = vec![down()];
    answers.extend((0..10).map(|_| refusal()));
    const TOPIC: &str = "refused-then-down";
    let mut sink = ScriptedSink::new(answers);
    sink.down = Some("broker-a unavailable".into());
    sink.set_queues(TOPIC, 4);
    let options = small_policy();
    let expected = total_delay(&options.retry) + refusal_delays(&options.retry, 10);
    let started = tokio::time::Instant::now();
    let done = run(Arc::new(sink), vec![event(1, "k", TOPIC)], options).await;
    match &done[0].outcome {
        SendOutcome::Failed { reason, attempts } => {
            assert_eq!(
                *attempts, 5,
                "the first attempt and 4 retries, not one less"
            );
            assert!(reason.contains("gave up after 4 retries"), "{reason}");
            assert!(reason.contains("unavailable"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        started.elapsed(),
        expected,
        "the policy's whole wait, plus the refusals' own"
    );
}

#[tokio::test(start_paused = true)]
async fn a_refused_route_look_up_waits_too_and_fails_nothing() {
    const TOPIC: &str = "route-refused";
    let sink = refusing(TOPIC, 0);
    sink.route_refusals.store(12, Ordering::SeqCst);
    let options = small_policy();
    let waited = refusal_delays(&options.retry, 12);
    let started = tokio::time::Instant::now();
    let done = run(Arc::clone(&sink), vec![event(1, "k", TOPIC)], options).await;
    assert_eq!(outcomes(&done), vec![("e1".into(), sent("e1"))]);
    assert_eq!(started.elapsed(), waited);
    assert_eq!(sink.calls().len(), 1, "sent once the route was given");
}
