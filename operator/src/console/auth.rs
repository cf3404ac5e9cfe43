//! Who is calling: an API call by its bearer token, a page by its session
//! (`session`). A presented token is always verified first, so a valid
//! one always passes; a bad one is counted (metric and log line, never the
//! token) and throttled per client ([`super::throttle`], the client as
//! [`hookinbox::client`] finds it).

use std::net::IpAddr;

use actix_web::HttpRequest;
use actix_web::http::header;

use super::config::Access;
use super::error::AdminError;
use super::session::{self, COOKIE, Session};
use super::state::State;
use super::tokens::{Identity, Role};
use hookinbox::client;

/// The operator every caller is under `--insecure-loopback`.
fn loopback() -> Identity {
    Identity {
        name: "loopback".to_owned(),
        role: Role::Operator,
    }
}

/// The client of a request: the peer, or the forwarded address behind a
/// trusted proxy.
pub(crate) fn client_of(req: &HttpRequest, state: &State) -> IpAddr {
    client::client(req, &state.trusted_proxies)
}

/// Counts a bad token from `req`'s client, and answers it: 401, or 429
/// with the client's wait once it is throttled.
fn failed(req: &HttpRequest, state: &State, via: &'static str) -> AdminError {
    let client = client_of(req, state);
    let key = client::bucket(client);
    let throttled = state.throttle.wait(key).is_some();
    let wait = state.throttle.fail(key);
    let outcome = if throttled { "throttled" } else { "bad_token" };
    metrics::counter!(
        hookinbox::metrics::ADMIN_SIGN_IN_FAILURES,
        "via" => via,
        "outcome" => outcome
    )
    .increment(1);
    tracing::warn!(
        client = %client,
        via,
        outcome,
        wait_secs = wait.as_secs(),
        "admin sign-in failed"
    );
    if throttled {
        AdminError::Throttled(wait.as_secs().max(1))
    } else {
        AdminError::Unauthorized
    }
}

/// The caller of an API request, from `Authorization: Bearer`.
pub(crate) fn api_identity(req: &HttpRequest, state: &State) -> Result<Identity, AdminError> {
    let tokens = match &state.access {
        Access::InsecureLoopback => return Ok(loopback()),
        Access::Tokens(tokens) => tokens,
    };
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(presented) = presented else {
        return Err(AdminError::Unauthorized);
    };
    tokens
        .verify(presented.trim())
        .ok_or_else(|| failed(req, state, "api"))
}

/// The session of a page request, from its cookie.
pub(crate) async fn page_session(req: &HttpRequest, state: &State) -> Result<Session, AdminError> {
    let tokens = match &state.access {
        Access::InsecureLoopback => {
            return Ok(Session {
                id: 0,
                identity: loopback(),
                csrf: session::loopback_csrf(&state.process_key),
            });
        }
        Access::Tokens(tokens) => tokens,
    };
    let Some(cookie) = req.cookie(COOKIE) else {
        return Err(AdminError::Unauthorized);
    };
    let client = state.pool.get().await?;
    session::check(&client, tokens, cookie.value())
        .await?
        .ok_or(AdminError::Unauthorized)
}

/// Signs in with a token from the sign-in form: the new session cookie's
/// value, or why not.
pub(crate) async fn sign_in(
    req: &HttpRequest,
    state: &State,
    token: &str,
) -> Result<String, AdminError> {
    let tokens = match &state.access {
        Access::InsecureLoopback => return Err(AdminError::Forbidden("no sign-in without tokens")),
        Access::Tokens(tokens) => tokens,
    };
    let identity = tokens
        .verify(token.trim())
        .ok_or_else(|| failed(req, state, "page"))?;
    tracing::info!(actor = %identity.name, role = identity.role.as_str(), "admin sign-in");
    let client = state.pool.get().await?;
    session::issue(&client, tokens, &identity, client_of(req, state)).await
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
