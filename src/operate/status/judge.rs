//! The verdict of `status` and its reasons, from what the report read (see the module doc of
//! `operate::status`).

use super::*;

/// How long after a leader's lease ran out (server clock) `status` says no instance streams: a
/// standby takes over about a lease (8 s) after the last renewal it saw.
const LEASE_RAN_OUT_LIMIT: f64 = 30.0;

/// The verdict and its reasons (see the module doc); `binlog`: how far the checkpoint is behind
/// the server, when it could be read.
pub(super) fn judge(
    tables: &[TableStatus],
    relay: &RelayState,
    binlog: Option<&BinlogLag>,
    mode: RelayMode,
    options: &StatusOptions,
) -> (Verdict, Vec<String>) {
    let mut findings = Findings {
        verdict: Verdict::Healthy,
        reasons: Vec::new(),
    };
    for t in tables {
        findings.judge_table(t, options);
    }
    findings.judge_leadership(relay, mode);
    findings.judge_binlog(binlog, options);
    findings.judge_checkpoint(tables, relay, mode, options);
    (findings.verdict, findings.reasons)
}

/// The most severe verdict found so far and every reason, in the order found.
struct Findings {
    verdict: Verdict,
    reasons: Vec<String>,
}

impl Findings {
    fn flag(&mut self, v: Verdict, reason: String) {
        self.verdict = self.verdict.max(v);
        self.reasons.push(reason);
    }

    /// One table's expired leases, recent FAILED rows and rows waiting past the lag threshold
    /// (per late topic, else for the table's oldest PENDING row).
    fn judge_table(&mut self, t: &TableStatus, options: &StatusOptions) {
        let lag = options.lag_threshold.as_secs_f64();
        if t.expired_leases > 0 {
            self.flag(
                Verdict::Stuck,
                format!(
                    "{}: {} SENDING row(s) with an expired lease (their sender stopped)",
                    t.table, t.expired_leases
                ),
            );
        }
        if t.failed_recently > 0 {
            self.flag(
                Verdict::Failing,
                format!(
                    "{}: {} row(s) FAILED in the last {}",
                    t.table,
                    t.failed_recently,
                    humantime::format_duration(options.failing_window)
                ),
            );
        }
        let late: Vec<&WaitingTopic> = (t.waiting.iter())
            .filter(|w| w.oldest_seconds > lag)
            .collect();
        for topic in &late {
            self.flag(Verdict::Lagging, waiting::reason(&t.table, topic, lag));
        }
        if late.is_empty() && t.oldest_pending_seconds > lag {
            self.flag(
                Verdict::Lagging,
                format!(
                    "{}: oldest PENDING row is {:.1} s old (threshold {} s)",
                    t.table, t.oldest_pending_seconds, lag
                ),
            );
        }
    }

    /// Whether an instance streams: a leader's lease that ran out long ago, an election lock
    /// nobody holds, or (CDC mode) no leader at all.
    fn judge_leadership(&mut self, relay: &RelayState, mode: RelayMode) {
        if let (Some(leader), Some(left)) = (&relay.leader, relay.lease_left_seconds) {
            // A standby claims a lease that ran out within about a lease (8 s); long after, none
            // runs.
            if left < -LEASE_RAN_OUT_LIMIT {
                self.flag(
                    Verdict::Stuck,
                    format!(
                        "the lease of leader {leader} ran out {:.0} s ago and no instance took over: no instance streams",
                        -left
                    ),
                );
            }
        }
        if let (Some(leader), Some(false)) = (&relay.leader, relay.lock_held) {
            // A standby waiting in GET_LOCK takes a freed lock at once: free, nobody waits.
            self.flag(
                Verdict::Stuck,
                format!(
                    "leader {leader} (epoch {}, elected by lock) no longer holds the election lock and \
                     no instance took it: no instance streams; start an instance, or read the \
                     instances' logs for why none leads",
                    relay.leader_epoch
                ),
            );
        }
        if mode == RelayMode::Cdc && relay.leader.is_none() {
            let why = match relay.found {
                true => format!(
                    "no instance streams: no leader (last epoch {}); start an instance, or read the instances' logs for why none leads",
                    relay.leader_epoch
                ),
                false => format!(
                    "no instance streams: no relay named `{}` has run here; start one",
                    relay.name
                ),
            };
            self.flag(Verdict::Stuck, why);
        }
    }

    /// The mirrored checkpoint more than the threshold of transactions behind the server.
    fn judge_binlog(&mut self, binlog: Option<&BinlogLag>, options: &StatusOptions) {
        if let Some(behind) = binlog.and_then(|b| b.transactions_behind) {
            if behind > options.behind_threshold {
                self.flag(
                    Verdict::Lagging,
                    format!(
                        "the checkpoint is {} transactions behind the server (threshold {})",
                        crate::operate::thousands(behind),
                        crate::operate::thousands(options.behind_threshold)
                    ),
                );
            }
        }
    }

    /// (CDC mode) rows waiting past the lag threshold while the checkpoint has not moved for
    /// `stuck_after`, or while there is no checkpoint.
    fn judge_checkpoint(
        &mut self,
        tables: &[TableStatus],
        relay: &RelayState,
        mode: RelayMode,
        options: &StatusOptions,
    ) {
        let lag = options.lag_threshold.as_secs_f64();
        let waiting = tables.iter().any(|t| t.oldest_pending_seconds > lag);
        if !(waiting && mode == RelayMode::Cdc) {
            return;
        }
        let stuck_after = options.stuck_after.as_secs_f64();
        match relay.checkpoint_age_seconds {
            Some(age) if age > stuck_after => self.flag(
                Verdict::Stuck,
                format!(
                    "the checkpoint has not moved for {age:.0} s while rows wait (limit {stuck_after} s)"
                ),
            ),
            Some(_) => {}
            None => self.flag(
                Verdict::Stuck,
                format!(
                    "no checkpoint for relay `{}` while rows wait: is the relay running?",
                    relay.name
                ),
            ),
        }
    }
}
