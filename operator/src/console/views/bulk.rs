//! Bulk replay and purge: the filter with its count, the dry run's
//! sample, the confirmation; a job's progress with its cancel button; the
//! list of jobs.

use hookinbox::deliveries::Delivery;
use maud::{Markup, html};

use super::deliveries::filter_form;
use super::{badge, delivery_href, number, page, when};
use crate::console::jobs::{Item, Job, Kind};
use crate::console::params::Checked;
use crate::console::session::Session;
use crate::console::tokens::Role;
use hookinbox::deliveries::State;

/// The bulk page: count first; with `sample`, the dry run and the confirm
/// button.
pub(crate) fn bulk(
    kind: Kind,
    checked: &Checked,
    count: i64,
    sample: Option<&[Delivery]>,
    per_second: f64,
    refused: Option<&str>,
    session: &Session,
) -> Markup {
    let verb = kind.as_str();
    let done = match kind {
        Kind::Replay | Kind::ReplayAny => "replayed",
        Kind::Purge => "purged",
    };
    let title = match kind {
        Kind::Replay => "Bulk replay",
        Kind::ReplayAny => "Bulk replay (completed too)",
        Kind::Purge => "Bulk purge",
    };
    let rate = per_second.to_string();
    page(
        title,
        Some(session),
        None,
        html! {
            nav.kinds #bulk-kinds {
                @for (k, label) in [(Kind::Replay, "Replay failed"), (Kind::ReplayAny, "Replay, completed too"), (Kind::Purge, "Purge dead letters")] {
                    @if k == kind { strong { (label) } } @else { a href={"/bulk?kind=" (k.as_str())} { (label) } }
                    " "
                }
            }
            p.hint {
                @match kind {
                    Kind::Replay => "Replays the failed deliveries the filter matches (dead letters and pending retries), from their bodies kept in Postgres, at a set rate.",
                    Kind::ReplayAny => "Replays every delivery the filter matches that is not in flight, completed ones too, from their bodies kept in Postgres, at a set rate. A forward destination receives each again with the same Idempotency-Key and X-Hookinbox-Replay.",
                    Kind::Purge => "Deletes the dead letters the filter matches, at a set rate.",
                }
                " Confirming freezes the selection: the job acts on exactly these deliveries."
            }
            (filter_form(checked, "/bulk", &[("kind", verb), ("per_second", &rate)], "Count"))
            @if let Some(r) = refused { p.error { (r) } }
            section.card.confirm {
                p.count #bulk-count { strong { (number(count)) } " deliver" @if count == 1 { "y" } @else { "ies" } " would be " (done) }
                @if count > 0 && sample.is_none() {
                    form method="get" action="/bulk" {
                        @for (k, v) in &checked.given { input type="hidden" name=(k) value=(v); }
                        input type="hidden" name="kind" value=(verb);
                        input type="hidden" name="dry_run" value="1";
                        label { "Per second " input #rate type="number" name="per_second" value=(rate) min="0.1" max="1000" step="any"; }
                        button #dry-run type="submit" { "Dry run" }
                    }
                }
                @if let Some(sample) = sample {
                    h2 { "Dry run: the first " (sample.len()) " of " (number(count)) }
                    table.list {
                        thead { tr { th { "Delivery" } th { "Source" } th { "Event" } th { "State" } th { "Error" } th { "Created" } } }
                        tbody { @for d in sample { tr {
                            td.mono { a href=(delivery_href(d.key.source.as_str(), d.key.hook_id.as_str(), d.key.delivery_id.as_str())) { (d.key.delivery_id.as_str()) } }
                            td { (d.key.source.as_str()) }
                            td { (d.event) @if let Some(a) = &d.action { span.muted { "." (a) } } }
                            td { (badge(State::of(d).as_str())) }
                            td.error { @if let Some(c) = d.last_error_class { code { (c.as_str()) } " " } (d.last_error.as_deref().unwrap_or("")) }
                            td { (when(Some(d.created_at))) }
                        } } }
                    }
                    @if session.identity.role == Role::Operator {
                        form method="post" action="/bulk" {
                            input type="hidden" name="csrf" value=(session.csrf);
                            input type="hidden" name="kind" value=(verb);
                            input type="hidden" name="per_second" value=(rate);
                            @for (k, v) in &checked.given { input type="hidden" name=(k) value=(v); }
                            button #confirm type="submit" class=@if kind == Kind::Purge { "danger" } {
                                "Confirm: " (verb) " " (number(count)) " at " (rate) "/s"
                            }
                        }
                    } @else {
                        p.hint { "Signed in as a viewer: a viewer cannot start a job." }
                    }
                }
            }
        },
    )
}

/// A job's page: progress, cancel, items.
pub(crate) fn job(j: &Job, items: &[Item], session: &Session) -> Markup {
    let running = j.status == "running";
    page(
        &format!("Job {}: {}", j.id, j.kind.as_str()),
        Some(session),
        running.then_some(1),
        html! {
            section.card {
                div.bar {
                    span class={"badge job " (j.status)} #job-status { (j.status) }
                    span { "by " strong { (j.actor) } ", " (j.per_second) "/s, started " (when(Some(j.created_at))) }
                    @if let Some(by) = &j.cancelled_by { span.muted { "cancelled by " (by) } }
                }
                // A <progress> element, not a styled div: the policy
                // (`default-src 'self'`) refuses inline style attributes.
                progress.progress #job-bar value=(j.done) max=(j.total.max(1)) { (j.done) " / " (j.total) }
                p #job-progress {
                    strong { (number(j.done)) " / " (number(i64::from(j.total))) } " done: "
                    (number(j.replayed)) " replayed, " (number(j.purged)) " purged, "
                    (number(j.skipped)) " skipped, " (number(j.failed)) " failed"
                }
                @if let Some(f) = &j.filter { p.muted { "Filter: " code { (f.to_string()) } } }
                @if running && session.identity.role == Role::Operator {
                    form method="post" action={"/jobs/" (j.id) "/cancel"} {
                        input type="hidden" name="csrf" value=(session.csrf);
                        button.danger #cancel type="submit" { "Cancel" }
                    }
                }
            }
            section.card {
                h2 { "Items" @if items.len() as i32 == 100 && j.total > 100 { " (the first 100)" } }
                table.list {
                    thead { tr { th.num { "#" } th { @if j.kind.replays() { "Replay of" } @else { "Delivery" } } th { "Result" } th { "Done" } } }
                    tbody { @for i in items {
                        @let [_, source, hook, id, _] = &i.key;
                        tr {
                            td.num { (i.position) }
                            td.mono { a href=(delivery_href(source, hook, id)) { (id) } }
                            td { @match &i.result { Some(r) => (badge(r)), None => span.muted { "pending" } }
                                 @if let Some(e) = &i.error { " " span.error { (e) } } }
                            td { (when(i.done_at)) }
                        }
                    } }
                }
            }
        },
    )
}

/// The list of jobs.
pub(crate) fn jobs(list: &[Job], session: &Session) -> Markup {
    page(
        "Jobs",
        Some(session),
        None,
        html! {
            table.list {
                thead { tr { th.num { "Job" } th { "Kind" } th { "Status" } th { "By" } th.num { "Done" } th { "Started" } } }
                tbody {
                    @for j in list { tr {
                        td.num { a href={"/jobs/" (j.id)} { (j.id) } }
                        td { (j.kind.as_str()) }
                        td { span class={"badge job " (j.status)} { (j.status) } }
                        td { (j.actor) }
                        td.num { (number(j.done)) " / " (number(i64::from(j.total))) }
                        td { (when(Some(j.created_at))) }
                    } }
                    @if list.is_empty() { tr { td colspan="6" .muted { "No job yet." } } }
                }
            }
        },
    )
}
