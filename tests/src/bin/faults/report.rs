//! The report: the faults' windows on stderr, then a Markdown report of
//! the faults injected and the ledger (docs/faults.md keeps the last full
//! run's), then the destination faults and the legs' ledger.

use std::time::Instant;

use crate::Settings;
use crate::check::Checked;
use crate::destinations::SOURCE;
use crate::faults::REPEAT_GRACE;
use crate::legs::Legs;
use crate::load::RATE;
use crate::settle::Settled;
use crate::sink::Answer;
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
        "Fault-injection run: {} cycle(s), {} worker kill(s) per cycle, a {} s destination outage, {:.0} s, 3 workers, {RATE} deliveries/s (half to a `store` source, a third to a `forward` source, a sixth to a source with three destinations){}.\n\n| fault | injected |\n|---|---|\n",
        settings.cycles,
        settings.kills_per_cycle,
        settings.outage.as_secs(),
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
    if let Some(unsettled) = &s.unsettled {
        report.push_str(&format!("\n**{unsettled}**\n"));
    }
    report
}

/// The destination faults, one row each, and the legs' ledger.
pub fn destinations(suite: &Suite, legs: &Legs) -> String {
    let r = &suite.receivers;
    let flaky = r.flaky.arrivals();
    let mut out = format!(
        "\n| destination fault (`{SOURCE}`'s `flaky`; `store` and `steady` beside it) | lasted | requests `flaky` read (2xx / other / cut) | breaker | legs waiting at most (held) | back to normal after |\n|---|---|---|---|---|---|\n"
    );
    for f in &r.faults {
        let during: Vec<_> = flaky
            .iter()
            .filter(|a| f.begin <= a.at && a.at < f.end)
            .collect();
        let count = |pick: fn(&Answer) -> bool| during.iter().filter(|a| pick(&a.answer)).count();
        out.push_str(&format!(
            "| {} | {:.1} s | {} ({} / {} / {}) | {} | {} ({}) | {} |\n",
            f.what,
            (f.end - f.begin).as_secs_f64(),
            during.len(),
            count(|a| *a == Answer::Effect),
            count(|a| matches!(a, Answer::Status(_))),
            count(|a| *a == Answer::Cut),
            match f.opened {
                Some(at) => format!("opened after {:.1} s", (at - f.begin).as_secs_f64()),
                None => "stayed closed".to_owned(),
            },
            f.waiting.0,
            f.waiting.1,
            match f.recovered {
                Some(at) => format!("{:.1} s", (at - f.end).as_secs_f64()),
                None => "**not within a minute**".to_owned(),
            },
        ));
    }
    let [steady, flaky] = &legs.receivers;
    out.push_str(&format!(
        "\n| destination legs (`{SOURCE}`: `store`, `steady`, `flaky`) | count |\n|---|---|\n\
        | deliveries answered 2xx | {} |\n\
        | legs expected / completed | {} / {} |\n\
        | **lost legs** (not completed, or no effect, and not dead-lettered) | **{}** |\n\
        | **dead letters among the legs** | **{}** |\n\
        | `steady`: requests / effects (2xx) / keys | {} / {} / {} |\n\
        | `flaky`: requests / effects (2xx) / keys | {} / {} / {} |\n\
        | keys answered 2xx again around a worker or infrastructure fault (allowed) | {} |\n\
        | **duplicate effects** (a key answered 2xx again outside those faults, +{}s grace) | **{}** |\n\
        | requests with a wrong key, delivery id or body | {} |\n\
        | `flaky`'s 404 answers / **of them spent an attempt** | {} / **{}** |\n\
        | `steady`'s slowest effect after the send, for deliveries sent during `flaky`'s faults | {} |\n\
        | `store` ordered by repository: keys / completed legs | {} / {} |\n\
        | **ordered legs completed out of claim order** | **{}** |\n\
        | `steady` (fair) legs that waited for their turn in Postgres | {} |\n",
        legs.deliveries,
        legs.expected,
        legs.completed,
        legs.lost.len(),
        legs.dead,
        steady.requests,
        steady.effects,
        steady.keys,
        flaky.requests,
        flaky.effects,
        flaky.keys,
        legs.repeats,
        REPEAT_GRACE.as_secs(),
        legs.duplicates.len(),
        legs.wrong,
        legs.not_found.0,
        legs.not_found.1,
        legs.steady_slowest
            .map(|d| format!("{:.1} s", d.as_secs_f64()))
            .unwrap_or_else(|| "-".to_owned()),
        legs.ordered.0,
        legs.ordered.1,
        legs.ordered.2.len(),
        legs.fair_waited,
    ));
    out
}
