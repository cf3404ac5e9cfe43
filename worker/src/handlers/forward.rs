//! The `forward` handler: POSTs each leg's raw body to its destination's URL.
//!
//! The request carries the body byte for byte, the original `X-GitHub-*`
//! headers and `Content-Type`, the destination's extra `headers`, and
//! `Idempotency-Key: <provider>:<source>:<hook_id>:<delivery_id>:<destination>`.
//! GitHub's own signature headers are never passed on (they were made with
//! the source's secret). With the destination's secret it signs the body
//! as its `signature` says: `github` sends `X-Hub-Signature-256:
//! sha256=<hex>` and GitHub's `User-Agent` as received, so that an
//! unmodified GitHub webhook receiver (an octokit or Probot app) verifies
//! it with its own secret; `hookinbox` sends `X-Hookinbox-Signature-256`;
//! `none` sends neither.
//!
//! A crash between the POST and the completion sends the same leg again,
//! always with the same `Idempotency-Key` and `X-GitHub-Delivery`:
//! receivers must dedupe on it. That is the price of an effect outside
//! Postgres. An operator's replay sends it again on purpose, with the same
//! key too, and `X-Hookinbox-Replay: N` (the leg's replays so far), so that
//! a receiver that dedupes can tell a replay it should run again from a
//! redelivery it has seen.
//!
//! Every connection passes the egress policy first (`egress.rs`): a
//! refused address sends nothing and fails the attempt as
//! [`HandlerError::Blocked`], counted in
//! `hookinbox_destination_blocked_total`.
//!
//! The answer is classified ([`classify`]): 2xx is done; 408, 429 and 5xx
//! are worth retrying; an answer that says the destination itself is wrong
//! (401, 403, 404, 405, 410, a redirect, which is never followed) and a
//! DNS or TLS failure are the destination's, not the delivery's
//! ([`HandlerError::Destination`]); any other answer (400, 422, …) is
//! permanent for this leg. At most the first 4 KiB of the answer's body
//! are read, for the attempt log, each secret header value in them masked
//! (a receiver may echo one).
//!
//! With traces on, each attempt is a span and the request carries its W3C
//! `traceparent`, so the receiver's own spans join the delivery's trace.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER, USER_AGENT};

use hookinbox::config::{ForwardConfig, ForwardSignature, mask_secret_values};
use hookinbox::deliveries::EXCERPT_BYTES;
use hookinbox::egress::{Blocked, Reason};
use hookinbox::job::Job;
use hookinbox::key::{DestinationName, SourceName};
use hookinbox::telemetry::SpanTrace;
use hookinbox::telemetry::context::TRACEPARENT;
use tracing::Instrument;

use super::egress::{GuardedResolver, blocked_in, literal_address};
use super::{Effect, Handler, HandlerError};

/// The header a replayed leg carries: which replay of it this is (its
/// replays so far, from 1).
pub const REPLAY_HEADER: &str = "x-hookinbox-replay";

/// The header carrying the hookinbox-style forward signature.
pub const SIGNATURE_HEADER: &str = "x-hookinbox-signature-256";

/// The header carrying the GitHub-style forward signature.
pub const GITHUB_SIGNATURE_HEADER: &str = "x-hub-signature-256";

/// GitHub's signature headers: never passed on from the original request.
const GITHUB_SIGNATURES: [&str; 2] = ["x-hub-signature-256", "x-hub-signature"];

/// Builds the HTTP client of one `forward` destination. Redirects are not
/// followed: a 3xx answer to a POST is a misconfiguration, not a place to
/// resend the payload. No proxy is used: a proxy would resolve the name
/// itself, past the egress policy. Its resolver checks every address it
/// connects to; its TLS trusts the destination's `ca_file` (instead of the
/// built-in roots) and presents its client certificate, when set.
fn client(config: &ForwardConfig) -> Result<reqwest::Client, reqwest::Error> {
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver::new(
            config.allow_networks.clone(),
            config.hosts_file.clone(),
        )))
        .pool_idle_timeout(Duration::from_secs(60))
        .user_agent(concat!("hookinbox/", env!("CARGO_PKG_VERSION")));
    if let Some(roots) = &config.tls.roots {
        builder = builder.tls_built_in_root_certs(false);
        for root in roots {
            builder = builder.add_root_certificate(root.clone());
        }
    }
    if let Some(identity) = &config.tls.identity {
        builder = builder.identity(identity.clone());
    }
    builder.build()
}

/// POSTs deliveries to one destination.
pub struct Forward {
    client: reqwest::Client,
    config: ForwardConfig,
    /// The address the URL names directly, checked at each attempt (no
    /// resolver sees it).
    literal: Option<IpAddr>,
    source: SourceName,
    destination: DestinationName,
    /// Its secret header values, masked in the answers it keeps.
    secret_values: Vec<String>,
}

impl Forward {
    /// The forwarder of destination `destination` of `source`, with an
    /// HTTP client of its own (its TLS and egress settings are its own).
    pub fn new(
        source: &SourceName,
        destination: &DestinationName,
        config: &ForwardConfig,
    ) -> Result<Self, reqwest::Error> {
        Ok(Self {
            client: client(config)?,
            literal: literal_address(&config.url),
            config: config.clone(),
            source: source.clone(),
            destination: destination.clone(),
            secret_values: config.secret_values(),
        })
    }

    /// Counts and logs a refusal (with the address, never the URL or the
    /// payload) and says what failed.
    fn refused(&self, blocked: Blocked) -> HandlerError {
        self.count_refusal(blocked.reason);
        tracing::warn!(
            source = %self.source,
            destination = %self.destination,
            address = %blocked.address,
            reason = %blocked.reason,
            "forward refused by the egress policy: nothing was sent"
        );
        HandlerError::Blocked {
            message: blocked.to_string(),
        }
    }

    fn count_refusal(&self, reason: Reason) {
        metrics::counter!(
            hookinbox::metrics::DESTINATION_BLOCKED,
            "source" => self.source.as_str().to_owned(),
            "destination" => self.destination.as_str().to_owned(),
            "reason" => reason.as_str()
        )
        .increment(1);
    }

    /// The request of `job`: its body, headers and signature.
    fn request(&self, job: &Job) -> reqwest::RequestBuilder {
        let github = self.config.signature == ForwardSignature::Github;
        let mut request = self
            .client
            .post(self.config.url.clone())
            .timeout(self.config.timeout)
            .header(CONTENT_TYPE, &job.content_type)
            .header("idempotency-key", job.key.idempotency_key());
        if job.replays > 0 {
            request = request.header(REPLAY_HEADER, job.replays);
        }
        for (name, value) in &job.github_headers {
            if GITHUB_SIGNATURES.contains(&name.as_str()) {
                continue;
            }
            if name == "user-agent" {
                // GitHub's `GitHub-Hookshot/…`, for a receiver that looks.
                if github {
                    request = request.header(USER_AGENT, value.as_str());
                }
                continue;
            }
            request = request.header(name.as_str(), value.as_str());
        }
        for extra in &self.config.headers {
            request = request.header(extra.name.clone(), extra.value.clone());
        }
        if let Some(secret) = &self.config.secret {
            match self.config.signature {
                ForwardSignature::Github => {
                    request = request.header(GITHUB_SIGNATURE_HEADER, secret.sign(&job.body));
                }
                ForwardSignature::Hookinbox => {
                    request = request.header(SIGNATURE_HEADER, secret.sign(&job.body));
                }
                ForwardSignature::None => {}
            }
        }
        // `Bytes` clones share the buffer: the body is not copied.
        request.body(job.body.clone())
    }
}

#[async_trait::async_trait]
impl Handler for Forward {
    async fn handle(&self, job: &Job, effect: &mut Effect) -> Result<(), HandlerError> {
        // An address in the URL never reaches the resolver: check it here,
        // at every attempt, as the resolver checks a name's.
        if let Some(ip) = self.literal {
            self.config
                .allow_networks
                .check(ip)
                .map_err(|blocked| self.refused(blocked))?;
        }
        // The attempt's span, when traces are on; its `traceparent` goes
        // with the request so the receiver continues the delivery's trace.
        let span = attempt_span();
        let mut request = self.request(job);
        if let Some(traceparent) = span.traceparent() {
            request = request.header(TRACEPARENT, traceparent);
        }
        match request.send().instrument(span.clone()).await {
            Ok(mut response) => {
                let status = response.status();
                span.record("http.response.status_code", status.as_u16());
                if status.is_redirection() {
                    // Not followed, wherever it points: counted with the
                    // refusals (the Location is not logged: it may carry a
                    // token).
                    self.count_refusal(Reason::Redirect);
                }
                let answer = classify(status, response.headers(), SystemTime::now());
                let kept = excerpt(&mut response, &self.secret_values).await;
                effect.note_answer(Some(status.as_u16()), kept);
                // The receiver has the delivery; the completion has not
                // committed. A crash here sends it again with the same key.
                if answer.is_ok() {
                    hookinbox::kill_point!("worker.mid_effect");
                }
                answer
            }
            // Messages name the failure, never the URL (it may carry a token).
            Err(e) => Err(match blocked_in(&e) {
                Some(blocked) => self.refused(blocked),
                None if e.is_timeout() => HandlerError::transient(format!(
                    "receiver did not answer within {:?}",
                    self.config.timeout
                )),
                None => unreachable(&e),
            }),
        }
    }

    /// A POST elsewhere: never database-only, whatever the job.
    fn database_only_leg(&self, _key: &hookinbox::key::LegKey) -> Option<bool> {
        Some(false)
    }
}

/// One attempt's span (a child of the worker's handler span), or a
/// disabled span when traces are off. Never the URL (it may carry a
/// token), the body or a signature.
fn attempt_span() -> tracing::Span {
    if !hookinbox::telemetry::enabled() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "forward",
        otel.name = "forward.attempt",
        otel.kind = "client",
        http.request.method = "POST",
        http.response.status_code = tracing::field::Empty,
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
    );
    span.record_ids();
    span
}

/// At most the first [`EXCERPT_BYTES`] of an answer's body, for the attempt
/// log, with each of `secrets` masked (a receiver may echo a secret header
/// it was sent); the rest is never read (the connection is dropped with
/// it).
async fn excerpt(response: &mut reqwest::Response, secrets: &[String]) -> Option<Bytes> {
    let mut kept = BytesMut::new();
    while kept.len() < EXCERPT_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = EXCERPT_BYTES - kept.len();
                kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    if kept.is_empty() {
        return None;
    }
    if secrets.is_empty() {
        return Some(kept.freeze());
    }
    let mut masked = mask_secret_values(&kept, secrets);
    masked.truncate(EXCERPT_BYTES);
    Some(masked.into())
}

/// A request that got no answer: a name that does not resolve and a TLS
/// handshake that fails are the destination's failures (its address or its
/// certificate is wrong); a refused or reset connection is worth retrying.
fn unreachable(e: &reqwest::Error) -> HandlerError {
    let chain = error_chain(e);
    let destination = |message: &str| HandlerError::Destination {
        message: message.to_owned(),
        answered: false,
        gone: false,
    };
    if chain.contains("dns error") || chain.contains("failed to lookup address") {
        destination("the receiver's host name does not resolve")
    } else if chain.contains("certificate")
        || chain.contains("tls")
        || chain.contains("handshake")
        || chain.contains("invalid peer")
    {
        destination("the TLS handshake with the receiver failed")
    } else if e.is_connect() {
        HandlerError::transient("cannot connect to the receiver")
    } else {
        HandlerError::transient("request to the receiver failed")
    }
}

/// An error and its sources, lower case, for classification only (it may
/// hold the URL, so it is never logged or stored).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text.to_lowercase()
}

/// 2xx is done; a 429 or 503 with `Retry-After` defers the leg to that
/// time (no attempt spent: the receiver is alive and said when); 408, 429
/// and 5xx are otherwise worth retrying (honouring `Retry-After`); 401,
/// 403, 404, 405, 410 and redirects say the destination itself is wrong
/// (410: gone for good); every other answer is permanent for this leg.
pub fn classify(
    status: StatusCode,
    headers: &HeaderMap,
    now: SystemTime,
) -> Result<(), HandlerError> {
    if status.is_success() {
        return Ok(());
    }
    let code = status.as_u16();
    let message = format!("receiver answered {code}");
    let asked = headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| retry_after(v, now));
    if let Some(asked) = asked
        && (status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE)
    {
        return Err(HandlerError::defer(
            format!("{message} with Retry-After: deferred"),
            later(now, asked),
        ));
    }
    if status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
    {
        return Err(HandlerError::Transient {
            message,
            retry_after: asked,
        });
    }
    if status.is_redirection() {
        return Err(HandlerError::Destination {
            message: format!("{message} (a redirect, which is not followed: fix the URL)"),
            answered: true,
            gone: false,
        });
    }
    if matches!(code, 401 | 403 | 404 | 405 | 410) {
        return Err(HandlerError::Destination {
            message,
            answered: true,
            gone: code == 410,
        });
    }
    Err(HandlerError::permanent(message))
}

/// For a handler that calls GitHub's API: GitHub's answer when it says
/// "rate limited", as a deferral (see [`HandlerError::Defer`]), following
/// GitHub's guidance for a `403` or `429`: wait `Retry-After` seconds when
/// it is present; else, when `x-ratelimit-remaining` is `0`, until
/// `x-ratelimit-reset` (UTC epoch seconds); else, for a `429`, a minute.
/// `None` for any other answer (a `403` without these headers is a
/// permission error, not a limit).
pub fn github_rate_limit(
    status: StatusCode,
    headers: &HeaderMap,
    now: SystemTime,
) -> Option<HandlerError> {
    if status != StatusCode::FORBIDDEN && status != StatusCode::TOO_MANY_REQUESTS {
        return None;
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let message = format!("GitHub answered {}: rate limited", status.as_u16());
    if let Some(asked) = header("retry-after").and_then(|v| retry_after(v, now)) {
        return Some(HandlerError::defer(message, later(now, asked)));
    }
    if header("x-ratelimit-remaining").map(str::trim) == Some("0")
        && let Some(reset) = header("x-ratelimit-reset").and_then(|v| v.trim().parse::<u64>().ok())
    {
        let at = SystemTime::UNIX_EPOCH
            .checked_add(Duration::from_secs(reset))
            .unwrap_or_else(|| later(now, Duration::MAX));
        return Some(HandlerError::defer(message, at.max(now)));
    }
    (status == StatusCode::TOO_MANY_REQUESTS)
        .then(|| HandlerError::defer(message, now + Duration::from_secs(60)))
}

/// `at + wait`, saturating at a century from `at` (a far side's number can
/// be anything; the runtime fails a deferral past its horizon anyway).
fn later(at: SystemTime, wait: Duration) -> SystemTime {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    at.checked_add(wait.min(CENTURY)).unwrap_or(at + CENTURY)
}

/// `Retry-After` in either form: delay-seconds or an HTTP-date. A date in
/// the past means now. The retry policy caps it.
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hookinbox::key::{DeliveryId, DeliveryKey, EventName, HookId};
    use hookinbox::signature::Secret;

    fn job(body: &str, headers: &[(&str, &str)]) -> Job {
        let key = DeliveryKey::github(
            SourceName::default_source(),
            HookId::parse(Some(b"123")).expect("hook id"),
            DeliveryId::parse(b"d-1").expect("delivery id"),
        );
        Job {
            key: key.leg(DestinationName::parse("app").expect("name")),
            event: EventName::parse(b"push").expect("event"),
            action: None,
            token: hookinbox::key::ClaimToken(uuid::Uuid::nil()),
            attempts: None,
            replays: 0,
            content_type: "application/json".to_owned(),
            github_headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            body: Bytes::from(body.to_owned()),
            trace: hookinbox::job::JobTrace::default(),
        }
    }

    fn built(signature: ForwardSignature, secret: Option<&str>, job: &Job) -> reqwest::Request {
        let mut config = ForwardConfig::new(
            reqwest::Url::parse("https://receiver.example/hook").expect("url"),
            secret.map(Secret::new),
            Duration::from_secs(1),
        );
        config.signature = signature;
        let forward = Forward::new(
            &SourceName::default_source(),
            &DestinationName::parse("app").expect("name"),
            &config,
        )
        .expect("client");
        forward.request(job).build().expect("request")
    }

    #[test]
    fn github_signing_matches_githubs_test_vector_and_passes_githubs_headers() {
        // docs.github.com, "Validating webhook deliveries": the secret
        // "It's a Secret to Everybody" over "Hello, World!".
        let headers = [
            ("x-github-delivery", "d-1"),
            ("x-github-event", "push"),
            ("x-github-hook-id", "123"),
            ("x-github-hook-installation-target-type", "repository"),
            ("x-github-hook-installation-target-id", "42"),
            ("user-agent", "GitHub-Hookshot/abc1234"),
            // Never carried, but never passed on if it were.
            ("x-hub-signature-256", "sha256=made-with-the-source-secret"),
            ("x-hub-signature", "sha1=made-with-the-source-secret"),
        ];
        let job = job("Hello, World!", &headers);
        let request = built(
            ForwardSignature::Github,
            Some("It's a Secret to Everybody"),
            &job,
        );
        let h = request.headers();
        assert_eq!(
            h.get("x-hub-signature-256").and_then(|v| v.to_str().ok()),
            Some("sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17")
        );
        assert!(h.get("x-hub-signature").is_none());
        assert!(h.get(SIGNATURE_HEADER).is_none());
        for (name, value) in &headers[..6] {
            assert_eq!(
                h.get(*name).and_then(|v| v.to_str().ok()),
                Some(*value),
                "{name}"
            );
        }
        assert_eq!(
            h.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()),
            Some("application/json")
        );
        assert_eq!(
            request.body().and_then(|b| b.as_bytes()),
            Some(&b"Hello, World!"[..])
        );
    }

    #[test]
    fn hookinbox_signing_keeps_its_header_and_none_sends_no_signature() {
        let job = job(
            "Hello, World!",
            &[
                ("user-agent", "GitHub-Hookshot/abc1234"),
                ("x-hub-signature-256", "sha256=x"),
            ],
        );
        let request = built(
            ForwardSignature::Hookinbox,
            Some("It's a Secret to Everybody"),
            &job,
        );
        let h = request.headers();
        assert_eq!(
            h.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok()),
            Some("sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17")
        );
        assert!(h.get("x-hub-signature-256").is_none());
        assert!(h.get(USER_AGENT).is_none(), "the client's own, set at send");
        let request = built(ForwardSignature::None, None, &job);
        let h = request.headers();
        for name in [SIGNATURE_HEADER, "x-hub-signature-256", "x-hub-signature"] {
            assert!(h.get(name).is_none(), "{name}");
        }
    }

    #[test]
    fn a_replay_says_which_with_the_same_idempotency_key() {
        let first = job("{}", &[]);
        let replayed = Job {
            replays: 2,
            ..first.clone()
        };
        let sent = built(ForwardSignature::None, None, &first);
        assert!(sent.headers().get(REPLAY_HEADER).is_none());
        let again = built(ForwardSignature::None, None, &replayed);
        assert_eq!(
            again.headers().get(REPLAY_HEADER).map(|v| v.as_bytes()),
            Some(&b"2"[..])
        );
        assert_eq!(
            again.headers().get("idempotency-key"),
            sent.headers().get("idempotency-key")
        );
    }

    #[test]
    fn retry_after_both_forms() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").expect("date");
        assert_eq!(retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("soon", now), None);
    }

    #[test]
    fn answers_are_classified() {
        let none = HeaderMap::new();
        let now = SystemTime::now();
        assert!(classify(StatusCode::OK, &none, now).is_ok());
        assert!(classify(StatusCode::NO_CONTENT, &none, now).is_ok());
        for transient in [408, 429, 500, 502, 503, 504] {
            let status = StatusCode::from_u16(transient).expect("status");
            let err = classify(status, &none, now).expect_err("fails");
            assert!(err.is_transient(), "{transient}");
        }
        for permanent in [400, 409, 413, 415, 422] {
            let status = StatusCode::from_u16(permanent).expect("status");
            let err = classify(status, &none, now).expect_err("fails");
            assert!(!err.is_transient(), "{permanent}");
        }
        for destination in [301, 302, 307, 308, 401, 403, 404, 405, 410] {
            let status = StatusCode::from_u16(destination).expect("status");
            let err = classify(status, &none, now).expect_err("fails");
            assert!(
                matches!(err, HandlerError::Destination { answered: true, gone, .. } if gone == (destination == 410)),
                "{destination}: {err:?}"
            );
        }
    }

    #[test]
    fn a_429_or_503_with_retry_after_defers_and_other_retry_afters_stay_transient() {
        let now = SystemTime::now();
        let mut asked = HeaderMap::new();
        asked.insert(RETRY_AFTER, "60".parse().expect("header"));
        for deferring in [429, 503] {
            let status = StatusCode::from_u16(deferring).expect("status");
            let err = classify(status, &asked, now).expect_err("fails");
            assert!(
                matches!(err, HandlerError::Defer { until, .. } if until == now + Duration::from_secs(60)),
                "{deferring}: {err:?}"
            );
            assert_eq!(err.class(), hookinbox::deliveries::ErrorClass::Deferred);
        }
        for transient in [408, 500, 502, 504] {
            let status = StatusCode::from_u16(transient).expect("status");
            let err = classify(status, &asked, now).expect_err("fails");
            assert!(
                matches!(err, HandlerError::Transient { retry_after: Some(d), .. } if d == Duration::from_secs(60)),
                "{transient}: {err:?}"
            );
        }
        // GitHub's limits, for a handler that calls its API.
        let until = |e: Option<HandlerError>| match e {
            Some(HandlerError::Defer { until, .. }) => Some(until),
            _ => None,
        };
        let mut primary = HeaderMap::new();
        primary.insert("x-ratelimit-remaining", "0".parse().expect("header"));
        primary.insert("x-ratelimit-reset", "4102444800".parse().expect("header"));
        assert_eq!(
            until(github_rate_limit(StatusCode::FORBIDDEN, &primary, now)),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(4_102_444_800))
        );
        assert_eq!(
            until(github_rate_limit(StatusCode::FORBIDDEN, &asked, now)),
            Some(now + Duration::from_secs(60))
        );
        assert_eq!(
            until(github_rate_limit(
                StatusCode::TOO_MANY_REQUESTS,
                &HeaderMap::new(),
                now
            )),
            Some(now + Duration::from_secs(60))
        );
        assert!(github_rate_limit(StatusCode::FORBIDDEN, &HeaderMap::new(), now).is_none());
        // Numbers too large for a time saturate; nothing panics.
        let mut huge = HeaderMap::new();
        huge.insert("retry-after", u64::MAX.to_string().parse().expect("header"));
        assert!(until(github_rate_limit(StatusCode::TOO_MANY_REQUESTS, &huge, now)).is_some());
        assert!(classify(StatusCode::TOO_MANY_REQUESTS, &huge, now).is_err());
        let mut far = HeaderMap::new();
        far.insert("x-ratelimit-remaining", "0".parse().expect("header"));
        far.insert(
            "x-ratelimit-reset",
            u64::MAX.to_string().parse().expect("header"),
        );
        assert!(until(github_rate_limit(StatusCode::FORBIDDEN, &far, now)).is_some());
        assert!(github_rate_limit(StatusCode::NOT_FOUND, &primary, now).is_none());
        // An unreadable Retry-After defers nothing.
        let mut unreadable = HeaderMap::new();
        unreadable.insert(RETRY_AFTER, "soon".parse().expect("header"));
        let err = classify(StatusCode::TOO_MANY_REQUESTS, &unreadable, now).expect_err("fails");
        assert!(matches!(err, HandlerError::Transient { .. }), "{err:?}");
    }
}
