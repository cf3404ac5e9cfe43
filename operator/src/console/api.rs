//! The JSON API under `/api/v1/`, described by `docs/admin-openapi.json`.
//! Every call carries `Authorization: Bearer <token>`; a change needs an
//! operator's token. The filters are the list page's (`params`), and the
//! queries are the CLI's (`hookinbox::deliveries`).

use actix_web::{HttpRequest, HttpResponse, web};
use hookinbox::deliveries::{self, Cursor};

use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::{api_identity, require_operator};
use super::body::{self, JSON_LIMIT};
use super::destinations::{self, Action, KeyAction};
use super::error::{AdminError, ApiError};
use super::jobs::{self, Kind};
use super::state::State;
use super::{detail, params, session};

type Answer = Result<HttpResponse, ApiError>;

/// `GET /api/v1/deliveries`: one page, newest first.
pub(crate) async fn list(req: HttpRequest, state: web::Data<State>) -> Answer {
    api_identity(&req, &state)?;
    let checked = params::from_query(req.query_string())?;
    let client = state.pool.get().await?;
    let page = deliveries::list_page(&client, &checked.filter, checked.cursor.as_ref()).await?;
    Ok(HttpResponse::Ok().json(json!({
        "items": page.items.iter().map(detail::summary).collect::<Vec<_>>(),
        "next_cursor": page.next.as_ref().map(Cursor::encode),
    })))
}

/// `GET /api/v1/deliveries/count`: how many match.
pub(crate) async fn count(req: HttpRequest, state: web::Data<State>) -> Answer {
    api_identity(&req, &state)?;
    let checked = params::from_query(req.query_string())?;
    if checked.cursor.is_some() {
        return Err(AdminError::field("cursor", "a count has no pages").into());
    }
    let client = state.pool.get().await?;
    let n = deliveries::count(&client, &checked.filter).await?;
    Ok(HttpResponse::Ok().json(json!({"count": n})))
}

#[derive(Deserialize)]
pub(crate) struct HookParam {
    hook_id: Option<String>,
}

/// `GET /api/v1/deliveries/{source}/{delivery_id}`.
pub(crate) async fn one(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String)>,
) -> Answer {
    let who = api_identity(&req, &state)?;
    let hook = web::Query::<HookParam>::from_query(req.query_string())
        .map_err(|_| AdminError::field("hook_id", "the only parameter here, 1 to 20 digits"))?;
    let (source, id) = path.into_inner();
    let client = state.pool.get().await?;
    let d = detail::load(
        &client,
        &who,
        &source,
        &id,
        hook.hook_id.as_deref(),
        &state.secret_values,
    )
    .await?;
    Ok(HttpResponse::Ok().json(detail::to_json(&d)))
}

/// `GET /api/v1/overview`.
pub(crate) async fn overview(req: HttpRequest, state: web::Data<State>) -> Answer {
    api_identity(&req, &state)?;
    let client = state.pool.get().await?;
    let o = deliveries::overview(&client).await?;
    let reconciler = deliveries::reconciler_states(&client).await?;
    Ok(HttpResponse::Ok().json(json!({
        "reconciler": reconciler.iter().map(|r| json!({
            "source": r.source, "hook": r.hook, "watermark": r.watermark,
            "last_pass_at": r.last_pass_at, "last_attempt_at": r.last_attempt_at,
            "last_error": r.last_error, "last_counts": r.last_counts,
        })).collect::<Vec<_>>(),
        "sources": o.sources.iter().map(|s| {
            let mut counts = json!({"source": s.source});
            for (state, n) in s.by_state() {
                counts[state.as_str()] = json!(n);
            }
            counts
        }).collect::<Vec<_>>(),
        "oldest_processing_secs": o.oldest_processing_secs,
        "oldest_due_secs": o.oldest_due_secs,
        "oldest_lost_secs": o.oldest_lost_secs,
        "dead_by_class": o.dead_by_class.iter().map(|(c, n)| json!({"error_class": c, "count": n})).collect::<Vec<_>>(),
        "last_hour": {
            "accepted": o.accepted_last_hour,
            "completed": o.completed_last_hour,
            "failed": o.failed_last_hour,
        },
    })))
}

/// The body of `POST /api/v1/replays` and `/purges`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkBody {
    filter: Option<Value>,
    ids: Option<Vec<String>>,
    #[serde(default)]
    dry_run: bool,
    per_second: Option<f64>,
    /// A replay of completed deliveries too (`replay_any`), not only of
    /// failed ones.
    #[serde(default)]
    completed: bool,
}

/// How many a dry run shows.
pub const SAMPLE: i64 = 20;

async fn bulk(
    req: HttpRequest,
    state: web::Data<State>,
    payload: web::Payload,
    kind: Kind,
) -> Answer {
    let who = api_identity(&req, &state)?;
    let body = body::read(&req, payload, JSON_LIMIT, state.body_timeout).await?;
    let body: BulkBody = serde_json::from_slice(&body)
        .map_err(|e| AdminError::field("body", format!("not the JSON this call takes ({e})")))?;
    let kind = match (kind, body.completed) {
        (Kind::Replay, true) => Kind::ReplayAny,
        (Kind::Purge, true) => {
            return Err(AdminError::field("completed", "a purge takes dead letters only").into());
        }
        (kind, _) => kind,
    };
    let (filter, target) = match (&body.filter, &body.ids) {
        (Some(f), None) => {
            let checked = params::from_json(f)?;
            (
                jobs::selection(kind, &checked, "filter.")?,
                json!({"filter": checked.json()}),
            )
        }
        (None, Some(ids)) => (jobs::by_ids(kind, ids)?, json!({"ids": ids})),
        _ => {
            return Err(AdminError::field("filter", "give either a filter or ids").into());
        }
    };
    let per_second = jobs::per_second(body.per_second, "per_second")?;
    let client = state.pool.get().await?;
    if body.dry_run {
        let n = deliveries::count(&client, &filter).await?;
        let sample = deliveries::list(
            &client,
            &deliveries::Filter {
                limit: SAMPLE,
                ..filter
            },
        )
        .await?;
        return Ok(HttpResponse::Ok().json(json!({
            "count": n,
            "dry_run": true,
            "sample": sample.iter().map(detail::summary).collect::<Vec<_>>(),
        })));
    }
    require_operator(&who)?;
    drop(client);
    let started = jobs::start(&state, &who, kind, &filter, &target, per_second).await?;
    Ok(HttpResponse::Accepted().json(json!({"count": started.count, "job": started.job})))
}

/// `POST /api/v1/replays`.
pub(crate) async fn replay(
    req: HttpRequest,
    state: web::Data<State>,
    payload: web::Payload,
) -> Answer {
    bulk(req, state, payload, Kind::Replay).await
}

/// `POST /api/v1/purges`.
pub(crate) async fn purge(
    req: HttpRequest,
    state: web::Data<State>,
    payload: web::Payload,
) -> Answer {
    bulk(req, state, payload, Kind::Purge).await
}

/// Items a job's answer lists.
const ITEMS_SHOWN: i64 = 100;

async fn job_of(state: &State, id: i64, kind: Kind) -> Result<jobs::Job, AdminError> {
    let client = state.pool.get().await?;
    jobs::store::get(&client, id)
        .await?
        // `/replays` shows replays of both kinds.
        .filter(|j| j.kind == kind || (kind.replays() && j.kind.replays()))
        .ok_or_else(|| AdminError::NotFound(format!("no {} job {id}", kind.as_str())))
}

async fn show_job(req: HttpRequest, state: web::Data<State>, id: i64, kind: Kind) -> Answer {
    api_identity(&req, &state)?;
    let job = job_of(&state, id, kind).await?;
    let client = state.pool.get().await?;
    let items = jobs::store::items(&client, id, ITEMS_SHOWN).await?;
    Ok(HttpResponse::Ok().json(crate::jobs::to_json(&job, &items)))
}

async fn cancel_job(req: HttpRequest, state: web::Data<State>, id: i64, kind: Kind) -> Answer {
    let who = api_identity(&req, &state)?;
    require_operator(&who)?;
    job_of(&state, id, kind).await?;
    jobs::cancel(&state, &who, id).await?;
    let job = job_of(&state, id, kind).await?;
    Ok(HttpResponse::Ok().json(crate::jobs::to_json(&job, &[])))
}

/// `GET /api/v1/replays/{job}`.
pub(crate) async fn replay_job(
    req: HttpRequest,
    state: web::Data<State>,
    id: web::Path<String>,
) -> Answer {
    show_job(req, state, params::id("job", &id)?, Kind::Replay).await
}

/// `DELETE /api/v1/replays/{job}`.
pub(crate) async fn cancel_replay(
    req: HttpRequest,
    state: web::Data<State>,
    id: web::Path<String>,
) -> Answer {
    cancel_job(req, state, params::id("job", &id)?, Kind::Replay).await
}

/// `GET /api/v1/purges/{job}`.
pub(crate) async fn purge_job(
    req: HttpRequest,
    state: web::Data<State>,
    id: web::Path<String>,
) -> Answer {
    show_job(req, state, params::id("job", &id)?, Kind::Purge).await
}

/// `DELETE /api/v1/purges/{job}`.
pub(crate) async fn cancel_purge(
    req: HttpRequest,
    state: web::Data<State>,
    id: web::Path<String>,
) -> Answer {
    cancel_job(req, state, params::id("job", &id)?, Kind::Purge).await
}

/// `GET /api/v1/jobs`: the newest jobs of both kinds.
pub(crate) async fn jobs_list(req: HttpRequest, state: web::Data<State>) -> Answer {
    api_identity(&req, &state)?;
    let client = state.pool.get().await?;
    let list = jobs::store::recent(&client, 50).await?;
    Ok(HttpResponse::Ok().json(json!({
        "items": list.iter().map(|j| crate::jobs::to_json(j, &[])).collect::<Vec<_>>(),
    })))
}

/// `GET /api/v1/audit`: newest first.
pub(crate) async fn audit(req: HttpRequest, state: web::Data<State>) -> Answer {
    api_identity(&req, &state)?;
    let (mut limit, mut cursor) = (params::DEFAULT_LIMIT, None);
    for (name, value) in form_urlencoded::parse(req.query_string().as_bytes()) {
        if value.is_empty() {
            continue;
        }
        match name.as_ref() {
            "limit" => {
                limit = value
                    .parse::<i64>()
                    .ok()
                    .filter(|n| (1..=params::MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        AdminError::field(
                            "limit",
                            format!("a whole number from 1 to {}", params::MAX_LIMIT),
                        )
                    })?;
            }
            "cursor" => cursor = Some(params::id("cursor", &value)?),
            other => {
                return Err(AdminError::field(
                    other.chars().take(64).collect::<String>(),
                    "not a parameter of this call (limit, cursor)",
                )
                .into());
            }
        }
    }
    let client = state.pool.get().await?;
    let mut rows = crate::audit::list(&client, cursor, limit + 1).await?;
    let next = (rows.len() as i64 > limit).then(|| {
        rows.truncate(limit as usize);
        rows.last().map(|r| r.id)
    });
    Ok(HttpResponse::Ok().json(json!({
        "items": rows.iter().map(|e| json!({
            "id": e.id, "at": e.at, "actor": e.actor, "role": e.role, "action": e.action,
            "target": e.target, "count": e.count, "result": e.result, "job": e.job_id,
        })).collect::<Vec<_>>(),
        "next_cursor": next.flatten(),
    })))
}

/// A live session as the API answers it.
fn session_json(s: &session::Listed) -> Value {
    json!({
        "id": s.id,
        "token": s.token_name,
        "client": s.client,
        "created_at": s.created_at,
        "expires_at": s.expires_at,
    })
}

/// `GET /api/v1/sessions`: the live page sessions, newest first.
pub(crate) async fn sessions(req: HttpRequest, state: web::Data<State>) -> Answer {
    api_identity(&req, &state)?;
    let client = state.pool.get().await?;
    let list = session::live(&client, super::sign_in::SESSIONS_SHOWN).await?;
    Ok(HttpResponse::Ok().json(json!({
        "items": list.iter().map(session_json).collect::<Vec<_>>(),
    })))
}

/// `DELETE /api/v1/sessions/{id}`: ends a session (operators; audited).
pub(crate) async fn revoke_session(
    req: HttpRequest,
    state: web::Data<State>,
    id: web::Path<String>,
) -> Answer {
    let who = api_identity(&req, &state)?;
    require_operator(&who)?;
    let id = params::id("session", &id)?;
    session::revoke(&state.pool, &who, id).await?;
    Ok(HttpResponse::Ok().json(json!({"id": id, "revoked": true})))
}

/// `GET /api/v1/destinations`: every destination, registered or
/// configured, with its state, waiting legs, last error and settings
/// (never a secret or a header's value).
pub(crate) async fn destinations(req: HttpRequest, state: web::Data<State>) -> Answer {
    api_identity(&req, &state)?;
    let all = destinations::list(&state).await?;
    Ok(HttpResponse::Ok().json(json!({
        "items": all.iter().map(destinations::DestinationView::json).collect::<Vec<_>>(),
    })))
}

async fn change_destination(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String)>,
    action: Action,
) -> Answer {
    let who = api_identity(&req, &state)?;
    require_operator(&who)?;
    let (source, name) = path.into_inner();
    let target = destinations::target(&source, &name)?;
    let changed = destinations::change(&state, &who, &target, action).await?;
    Ok(HttpResponse::Ok().json(json!({
        "source": target.source.as_str(),
        "name": target.name.as_str(),
        "state": changed.to.as_str(),
        "from": changed.from.as_str(),
        "changed": changed.changed(),
    })))
}

/// `POST /api/v1/destinations/{source}/{name}/pause` (operators; audited).
pub(crate) async fn pause_destination(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String)>,
) -> Answer {
    change_destination(req, state, path, Action::Pause).await
}

/// `POST /api/v1/destinations/{source}/{name}/resume` (operators;
/// audited): back to closed from any state.
pub(crate) async fn resume_destination(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String)>,
) -> Answer {
    change_destination(req, state, path, Action::Resume).await
}

/// `GET /api/v1/destinations/{source}/{name}/halted`: the halted keys of
/// an ordered destination, oldest halt first, each with the leg that
/// halts it and the legs waiting behind it.
pub(crate) async fn halted(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String)>,
) -> Answer {
    api_identity(&req, &state)?;
    let (source, name) = path.into_inner();
    let target = destinations::target(&source, &name)?;
    let keys = destinations::halted(&state, &target).await?;
    Ok(HttpResponse::Ok().json(json!({
        "items": keys.iter().map(destinations::halted_json).collect::<Vec<_>>(),
    })))
}

async fn act_on_key(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String, String)>,
    action: KeyAction,
) -> Answer {
    let who = api_identity(&req, &state)?;
    require_operator(&who)?;
    let (source, name, key) = path.into_inner();
    let target = destinations::target(&source, &name)?;
    let leg = destinations::act(&state, &who, &target, &key, action).await?;
    Ok(HttpResponse::Ok().json(json!({
        "source": target.source.as_str(),
        "name": target.name.as_str(),
        "key": key,
        "delivery_id": leg.delivery_id.as_str(),
        "action": match action {
            KeyAction::Skip => "skipped",
            KeyAction::Retry => "retried",
        },
    })))
}

/// `POST /api/v1/destinations/{source}/{name}/halted/{key}/skip`
/// (operators; audited): the halting leg stays dead, and the key resumes
/// with its next leg.
pub(crate) async fn skip_halted(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String, String)>,
) -> Answer {
    act_on_key(req, state, path, KeyAction::Skip).await
}

/// `POST /api/v1/destinations/{source}/{name}/halted/{key}/retry`
/// (operators; audited): the halting leg goes again in its place, and
/// the key waits for it.
pub(crate) async fn retry_halted(
    req: HttpRequest,
    state: web::Data<State>,
    path: web::Path<(String, String, String)>,
) -> Answer {
    act_on_key(req, state, path, KeyAction::Retry).await
}
