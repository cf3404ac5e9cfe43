//! The overview: where work is stuck and what is dead.

use hookinbox::deliveries::{Overview, State};
use maud::{Markup, html};

use super::{age, number, page, when};
use crate::console::session::Session;
use hookinbox::deliveries::ReconcilerState;

fn state_link(source: &str, state: State, n: i64) -> Markup {
    let state = state.as_str();
    html! {
        @if n == 0 { span.muted { "0" } }
        // The completed column counts the last day: its link shows that day.
        @else if state == "completed" { a href={"/deliveries?source=" (source) "&status=completed&since=1d"} { (number(n)) } }
        @else { a href={"/deliveries?source=" (source) "&status=" (state)} { (number(n)) } }
    }
}

fn stuck(label: &str, secs: Option<f64>) -> Markup {
    html! {
        div.stat {
            span.label { (label) }
            span.value { @match secs { Some(s) => (age(s)), None => span.muted { "none" } } }
        }
    }
}

/// A figure of a reconciler pass's counts, or a dash.
fn pass_count(counts: Option<&serde_json::Value>, field: &str) -> Markup {
    match counts.and_then(|c| c[field].as_i64()) {
        Some(n) => html! { (number(n)) },
        None => html! { span.muted { "–" } },
    }
}

/// The reconciler's state per source that names a GitHub hook.
fn reconciler(states: &[ReconcilerState]) -> Markup {
    html! {
        section.card {
            h2 { "Reconciler" }
            @if states.is_empty() {
                p.muted { "No source names a GitHub hook to reconcile, or no pass has run yet." }
            } @else {
                table {
                    thead { tr {
                        th { "Source" } th { "Hook" } th { "Last complete pass" } th { "Judged up to" }
                        th.num title="redeliveries asked in the last complete pass" { "Redelivered" }
                        th.num title="failed at GitHub, but taken here" { "Late" }
                        th.num title="successes at GitHub that hookinbox never saw" { "Unexplained" }
                        th { "Last error" }
                    } }
                    tbody {
                        @for r in states {
                            @let counts = r.last_counts.as_ref();
                            tr {
                                td { a href={"/deliveries?source=" (r.source)} { (r.source) } }
                                td { code { (r.hook) } }
                                td { (when(r.last_pass_at)) }
                                td { (when(r.watermark)) }
                                td.num { (pass_count(counts, "redelivered")) }
                                td.num { (pass_count(counts, "late")) }
                                td.num.dead[counts.and_then(|c| c["unexplained"].as_i64()).is_some_and(|n| n > 0)] {
                                    (pass_count(counts, "unexplained"))
                                }
                                td { @match &r.last_error { Some(e) => span.dead { (e) }, None => span.muted { "none" } } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The overview page.
pub(crate) fn overview(o: &Overview, states: &[ReconcilerState], session: &Session) -> Markup {
    let total =
        |f: fn(&hookinbox::deliveries::SourceCounts) -> i64| o.sources.iter().map(f).sum::<i64>();
    page(
        "Overview",
        Some(session),
        None,
        html! {
            section.stats {
                div.stat { span.label { "Accepted, last hour" } span.value { (number(o.accepted_last_hour)) } }
                div.stat { span.label { "Completed, last hour" } span.value { (number(o.completed_last_hour)) } }
                div.stat { span.label { "Failed, last hour" } span.value { (number(o.failed_last_hour)) } }
                (stuck("Oldest processing for", o.oldest_processing_secs))
                (stuck("Due retry waiting for", o.oldest_due_secs))
                (stuck("Oldest lost for", o.oldest_lost_secs))
            }
            section.card {
                h2 { "Deliveries by source and state" }
                table {
                    thead { tr { th { "Source" } th.num { "Processing" } th.num title="completed in the last 24 hours" { "Completed, 24 h" } th.num { "Retrying" } th.num title="held by its destination, deferred, ordered or fair: no attempt spent" { "Waiting" } th.num { "Dead" } th.num title="only a redelivery from GitHub can finish these" { "Awaiting redelivery" } } }
                    tbody {
                        @for s in &o.sources {
                            tr {
                                td { a href={"/deliveries?source=" (s.source)} { (s.source) } }
                                td.num { (state_link(&s.source, State::Processing, s.processing)) }
                                td.num { (state_link(&s.source, State::Completed, s.completed)) }
                                td.num { (state_link(&s.source, State::Retrying, s.retrying)) }
                                td.num { (state_link(&s.source, State::Waiting, s.waiting)) }
                                td.num.dead { (state_link(&s.source, State::Dead, s.dead)) }
                                td.num { (state_link(&s.source, State::AwaitingRedelivery, s.awaiting_redelivery)) }
                            }
                        }
                        @if o.sources.is_empty() { tr { td colspan="7" .muted { "No deliveries yet." } } }
                    }
                    @if o.sources.len() > 1 {
                        tfoot { tr {
                            th { "All" }
                            th.num { (number(total(|s| s.processing))) }
                            th.num { (number(total(|s| s.completed))) }
                            th.num { (number(total(|s| s.retrying))) }
                            th.num { (number(total(|s| s.waiting))) }
                            th.num { (number(total(|s| s.dead))) }
                            th.num { (number(total(|s| s.awaiting_redelivery))) }
                        } }
                    }
                }
            }
            section.card {
                h2 { "Dead letters by error class" }
                @if o.dead_by_class.is_empty() { p.muted { "No dead letters." } }
                @else {
                    table {
                        thead { tr { th { "Class" } th.num { "Dead letters" } th {} } }
                        tbody {
                            @for (class, n) in &o.dead_by_class {
                                tr {
                                    td { code { (class) } }
                                    td.num { a href={"/deliveries?status=dead&error_class=" (class)} { (number(*n)) } }
                                    td { a.button.small href={"/bulk?kind=replay&status=dead&error_class=" (class)} { "Replay…" } }
                                }
                            }
                        }
                    }
                }
            }
            (reconciler(states))
        },
    )
}
