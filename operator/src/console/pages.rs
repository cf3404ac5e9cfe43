//! The page handlers: each reads its caller's session, runs the same
//! library calls as the API, and renders a view. A form that changes
//! something needs an operator's session and its CSRF token.

use std::collections::BTreeMap;

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use hookinbox::deliveries::{self, Filter};

use maud::Markup;

use super::auth::{page_session, require_csrf, require_operator};
use super::body::{self, FORM_LIMIT};
use super::destinations::{self, Action, KeyAction};
use super::error::{AdminError, PageError};
use super::jobs::{self, Kind};
use super::params::{self, Checked};
use super::session::Session;
use super::state::State;
use super::{detail, views};
use crate::audit;

pub(super) type Page = Result<HttpResponse, PageError>;

pub(super) fn html(markup: Markup) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(markup.into_string())
}

pub(super) fn see_other(location: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, location))
        .finish()
}

/// Splits `extra` names off a query string or form body; the rest is the
/// filter's.
pub(super) fn split(text: &[u8], extra: &[&str]) -> (String, BTreeMap<String, String>) {
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

/// A form's body, within the form cap and the body timeout.
pub(super) async fn form(
    req: &HttpRequest,
    state: &State,
    payload: web::Payload,
) -> Result<web::Bytes, AdminError> {
    body::read(req, payload, FORM_LIMIT, state.body_timeout).await
}

/// A form that changes something, checked: its body read, its caller's
/// session, and the session's CSRF token in it. Returns the session, the
/// fields named in `extra` and the rest (a filter's query).
pub(super) async fn changing_form(
    req: &HttpRequest,
    state: &State,
    payload: web::Payload,
    extra: &[&str],
) -> Result<(Session, BTreeMap<String, String>, String), AdminError> {
    let body = form(req, state, payload).await?;
    let session = page_session(req, state).await?;
    let names: Vec<&str> = extra.iter().copied().chain(["csrf"]).collect();
    let (rest, fields) = split(&body, &names);
    require_csrf(&session, fields.get("csrf").map(String::as_str))?;
    Ok((session, fields, rest))
}

/// `GET /`.
pub(crate) async fn overview(req: HttpRequest, state: web::Data<State>) -> Page {
    let session = page_session(&req, &state).await?;
    let client = state.pool.get().await?;
    let o = deliveries::overview(&client).await?;
    let reconciler = deliveries::reconciler_states(&client).await?;
    Ok(html(views::overview(&o, &reconciler, &session)))
}

/// `GET /deliveries`.
pub(crate) async fn deliveries(req: HttpRequest, state: web::Data<State>) -> Page {
    let session = page_session(&req, &state).await?;
    let checked = params::from_query(req.query_string())?;
    let client = state.pool.get().await?;
    let count = deliveries::count(&client, &checked.filter).await?;
    let page = deliveries::list_page(&client, &checked.filter, checked.cursor.as_ref()).await?;
    Ok(html(views::deliveries(&checked, &page, count, &session)))
}

fn hook_param(query: &str) -> Result<Option<String>, AdminError> {
    let (_, p) = split(query.as_bytes(), &["hook_id"]);
    p.get("hook_id")
        .map(|h| params::hook_id("hook_id", h))
        .transpose()
}

/// `GET /deliveries/{source}/{delivery_id}`.
pub(crate) async fn delivery(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String)>,
) -> Page {
    let session = page_session(&req, &state).await?;
    let hook = hook_param(req.query_string())?;
    let (source, id) = path.into_inner();
    let client = state.pool.get().await?;
    let d = detail::load(
        &client,
        &session.identity,
        &source,
        &id,
        hook.as_deref(),
        &state.secret_values,
    )
    .await?;
    Ok(html(views::delivery(&d, &session)))
}

/// `POST /deliveries/{source}/{delivery_id}/replay` and `/purge`: a job of
/// one, so that the change has its lineage and audit row like any other.
async fn act_on_one(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String)>,
    payload: web::Payload,
    kind: Kind,
) -> Page {
    let (session, fields, _) =
        changing_form(&req, &state, payload, &["hook_id", "destination"]).await?;
    require_operator(&session.identity)?;
    let (source, id) = path.into_inner();
    params::delivery_path(&source, &id)?;
    let hook = params::hook_id("hook_id", fields.get("hook_id").map_or("", String::as_str))?;
    // One leg (a replay of it, completed or failed), or every leg the
    // kind applies to.
    let destination = match fields.get("destination").filter(|d| !d.is_empty()) {
        Some(d) => Some(params::destination("destination", d)?),
        None => None,
    };
    let kind = match (kind, &destination) {
        (Kind::Replay, Some(_)) => Kind::ReplayAny,
        (kind, _) => kind,
    };
    let filter = Filter {
        source: Some(source.clone()),
        ids: Some(vec![id.clone()]),
        hook_id: Some(hook.clone()),
        destination: destination.clone(),
        states: kind.states().to_vec(),
        // Each leg of the delivery that the job applies to: one per
        // destination of its source.
        limit: 1000,
        ..Filter::default()
    };
    let mut target =
        serde_json::json!({"delivery": {"source": source, "hook_id": hook, "delivery_id": id}});
    if let Some(d) = &destination {
        target["delivery"]["destination"] = d.as_str().into();
    }
    jobs::start(
        &state,
        &session.identity,
        kind,
        &filter,
        &target,
        jobs::MAX_PER_SECOND,
    )
    .await?;
    let back = match kind {
        Kind::Replay | Kind::ReplayAny => views::delivery_href(&source, &hook, &id),
        Kind::Purge => "/deliveries?status=dead".to_owned(),
    };
    Ok(see_other(&back))
}

/// `POST /deliveries/{source}/{delivery_id}/replay`: the delivery's
/// failed legs, or (with `destination`) that one leg, completed or failed.
pub(crate) async fn replay_one(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Page {
    act_on_one(req, state, path, payload, Kind::Replay).await
}

/// `POST /deliveries/{source}/{delivery_id}/purge`.
pub(crate) async fn purge_one(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Page {
    act_on_one(req, state, path, payload, Kind::Purge).await
}

fn kind_of(extra: &BTreeMap<String, String>) -> Result<Kind, AdminError> {
    match extra.get("kind").map(String::as_str) {
        None | Some("replay") => Ok(Kind::Replay),
        Some("replay_any") => Ok(Kind::ReplayAny),
        Some("purge") => Ok(Kind::Purge),
        Some(_) => Err(AdminError::field("kind", "replay, replay_any or purge")),
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
    let session = page_session(&req, &state).await?;
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
    payload: web::Payload,
) -> Page {
    let (session, extra, rest) =
        changing_form(&req, &state, payload, &["kind", "per_second"]).await?;
    require_operator(&session.identity)?;
    let kind = kind_of(&extra)?;
    let rate = rate_of(&extra)?;
    let checked = params::from_query(&rest)?;
    let filter = jobs::selection(kind, &checked, "")?;
    let target = serde_json::json!({"filter": checked.json()});
    let started = jobs::start(&state, &session.identity, kind, &filter, &target, rate).await?;
    Ok(see_other(&format!("/jobs/{}", started.job)))
}

/// `GET /jobs`.
pub(crate) async fn jobs_page(req: HttpRequest, state: web::Data<State>) -> Page {
    let session = page_session(&req, &state).await?;
    let client = state.pool.get().await?;
    let list = jobs::store::recent(&client, 50).await?;
    Ok(html(views::jobs(&list, &session)))
}

/// `GET /jobs/{id}`.
pub(crate) async fn job_page(
    req: HttpRequest,
    state: web::Data<State>,
    id: web::Path<String>,
) -> Page {
    let session = page_session(&req, &state).await?;
    let id = params::id("job", &id)?;
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
    id: web::Path<String>,
    payload: web::Payload,
) -> Page {
    let (session, _, _) = changing_form(&req, &state, payload, &[]).await?;
    require_operator(&session.identity)?;
    let id = params::id("job", &id)?;
    jobs::cancel(&state, &session.identity, id).await?;
    Ok(see_other(&format!("/jobs/{id}")))
}

/// `GET /audit`.
pub(crate) async fn audit_page(req: HttpRequest, state: web::Data<State>) -> Page {
    let session = page_session(&req, &state).await?;
    let (_, p) = split(req.query_string().as_bytes(), &["cursor"]);
    let before = p
        .get("cursor")
        .filter(|c| !c.is_empty())
        .map(|c| params::id("cursor", c))
        .transpose()?;
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

/// `GET /destinations`: each destination's state, waiting legs, last
/// error and settings, with (for an operator) its pause or resume button;
/// and each ordered destination's halted keys, with (for an operator)
/// their skip and retry buttons.
pub(crate) async fn destinations_page(req: HttpRequest, state: web::Data<State>) -> Page {
    let session = page_session(&req, &state).await?;
    let all = destinations::list(&state).await?;
    let halted = destinations::halted_by_destination(&state).await?;
    Ok(html(views::destinations(&all, &halted, &session)))
}

async fn change_destination(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String)>,
    payload: web::Payload,
    action: Action,
) -> Page {
    let (session, _, _) = changing_form(&req, &state, payload, &[]).await?;
    require_operator(&session.identity)?;
    let (source, name) = path.into_inner();
    let target = destinations::target(&source, &name)?;
    destinations::change(&state, &session.identity, &target, action).await?;
    Ok(see_other("/destinations"))
}

/// `POST /destinations/{source}/{name}/pause` (audited).
pub(crate) async fn pause_destination(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Page {
    change_destination(req, state, path, payload, Action::Pause).await
}

/// `POST /destinations/{source}/{name}/resume` (audited).
pub(crate) async fn resume_destination(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String)>,
    payload: web::Payload,
) -> Page {
    change_destination(req, state, path, payload, Action::Resume).await
}

async fn act_on_key(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String, String)>,
    payload: web::Payload,
    action: KeyAction,
) -> Page {
    let (session, _, _) = changing_form(&req, &state, payload, &[]).await?;
    require_operator(&session.identity)?;
    let (source, name, key) = path.into_inner();
    let target = destinations::target(&source, &name)?;
    destinations::act(&state, &session.identity, &target, &key, action).await?;
    Ok(see_other("/destinations"))
}

/// `POST /destinations/{source}/{name}/halted/{key}/skip` (audited): the
/// halting leg stays dead and the key resumes.
pub(crate) async fn skip_halted(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String, String)>,
    payload: web::Payload,
) -> Page {
    act_on_key(req, state, path, payload, KeyAction::Skip).await
}

/// `POST /destinations/{source}/{name}/halted/{key}/retry` (audited): the
/// halting leg goes again in its place.
pub(crate) async fn retry_halted(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String, String)>,
    payload: web::Payload,
) -> Page {
    act_on_key(req, state, path, payload, KeyAction::Retry).await
}
