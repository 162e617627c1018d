//! The goals of a run, each a ratio of two figures measured in the same run (so a verdict holds on
//! any machine), with a met / not met verdict.

use crate::report::{verdict, Report};
use crate::runs::System;
use std::fmt::Write as _;

/// CDC commit → stored p99 at 5k/s, at most this many times the client's single-send p99.
const P99_OVER_SINGLE_SEND: f64 = 5.0;
/// Highest sustained CDC rate, at least this share of the database's marking ceiling.
const SUSTAINED_OVER_CEILING: f64 = 0.8;
/// CDC drain rate, at least this share of the database's marking ceiling.
const DRAIN_OVER_CEILING: f64 = 0.9;
/// Relay CPU per event in the drain, at most this share of the database server's.
const CPU_OVER_DATABASE: f64 = 0.15;
/// Relay CPU per event at a steady 1k/s, at most this many times the drain's.
const STEADY_OVER_DRAIN: f64 = 3.0;
/// The relay as users run it (sweeper on): p50 and p99 at most this many times the sweeper-off
/// figures of the same run.
const SWEEPER_ON_OVER_OFF: f64 = 1.2;

/// Writes the goals table of `report` to `s`.
pub fn write(report: &Report<'_>, s: &mut String) {
    let c = report.ceiling;
    let ceiling = report.marking.rate();
    let db = report.database_role;
    let _ = writeln!(
        s,
        "\n### Goals (ratios from this run)\n\n| goal | measured | verdict |\n| --- | --- | --- |"
    );
    let cdc = |rate| report.latency_of("cdc", rate);
    if let Some(l) = cdc(5000) {
        let ratio = l.p99 as f64 / c.single_p99_ms;
        let _ = writeln!(
            s,
            "| CDC commit → stored p99 at 5k/s ≤ {P99_OVER_SINGLE_SEND}× the client's single-send p99 | {} ms / {:.2} ms = {ratio:.1}× | {} |",
            l.p99,
            c.single_p99_ms,
            verdict(ratio <= P99_OVER_SINGLE_SEND)
        );
    }
    let sustained = report
        .latencies
        .iter()
        .filter(|l| l.mode == "cdc" && l.sustained)
        .map(|l| l.achieved)
        .fold(0.0, f64::max);
    if report.latencies.iter().any(|l| l.mode == "cdc") {
        let ratio = sustained / ceiling;
        let _ = writeln!(
            s,
            "| highest sustained CDC rate ≥ {SUSTAINED_OVER_CEILING}× the database's marking ceiling | {sustained:.0} / {ceiling:.0} = {ratio:.2}× | {} |",
            verdict(ratio >= SUSTAINED_OVER_CEILING)
        );
    }
    for d in report.drains.iter().filter(|d| d.mode == "cdc") {
        let ratio = d.rate() / ceiling;
        let _ = writeln!(
            s,
            "| CDC drain ≥ {DRAIN_OVER_CEILING}× the database's marking ceiling | {:.0} / {ceiling:.0} = {ratio:.2}× | {} |",
            d.rate(),
            verdict(ratio >= DRAIN_OVER_CEILING)
        );
        let cpu = [(
            format!("relay CPU per event in the drain ≤ {CPU_OVER_DATABASE}× {db}'s"),
            d.database_cpu_us_per_event,
            CPU_OVER_DATABASE,
            d.cpu_us_per_event,
        )];
        let steady = cdc(1000).map(|l| {
            (
                format!("relay CPU per event at a steady 1k/s ≤ {STEADY_OVER_DRAIN}× the drain's"),
                d.cpu_us_per_event,
                STEADY_OVER_DRAIN,
                l.cpu_us_per_event,
            )
        });
        for (goal, base, limit, measured) in cpu.into_iter().chain(steady) {
            let ratio = measured / base;
            let _ = writeln!(
                s,
                "| {goal} | {measured:.1} / {base:.1} µs = {ratio:.2}× | {} |",
                verdict(ratio <= limit)
            );
        }
    }
    for d in report
        .drains
        .iter()
        .filter(|d| !["cdc", "debezium", "canal"].contains(&d.mode))
    {
        let _ = writeln!(
            s,
            "| (context) {} drain vs the database's marking ceiling | {:.0} / {ceiling:.0} = {:.2}× | — |",
            d.mode,
            d.rate(),
            d.rate() / ceiling
        );
    }
    for rate in [1000, 5000] {
        let poll = report.latency_of("poll", rate);
        if let (Some(cdc), Some(poll)) = (cdc(rate), poll) {
            let ratio = poll.p50 as f64 / (cdc.p50.max(1)) as f64;
            let _ = writeln!(
                s,
                "| CDC p50 ≥ 100× lower than poll at {rate}/s | {} ms vs {} ms = {ratio:.0}× | {} |",
                cdc.p50,
                poll.p50,
                verdict(ratio >= 100.0)
            );
        }
    }
    sweeper_goals(report, s);
    for (goal, measured, met) in crate::cost::goals(report.costs) {
        let _ = writeln!(s, "| {goal} | {measured} | {} |", verdict(met));
    }
}

/// What the defaults cost: the sweeper-on runs against the sweeper-off runs of the same rate,
/// and the relay's CPU at a steady 500/s with the defaults.
fn sweeper_goals(report: &Report<'_>, s: &mut String) {
    let (off, on) = (System::Cdc.label(), System::CdcSweeper.label());
    for rate in [1000, 5000] {
        let (Some(off), Some(on)) = (report.latency_of(off, rate), report.latency_of(on, rate))
        else {
            continue;
        };
        for (name, off, on) in [("p50", off.p50, on.p50), ("p99", off.p99, on.p99)] {
            // Latencies are whole milliseconds (the broker's store clock): 0 ms counts as 1.
            let ratio = on.max(1) as f64 / off.max(1) as f64;
            let _ = writeln!(
                s,
                "| sweeper on (defaults) {name} at {rate}/s ≤ {SWEEPER_ON_OVER_OFF}× sweeper off | {on} ms / {off} ms = {ratio:.2}× | {} |",
                verdict(ratio <= SWEEPER_ON_OVER_OFF)
            );
        }
        // The same at the stage trace's resolution: a step of 1 ms in a 2 ms p99 is the store
        // clock's, not the sweeper's.
        let (Some(off), Some(on)) = (&off.stages, &on.stages) else {
            continue;
        };
        for (name, p) in [("p50", 50.0), ("p99", 99.0)] {
            let (off, on) = (off.total_ms(p), on.total_ms(p));
            let ratio = on / off.max(0.001);
            let _ = writeln!(
                s,
                "| sweeper on (defaults) commit → SEND_OK {name} at {rate}/s ≤ {SWEEPER_ON_OVER_OFF}× sweeper off (µs resolution) | {on:.2} ms / {off:.2} ms = {ratio:.2}× | {} |",
                verdict(ratio <= SWEEPER_ON_OVER_OFF)
            );
        }
    }
}
