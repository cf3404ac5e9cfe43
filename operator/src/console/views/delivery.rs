//! One delivery: its key, its legs (one per destination) with each one's
//! attempt log, headers, timeline, payload (operators only) and the
//! actions that apply to it.

use hookinbox::deliveries::{ErrorClass, NO_BODY_TO_REPLAY, Status};
use maud::{Markup, html};

use super::{badge, page, stamp, when};
use crate::console::detail::{Detail, Leg};
use crate::console::session::Session;
use crate::console::tokens::Role;
use hookinbox::deliveries::State;

/// The delivery page.
pub(crate) fn delivery(d: &Detail, session: &Session) -> Markup {
    let row = &d.delivery;
    let key = &row.key;
    let base = format!(
        "/deliveries/{}/{}",
        form_urlencoded::byte_serialize(key.source.as_str().as_bytes()).collect::<String>(),
        form_urlencoded::byte_serialize(key.delivery_id.as_str().as_bytes()).collect::<String>()
    );
    let operator = session.identity.role == Role::Operator;
    // A delivery in flight changes by itself: look again shortly.
    let refresh = d
        .legs
        .iter()
        .any(|l| l.delivery.status == Status::Processing)
        .then_some(2);
    page(
        &format!("Delivery {}", key.delivery_id.as_str()),
        Some(session),
        refresh,
        html! {
            section.card {
                div.bar {
                    (badge(State::of(row).as_str()))
                    @if let (Status::Failed, Some(c)) = (row.status, row.last_error_class) { code { (c.as_str()) } }
                    span.muted { (row.attempts) " attempt(s), " (row.replays) " replay(s)" }
                }
                dl.key {
                    dt { "Delivery id" } dd.mono { (key.delivery_id.as_str()) }
                    dt { "Source" } dd { (key.source.as_str()) }
                    dt { "Hook id" } dd.mono { @if key.hook_id.as_str().is_empty() { span.muted { "none" } } @else { (key.hook_id.as_str()) } }
                    dt { "Event" } dd { (row.event) @if let Some(a) = &row.action { "." (a) } }
                    dt { "Repository" } dd { (row.repository.as_deref().unwrap_or("—")) }
                    @if let Some(tenant) = &row.github_tenant { dt { "GHE.com tenant" } dd.mono #tenant { (tenant) } }
                    dt { "Created" } dd { (when(Some(row.created_at))) }
                    @if let Some(e) = &row.last_error {
                    // A delivery that failed and then completed keeps its
                    // last error: shown as history, not as its state.
                    @if row.status == Status::Failed { dt { "Last error" } dd.error { (e) } }
                    @else { dt { "Earlier error" } dd.muted { (e) } }
                }
                }
                @if d.failed_without_body() {
                    // Nothing to publish: say why and what brings it back.
                    p.hint #no-body { (NO_BODY_TO_REPLAY) "." }
                }
                @if operator && d.legs.iter().any(|l| l.delivery.status == Status::Failed) {
                    div.actions {
                        @if d.replayable() {
                            form method="post" action={(base) "/replay"} {
                                input type="hidden" name="csrf" value=(session.csrf);
                                input type="hidden" name="hook_id" value=(key.hook_id.as_str());
                                button #replay type="submit" { "Replay" }
                            }
                        }
                        @if d.purgeable() {
                            form method="post" action={(base) "/purge"} {
                                input type="hidden" name="csrf" value=(session.csrf);
                                input type="hidden" name="hook_id" value=(key.hook_id.as_str());
                                button.danger #purge type="submit" { "Purge" }
                            }
                        }
                    }
                } @else if !operator {
                    p.hint { "Signed in as a viewer: no actions, no payload." }
                }
            }
            (legs(d, operator.then_some((&base, session))))
            @for leg in &d.legs { (attempt_log(leg)) }
            section.card {
                h2 { "Timeline" }
                ol.timeline {
                    @for s in &d.timeline {
                        li class=(s.what.replace(' ', "-")) {
                            span.when { (stamp(s.at)) }
                            @if d.legs.len() > 1 && !s.destination.is_empty() { code { (s.destination) } " " }
                            strong { (s.what) }
                            @if let Some(detail) = &s.detail { " " span { (detail) } }
                        }
                    }
                }
            }
            section.card {
                h2 { "Headers" }
                @if d.headers.is_empty() { p.muted { "Not kept: the headers are kept with the body while HOOKINBOX_RETENTION_BODIES keeps it (signature headers never)." } }
                @else {
                    table { tbody { @for (k, v) in &d.headers { tr { th.mono { (k) } td.mono { (v) } } } } }
                }
            }
            @if operator {
                section.card {
                    h2 { "Payload" }
                    @match &d.payload {
                        Some(p) => {
                            p.muted { @if p.origin == "event" { "As stored by the store handler (github_events): the body as received is past its retention." } @else { "The body as received, kept in Postgres: what a retry or a replay sends." } }
                            pre.payload { code { (p.pretty) } }
                        }
                        None => p.muted { "Not kept: the body is past HOOKINBOX_RETENTION_BODIES (or the delivery was claimed before bodies were kept)." },
                    }
                }
            }
            @if row.status == Status::Failed && row.last_error_class == Some(ErrorClass::Lost) {
                p.hint { "Reaped as lost: its claim's lease expired long ago and its message is presumed gone. The scheduler publishes it again from the body kept in Postgres; without one (a delivery claimed before bodies were kept), redeliver it from GitHub." }
            }
        },
    )
}

/// A leg's destination as shown (a leg claimed before destinations
/// existed has none).
fn destination(leg: &Leg) -> Markup {
    let name = leg.delivery.key.destination.as_str();
    html! { @if name.is_empty() { span.muted { "(its source's first)" } } @else { code { (name) } } }
}

/// Each leg: its destination, state, attempts and why it is where it is;
/// for an operator (`act`: the delivery's path and the session), a button
/// that replays that one leg, completed or failed, while its body is kept.
fn legs(d: &Detail, act: Option<(&str, &Session)>) -> Markup {
    html! {
        section.card #legs {
            h2 { "Legs" }
            p.hint { "One leg per destination of its source: each is attempted, retried and dead-lettered on its own." }
            @if act.is_some() { p.hint { "Replay sends a leg again, a completed one too, from the body kept in Postgres; a forward destination receives it with the same Idempotency-Key and X-Hookinbox-Replay." } }
            table {
                thead { tr {
                    th { "Destination" } th { "State" } th.num { "Attempts" } th.num { "Replays" }
                    th { "Next attempt" } th { "Error or reason" }
                    @if act.is_some() { th { } }
                } }
                tbody {
                    @for leg in &d.legs {
                        @let row = &leg.delivery;
                        tr {
                            td { (destination(leg)) }
                            td { (badge(State::of(row).as_str())) }
                            td.num {
                                (row.attempts)
                                @if let Some(max) = row.max_attempts { span.muted { " of " (max) } }
                            }
                            td.num { (row.replays) }
                            td { @if row.status == Status::Failed && row.retryable { (when(row.next_attempt_at)) } @else { span.muted { "—" } } }
                            td {
                                @if let Some(reason) = &row.filter_reason { span.muted { (reason) } }
                                @else if let Some(e) = &row.last_error {
                                    span class=(if row.status == Status::Failed { "error" } else { "muted" }) {
                                        @if let Some(c) = row.last_error_class { code { (c.as_str()) } " " }
                                        (e)
                                    }
                                }
                            }
                            @if let Some((base, session)) = act {
                                td {
                                    @if leg.body_kept && matches!(row.status, Status::Completed | Status::Failed) {
                                        form method="post" action={(base) "/replay"} {
                                            input type="hidden" name="csrf" value=(session.csrf);
                                            input type="hidden" name="hook_id" value=(row.key.hook_id.as_str());
                                            input type="hidden" name="destination" value=(row.key.destination.as_str());
                                            button.replay-leg type="submit" data-destination=(row.key.destination.as_str()) { "Replay" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A leg's attempt log, newest first: time, status code or error,
/// duration, and the first 4 KiB of the answer (escaped, with every secret
/// header value masked).
fn attempt_log(leg: &Leg) -> Markup {
    html! {
        @if !leg.attempts.is_empty() {
            section.card.attempts {
                h2 { "Attempts to " (destination(leg)) }
                table {
                    thead { tr {
                        th { "Time" } th.num { "#" } th { "Result" } th { "Status or error" }
                        th.num { "Duration" } th { "Answer (first 4 KiB)" }
                    } }
                    tbody {
                        @for a in &leg.attempts {
                            tr {
                                td { (stamp(a.at)) }
                                td.num { (a.attempt) @if a.probe { span.muted { " probe" } } }
                                td { (badge(&a.result)) }
                                td {
                                    @if let Some(code) = a.status_code { code { (code) } " " }
                                    @if let Some(e) = &a.error { span.error { (e) } }
                                }
                                td.num { (format!("{:.0} ms", a.duration_ms)) }
                                td { @match &a.excerpt {
                                    Some(text) if !text.is_empty() => pre.excerpt { code { (text) } },
                                    _ => span.muted { "—" },
                                } }
                            }
                        }
                    }
                }
            }
        }
    }
}
