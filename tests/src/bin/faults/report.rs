//! The report: the faults' windows on stderr, then a Markdown report of
//! the faults injected and the ledger (docs/faults.md keeps the last full
//! run's).

use std::time::Instant;

use crate::Settings;
use crate::check::Checked;
use crate::faults::REPEAT_GRACE;
use crate::load::RATE;
use crate::settle::Settled;
use crate::stack::Suite;

/// Prints the faults' windows (seconds since `started`) on stderr.
pub fn windows(suite: &Suite, started: Instant) {
    eprintln!(
        "faults: fault windows (s since start): {:?}",
        suite
            .windows
            .iter()
            .map(|(b, e)| (
                format!("{:.1}", b.saturating_duration_since(started).as_secs_f64()),
                format!("{:.1}", e.saturating_duration_since(started).as_secs_f64())
            ))
            .collect::<Vec<_>>()
    );
}

/// The Markdown report of a run that began at `started`.
pub fn markdown(
    settings: &Settings,
    suite: &Suite,
    started: Instant,
    c: &Checked,
    s: &Settled,
) -> String {
    let mut report = String::new();
    report.push_str(&format!(
        "Fault-injection run: {} cycle(s), {} worker kill(s) per cycle, {:.0} s, 3 workers, {RATE} deliveries/s (two thirds to a `store` source, one third to a `forward` source){}.\n\n| fault | injected |\n|---|---|\n",
        settings.cycles,
        settings.kills_per_cycle,
        started.elapsed().as_secs_f64(),
        if suite.pgbouncer.is_some() {
            "; ingest and workers reach Postgres through PgBouncer in transaction mode"
        } else {
            ""
        }
    ));
    let mut counts: Vec<_> = suite.counts.iter().collect();
    counts.sort();
    for (fault, n) in counts {
        report.push_str(&format!("| {fault} | {n} |\n"));
    }
    report.push_str(&format!(
        "\n| ledger | count |\n|---|---|\n| deliveries sent | {} |\n| redeliveries sent | {} |\n| requests that failed (no 2xx) | {} |\n| answered 2xx | {} |\n| effects | {} |\n| dead letters | {} |\n| **lost** (2xx, no effect, not dead-lettered) | **{}** |\n| **duplicate effects** | **{}** |\n| effects for never-sent ids | {} |\n| effects of deliveries that had a failed request (allowed) | {} |\n| fenced jobs logged | {} |\n| one-statement completions fenced (then taken the full way) | {} |\n\
        | relayed (`forward`) deliveries answered 2xx | {} |\n| relayed keys that arrived | {} |\n\
        | repeated arrivals (same key, same body) | {} |\n\
        | **repeats outside a fault window** (+{}s grace) | **{}** |\n| arrivals with a wrong key, delivery id or body | {} |\n\
        | deliveries that got no 2xx when sent (failed at GitHub) | {} |\n\
        | redeliveries the reconciler asked GitHub for (during the run / in all) | {} / {} |\n\
        | failed at GitHub, brought back by the reconciler | {} |\n\
        | failed at GitHub, completed here all the same (answered too late) | {} |\n\
        | **failed at GitHub and never brought back** | **{}** |\n",
        c.sent,
        c.redeliveries,
        c.failed_requests,
        c.accepted,
        c.effects,
        c.dead,
        c.lost.len(),
        c.duplicates.len(),
        c.unknown.len(),
        c.effects_after_failure,
        c.fenced,
        c.fused_fenced,
        c.relayed_accepted,
        c.relayed_keys,
        c.repeats,
        REPEAT_GRACE.as_secs(),
        c.stray.len(),
        c.wrong,
        s.failed_at_github,
        s.asked_during_the_run,
        s.reconciler_asked,
        s.brought_back,
        s.late_answers,
        s.never_brought_back,
    ));
    report
}
