//! The page handlers: each reads its caller's session, runs the same
//! library calls as the API, and renders a view. A form that changes
//! something needs an operator's session and its CSRF token.

use std::collections::BTreeMap;

use actix_web::cookie::{Cookie, SameSite};
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use hookinbox::deliveries::{self, Filter, Status};

use crate::reconcile;
use maud::Markup;

use super::auth::{page_session, require_csrf, require_operator, sign_in};
use super::error::{AdminError, PageError};
use super::jobs::{self, Kind};
use super::params::{self, Checked};
use super::session::{COOKIE, LIFETIME, Session};
use super::state::State;
use super::{audit, detail, views};

type Page = Result<HttpResponse, PageError>;

fn html(markup: Markup) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(markup.into_string())
}

fn see_other(location: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, location))
        .finish()
}

/// Splits `extra` names off a query string or form body; the rest is the
/// filter's.
fn split(text: &[u8], extra: &[&str]) -> (String, BTreeMap<String, String>) {
    let mut rest = form_urlencoded::Serializer::new(String::new());
    let mut taken = BTreeMap::new();
    for (k, v) in form_urlencoded::parse(text) {
        if extra.contains(&k.as_ref()) {
            taken.insert(k.into_owned(), v.into_owned());
        } else {
            rest.append_pair(&k, &v);
        }
    }
    (rest.finish(), taken)
}

/// `GET /login` (without tokens, `--insecure-loopback`, nobody signs in).
pub(crate) async fn login_form(state: web::Data<State>) -> HttpResponse {
    match state.access {
        super::config::Access::InsecureLoopback => see_other("/"),
        super::config::Access::Tokens(_) => html(views::login(None)),
    }
}

/// `POST /login`: a token for a session cookie (HttpOnly, SameSite=Strict).
pub(crate) async fn login(
    req: HttpRequest,
    state: web::Data<State>,
    body: web::Bytes,
) -> HttpResponse {
    let (_, fields) = split(&body, &["token"]);
    let token = fields.get("token").map(String::as_str).unwrap_or("");
    match sign_in(&req, &state, token) {
        Ok(value) => {
            let secure = req.connection_info().scheme() == "https";
            let cookie = Cookie::build(COOKIE, value)
                .path("/")
                .http_only(true)
                .same_site(SameSite::Strict)
                .secure(secure)
                .max_age(actix_web::cookie::time::Duration::seconds(
                    LIFETIME.as_secs() as i64,
                ))
                .finish();
            HttpResponse::SeeOther()
                .insert_header((header::LOCATION, "/"))
                .cookie(cookie)
                .finish()
        }
        Err(AdminError::LockedOut(secs)) => HttpResponse::TooManyRequests()
            .insert_header((header::RETRY_AFTER, secs.to_string()))
            .content_type("text/html; charset=utf-8")
            .body(
                views::login(Some(&format!(
                    "Too many failed sign-ins from this address; try again in {secs} s."
                )))
                .into_string(),
            ),
        Err(_) => HttpResponse::Unauthorized()
            .content_type("text/html; charset=utf-8")
            .body(views::login(Some("That token is not valid.")).into_string()),
    }
}

/// `POST /logout`.
pub(crate) async fn logout(req: HttpRequest, state: web::Data<State>, body: web::Bytes) -> Page {
    let session = page_session(&req, &state)?;
    let (_, fields) = split(&body, &["csrf"]);
    require_csrf(&session, fields.get("csrf").map(String::as_str))?;
    let mut gone = Cookie::build(COOKIE, "").path("/").finish();
    gone.make_removal();
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/login"))
        .cookie(gone)
        .finish())
}

/// `GET /`.
pub(crate) async fn overview(req: HttpRequest, state: web::Data<State>) -> Page {
    let session = page_session(&req, &state)?;
    let client = state.pool.get().await?;
    let o = deliveries::overview(&client).await?;
    let reconciler = reconcile::state::states(&client).await?;
    Ok(html(views::overview(&o, &reconciler, &session)))
}

/// `GET /deliveries`.
pub(crate) async fn deliveries(req: HttpRequest, state: web::Data<State>) -> Page {
    let session = page_session(&req, &state)?;
    let checked = params::from_query(req.query_string())?;
    let client = state.pool.get().await?;
    let count = deliveries::count(&client, &checked.filter).await?;
    let page = deliveries::list_page(&client, &checked.filter, checked.cursor.as_ref()).await?;
    Ok(html(views::deliveries(&checked, &page, count, &session)))
}

fn hook_param(query: &str) -> Result<Option<String>, AdminError> {
    let (_, p) = split(query.as_bytes(), &["hook_id"]);
    match p.get("hook_id") {
        Some(h) if h.len() > 20 || !h.bytes().all(|b| b.is_ascii_digit()) => {
            Err(AdminError::field("hook_id", "1 to 20 digits"))
        }
        other => Ok(other.cloned()),
    }
}

/// `GET /deliveries/{source}/{delivery_id}`.
pub(crate) async fn delivery(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String)>,
) -> Page {
    let session = page_session(&req, &state)?;
    let hook = hook_param(req.query_string())?;
    let (source, id) = path.into_inner();
    let client = state.pool.get().await?;
    let d = detail::load(&client, &session.identity, &source, &id, hook.as_deref()).await?;
    Ok(html(views::delivery(&d, &session)))
}

/// `POST /deliveries/{source}/{delivery_id}/replay` and `/purge`: a job of
/// one, so that the change has its lineage and audit row like any other.
async fn act_on_one(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String)>,
    body: web::Bytes,
    kind: Kind,
) -> Page {
    let session = page_session(&req, &state)?;
    let (_, fields) = split(&body, &["csrf", "hook_id"]);
    require_csrf(&session, fields.get("csrf").map(String::as_str))?;
    require_operator(&session.identity)?;
    let (source, id) = path.into_inner();
    let hook = fields.get("hook_id").cloned().unwrap_or_default();
    let filter = Filter {
        source: Some(source.clone()),
        ids: Some(vec![id.clone()]),
        hook_id: Some(hook.clone()),
        status: (kind == Kind::Replay).then_some(Status::Failed),
        dead: kind == Kind::Purge,
        limit: 2,
        ..Filter::default()
    };
    let target =
        serde_json::json!({"delivery": {"source": source, "hook_id": hook, "delivery_id": id}});
    jobs::start(
        &state.pool,
        &session.identity,
        kind,
        &filter,
        &target,
        jobs::MAX_PER_SECOND,
    )
    .await?;
    state.wake_runner.notify_waiters();
    let back = match kind {
        Kind::Replay => views::delivery_href(&source, &hook, &id),
        Kind::Purge => "/deliveries?status=dead".to_owned(),
    };
    Ok(see_other(&back))
}

/// `POST /deliveries/{source}/{delivery_id}/replay`.
pub(crate) async fn replay_one(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String)>,
    body: web::Bytes,
) -> Page {
    act_on_one(req, state, path, body, Kind::Replay).await
}

/// `POST /deliveries/{source}/{delivery_id}/purge`.
pub(crate) async fn purge_one(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String)>,
    body: web::Bytes,
) -> Page {
    act_on_one(req, state, path, body, Kind::Purge).await
}

fn kind_of(extra: &BTreeMap<String, String>) -> Result<Kind, AdminError> {
    match extra.get("kind").map(String::as_str) {
        None | Some("replay") => Ok(Kind::Replay),
        Some("purge") => Ok(Kind::Purge),
        Some(_) => Err(AdminError::field("kind", "replay or purge")),
    }
}

fn rate_of(extra: &BTreeMap<String, String>) -> Result<f64, AdminError> {
    let rate = match extra.get("per_second").filter(|v| !v.is_empty()) {
        Some(v) => Some(
            v.parse::<f64>()
                .map_err(|_| AdminError::field("per_second", "a number"))?,
        ),
        None => None,
    };
    jobs::per_second(rate, "per_second")
}

/// `GET /bulk`: the count for the filter; with `dry_run=1`, the sample
/// and the confirm button.
pub(crate) async fn bulk(req: HttpRequest, state: web::Data<State>) -> Page {
    let session = page_session(&req, &state)?;
    let (rest, extra) = split(
        req.query_string().as_bytes(),
        &["kind", "dry_run", "per_second"],
    );
    let kind = kind_of(&extra)?;
    let rate = rate_of(&extra)?;
    let checked: Checked = params::from_query(&rest)?;
    let client = state.pool.get().await?;
    let (count, refused, filter) = match jobs::selection(kind, &checked, "") {
        Ok(filter) => (
            deliveries::count(&client, &filter).await?,
            None,
            Some(filter),
        ),
        Err(e) => (0, Some(e.to_string()), None),
    };
    let sample = match (&filter, extra.contains_key("dry_run")) {
        (Some(f), true) => Some(
            deliveries::list(
                &client,
                &Filter {
                    limit: super::api::SAMPLE,
                    ..f.clone()
                },
            )
            .await?,
        ),
        _ => None,
    };
    Ok(html(views::bulk(
        kind,
        &checked,
        count,
        sample.as_deref(),
        rate,
        refused.as_deref(),
        &session,
    )))
}

/// `POST /bulk`: freezes the selection and starts the job.
pub(crate) async fn bulk_start(
    req: HttpRequest,
    state: web::Data<State>,
    body: web::Bytes,
) -> Page {
    let session = page_session(&req, &state)?;
    let (rest, extra) = split(&body, &["csrf", "kind", "per_second"]);
    require_csrf(&session, extra.get("csrf").map(String::as_str))?;
    require_operator(&session.identity)?;
    let kind = kind_of(&extra)?;
    let rate = rate_of(&extra)?;
    let checked = params::from_query(&rest)?;
    let filter = jobs::selection(kind, &checked, "")?;
    let target = serde_json::json!({"filter": checked.json()});
    let started = jobs::start(&state.pool, &session.identity, kind, &filter, &target, rate).await?;
    state.wake_runner.notify_waiters();
    Ok(see_other(&format!("/jobs/{}", started.job)))
}

/// `GET /jobs`.
pub(crate) async fn jobs_page(req: HttpRequest, state: web::Data<State>) -> Page {
    let session = page_session(&req, &state)?;
    let client = state.pool.get().await?;
    let list = jobs::store::recent(&client, 50).await?;
    Ok(html(views::jobs(&list, &session)))
}

/// `GET /jobs/{id}`.
pub(crate) async fn job_page(
    req: HttpRequest,
    state: web::Data<State>,
    id: web::Path<i64>,
) -> Page {
    let session = page_session(&req, &state)?;
    let id = id.into_inner();
    let client = state.pool.get().await?;
    let job = jobs::store::get(&client, id)
        .await?
        .ok_or_else(|| AdminError::NotFound(format!("no job {id}")))?;
    let items = jobs::store::items(&client, id, 100).await?;
    Ok(html(views::job(&job, &items, &session)))
}

/// `POST /jobs/{id}/cancel`.
pub(crate) async fn job_cancel(
    req: HttpRequest,
    state: web::Data<State>,
    id: web::Path<i64>,
    body: web::Bytes,
) -> Page {
    let session: Session = page_session(&req, &state)?;
    let (_, fields) = split(&body, &["csrf"]);
    require_csrf(&session, fields.get("csrf").map(String::as_str))?;
    require_operator(&session.identity)?;
    let id = id.into_inner();
    jobs::cancel(&state.pool, &session.identity, id).await?;
    state.wake_runner.notify_waiters();
    Ok(see_other(&format!("/jobs/{id}")))
}

/// `GET /audit`.
pub(crate) async fn audit_page(req: HttpRequest, state: web::Data<State>) -> Page {
    let session = page_session(&req, &state)?;
    let (_, p) = split(req.query_string().as_bytes(), &["cursor"]);
    let before = match p.get("cursor") {
        Some(c) => Some(
            c.parse::<i64>()
                .map_err(|_| AdminError::field("cursor", "a whole number"))?,
        ),
        None => None,
    };
    let client = state.pool.get().await?;
    let mut rows = audit::list(&client, before, 51).await?;
    let next = (rows.len() > 50).then(|| {
        rows.truncate(50);
        rows.last().map(|r| r.id)
    });
    Ok(html(views::audit(&rows, next.flatten(), &session)))
}

/// `GET /static/admin.css`.
pub(crate) async fn stylesheet() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/css; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "max-age=3600"))
        .body(views::STYLESHEET)
}
