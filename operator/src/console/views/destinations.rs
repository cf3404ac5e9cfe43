//! The destinations page: each destination's state, the legs waiting for
//! it and its last error, with (for an operator) its pause or resume
//! button; each ordered destination's halted keys, with (for an operator)
//! their skip and retry buttons; then each one's settings, never a secret
//! or a header's value.

use hookinbox::deliveries::HaltedKey;
use maud::{Markup, html};

use super::{age, badge, delivery_href, number, page, when};
use crate::console::destinations::DestinationView;
use crate::console::session::Session;
use crate::console::tokens::Role;
use crate::destinations::{RetrySetting, Settings, Target};

fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The pause or resume button of `d`: paused and disabled destinations
/// resume; the others pause, and an open one may also be resumed (closed
/// by hand, its waiting legs released).
fn actions(d: &DestinationView, session: &Session) -> Markup {
    let base = format!("/destinations/{}/{}", enc(&d.source), enc(&d.name));
    let resume = d.state != "closed";
    let pause = d.state != "paused";
    html! {
        div.actions {
            @if pause {
                form method="post" action={(base) "/pause"} {
                    input type="hidden" name="csrf" value=(session.csrf);
                    button.small.danger type="submit" title="hold its legs until resumed" { "Pause" }
                }
            }
            @if resume {
                form method="post" action={(base) "/resume"} {
                    input type="hidden" name="csrf" value=(session.csrf);
                    button.small type="submit" title="back to closed: its waiting legs go again" { "Resume" }
                }
            }
        }
    }
}

/// The skip and retry buttons of a halted key of `target`.
fn key_actions(target: &Target, k: &HaltedKey, session: &Session) -> Markup {
    let base = format!(
        "/destinations/{}/{}/halted/{}",
        enc(target.source.as_str()),
        enc(target.name.as_str()),
        enc(&k.key)
    );
    html! {
        div.actions {
            form method="post" action={(base) "/skip"} {
                input type="hidden" name="csrf" value=(session.csrf);
                button.small.danger type="submit" title="the halting leg stays dead; the key's next leg goes" { "Skip" }
            }
            form method="post" action={(base) "/retry"} {
                input type="hidden" name="csrf" value=(session.csrf);
                button.small type="submit" title="the halting leg goes again, in its place" { "Retry" }
            }
        }
    }
}

/// The halted keys of each ordered destination.
fn halted_keys(halted: &[(Target, Vec<HaltedKey>)], session: &Session) -> Markup {
    let operator = session.identity.role == Role::Operator;
    html! {
        @for (target, keys) in halted {
            section.card id={"halted-" (target.source) "-" (target.name)} {
                h2 { "Halted keys of " (target) }
                @if keys.is_empty() {
                    p.muted { "No key is halted." }
                } @else {
                    table.list {
                        thead { tr {
                            th { "Key" } th { "Halted by" } th { "Event" } th { "Error" }
                            th.num title="the key's legs waiting behind it" { "Waiting" } th {}
                        } }
                        tbody {
                            @for k in keys {
                                @let leg = &k.halted_by;
                                tr {
                                    td.mono { (k.key) }
                                    td.mono {
                                        a href=(delivery_href(leg.source.as_str(), leg.hook_id.as_str(), leg.delivery_id.as_str())) { (leg.delivery_id.as_str()) }
                                        " " (when(k.failed_at))
                                    }
                                    td { (k.event) @if let Some(a) = &k.action { span.muted { "." (a) } } }
                                    td.error {
                                        @if let Some(c) = &k.error_class { code { (c) } " " }
                                        (k.error.as_deref().unwrap_or(""))
                                    }
                                    td.num { (number(k.waiting)) }
                                    td { @if operator { (key_actions(target, k, session)) } }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn list_or_all(items: &[String]) -> Markup {
    html! {
        @if items.is_empty() { span.muted { "all" } }
        @else { @for (i, item) in items.iter().enumerate() { @if i > 0 { ", " } code { (item) } } }
    }
}

fn secs(s: u64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(s)).to_string()
}

fn ms(m: u64) -> String {
    humantime::format_duration(std::time::Duration::from_millis(m)).to_string()
}

/// One destination's settings.
fn settings(s: &Settings) -> Markup {
    html! {
        dl.key {
            dt { "Kind" } dd { code { (s.kind) } }
            @if let Some(url) = &s.url { dt { "URL" } dd.mono { (url) } }
            dt { "Events" } dd { (list_or_all(&s.events)) }
            dt { "Repositories" } dd { (list_or_all(&s.repositories)) }
            @if let Some(t) = s.timeout_ms { dt { "Timeout" } dd { (ms(t)) } }
            dt { "Concurrency" } dd { (s.concurrency) " per worker" }
            dt { "Rate limit" } dd {
                @match s.rate_limit {
                    Some(r) => { (r.per_second) " per second, burst " (r.burst) }
                    None => span.muted { "none" },
                }
            }
            dt { "Retries" } dd {
                @match &s.retry {
                    RetrySetting::Schedule { delays, max_attempts } => {
                        (delays.join(", ")) span.muted { " (" (max_attempts) " attempts)" }
                    }
                    RetrySetting::Exponential { base_ms, max_ms, max_attempts } => {
                        "exponential, " (ms(*base_ms)) " to " (ms(*max_ms)) span.muted { " (" (max_attempts) " attempts)" }
                    }
                }
            }
            dt { "Breaker" } dd {
                @match s.breaker {
                    Some(b) => {
                        "opens at " (format!("{}", (b.failure_ratio * 100.0).round())) "% failed of at least "
                        (b.min_requests) " in " (secs(b.window_secs)) "; probes every " (secs(b.probe_secs))
                        "; disabled after " (secs(s.disable_after_secs)) " open"
                    }
                    None => span.muted { "off" },
                }
            }
            @if let (Some(signature), Some(secret)) = (s.signature, s.secret) {
                dt { "Signature" } dd { code { (signature) } " · secret " strong { (secret) } }
            }
            @if !s.headers.is_empty() {
                dt { "Headers" } dd {
                    @for (i, h) in s.headers.iter().enumerate() {
                        @if i > 0 { ", " }
                        code { (h.name) } " "
                        span.muted { @if h.secret { "(set, from a file)" } @else { "(set)" } }
                    }
                }
            }
        }
    }
}

/// The destinations page.
pub(crate) fn destinations(
    all: &[DestinationView],
    halted: &[(Target, Vec<HaltedKey>)],
    session: &Session,
) -> Markup {
    let operator = session.identity.role == Role::Operator;
    page(
        "Destinations",
        Some(session),
        None,
        html! {
            p.hint {
                "A destination is closed (its legs are attempted), open (failing: its legs wait and a probe goes now and then), half_open (a probe is out), paused by an operator, or disabled (it answered 410, or stayed open past its disable_after). "
                "Pause holds its legs; resume closes it from any state and its waiting legs go again. Both are audited."
            }
            table.list #destinations {
                thead { tr {
                    th { "Destination" } th { "Kind" } th { "State" } th { "Since" } th { "Changed by" }
                    th.num title="legs in its queue untaken, retrying or held" { "Waiting" }
                    th { "Oldest waiting" } th { "Last error" } th {}
                } }
                tbody {
                    @for d in all {
                        tr id={"destination-" (d.source) "-" (d.name)} {
                            td { strong { (d.source) "/" (d.name) } }
                            td { code { (d.kind) } }
                            td { (badge(d.state)) }
                            td { (when(d.state_since)) }
                            td { (d.changed_by.as_deref().unwrap_or("—")) }
                            td.num {
                                @if d.waiting == 0 { span.muted { "0" } }
                                @else { a href={"/deliveries?source=" (enc(&d.source)) "&destination=" (enc(&d.name))} { (number(d.waiting)) } }
                            }
                            td { @match d.oldest_waiting_secs { Some(s) => (age(s)), None => span.muted { "—" } } }
                            td.error {
                                @if let Some(e) = &d.last_error { (e) " " (when(d.last_error_at)) }
                            }
                            td { @if operator { (actions(d, session)) } }
                        }
                    }
                    @if all.is_empty() { tr { td colspan="9" .muted { "No destination is configured or registered." } } }
                }
            }
            @if !halted.is_empty() {
                p.hint {
                    "An ordered destination takes each key's legs one at a time, in order; a leg that fails for good halts its key. "
                    "Skip leaves that leg dead and the key resumes; retry sends it again in its place. Both are audited."
                }
                (halted_keys(halted, session))
            }
            @for d in all {
                section.card {
                    h2 { (d.source) "/" (d.name) }
                    @match &d.settings {
                        Some(s) => (settings(s)),
                        None => p.muted { "Registered by a worker, but not in this console's configuration (HOOKINBOX_CONFIG): its settings are not known here." },
                    }
                    @if !d.registered { p.hint { "No worker has registered it yet: it starts closed." } }
                }
            }
        },
    )
}
