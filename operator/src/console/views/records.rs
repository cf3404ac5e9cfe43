//! The audit page.

use maud::{Markup, html};

use super::{number, page, when};
use crate::audit::Entry;
use crate::console::session::Session;

/// The audit log, newest first.
pub(crate) fn audit(entries: &[Entry], next: Option<i64>, session: &Session) -> Markup {
    page(
        "Audit",
        Some(session),
        None,
        html! {
            p.hint { "Every change made through the console: one row each. Also logged (\"admin audit\")." }
            table.list {
                thead { tr { th { "When" } th { "Who" } th { "Action" } th { "Applied to" } th.num { "Count" } th { "Result" } } }
                tbody {
                    @for e in entries { tr {
                        td { (when(Some(e.at))) }
                        td { (e.actor) span.muted { " · " (e.role) } }
                        td { (e.action) }
                        td.mono { (e.target.to_string()) }
                        td.num { (number(e.count)) }
                        td { @if let Some(j) = e.job_id { a href={"/jobs/" (j)} { "job " (j) } ": " } (e.result) }
                    } }
                    @if entries.is_empty() { tr { td colspan="6" .muted { "No change yet." } } }
                }
            }
            @if let Some(n) = next { p.pager { a.button href={"/audit?cursor=" (n)} { "Older →" } } }
        },
    )
}
