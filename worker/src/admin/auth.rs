//! Who is calling: an API call by its bearer token, a page by its session
//! cookie. Failed sign-ins are counted (metric and log line, never the
//! token) and limited per address ([`super::lockout`]), checked before any
//! token is compared.

use std::net::IpAddr;

use actix_web::HttpRequest;
use actix_web::http::header;

use super::config::Access;
use super::error::AdminError;
use super::session::{self, COOKIE, Session};
use super::state::State;
use super::tokens::{Identity, Role};

/// The operator every caller is under `--insecure-loopback`.
fn loopback() -> Identity {
    Identity {
        name: "loopback".to_owned(),
        role: Role::Operator,
    }
}

/// The client's address (the peer: a forwarded-for header could be forged
/// to dodge the lockout).
pub(crate) fn peer(req: &HttpRequest) -> IpAddr {
    req.peer_addr()
        .map(|a| a.ip())
        .unwrap_or(IpAddr::from([0, 0, 0, 0]))
}

fn count_failure(via: &'static str, outcome: &'static str) {
    metrics::counter!(
        hookinbox::metrics::ADMIN_SIGN_IN_FAILURES,
        "via" => via,
        "outcome" => outcome
    )
    .increment(1);
}

/// Refuses a locked-out address before any token is compared.
fn refuse_locked(state: &State, ip: IpAddr, via: &'static str) -> Result<(), AdminError> {
    if let Some(left) = state.lockout.locked(ip) {
        count_failure(via, "locked_out");
        return Err(AdminError::LockedOut(left.as_secs() + 1));
    }
    Ok(())
}

/// Records a failed sign-in.
fn failed(state: &State, ip: IpAddr, via: &'static str) {
    count_failure(via, "bad_token");
    let locked = state.lockout.fail(ip);
    tracing::warn!(client = %ip, via, locked_out = locked, "admin sign-in failed");
}

/// The caller of an API request, from `Authorization: Bearer`.
pub(crate) fn api_identity(req: &HttpRequest, state: &State) -> Result<Identity, AdminError> {
    let tokens = match &state.access {
        Access::InsecureLoopback => return Ok(loopback()),
        Access::Tokens(tokens) => tokens,
    };
    let ip = peer(req);
    refuse_locked(state, ip, "api")?;
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(presented) = presented else {
        return Err(AdminError::Unauthorized);
    };
    tokens.verify(presented.trim()).ok_or_else(|| {
        failed(state, ip, "api");
        AdminError::Unauthorized
    })
}

/// The session of a page request, from its cookie.
pub(crate) fn page_session(req: &HttpRequest, state: &State) -> Result<Session, AdminError> {
    match &state.access {
        Access::InsecureLoopback => Ok(Session {
            identity: loopback(),
            csrf: session::loopback_csrf(&state.process_key),
        }),
        Access::Tokens(tokens) => req
            .cookie(COOKIE)
            .and_then(|c| session::check(tokens, c.value()))
            .ok_or(AdminError::Unauthorized),
    }
}

/// Signs in with a token from the sign-in form: the new session cookie's
/// value, or why not.
pub(crate) fn sign_in(req: &HttpRequest, state: &State, token: &str) -> Result<String, AdminError> {
    let tokens = match &state.access {
        Access::InsecureLoopback => return Err(AdminError::Forbidden("no sign-in without tokens")),
        Access::Tokens(tokens) => tokens,
    };
    let ip = peer(req);
    refuse_locked(state, ip, "page")?;
    let identity = tokens.verify(token.trim()).ok_or_else(|| {
        failed(state, ip, "page");
        AdminError::Unauthorized
    })?;
    tracing::info!(actor = %identity.name, role = identity.role.as_str(), "admin sign-in");
    session::issue(tokens, &identity.name).ok_or(AdminError::Unauthorized)
}

/// Refuses a viewer's change.
pub(crate) fn require_operator(identity: &Identity) -> Result<(), AdminError> {
    match identity.role {
        Role::Operator => Ok(()),
        Role::Viewer => Err(AdminError::Forbidden("a viewer cannot change anything")),
    }
}

/// Refuses a form without the session's CSRF token.
pub(crate) fn require_csrf(session: &Session, given: Option<&str>) -> Result<(), AdminError> {
    match given {
        Some(given) if session::csrf_matches(&session.csrf, given) => Ok(()),
        _ => Err(AdminError::Forbidden(
            "the form's CSRF token is missing or wrong; reload the page and try again",
        )),
    }
}
