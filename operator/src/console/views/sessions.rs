//! The sessions page: who is signed in, from where, until when, and (for
//! an operator) a button to end each session.

use maud::{Markup, html};

use super::{page, when};
use crate::console::session::{Listed, Session};
use crate::console::tokens::Role;

/// The live sessions, newest first.
pub(crate) fn sessions(list: &[Listed], session: &Session) -> Markup {
    let operator = session.identity.role == Role::Operator;
    page(
        "Sessions",
        Some(session),
        None,
        html! {
            p.hint { "Page sessions signed in and not yet ended. A session ends when its owner signs out, when it is revoked here, after 12 hours, and when its token is removed from or changed in the tokens file. Revoking is audited." }
            table.list #sessions {
                thead { tr { th.num { "#" } th { "Token" } th { "Client" } th { "Signed in" } th { "Ends" } th {} } }
                tbody {
                    @for s in list { tr {
                        td.num { (s.id) }
                        td { (s.token_name) @if s.id == session.id { span.muted { " (this session)" } } }
                        td.mono { (s.client) }
                        td { (when(Some(s.created_at))) }
                        td { (when(Some(s.expires_at))) }
                        td { @if operator {
                            form method="post" action={"/sessions/" (s.id) "/revoke"} {
                                input type="hidden" name="csrf" value=(session.csrf);
                                button.small.danger type="submit" { "Revoke" }
                            }
                        } }
                    } }
                    @if list.is_empty() { tr { td colspan="6" .muted { "No session (the console runs without tokens, or nobody is signed in)." } } }
                }
            }
        },
    )
}
