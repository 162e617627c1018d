//! One soak run: servers, relays under a supervisor, the consumer, the writers, the fault
//! schedule with recovery measured after each fault, the drain, then the audit.

use super::audit::{audit, Audit, CalmSamples, FaultRecord, RunFacts};
use super::consumer::SoakConsumer;
use super::faults::{inject, leader, schedule, FaultKind};
use super::relays::{soak_config, Relays};
use super::servers::{Servers, SIDE_TOPIC, TOPIC};
use super::workload::{self, WorkloadSpec};
use rocketmq_outbox::outbox::status::codes::{PENDING, SENDING, SENT};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Writing time before the first fault: the relays and brokers warm up (connections, the
/// brokers' JIT) so the seconds a fault is judged against are steady.
const WARM_UP: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct SoakSpec {
    pub events: usize,
    pub writers: usize,
    pub keys: usize,
    /// Target events per second.
    pub rate: f64,
    pub relays: usize,
    pub faults: usize,
    /// A fault is due every `fault_every` (the first after [`WARM_UP`]), and never before the
    /// previous one recovered.
    pub fault_every: Duration,
    /// How long a fault with a duration (broker down or frozen, relays down) lasts.
    pub hold: Duration,
    pub seed: u64,
    /// The fault kinds scheduled.
    pub kinds: Vec<FaultKind>,
}

/// The oldest unsent row younger than this means "caught up".
const CAUGHT_UP: Duration = Duration::from_secs(1);
/// …and it must stay so this long.
const SETTLE: Duration = Duration::from_secs(2);
/// A fault not recovered from within this is a failure.
const RECOVERY_BOUND: Duration = Duration::from_secs(120);
const SAMPLE: Duration = Duration::from_millis(100);

impl SoakSpec {
    /// The CI form: every fault kind once, about a minute and a half.
    pub fn short() -> Self {
        SoakSpec {
            events: 11_000,
            writers: 4,
            keys: 200,
            rate: 200.0,
            relays: 2,
            faults: 9,
            fault_every: Duration::from_secs(3),
            hold: Duration::from_secs(2),
            seed: 0x50A4,
            kinds: FaultKind::ALL.to_vec(),
        }
    }

    /// `base` with `SOAK_EVENTS`, `SOAK_RATE`, `SOAK_WRITERS`, `SOAK_KEYS`, `SOAK_RELAYS`,
    /// `SOAK_FAULTS`, `SOAK_FAULT_EVERY` (humantime, e.g. `5s`), `SOAK_HOLD`, `SOAK_SEED`,
    /// `SOAK_KINDS` (comma-separated short names, e.g. `kill-leader`) applied.
    pub fn from_env(base: SoakSpec) -> Self {
        fn var<T: std::str::FromStr>(name: &str) -> Option<T> {
            let value = std::env::var(name).ok()?;
            Some(
                value
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={value} does not parse")),
            )
        }
        fn duration(name: &str) -> Option<Duration> {
            let value = std::env::var(name).ok()?;
            Some(humantime::parse_duration(&value).unwrap_or_else(|e| panic!("{name}: {e}")))
        }
        let mut spec = base;
        spec.events = var("SOAK_EVENTS").unwrap_or(spec.events);
        spec.rate = var("SOAK_RATE").unwrap_or(spec.rate);
        spec.writers = var("SOAK_WRITERS").unwrap_or(spec.writers);
        spec.keys = var("SOAK_KEYS").unwrap_or(spec.keys);
        spec.relays = var("SOAK_RELAYS").unwrap_or(spec.relays);
        spec.fault_every = duration("SOAK_FAULT_EVERY").unwrap_or(spec.fault_every);
        spec.hold = duration("SOAK_HOLD").unwrap_or(spec.hold);
        spec.seed = var("SOAK_SEED").unwrap_or(spec.seed);
        if let Ok(kinds) = std::env::var("SOAK_KINDS") {
            spec.kinds = FaultKind::parse_list(&kinds);
        }
        // Enough faults to cover the writing time unless given.
        let writing = Duration::from_secs_f64(spec.events as f64 / spec.rate);
        let fitting = (writing.as_secs_f64() / spec.fault_every.as_secs_f64()) as usize;
        spec.faults = var("SOAK_FAULTS").unwrap_or(fitting.max(spec.faults));
        spec
    }
}

pub async fn run(spec: SoakSpec) -> Audit {
    let started = Instant::now();
    let servers = Arc::new(Servers::start().await);
    let dir = tempfile::tempdir().unwrap();
    let config = soak_config(servers.relay_url(), servers.namesrv_addr());
    let pending_bound = config.sweeper.min_age + config.sweeper.interval + CAUGHT_UP;
    let relays = Arc::new(Mutex::new(Relays::start(
        &config,
        spec.relays,
        dir.path(),
        vec![],
    )));
    let supervising = Arc::new(AtomicBool::new(true));
    let supervisor = {
        let (relays, supervising) = (relays.clone(), supervising.clone());
        tokio::spawn(async move {
            while supervising.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(300)).await;
                relays.lock().unwrap().supervise();
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while leader(&servers).await.is_none() {
        assert!(
            Instant::now() < deadline,
            "no relay leads:\n{}",
            relays.lock().unwrap().log_tails(30)
        );
        tokio::time::sleep(SAMPLE).await;
    }
    let consumer = SoakConsumer::start(servers.pool.clone(), servers.namesrv_addr(), TOPIC).await;
    let plan = schedule(spec.seed, spec.faults, &spec.kinds);
    println!(
        "soak: {spec:?}\nsoak: fault schedule (seed {:#x}): {:?}",
        spec.seed, plan
    );

    let workload = WorkloadSpec {
        events: spec.events,
        writers: spec.writers,
        keys: spec.keys,
        rate: spec.rate,
        rollback_every: 10,
        poison: 3,
        topic: TOPIC.to_string(),
        seed: spec.seed,
    };
    // The writers go on past `spec.events` until the last fault whose isolation is judged is
    // over: on a loaded machine the faults before it have taken 40 s to recover from, which
    // once left it no writes to judge by.
    let last_judged = plan.iter().rposition(|kind| kind.isolation_judged());
    let keep_writing = Arc::new(AtomicBool::new(last_judged.is_some()));
    let writers = tokio::spawn(workload::run(
        servers.pool.clone(),
        workload,
        Arc::clone(&keep_writing),
    ));
    let side_done = Arc::new(AtomicBool::new(false));
    let side = tokio::spawn(workload::side_topic(
        servers.pool.clone(),
        SIDE_TOPIC,
        Arc::clone(&side_done),
    ));
    let t0 = Instant::now();
    let mut records = Vec::new();
    let mut calm = CalmSamples::default();
    for (i, kind) in plan.into_iter().enumerate() {
        // The first fault waits for the relays and brokers to warm up: its isolation is judged
        // against the seconds just before it, which must be steady (CI's MySQL soak once
        // measured a 3.7 s p99 in the first seconds of writing, and judged the fault by it).
        let due = WARM_UP.max(spec.fault_every) + spec.fault_every * i as u32;
        calm_until(&servers, t0 + due, &mut calm).await;
        let at = t0.elapsed();
        let injected = inject(kind, &servers, &relays, spec.hold).await;
        let (recovery, peak_age) = watch_recovery(&servers).await;
        println!(
            "soak: {at:>8.1?} {:<26} recovered in {recovery:.1?} (oldest unsent peaked at {peak_age:.1?}): {}",
            kind.name(),
            injected.detail
        );
        records.push(FaultRecord {
            kind,
            at,
            detail: injected.detail,
            isolation: injected.isolation,
            recovery,
            peak_age,
        });
        if Some(i) == last_judged {
            keep_writing.store(false, Ordering::SeqCst);
        }
    }
    let log = writers.await.unwrap();
    side_done.store(true, Ordering::SeqCst);
    side.await.unwrap();
    drain(&servers, &consumer, spec.events).await;
    supervising.store(false, Ordering::Relaxed);
    supervisor.await.unwrap();
    let unclean = relays.lock().unwrap().stop_all();
    let deliveries = consumer.deliveries();
    consumer.shutdown().await;
    let facts = RunFacts {
        faults: records,
        calm,
        pending_bound,
        relay_restarts: relays.lock().unwrap().restarts(),
        elapsed: started.elapsed(),
    };
    let mut result = audit(&servers, &log, &deliveries, &facts).await;
    if !unclean.is_empty() {
        result.failures.push(format!(
            "relays {unclean:?} did not stop cleanly on SIGTERM"
        ));
    }
    result
        .report
        .push_str(&relays.lock().unwrap().error_summary());
    if !result.failures.is_empty() {
        result
            .report
            .push_str(&relays.lock().unwrap().log_tails(40));
    }
    // SOAK_KEEP=1 keeps the relays' configs, logs and checkpoints for a look afterwards.
    if std::env::var_os("SOAK_KEEP").is_some() {
        result.report.push_str(&format!(
            "  relay files kept (SOAK_KEEP): {}\n",
            dir.keep().display()
        ));
    }
    result
}

/// Samples the calm-period invariants until `until`.
async fn calm_until(servers: &Servers, until: Instant, calm: &mut CalmSamples) {
    while Instant::now() < until {
        if let Ok(age) = servers.oldest_unsent_age().await {
            calm.max_pending_age = calm.max_pending_age.max(age.unwrap_or_default());
        }
        if let Ok(stale) = servers.stale_sending(Duration::from_secs(2)).await {
            calm.max_stale_sending = calm.max_stale_sending.max(stale);
        }
        calm.samples += 1;
        tokio::time::sleep(SAMPLE * 2).await;
    }
}

/// From now (a fault's end): how long until the oldest unsent row is younger than [`CAUGHT_UP`]
/// for [`SETTLE`], and the oldest age seen meanwhile.
async fn watch_recovery(servers: &Servers) -> (Option<Duration>, Duration) {
    let end = Instant::now();
    let (mut recovered_at, mut peak) = (end, Duration::ZERO);
    while end.elapsed() < RECOVERY_BOUND {
        let behind = match servers.oldest_unsent_age().await {
            Err(()) => true,
            Ok(age) => {
                let age = age.unwrap_or_default();
                peak = peak.max(age);
                age >= CAUGHT_UP
            }
        };
        if behind {
            recovered_at = Instant::now() + SAMPLE;
        } else if recovered_at.elapsed() >= SETTLE {
            return (Some(recovered_at - end), peak);
        }
        tokio::time::sleep(SAMPLE).await;
    }
    (None, peak)
}

/// Waits (bounded: 2 minutes, and a second more per 1,000 events, for a consumer that fell
/// behind a long run) until no row is PENDING or SENDING and every SENT event has its business
/// effect committed and a delivery ACKed; the audit says what is missing if that never happens.
async fn drain(servers: &Servers, consumer: &SoakConsumer, events: usize) {
    let bound = Duration::from_secs(120 + events as u64 / 1_000);
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        let counts: Vec<(u64, u64, u64)> = servers
            .query(&format!(
                "SELECT COALESCE(SUM(status IN ({PENDING}, {SENDING})), 0), COALESCE(SUM(status = {SENT} AND topic = '{TOPIC}'), 0), \
                 (SELECT COUNT(DISTINCT event_id) FROM soak_effect) FROM outbox_event"
            ))
            .await;
        let (unsent, sent, processed) = counts[0];
        if unsent == 0 && processed >= sent && consumer.acked() as u64 >= sent {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
