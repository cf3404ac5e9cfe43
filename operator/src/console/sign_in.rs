//! Signing in and out, and the sessions page: the sign-in form with its
//! own CSRF cookie, the session cookie (`Secure` by configuration), sign-out
//! that ends the session on the server, and an operator's revocation.

use actix_web::cookie::{Cookie, SameSite};
use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};

use super::auth::{page_session, require_operator, sign_in};
use super::config::Access;
use super::error::AdminError;
use super::pages::{Page, changing_form, form, html, see_other, split};
use super::session::{self, COOKIE, LIFETIME};
use super::state::State;
use super::{params, views};
use hookinbox::client;

/// The sign-in form's own cookie: a random value the form repeats in a
/// hidden field (the double-submit pattern), so that a sign-in can only
/// be posted by a page this console served. `SameSite=Strict` keeps
/// another site's form from sending it; it lives as long as a form is
/// likely to stay open.
const LOGIN_COOKIE: &str = "hookinbox_login";

/// Whether a cookie must be `Secure`: by configuration (an https public
/// URL), or a trusted proxy's word that the browser used https; never a
/// header anyone else sends.
fn secure(req: &HttpRequest, state: &State) -> bool {
    state.secure_cookies || client::forwarded_https(req, &state.trusted_proxies)
}

fn cookie<'c>(
    name: &'c str,
    value: String,
    path: &'c str,
    max_age: std::time::Duration,
    secure: bool,
) -> Cookie<'c> {
    Cookie::build(name, value)
        .path(path)
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(secure)
        .max_age(actix_web::cookie::time::Duration::seconds(
            max_age.as_secs() as i64,
        ))
        .finish()
}

fn removal(name: &str, path: &str) -> Cookie<'static> {
    let mut gone = Cookie::build(name.to_owned(), "")
        .path(path.to_owned())
        .finish();
    gone.make_removal();
    gone
}

/// The sign-in page with a new form cookie, answered with `status`.
fn login_page(
    req: &HttpRequest,
    state: &State,
    status: StatusCode,
    error: Option<&str>,
) -> HttpResponse {
    let value = hex::encode(rand::random::<[u8; 32]>());
    let mut answer = HttpResponse::build(status);
    answer
        .content_type("text/html; charset=utf-8")
        .cookie(cookie(
            LOGIN_COOKIE,
            value.clone(),
            "/login",
            std::time::Duration::from_secs(3600),
            secure(req, state),
        ));
    answer.body(views::login(error, &value).into_string())
}

/// `GET /login` (without tokens, `--insecure-loopback`, nobody signs in).
pub(crate) async fn login_form(req: HttpRequest, state: web::Data<State>) -> HttpResponse {
    match state.access {
        Access::InsecureLoopback => see_other("/"),
        Access::Tokens(_) => login_page(&req, &state, StatusCode::OK, None),
    }
}

/// `POST /login`: a token for a session cookie (HttpOnly, SameSite=Strict),
/// from a form this console served (its CSRF token).
pub(crate) async fn login(
    req: HttpRequest,
    state: web::Data<State>,
    payload: web::Payload,
) -> Page {
    if let Access::InsecureLoopback = state.access {
        return Ok(see_other("/"));
    }
    let body = form(&req, &state, payload).await?;
    let (_, fields) = split(&body, &["token", "csrf"]);
    let form_cookie = req.cookie(LOGIN_COOKIE);
    let from_our_form = match (&form_cookie, fields.get("csrf")) {
        (Some(c), Some(given)) => !c.value().is_empty() && session::csrf_matches(c.value(), given),
        _ => false,
    };
    if !from_our_form {
        return Ok(login_page(
            &req,
            &state,
            StatusCode::FORBIDDEN,
            Some(
                "This sign-in did not come from the console's own form (or the form had expired); try again.",
            ),
        ));
    }
    let token = fields.get("token").map(String::as_str).unwrap_or("");
    match sign_in(&req, &state, token).await {
        Ok(value) => Ok(HttpResponse::SeeOther()
            .insert_header((header::LOCATION, "/"))
            .cookie(cookie(COOKIE, value, "/", LIFETIME, secure(&req, &state)))
            .cookie(removal(LOGIN_COOKIE, "/login"))
            .finish()),
        Err(AdminError::Throttled(secs)) => {
            let mut answer = login_page(
                &req,
                &state,
                StatusCode::TOO_MANY_REQUESTS,
                Some(&format!(
                    "Too many failed sign-ins from this client; try again in {secs} s."
                )),
            );
            answer
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
            Ok(answer)
        }
        Err(AdminError::Unauthorized) => Ok(login_page(
            &req,
            &state,
            StatusCode::UNAUTHORIZED,
            Some("That token is not valid."),
        )),
        Err(e) => Err(e.into()),
    }
}

/// `POST /logout`: ends the session on the server, then drops its cookie.
pub(crate) async fn logout(
    req: HttpRequest,
    state: web::Data<State>,
    payload: web::Payload,
) -> Page {
    let (session, _, _) = changing_form(&req, &state, payload, &[]).await?;
    if session.id != 0 {
        let client = state.pool.get().await?;
        session::end(&client, session.id, session::Ended::SignedOut, None).await?;
    }
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/login"))
        .cookie(removal(COOKIE, "/"))
        .finish())
}

/// `GET /sessions`: the live sessions.
pub(crate) async fn sessions_page(req: HttpRequest, state: web::Data<State>) -> Page {
    let session = page_session(&req, &state).await?;
    let client = state.pool.get().await?;
    let list = session::live(&client, SESSIONS_SHOWN).await?;
    Ok(html(views::sessions(&list, &session)))
}

/// Sessions a list shows.
pub(crate) const SESSIONS_SHOWN: i64 = 200;

/// `POST /sessions/{id}/revoke`: an operator ends a session (audited).
pub(crate) async fn session_revoke(
    req: HttpRequest,
    state: web::Data<State>,
    id: web::Path<String>,
    payload: web::Payload,
) -> Page {
    let (session, _, _) = changing_form(&req, &state, payload, &[]).await?;
    require_operator(&session.identity)?;
    let id = params::id("session", &id)?;
    session::revoke(&state.pool, &session.identity, id).await?;
    Ok(see_other("/sessions"))
}
