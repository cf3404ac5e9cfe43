//! The list of deliveries: the filter form (a GET form, so the filter is
//! in the URL and a view can be linked), the count, one page, and the link
//! to the next.

use hookinbox::deliveries::{Cursor, ErrorClass, Page};
use maud::{Markup, html};

use super::{badge, delivery_href, number, page, when};
use crate::console::params::Checked;
use crate::console::session::Session;
use hookinbox::deliveries::State;

/// The filter's fields, as a form whose values are the current filter.
pub(crate) fn filter_form(
    checked: &Checked,
    action: &str,
    hidden: &[(&str, &str)],
    submit: &str,
) -> Markup {
    let v = |name: &str| checked.given.get(name).cloned().unwrap_or_default();
    html! {
        form.card.filter method="get" action=(action) {
            @for (name, value) in hidden { input type="hidden" name=(name) value=(value); }
            label { "State"
                select name="status" {
                    option value="" { "any" }
                    @for s in State::filter_words() { option value=(s) selected[v("status") == s] { (s) } }
                }
            }
            label { "Source" input name="source" value=(v("source")) placeholder="default"; }
            label { "Destination" input name="destination" value=(v("destination")) placeholder="ci"; }
            label { "Event" input name="event" value=(v("event")) placeholder="push"; }
            label { "Action" input name="action" value=(v("action")) placeholder="opened"; }
            label { "Repository" input name="repository" value=(v("repository")) placeholder="owner/name"; }
            label { "Error class"
                select name="error_class" {
                    option value="" { "any" }
                    @for c in ErrorClass::ALL { option value=(c.as_str()) selected[v("error_class") == c.as_str()] { (c.as_str()) } }
                }
            }
            label { "Since" input name="since" value=(v("since")) placeholder="2h or 2026-01-31T12:00:00Z"; }
            label { "Until" input name="until" value=(v("until")) placeholder="time or age"; }
            label.wide { "Delivery id or prefix" input name="delivery_id" value=(v("delivery_id")) placeholder="72d3162e"; }
            div.actions { button type="submit" { (submit) } a href=(action) { "Clear" } }
        }
    }
}

/// The list page.
pub(crate) fn deliveries(checked: &Checked, p: &Page, count: i64, session: &Session) -> Markup {
    let query = checked.query();
    let next = p.next.as_ref().map(|c: &Cursor| {
        let mut q = query.clone();
        if !q.is_empty() {
            q.push('&');
        }
        format!("/deliveries?{q}cursor={}", c.encode())
    });
    page(
        "Deliveries",
        Some(session),
        None,
        html! {
            (filter_form(checked, "/deliveries", &[], "Filter"))
            div.bar {
                p.count { strong { (number(count)) } " deliver" @if count == 1 { "y" } @else { "ies" } " match" }
                @if count > 0 {
                    a.button.small href={"/bulk?kind=replay&" (query)} { "Bulk replay…" }
                    a.button.small.danger href={"/bulk?kind=purge&" (query)} { "Bulk purge…" }
                }
            }
            table.list {
                thead { tr {
                    th { "Delivery" } th { "Source" } th { "Destination" } th { "Event" } th { "Repository" } th { "State" }
                    th.num { "Att." } th.num { "Rep." } th { "Error" } th { "Created" }
                } }
                tbody {
                    @for d in &p.items {
                        tr {
                            td.mono { a href=(delivery_href(d.key.source.as_str(), d.key.hook_id.as_str(), d.key.delivery_id.as_str())) { (d.key.delivery_id.as_str()) } }
                            td { (d.key.source.as_str()) }
                            td { (d.key.destination.as_str()) }
                            td { (d.event) @if let Some(a) = &d.action { span.muted { "." (a) } } }
                            td { (d.repository.as_deref().unwrap_or("")) }
                            td { (badge(State::of(d).as_str())) }
                            td.num { (d.attempts) }
                            td.num { (d.replays) }
                            // A settled delivery's old error is history, not its state.
                        td class=(if d.status == hookinbox::deliveries::Status::Failed { "error" } else { "muted" }) {
                                @if let Some(c) = d.last_error_class { code { (c.as_str()) } " " }
                                (d.last_error.as_deref().unwrap_or(""))
                            }
                            td { (when(Some(d.created_at))) }
                        }
                    }
                    @if p.items.is_empty() { tr { td colspan="10" .muted { "Nothing matches." } } }
                }
            }
            @if let Some(href) = next { p.pager { a.button href=(href) { "Next page →" } } }
        },
    )
}
