//! The HTTP application of `hookinbox-ingest`.
//!
//! A request goes through the steps of the design, in this order, and
//! nothing touches Postgres before step 4:
//!
//! 1. Read the raw body, bounded in size while streaming and in time; refuse
//!    any `Content-Encoding` but identity (the signature covers the bytes on
//!    the wire) and any content type but JSON or form.
//! 2. Verify `X-Hub-Signature-256` over the raw bytes, in constant time.
//! 3. Check the event (answer `ping` and events the source does not take
//!    without a claim), the delivery id and the hook id.
//! 4. Claim the delivery key in one statement.
//! 5. Publish the job with a confirm; answer 202 only after the confirm.
//!    If the publish fails, park the body in Postgres as a retry due now
//!    and answer 202 all the same: the scheduler publishes it later.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderMap};
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use bytes::{Bytes, BytesMut};
use deadpool_postgres::Pool;
use futures::StreamExt;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::broker::{Job, Publisher, Topology};
use crate::config::IngestConfig;
use crate::db::{self, DbError};
use crate::deliveries::{self, Claim, NewClaim, ParkedBody, Policy, Status};
use crate::key::{DeliveryId, DeliveryKey, EventName, HookId, KeyError, SourceName};
use crate::payload::{self, ContentType};
use crate::signature::SignatureError;
use crate::sources::Source;

/// Stops a running server (see [`IngestApp::handle`]).
pub use actix_web::dev::ServerHandle;

/// Why ingest could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Postgres failed (pool or migrations).
    #[error(transparent)]
    Db(#[from] DbError),
    /// The listener could not be bound.
    #[error("cannot listen: {0}")]
    Listen(#[from] std::io::Error),
}

/// Shared by every request.
struct State {
    config: IngestConfig,
    policy: Policy,
    pool: Pool,
    publisher: Publisher,
    secret_matches: Arc<SecretMatches>,
    /// Bounds the requests in progress: past it, answer 429 at once
    /// rather than queue work (and memory) without end.
    in_flight: Arc<tokio::sync::Semaphore>,
    /// Group commit of claims; `None` claims each request on its own.
    batcher: Option<crate::batcher::ClaimBatcher>,
}

/// How often each secret position of each source verified a request.
/// Rotation can be finished once the old secret's count stops moving; the
/// same counts are exported as `hookinbox_secret_matches_total`.
#[derive(Default, Debug)]
pub struct SecretMatches(Mutex<BTreeMap<(String, usize), u64>>);

impl SecretMatches {
    fn record(&self, source: &SourceName, position: usize) {
        metrics::counter!(
            crate::metrics::SECRET_MATCHES,
            "source" => source.as_str().to_owned(),
            "position" => position.to_string()
        )
        .increment(1);
        if let Ok(mut counts) = self.0.lock() {
            *counts
                .entry((source.as_str().to_owned(), position))
                .or_default() += 1;
        }
    }

    /// Matches of `source`'s secret at `position` (0 is the first listed).
    pub fn get(&self, source: &str, position: usize) -> u64 {
        self.0
            .lock()
            .map(|c| c.get(&(source.to_owned(), position)).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

/// A built, bound, not yet running ingest server.
pub struct IngestApp {
    server: actix_web::dev::Server,
    port: u16,
    metrics_port: u16,
    secret_matches: Arc<SecretMatches>,
}

impl IngestApp {
    /// Builds the pool (migrating when `HOOKINBOX_AUTO_MIGRATE` is on), the
    /// publisher and the listener. Binding port 0 picks a free port; see
    /// [`IngestApp::port`].
    pub async fn build(config: IngestConfig) -> Result<Self, StartError> {
        let listener = TcpListener::bind(config.listen)?;
        Self::build_with_listener(config, listener).await
    }

    /// Like [`IngestApp::build`], on a listener the caller bound.
    pub async fn build_with_listener(
        config: IngestConfig,
        listener: TcpListener,
    ) -> Result<Self, StartError> {
        let common = &config.common;
        let pool = common.db_pool()?;
        if common.auto_migrate {
            db::migrate(&pool).await?;
        }
        let publisher = Publisher::new(
            &common.amqp_url,
            "hookinbox-ingest",
            Topology::new(&common.queue_prefix),
            Duration::from_millis(common.publish_timeout_ms),
        )
        .with_window(common.publish_window);
        // Declares the topology now if the broker is up; if not, the first
        // publish connects and /readyz says so meanwhile.
        if let Err(e) = publisher.connect().await {
            tracing::warn!(error = %e, "RabbitMQ not reachable at start; will retry on publish");
        }
        let port = listener.local_addr()?.port();
        let ready_pool = pool.clone();
        let readiness: crate::metrics::Readiness = Arc::new(move || {
            let pool = ready_pool.clone();
            Box::pin(async move { db::ping(&pool).await })
        });
        let (metrics_port, metrics_server) =
            crate::metrics::serve(config.metrics_listen, readiness)?;
        tokio::spawn(metrics_server);
        let secret_matches = Arc::new(SecretMatches::default());
        let in_flight = Arc::new(tokio::sync::Semaphore::new(config.max_in_flight));
        let batcher = (config.claim_batch > 1)
            .then(|| crate::batcher::claims(pool.clone(), common.policy(), config.claim_batch));
        let state = web::Data::new(State {
            batcher,
            in_flight,
            policy: common.policy(),
            config,
            pool,
            publisher,
            secret_matches: secret_matches.clone(),
        });
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .route("/healthz", web::get().to(healthz))
                .route("/readyz", web::get().to(readyz))
                .service(web::resource("/webhooks/github").route(web::post().to(receive_default)))
                .service(
                    web::resource("/webhooks/github/{source}").route(web::post().to(receive_named)),
                )
                .default_service(web::to(not_found))
        })
        // Slowloris: the request head must arrive within this time.
        .client_request_timeout(Duration::from_secs(5))
        .listen(listener)?
        .run();
        Ok(Self {
            server,
            port,
            metrics_port,
            secret_matches,
        })
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of the metrics listener.
    pub fn metrics_port(&self) -> u16 {
        self.metrics_port
    }

    /// Secret matches by source and position, for rotation.
    pub fn secret_matches(&self) -> Arc<SecretMatches> {
        self.secret_matches.clone()
    }

    /// A handle that can stop the server.
    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Serves until the server is stopped (SIGTERM, SIGINT or the handle).
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }
}

/// A refusal: a status and a message that names what was wrong and never
/// echoes a secret, a signature or the payload.
struct Reject {
    status: StatusCode,
    message: String,
    outcome: &'static str,
}

impl Reject {
    fn new(status: StatusCode, outcome: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            outcome,
        }
    }
}

impl From<KeyError> for Reject {
    fn from(e: KeyError) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_header", e.to_string())
    }
}

impl From<SignatureError> for Reject {
    fn from(e: SignatureError) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "bad_signature", e.to_string())
    }
}

fn unavailable(what: &str) -> Reject {
    Reject::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        format!("{what} unavailable, retry later"),
    )
}

fn answer(status: StatusCode, body: serde_json::Value) -> HttpResponse {
    HttpResponse::build(status).json(body)
}

async fn healthz() -> HttpResponse {
    answer(StatusCode::OK, json!({"status": "ok"}))
}

async fn readyz(state: web::Data<State>) -> HttpResponse {
    let postgres = db::ping(&state.pool).await;
    let rabbitmq = state.publisher.is_connected().await || state.publisher.connect().await.is_ok();
    let status = if postgres && rabbitmq {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    answer(
        status,
        json!({"status": if status == StatusCode::OK {"ok"} else {"error"},
               "postgres": postgres, "rabbitmq": rabbitmq}),
    )
}

async fn not_found() -> HttpResponse {
    answer(
        StatusCode::NOT_FOUND,
        json!({"status": "error", "error": "no such route"}),
    )
}

async fn receive_default(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<State>,
) -> HttpResponse {
    receive(req, body, state, SourceName::DEFAULT).await
}

async fn receive_named(
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
/// ([`crate::metrics::event_label`]).
#[derive(Default)]
struct Seen {
    /// The configured source, or `None` for an unknown one.
    source: Option<SourceName>,
    /// The event, once the signature verified.
    event: Option<EventName>,
    /// The delivery id, once validated.
    delivery_id: Option<DeliveryId>,
}

async fn receive(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<State>,
    source: &str,
) -> HttpResponse {
    let started = std::time::Instant::now();
    let mut seen = Seen::default();
    let Ok(_permit) = state.in_flight.clone().try_acquire_owned() else {
        metrics::counter!(
            crate::metrics::INGEST_REQUESTS,
            "source" => "unknown",
            "event" => "",
            "outcome" => "overloaded"
        )
        .increment(1);
        return HttpResponse::TooManyRequests()
            .insert_header((header::RETRY_AFTER, "1"))
            .json(json!({"status": "error", "error": "overloaded, retry later"}));
    };
    let result = handle(&req, body, &state, source, &mut seen).await;
    let (status, outcome, body) = match result {
        Ok((status, body, outcome)) => (status, outcome, body),
        Err(reject) => {
            if reject.status == StatusCode::UNAUTHORIZED {
                metrics::counter!(
                    crate::metrics::SIGNATURE_FAILURES,
                    "source" => seen.source.as_ref().map_or("unknown", |s| s.as_str()).to_owned()
                )
                .increment(1);
            }
            let body = json!({"status": "error", "error": reject.message});
            (reject.status, reject.outcome, body)
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
        .map_or("", |e| crate::metrics::event_label(e.as_str()));
    tracing::info!(
        source = %source_label,
        event = seen.event.as_ref().map_or("", |e| e.as_str()),
        delivery_id = seen.delivery_id.as_ref().map_or("", |d| d.as_str()),
        status = status.as_u16(),
        outcome,
        error = body["error"].as_str().unwrap_or(""),
        "webhook answered"
    );
    metrics::counter!(
        crate::metrics::INGEST_REQUESTS,
        "source" => source_label,
        "event" => event_label,
        "outcome" => outcome
    )
    .increment(1);
    metrics::histogram!(crate::metrics::INGEST_REQUEST_SECONDS).record(started.elapsed());
    answer(status, body)
}

/// The value of a header that must appear at most once.
fn single<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<Option<&'a [u8]>, KeyError> {
    let mut values = headers.get_all(name);
    let first = values.next();
    if values.next().is_some() {
        return Err(KeyError::Duplicated(name));
    }
    Ok(first.map(|v| v.as_bytes()))
}

async fn handle(
    req: &HttpRequest,
    body: web::Payload,
    state: &State,
    source_name: &str,
    seen: &mut Seen,
) -> Result<(StatusCode, serde_json::Value, &'static str), Reject> {
    let config = &state.config;
    let source = SourceName::parse(source_name)
        .ok()
        .and_then(|name| config.sources.get(&name))
        .ok_or_else(|| Reject::new(StatusCode::NOT_FOUND, "unknown_source", "unknown source"))?;
    seen.source = Some(source.name.clone());
    let headers = req.headers();

    // 1. The raw body, bounded.
    let content_type = check_framing(headers)?;
    let body = read_body(body, headers, config.max_body_bytes, config.body_timeout).await?;

    // 2. The signature, before anything else is trusted.
    let position = verify(source, headers, &body)?;
    state.secret_matches.record(&source.name, position);

    // 3. Event, delivery id, hook id.
    let event = match single(headers, "x-github-event")? {
        Some(raw) => EventName::parse(raw)?,
        None => return Err(KeyError::MissingEvent.into()),
    };
    seen.event = Some(event.clone());
    if event.as_str() == "ping" {
        return Ok((StatusCode::OK, json!({"status": "pong"}), "pong"));
    }
    if !source.events.takes_event(&event) {
        return Ok((StatusCode::OK, json!({"status": "ignored"}), "ignored"));
    }
    let delivery_id = match single(headers, "x-github-delivery")? {
        Some(raw) => DeliveryId::parse(raw)?,
        None => return Err(KeyError::MissingDeliveryId.into()),
    };
    seen.delivery_id = Some(delivery_id.clone());
    let hook_id = HookId::parse(single(headers, "x-github-hook-id")?)?;
    if !source.accepts_hook(&hook_id) {
        // The hook id is not covered by the signature: without this pin a
        // captured request could be replayed under another hook id.
        return Err(Reject::new(
            StatusCode::FORBIDDEN,
            "unknown_hook",
            "X-GitHub-Hook-ID is not a hook this source accepts",
        ));
    }
    let json = payload::json_text(content_type, &body)
        .map_err(|e| Reject::new(StatusCode::BAD_REQUEST, "bad_payload", e.to_string()))?;
    let action = payload::action(&json)
        .map_err(|e| Reject::new(StatusCode::BAD_REQUEST, "bad_payload", e.to_string()))?;
    drop(json);
    if !source.events.takes(&event, action.as_deref()) {
        return Ok((StatusCode::OK, json!({"status": "ignored"}), "ignored"));
    }
    let key = DeliveryKey::github(source.name.clone(), hook_id, delivery_id);

    // 4. The claim: one statement decides.
    let body_sha256: [u8; 32] = Sha256::digest(&body).into();
    let claim_started = std::time::Instant::now();
    let claim = match &state.batcher {
        Some(batcher) => batcher
            .submit(deliveries::OwnedClaim {
                key: key.clone(),
                event: event.as_str().to_owned(),
                action: action.clone(),
                body_sha256,
            })
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "claim failed");
                unavailable("database")
            })?,
        None => {
            let client = state.pool.get().await.map_err(|e| {
                tracing::warn!(error = %e, "Postgres unavailable");
                unavailable("database")
            })?;
            deliveries::claim(
                &client,
                &state.policy,
                NewClaim {
                    key: &key,
                    event: event.as_str(),
                    action: action.as_deref(),
                    body_sha256: &body_sha256,
                },
            )
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "claim failed");
                unavailable("database")
            })?
        }
    };
    metrics::histogram!(crate::metrics::CLAIM_SECONDS).record(claim_started.elapsed());
    crate::kill_point!("ingest.after_claim");

    let (token, attempts_at_claim, republish) = match claim {
        Claim::Claimed {
            token, attempts, ..
        } => (token, attempts, false),
        Claim::Republish { token } => (token, 0, true),
        Claim::Conflict => {
            return Ok((
                StatusCode::CONFLICT,
                json!({"status": "conflict", "error": "this delivery was received before with a different body"}),
                "conflict",
            ));
        }
        Claim::Duplicate(Status::Processing) => {
            // A copy racing an earlier claim whose publish we cannot see.
            // If that ingest died before publishing, nothing would carry the
            // delivery: park this copy's body, so that once the claim is
            // reaped as lost the scheduler republishes it. Completion
            // deletes it. The 2xx is given only once the body is parked.
            park_copy(
                state,
                &key,
                &content_type_header(headers),
                &github_headers(headers),
                &body,
            )
            .await?;
            return Ok((
                StatusCode::ACCEPTED,
                json!({"status": "duplicate", "state": Status::Processing.as_str()}),
                "duplicate",
            ));
        }
        Claim::Duplicate(status) => {
            let code = if status == Status::Completed {
                StatusCode::OK
            } else {
                StatusCode::ACCEPTED
            };
            return Ok((
                code,
                json!({"status": "duplicate", "state": status.as_str()}),
                "duplicate",
            ));
        }
    };

    // 5. Publish, and answer only after the confirm.
    let job = Job {
        key,
        event,
        action,
        token,
        content_type: content_type_header(headers),
        github_headers: github_headers(headers),
        body,
    };
    let publish_started = std::time::Instant::now();
    let published = state.publisher.publish(&job).await;
    metrics::histogram!(crate::metrics::PUBLISH_CONFIRM_SECONDS).record(publish_started.elapsed());
    match published {
        Ok(()) if republish => Ok((
            StatusCode::ACCEPTED,
            json!({"status": "accepted", "republished": true}),
            "republished",
        )),
        Ok(()) => Ok((
            StatusCode::ACCEPTED,
            json!({"status": "accepted"}),
            "accepted",
        )),
        Err(e) => {
            tracing::warn!(error = %e, delivery_id = %job.key.delivery_id, "publish failed; parking");
            park(state, &job, attempts_at_claim, &e.to_string()).await
        }
    }
}

/// The broker failed us: park the body and record the delivery as due now
/// (guarded by the token and the attempts the claim saw, see [`deliveries::park_due`]), so the
/// scheduler publishes it once the broker is back. Postgres holds it now,
/// so the answer is still 202; only if Postgres fails too is it 503.
async fn park(
    state: &State,
    job: &Job,
    attempts_at_claim: i32,
    error: &str,
) -> Result<(StatusCode, serde_json::Value, &'static str), Reject> {
    let parked = match state.pool.get().await {
        Ok(client) => {
            deliveries::park_due(
                &client,
                &job.key,
                job.token,
                error,
                attempts_at_claim,
                ParkedBody::of(job),
            )
            .await
        }
        Err(e) => Err(DbError::from(e)),
    };
    match parked {
        Ok(true) => Ok((
            StatusCode::ACCEPTED,
            json!({"status": "accepted", "parked": true}),
            "parked",
        )),
        // The guard refused: a worker took the job after all (the confirm
        // was lost, not the message) or a concurrent redelivery claimed it
        // anew. Either way it is in flight.
        Ok(false) => Ok((
            StatusCode::ACCEPTED,
            json!({"status": "accepted"}),
            "accepted",
        )),
        Err(e) => {
            tracing::warn!(error = %e, "could not park the delivery");
            Err(unavailable("message broker and database"))
        }
    }
}

fn content_type_header(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_default()
}

/// Parks a racing copy's body for a claim still processing (see
/// [`deliveries::park_copy`]); 503 if Postgres cannot take it.
async fn park_copy(
    state: &State,
    key: &DeliveryKey,
    content_type: &str,
    github_headers: &[(String, String)],
    body: &[u8],
) -> Result<(), Reject> {
    let parked = ParkedBody {
        content_type,
        headers: github_headers,
        body,
    };
    let result = match state.pool.get().await {
        Ok(client) => deliveries::park_copy(&client, key, parked).await,
        Err(e) => Err(DbError::from(e)),
    };
    result.map_err(|e| {
        tracing::warn!(error = %e, "could not park a duplicate's body");
        unavailable("database")
    })
}

/// The original `X-GitHub-*` headers, carried with the job so a handler can
/// pass them on.
fn github_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| name.as_str().starts_with("x-github-"))
        .filter_map(|(name, value)| {
            value
                .to_str()
                .ok()
                .map(|v| (name.as_str().to_owned(), v.to_owned()))
        })
        .collect()
}

/// Content encoding, content type and declared length, before any byte of
/// the body is read.
fn check_framing(headers: &HeaderMap) -> Result<ContentType, Reject> {
    for encoding in headers.get_all(header::CONTENT_ENCODING) {
        let identity = encoding
            .to_str()
            .map(|e| {
                e.split(',')
                    .all(|p| p.trim().eq_ignore_ascii_case("identity") || p.trim().is_empty())
            })
            .unwrap_or(false);
        if !identity {
            return Err(Reject::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "encoded",
                "Content-Encoding is not supported: the signature covers the bytes as sent",
            ));
        }
    }
    let content_type = single(headers, "content-type")
        .map_err(|_| {
            Reject::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "bad_content_type",
                "Content-Type sent more than once",
            )
        })?
        .and_then(|v| std::str::from_utf8(v).ok())
        .filter(|v| v.len() <= 255)
        .and_then(ContentType::parse)
        .ok_or_else(|| {
            Reject::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "bad_content_type",
                "Content-Type must be application/json or application/x-www-form-urlencoded",
            )
        })?;
    Ok(content_type)
}

fn too_large(cap: usize) -> Reject {
    Reject::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("body larger than {cap} bytes"),
    )
}

/// Reads the body, refusing it as soon as it passes the cap (a declared
/// `Content-Length` over the cap is refused before reading) and when it does
/// not arrive within `timeout`.
async fn read_body(
    mut body: web::Payload,
    headers: &HeaderMap,
    cap: usize,
    timeout: Duration,
) -> Result<Bytes, Reject> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > cap) {
        return Err(too_large(cap));
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(8 * 1024));
    let read = async {
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|_| {
                Reject::new(
                    StatusCode::BAD_REQUEST,
                    "bad_body",
                    "the body could not be read",
                )
            })?;
            if buf.len() + chunk.len() > cap {
                return Err(too_large(cap));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(())) => Ok(buf.freeze()),
        Ok(Err(reject)) => Err(reject),
        Err(_) => Err(Reject::new(
            StatusCode::REQUEST_TIMEOUT,
            "slow_body",
            format!("the body did not arrive within {timeout:?}"),
        )),
    }
}

/// Step 2: exactly one `X-Hub-Signature-256`, matching one of the source's
/// secrets. `X-Hub-Signature` (SHA-1) alone is refused.
fn verify(source: &Source, headers: &HeaderMap, body: &[u8]) -> Result<usize, Reject> {
    let header = single(headers, "x-hub-signature-256")
        .map_err(|_| SignatureError::Duplicated)?
        .ok_or(SignatureError::Missing)?;
    Ok(source.secrets.verify(body, header)?)
}
