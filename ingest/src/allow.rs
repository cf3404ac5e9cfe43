//! The optional allow-list (`HOOKINBOX_GITHUB_META_FILE`): only GitHub's
//! webhook addresses, the `hooks` ranges of its `/meta` answer, are
//! admitted; any other client is refused `403` before its body is read or
//! anything else about the request is looked at. Behind a proxy the
//! client is the one a trusted proxy names (`HOOKINBOX_TRUSTED_PROXIES`,
//! see [`hookinbox::client::client_of`]); with no proxy trusted it is the
//! peer, so a proxy in front without that setting would be refused (it is
//! not GitHub).
//!
//! It narrows who can spend ingest's receiving slots and signature checks;
//! the signature still decides what is accepted.

use actix_web::HttpRequest;
use actix_web::http::StatusCode;
use hookinbox::client::{self, HookRanges, TrustedProxies};

use crate::answer::{Outcome, Reject};

/// `Err(403)` when a list is set and the client is not in it.
pub(crate) fn check(
    req: &HttpRequest,
    hooks: Option<&HookRanges>,
    trusted: &TrustedProxies,
) -> Result<(), Reject> {
    let Some(hooks) = hooks else {
        return Ok(());
    };
    if hooks.contains(client::client(req, trusted)) {
        Ok(())
    } else {
        Err(Reject::new(
            StatusCode::FORBIDDEN,
            Outcome::NotGithub,
            "this address is not one GitHub sends webhooks from",
        ))
    }
}
