//! One webhook request, in the design's order (see the crate's docs):
//! [`read_and_verify`] (steps 1 and 2), [`check_headers`] (step 3),
//! [`claim`] (step 4, the delivery's legs and its body, in one statement)
//! and [`publish_or_park`] (step 5, each leg's key to its destination's
//! queue). Nothing touches Postgres before step 4.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::http::header::HeaderMap;
use actix_web::{HttpRequest, HttpResponse, web};
use bytes::Bytes;
use deadpool_postgres::Pool;
use hookinbox::broker::Publisher;
use hookinbox::config::{IngestConfig, Source};
use hookinbox::deliveries::group_commit::ClaimBatcher;
use hookinbox::deliveries::{
    self, Claim, ClaimRequest, Claimed, Encoded, LegClaim, LegRequest, Origin, Policy, Status,
};
use hookinbox::job::{Body, BodyCopy, Envelope, JobTrace};
use hookinbox::key::{
    ClaimToken, DeliveryId, DeliveryKey, DestinationName, EventName, HookId, KeyError, SourceName,
};
use hookinbox::payload::{self, ContentType};
use hookinbox::postgres::DbError;
use hookinbox::signature::SignatureError;
use hookinbox::telemetry::{self, SpanTrace};
use serde_json::json;
use sha2::{Digest, Sha256};
use tracing::{Instrument, Span, field};

use crate::admission::{Admission, Ticket};
use crate::answer::{Answer, Outcome, Reject};
use crate::body::{
    BodyLimits, check_framing, content_type_header, declared_length, github_headers, read_body,
    single,
};
use crate::limits::RateLimits;
use crate::rotation::SecretMatches;

/// Shared by every request.
pub(crate) struct State {
    pub(crate) config: IngestConfig,
    pub(crate) policy: Policy,
    pub(crate) pool: Pool,
    pub(crate) publisher: Arc<Publisher>,
    pub(crate) secret_matches: Arc<SecretMatches>,
    /// Bounds the verified requests in progress: past it, answer 429 at
    /// once rather than queue work without end.
    pub(crate) in_flight: Arc<tokio::sync::Semaphore>,
    /// Bounds what unverified bodies take: memory, slots, per client.
    pub(crate) admission: Arc<Admission>,
    /// Group commit of claims; `None` claims each request on its own.
    pub(crate) batcher: Option<ClaimBatcher>,
    /// The sources' token buckets.
    pub(crate) rate_limits: RateLimits,
}

pub(crate) async fn receive_default(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<State>,
) -> HttpResponse {
    receive(req, body, state, SourceName::DEFAULT).await
}

pub(crate) async fn receive_named(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<State>,
    source: web::Path<String>,
) -> HttpResponse {
    receive(req, body, state, &source).await
}

/// What a request revealed about itself, for its log line and metrics.
/// Filled as the steps pass. The event header is not covered by the
/// signature, so its label is bounded to GitHub's event names
/// ([`hookinbox::metrics::event_label`]).
#[derive(Default)]
struct Seen {
    /// The configured source, or `None` for an unknown one.
    source: Option<SourceName>,
    /// The event, once the signature verified.
    event: Option<EventName>,
    /// The delivery id, once validated.
    delivery_id: Option<DeliveryId>,
}

/// Answers one request, then logs it and counts it.
async fn receive(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<State>,
    source: &str,
) -> HttpResponse {
    let started = std::time::Instant::now();
    let mut seen = Seen::default();
    let span = request_span(source);
    let handled = handle(&req, body, &state, source, &mut seen)
        .instrument(span.clone())
        .await;
    // No await from here on: the log line and the answer are inside the
    // request's span (their log line carries its trace id).
    let _in_request = span.enter();
    let answer = match handled {
        Ok(answer) => answer,
        Err(reject) => {
            if reject.outcome == Outcome::BadSignature {
                metrics::counter!(
                    hookinbox::metrics::SIGNATURE_FAILURES,
                    "source" => seen.source.as_ref().map_or("unknown", |s| s.as_str()).to_owned()
                )
                .increment(1);
            }
            reject.into()
        }
    };
    let source_label = seen
        .source
        .as_ref()
        .map_or("unknown", |s| s.as_str())
        .to_owned();
    let event_label = seen
        .event
        .as_ref()
        .map_or("", |e| hookinbox::metrics::event_label(e.as_str()));
    let elapsed = started.elapsed();
    // A request shed by a limit is counted but not logged: under a flood
    // the log would cost more than the refusal.
    if !answer.outcome.is_shed() {
        log_answer(&answer, &seen, &source_label, elapsed);
    }
    metrics::counter!(
        hookinbox::metrics::INGEST_REQUESTS,
        "source" => source_label,
        "event" => event_label,
        "outcome" => answer.outcome.as_str()
    )
    .increment(1);
    metrics::histogram!(hookinbox::metrics::INGEST_REQUEST_SECONDS).record(elapsed);
    span.record("outcome", answer.outcome.as_str());
    span.record("http.response.status_code", answer.status.as_u16());
    let _answering = telemetry::step("ingest.answer").entered();
    answer.into_response()
}

/// The request's span, the root of the delivery's trace, when traces are
/// on: its key, event, action and outcome; never the payload, a secret or
/// a signature. A disabled span otherwise.
fn request_span(source: &str) -> Span {
    if !telemetry::enabled() {
        return Span::none();
    }
    let span = tracing::info_span!(
        "request",
        otel.name = "ingest.request",
        otel.kind = "server",
        source,
        delivery_key = field::Empty,
        delivery_id = field::Empty,
        event = field::Empty,
        action = field::Empty,
        outcome = field::Empty,
        http.response.status_code = field::Empty,
        trace_id = field::Empty,
        span_id = field::Empty,
    );
    span.record_ids();
    span
}

/// The request's log line.
fn log_answer(answer: &Answer, seen: &Seen, source_label: &str, elapsed: std::time::Duration) {
    tracing::info!(
        source = %source_label,
        event = seen.event.as_ref().map_or("", |e| e.as_str()),
        delivery_id = seen.delivery_id.as_ref().map_or("", |d| d.as_str()),
        status = answer.status.as_u16(),
        outcome = answer.outcome.as_str(),
        error = answer.error(),
        duration_ms = elapsed.as_secs_f64() * 1000.0,
        "webhook answered"
    );
}

/// The steps, in order; each returns early with its answer or refusal.
async fn handle(
    req: &HttpRequest,
    body: web::Payload,
    state: &State,
    source_name: &str,
    seen: &mut Seen,
) -> Result<Answer, Reject> {
    // First: a client the allow-list refuses gets nothing read.
    crate::allow::check(
        req,
        state.config.github_hooks.as_ref(),
        &state.config.trusted_proxies,
    )?;
    let source = SourceName::parse(source_name)
        .ok()
        .and_then(|name| state.config.sources.get(&name))
        .ok_or_else(|| {
            Reject::new(
                StatusCode::NOT_FOUND,
                Outcome::UnknownSource,
                "unknown source",
            )
        })?;
    seen.source = Some(source.name.clone());
    let headers = req.headers();
    // An unverified body takes a receiving slot and its bytes from the
    // budget as they arrive ([`crate::admission`]); the slot for work is
    // taken only once the signature verified, so connections that trickle
    // bytes cannot take it from a signed delivery.
    let mut ticket = state.admission.enter(req, declared_length(headers))?;
    let (content_type, body) = read_and_verify(state, source, headers, body, &mut ticket)
        .instrument(telemetry::step("ingest.read_and_verify"))
        .await?;
    ticket.verified();
    let Ok(_permit) = state.in_flight.clone().try_acquire_owned() else {
        return Err(Reject::new(
            StatusCode::TOO_MANY_REQUESTS,
            Outcome::Overloaded,
            "overloaded, retry later",
        )
        .retry_after(1));
    };
    let delivery = match check_headers(source, headers, content_type, &body, seen)? {
        Checked::Answered(answer) => return Ok(answer),
        Checked::Delivery(delivery) => delivery,
    };
    // After the signature (an unsigned request never spends the bucket)
    // and before anything is written.
    state.rate_limits.admit(&source.name)?;
    // The request's span: the trace retries and replays link back to.
    let request = Span::current();
    let traceparent = request.traceparent();
    let received = Body {
        content_type: content_type_header(headers),
        github_headers: github_headers(headers),
        bytes: body,
    };
    let encoded = Encoded::of(&received);
    // Only a leg whose worker would read the body apart is sent a copy.
    let copy = source
        .destinations
        .iter()
        .any(|d| d.reads_body_apart())
        .then(|| encoded.copy());
    let Claimed {
        claim: claimed,
        links,
    } = claim(state, source, &delivery, &received, encoded, traceparent)
        .instrument(telemetry::step("ingest.claim"))
        .await?;
    // A redelivery the reconciler asked GitHub for links to the trace of
    // that ask; a delivery stored before, to its first request's trace.
    for linked in [links.redelivery, links.stored].iter().flatten() {
        request.link_to(linked);
    }
    publish_or_park(state, source, delivery, claimed, copy)
        .instrument(telemetry::step("ingest.publish_or_park"))
        .await
}

/// Steps 1 and 2: the raw body, bounded, then the signature over it,
/// before anything else is trusted.
async fn read_and_verify(
    state: &State,
    source: &Source,
    headers: &HeaderMap,
    body: web::Payload,
    ticket: &mut Ticket,
) -> Result<(ContentType, Bytes), Reject> {
    let config = &state.config;
    let content_type = check_framing(headers)?;
    let limits = BodyLimits {
        cap: config.max_body_bytes,
        timeout: config.body_timeout,
        min_rate: config.min_body_bytes_per_sec,
    };
    let body = read_body(body, headers, &limits, ticket).await?;
    // Exactly one `X-Hub-Signature-256`, matching one of the source's
    // secrets. `X-Hub-Signature` (SHA-1) alone is refused.
    let signature = single(headers, "x-hub-signature-256")
        .map_err(|_| SignatureError::Duplicated)?
        .ok_or(SignatureError::Missing)?;
    let position = source.secrets.verify_parts(body.parts(), signature)?;
    state.secret_matches.record(&source.name, position);
    Ok((content_type, body.assemble(ticket)))
}

/// A verified request that carries a delivery to claim.
struct Delivery {
    key: DeliveryKey,
    event: EventName,
    /// The payload's `action`, its `repository.full_name` (stored with
    /// the claim for operators' filters), and what an ordered destination
    /// keys its legs by.
    fields: payload::Fields,
    /// `X-GitHub-Tenant` (GHE.com), kept with the claim.
    github_tenant: Option<String>,
}

/// What step 3 found.
enum Checked {
    /// Answered without a claim (`ping`, an event the source does not take).
    Answered(Answer),
    /// A delivery to claim.
    Delivery(Delivery),
}

/// Step 3: the event, the delivery id, the hook id, and the payload's
/// `action` and `repository.full_name` (the body is verified by now).
fn check_headers(
    source: &Source,
    headers: &HeaderMap,
    content_type: ContentType,
    body: &[u8],
    seen: &mut Seen,
) -> Result<Checked, Reject> {
    let event = match single(headers, "x-github-event")? {
        Some(raw) => EventName::parse(raw)?,
        None => return Err(KeyError::MissingEvent.into()),
    };
    seen.event = Some(event.clone());
    let ignored = || {
        Checked::Answered(Answer::new(
            StatusCode::OK,
            Outcome::Ignored,
            json!({"status": "ignored"}),
        ))
    };
    if event.as_str() == "ping" {
        return Ok(Checked::Answered(Answer::new(
            StatusCode::OK,
            Outcome::Pong,
            json!({"status": "pong"}),
        )));
    }
    if !source.events.takes_event(&event) {
        return Ok(ignored());
    }
    let delivery_id = match single(headers, "x-github-delivery")? {
        Some(raw) => DeliveryId::parse(raw)?,
        None => return Err(KeyError::MissingDeliveryId.into()),
    };
    seen.delivery_id = Some(delivery_id.clone());
    let hook_id = HookId::parse(single(headers, "x-github-hook-id")?)?;
    let github_tenant = github_tenant(single(headers, "x-github-tenant")?)?;
    if !source.accepts_hook(&hook_id) {
        // The hook id is not covered by the signature: without this pin a
        // captured request could be replayed under another hook id.
        return Err(Reject::new(
            StatusCode::FORBIDDEN,
            Outcome::UnknownHook,
            "X-GitHub-Hook-ID is not a hook this source accepts",
        ));
    }
    let bad_payload = |e: payload::PayloadError| {
        Reject::new(StatusCode::BAD_REQUEST, Outcome::BadPayload, e.to_string())
    };
    let json = payload::json_text(content_type, body).map_err(bad_payload)?;
    let fields = payload::fields(&json).map_err(bad_payload)?;
    if !source.events.takes(&event, fields.action.as_deref()) {
        return Ok(ignored());
    }
    let key = DeliveryKey::github(source.name.clone(), hook_id, delivery_id);
    if telemetry::enabled() {
        let span = Span::current();
        span.record(
            "delivery_key",
            format!(
                "{}:{}:{}:{}",
                key.provider, key.source, key.hook_id, key.delivery_id
            ),
        );
        span.record("delivery_id", key.delivery_id.as_str());
        span.record("event", event.as_str());
        span.record("action", fields.action.as_deref().unwrap_or(""));
    }
    Ok(Checked::Delivery(Delivery {
        key,
        event,
        fields,
        github_tenant,
    }))
}

/// `X-GitHub-Tenant`, sent by GitHub Enterprise Cloud with data residency
/// (GHE.com): the enterprise's subdomain, 1 to 63 letters, digits and
/// hyphens; anything else is a bad header (400).
fn github_tenant(raw: Option<&[u8]>) -> Result<Option<String>, Reject> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let valid = (1..=63).contains(&raw.len())
        && raw.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-');
    if !valid {
        return Err(Reject::new(
            StatusCode::BAD_REQUEST,
            Outcome::BadHeader,
            "X-GitHub-Tenant must be 1 to 63 letters, digits and hyphens",
        ));
    }
    Ok(Some(String::from_utf8_lossy(raw).into_owned()))
}

/// Step 4: the claim of the delivery's legs and its body, one statement
/// (batched with other requests' claims when they arrive together). Each
/// destination's filters are decided here, once, from the verified
/// payload, and recorded with the leg. The body, compressed here, is
/// written with the legs: once the claim commits, Postgres can publish
/// each leg again whatever becomes of its message. With traces on, the
/// same statement finds the traces the request links to (a reconciler's
/// ask, a first claim's request).
async fn claim(
    state: &State,
    source: &Source,
    delivery: &Delivery,
    body: &Body,
    encoded: Encoded,
    traceparent: Option<String>,
) -> Result<Claimed, Reject> {
    let legs = source
        .destinations
        .iter()
        .map(|d| LegRequest {
            destination: d.name.clone(),
            filtered: d
                .takes(
                    &delivery.event,
                    delivery.fields.action.as_deref(),
                    delivery.fields.repository.as_deref(),
                )
                .err()
                .map(|why| why.reason()),
            order_key: d.ordering.and_then(|o| o.key(&delivery.fields)),
            fair: d.fair_key(&delivery.fields),
            stale_clock: d.stale_clock(&delivery.fields),
        })
        .collect();
    let request = ClaimRequest {
        origin: Origin {
            traceparent,
            github_tenant: delivery.github_tenant.clone(),
        },
        key: delivery.key.clone(),
        event: delivery.event.as_str().to_owned(),
        action: delivery.fields.action.clone(),
        repository: delivery.fields.repository.clone(),
        body_sha256: Sha256::digest(&body.bytes).into(),
        guarded: source.replay_guard,
        pinned: source.hook_ids.is_some(),
        legs,
        body: encoded,
    };
    let started = std::time::Instant::now();
    let claimed = match &state.batcher {
        Some(batcher) => batcher.submit(request).await.map_err(DbError::from),
        None => match state.pool.get().await {
            Ok(client) => match deliveries::claim_linked(&client, &state.policy, &request).await {
                Ok(claim) => Ok(Ok(claim)),
                Err(e) => e.refusal().map(Err).ok_or(e),
            },
            Err(e) => Err(DbError::from(e)),
        },
    };
    metrics::histogram!(hookinbox::metrics::CLAIM_SECONDS).record(started.elapsed());
    let claimed = match claimed {
        Ok(Ok(claim)) => claim,
        // Postgres refused this claim alone: about its input when the
        // error is a data or constraint one.
        Ok(Err(refusal)) if refusal.is_row_level() => {
            tracing::warn!(error = %refusal, "claim refused");
            return Err(Reject::new(
                StatusCode::BAD_REQUEST,
                Outcome::BadPayload,
                "the delivery cannot be stored",
            ));
        }
        Ok(Err(refusal)) => {
            tracing::warn!(error = %refusal, "claim refused");
            return Err(Reject::unavailable("database"));
        }
        Err(e) => {
            tracing::warn!(error = %e, "claim failed");
            return Err(Reject::unavailable("database"));
        }
    };
    hookinbox::kill_point!("ingest.after_claim");
    Ok(claimed)
}

/// Step 5: publish each leg's key to its destination's queue, every
/// confirm in flight at once, and answer only after each is confirmed; a
/// leg whose publish fails is recorded as due in Postgres instead (the
/// claim wrote its body), and the answer is 202 all the same. A delivery
/// with no leg to publish is answered from its legs' states.
async fn publish_or_park(
    state: &State,
    source: &Source,
    delivery: Delivery,
    claimed: Claim,
    copy: Option<BodyCopy>,
) -> Result<Answer, Reject> {
    let legs = match claimed {
        Claim::Legs(legs) => legs,
        Claim::Conflict => {
            return Ok(Answer::new(
                StatusCode::CONFLICT,
                Outcome::Conflict,
                json!({"status": "conflict", "error": "this delivery was received before with a different body"}),
            ));
        }
        Claim::ReplayedBody => {
            return Ok(Answer::new(
                StatusCode::CONFLICT,
                Outcome::ReplayedBody,
                json!({"status": "conflict", "error": "this body was received before under another delivery id"}),
            ));
        }
        Claim::Copy { of, legs } => {
            // The event's claim wrote its body: an untaken leg whose ingest
            // died before publishing is published again from it.
            let mut answer = json!({"status": "duplicate", "copy_of_hook_id": of.hook_id.as_str()});
            if !legs.is_empty() {
                answer["state"] = legs_state(&legs).as_str().into();
            }
            return Ok(Answer::new(StatusCode::OK, Outcome::Copy, answer));
        }
    };
    // (destination, token, attempts, held, whether its message carries
    // the body's copy)
    let mut to_publish: Vec<(DestinationName, ClaimToken, i32, bool, bool)> = Vec::new();
    let mut only_republishes = true;
    let mut filtered = 0;
    let mut existing: Vec<(DestinationName, Status)> = Vec::new();
    for (destination, leg) in legs {
        match leg {
            LegClaim::Claimed {
                token,
                attempts,
                held,
                reclaimed,
            } => {
                only_republishes = false;
                // A new leg: never run, never replayed, as the copy's
                // reader assumes.
                let copied = copy.is_some()
                    && !reclaimed
                    && attempts == 0
                    && source
                        .destinations
                        .iter()
                        .any(|d| d.name == destination && d.reads_body_apart());
                to_publish.push((destination, token, attempts, held, copied));
            }
            // A republish only ever concerns a claim nobody took (attempts 0).
            LegClaim::Republish { token } => {
                to_publish.push((destination, token, 0, false, false));
            }
            LegClaim::Filtered => filtered += 1,
            LegClaim::Duplicate(status) => existing.push((destination, status)),
        }
    }
    if to_publish.is_empty() {
        return Ok(answer_without_publish(filtered, &existing));
    }
    let publishes = to_publish
        .into_iter()
        .map(|(destination, token, attempts, held, copied)| {
            let job = Envelope {
                // The worker's span continues this trace.
                trace: JobTrace {
                    parent: Span::current().traceparent(),
                    origin: None,
                },
                key: delivery.key.clone().leg(destination),
                event: delivery.event.clone(),
                action: delivery.fields.action.clone(),
                token,
                attempts: Some(attempts),
                carried: None,
                copy: if copied { copy.clone() } else { None },
            };
            async move {
                if held && hold_leg(state, &job, attempts).await {
                    return Ok(false);
                }
                publish_leg(state, job, attempts).await
            }
        });
    let mut parked = false;
    for published in futures::future::join_all(publishes).await {
        parked |= published?;
    }
    Ok(if parked {
        Answer::accepted(Outcome::Parked, Some(("parked", true)))
    } else if only_republishes {
        Answer::accepted(Outcome::Republished, Some(("republished", true)))
    } else {
        Answer::accepted(Outcome::Accepted, None)
    })
}

/// Publishes one leg's job with a confirm; when the broker fails, records
/// the leg as due in Postgres. `Ok(true)` when it was so recorded, `Err`
/// when it could be neither.
async fn publish_leg(state: &State, job: Envelope, attempts_at_claim: i32) -> Result<bool, Reject> {
    let started = std::time::Instant::now();
    let published = state.publisher.publish(&job).await;
    metrics::histogram!(hookinbox::metrics::PUBLISH_CONFIRM_SECONDS).record(started.elapsed());
    match published {
        Ok(()) => Ok(false),
        Err(e) => {
            tracing::warn!(
                error = %e,
                delivery_id = %job.key.delivery_id,
                destination = %job.key.destination,
                "publish failed; the leg is due in Postgres"
            );
            park(state, &job, attempts_at_claim, &e.to_string()).await
        }
    }
}

/// A leg its claim found crowded (its installation has its share queued
/// or in flight at a fair destination): held in Postgres until a release
/// publishes it (see [`deliveries::hold_fair`]): a change of its state, its
/// body already written by the claim. `true` when it was held. `false`
/// when it was not: Postgres failed, or the hold moved nothing; the caller
/// then publishes it, as it would have without fairness.
///
/// Why publish when the hold moved nothing: the leg then has no message,
/// and although the scheduler would publish it once the reaper marked it
/// lost, that is minutes away. If a worker or a concurrent claim did have
/// it, the extra message is harmless: its take presents the claim's old
/// token and finds the leg taken or resolved.
async fn hold_leg(state: &State, job: &Envelope, attempts_at_claim: i32) -> bool {
    let held = match state.pool.get().await {
        Ok(client) => deliveries::hold_fair(&client, &job.key, job.token, attempts_at_claim).await,
        Err(e) => Err(DbError::from(e)),
    };
    match held {
        Ok(true) => {
            metrics::counter!(hookinbox::metrics::FAIR_HELD).increment(1);
            true
        }
        Ok(false) => {
            tracing::warn!(
                delivery_id = %job.key.delivery_id,
                destination = %job.key.destination,
                "the leg moved on before it could be held for its installation's turn; publishing it"
            );
            false
        }
        Err(error) => {
            tracing::warn!(%error, "could not hold the leg for its installation's turn; publishing it");
            false
        }
    }
}

/// No leg to publish: a delivery every destination filtered out (200
/// `filtered`), or a duplicate, answered from its legs' states. A copy
/// racing a claim still processing needs nothing written: that claim wrote
/// the body, and its legs are published again from it if their messages
/// never went out.
fn answer_without_publish(filtered: usize, existing: &[(DestinationName, Status)]) -> Answer {
    if existing.is_empty() && filtered > 0 {
        return Answer::new(
            StatusCode::OK,
            Outcome::Filtered,
            json!({"status": "filtered"}),
        );
    }
    let status = legs_state(existing);
    let code = if status.is_done() {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    duplicate(code, status)
}

fn duplicate(code: StatusCode, status: Status) -> Answer {
    Answer::new(
        code,
        Outcome::Duplicate,
        json!({"status": "duplicate", "state": status.as_str()}),
    )
}

/// The broker failed us: record the leg as due now (guarded by the token
/// and the attempts the claim saw, see [`deliveries::publish_failed`]), so
/// the scheduler publishes it once the broker is back. Postgres holds its
/// body since the claim, so the answer is still 202; only if Postgres
/// fails too is it 503. `Ok(true)`: recorded; `Ok(false)`: the guard
/// refused because the leg is in flight after all.
async fn park(
    state: &State,
    job: &Envelope,
    attempts_at_claim: i32,
    error: &str,
) -> Result<bool, Reject> {
    let parked = match state.pool.get().await {
        Ok(client) => {
            deliveries::publish_failed(&client, &job.key, job.token, error, attempts_at_claim).await
        }
        Err(e) => Err(DbError::from(e)),
    };
    match parked {
        Ok(true) => Ok(true),
        // The guard refused: a worker took the job after all (the confirm
        // was lost, not the message) or a concurrent redelivery claimed it
        // anew. Either way it is in flight.
        Ok(false) => Ok(false),
        Err(e) => {
            tracing::warn!(error = %e, "could not record the unpublished leg");
            Err(Reject::unavailable("message broker and database"))
        }
    }
}

/// One word for a delivery's state from its legs': processing while any
/// leg is (or there are none yet), failed while any is, then completed,
/// or filtered when every leg was.
fn legs_state(legs: &[(DestinationName, Status)]) -> Status {
    if legs.is_empty() || legs.iter().any(|(_, s)| *s == Status::Processing) {
        Status::Processing
    } else if legs.iter().any(|(_, s)| *s == Status::Failed) {
        Status::Failed
    } else if legs.iter().all(|(_, s)| *s == Status::Filtered) {
        Status::Filtered
    } else {
        Status::Completed
    }
}
