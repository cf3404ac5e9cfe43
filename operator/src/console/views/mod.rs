//! The console's pages, rendered on the server with `maud` (which escapes
//! every interpolated value). One small stylesheet, no script, and no
//! inline style (the content security policy allows neither): a running
//! job's page refreshes itself with a `<meta http-equiv="refresh">`.

use actix_web::http::StatusCode;
use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};

use super::session::Session;

mod bulk;
mod deliveries;
mod delivery;
mod destinations;
mod overview;
mod records;
mod sessions;

pub(crate) use bulk::{bulk, job, jobs};
pub(crate) use deliveries::deliveries;
pub(crate) use delivery::delivery;
pub(crate) use destinations::destinations;
pub(crate) use overview::overview;
pub(crate) use records::audit;
pub(crate) use sessions::sessions;

/// The stylesheet, served at `/static/admin.css`.
pub const STYLESHEET: &str = include_str!("admin.css");

/// The frame of every page: title, navigation, who is signed in.
pub(crate) fn page(
    title: &str,
    session: Option<&Session>,
    refresh: Option<u32>,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(secs) = refresh {
                    meta http-equiv="refresh" content=(secs);
                }
                title { (title) " · hookinbox admin" }
                link rel="stylesheet" href="/static/admin.css";
            }
            body {
                header {
                    a.brand href="/" { "hookinbox" }
                    @if let Some(s) = session {
                        nav {
                            a href="/" { "Overview" }
                            a href="/deliveries" { "Deliveries" }
                            a href="/deliveries?status=dead" { "Dead letters" }
                            a href="/destinations" { "Destinations" }
                            a href="/bulk?kind=replay&status=dead" { "Bulk" }
                            a href="/jobs" { "Jobs" }
                            a href="/audit" { "Audit" }
                            a href="/sessions" { "Sessions" }
                        }
                        div.who {
                            span { (s.identity.name) " · " (s.identity.role.as_str()) }
                            form method="post" action="/logout" {
                                input type="hidden" name="csrf" value=(s.csrf);
                                button.link type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

/// An error page.
pub(crate) fn error_page(status: StatusCode, message: &str) -> Markup {
    page(
        status.canonical_reason().unwrap_or("Error"),
        None,
        None,
        html! {
            p.error { (message) }
            p { a href="/" { "Back to the overview" } }
        },
    )
}

/// The sign-in page; `csrf` repeats the sign-in form's cookie.
pub(crate) fn login(error: Option<&str>, csrf: &str) -> Markup {
    page(
        "Sign in",
        None,
        None,
        html! {
            @if let Some(e) = error { p.error { (e) } }
            form.card.login method="post" action="/login" {
                input type="hidden" name="csrf" value=(csrf);
                label for="token" { "Token" }
                input #token type="password" name="token" autocomplete="current-password" required autofocus;
                button type="submit" { "Sign in" }
                p.hint { "A line of HOOKINBOX_ADMIN_TOKENS_FILE: NAME ROLE SECRET. Paste the secret." }
            }
        },
    )
}

/// A time, short, with the full time on hover.
pub(crate) fn when(t: Option<DateTime<Utc>>) -> Markup {
    match t {
        Some(t) => html! { time datetime=(t.to_rfc3339()) title=(t.to_rfc3339()) { (ago(t)) } },
        None => html! { span.muted { "—" } },
    }
}

/// A time to the second (UTC), with how long ago on hover: for a timeline,
/// where steps a second apart must read apart.
pub(crate) fn stamp(t: DateTime<Utc>) -> Markup {
    html! { time datetime=(t.to_rfc3339()) title=(ago(t)) { (t.format("%Y-%m-%d %H:%M:%S")) } }
}

/// How long ago (or, for a future time, in how long), in the largest unit.
pub(crate) fn ago(t: DateTime<Utc>) -> String {
    let secs = (Utc::now() - t).num_seconds();
    let (n, future) = (secs.unsigned_abs(), secs < 0);
    let text = age(n as f64);
    if future {
        format!("in {text}")
    } else {
        format!("{text} ago")
    }
}

/// A number of seconds in its largest unit.
pub(crate) fn age(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86_400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// A state, as a coloured badge.
pub(crate) fn badge(state: &str) -> Markup {
    html! { span class={"badge " (state)} { (state) } }
}

/// A number with thousands separators.
pub(crate) fn number(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// The link to one delivery's page.
pub(crate) fn delivery_href(source: &str, hook_id: &str, delivery_id: &str) -> String {
    let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    // Always with the hook id (empty when the delivery had none): GitHub
    // gives one id to an event delivered to several hooks.
    format!(
        "/deliveries/{}/{}?hook_id={}",
        enc(source),
        enc(delivery_id),
        enc(hook_id)
    )
}
