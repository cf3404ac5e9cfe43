//! The `forward` handler: POSTs each leg's raw body to its destination's URL.
//!
//! The request carries the body byte for byte, the original `X-GitHub-*`
//! headers and `Content-Type`, and `Idempotency-Key:
//! <provider>:<source>:<hook_id>:<delivery_id>:<destination>`. With a
//! forward secret it also carries `X-Hookinbox-Signature-256:
//! sha256=<hex>`, the HMAC-SHA256 of the body, so the receiver can check
//! where it came from.
//!
//! A crash between the POST and the completion sends the same leg again,
//! always with the same `Idempotency-Key`: receivers must dedupe on it.
//! That is the price of an effect outside Postgres.
//!
//! The answer is classified ([`classify`]): 2xx is done; 408, 429 and 5xx
//! are worth retrying; an answer that says the destination itself is wrong
//! (401, 403, 404, 405, 410, a redirect, which is never followed) and a
//! DNS or TLS failure are the destination's, not the delivery's
//! ([`HandlerError::Destination`]); any other answer (400, 422, …) is
//! permanent for this leg. At most the first 4 KiB of the answer's body
//! are read, for the attempt log.
//!
//! With traces on, each attempt is a span and the request carries its W3C
//! `traceparent`, so the receiver's own spans join the delivery's trace.

use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER};

use hookinbox::config::ForwardConfig;
use hookinbox::deliveries::EXCERPT_BYTES;
use hookinbox::job::Job;
use hookinbox::signature::Secret;
use hookinbox::telemetry::SpanTrace;
use hookinbox::telemetry::context::TRACEPARENT;
use tracing::Instrument;

use super::{Effect, Handler, HandlerError};

/// The header carrying the forward signature.
pub const SIGNATURE_HEADER: &str = "x-hookinbox-signature-256";

/// Builds the one pooled HTTP client a worker shares between its `forward`
/// sources. Redirects are not followed: a 3xx answer to a POST is a
/// misconfiguration, not a place to resend the payload.
pub fn client() -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_idle_timeout(Duration::from_secs(60))
        .user_agent(concat!("hookinbox/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// POSTs deliveries to one URL.
pub struct Forward {
    client: reqwest::Client,
    url: reqwest::Url,
    secret: Option<Secret>,
    timeout: Duration,
}

impl Forward {
    /// A forwarder using the shared `client`.
    pub fn new(client: reqwest::Client, config: &ForwardConfig) -> Self {
        Self {
            client,
            url: config.url.clone(),
            secret: config.secret.clone(),
            timeout: config.timeout,
        }
    }
}

#[async_trait::async_trait]
impl Handler for Forward {
    async fn handle(&self, job: &Job, effect: &mut Effect) -> Result<(), HandlerError> {
        let mut request = self
            .client
            .post(self.url.clone())
            .timeout(self.timeout)
            .header(CONTENT_TYPE, &job.content_type)
            .header("idempotency-key", job.key.idempotency_key());
        for (name, value) in &job.github_headers {
            request = request.header(name.as_str(), value.as_str());
        }
        if let Some(secret) = &self.secret {
            request = request.header(SIGNATURE_HEADER, secret.sign(&job.body));
        }
        // The attempt's span, when traces are on; its `traceparent` goes
        // with the request so the receiver continues the delivery's trace.
        let span = attempt_span();
        if let Some(traceparent) = span.traceparent() {
            request = request.header(TRACEPARENT, traceparent);
        }
        // `Bytes` clones share the buffer: the body is not copied.
        let sent = request
            .body(job.body.clone())
            .send()
            .instrument(span.clone())
            .await;
        match sent {
            Ok(mut response) => {
                let status = response.status();
                span.record("http.response.status_code", status.as_u16());
                let answer = classify(status, response.headers(), SystemTime::now());
                effect.note_answer(Some(status.as_u16()), excerpt(&mut response).await);
                // The receiver has the delivery; the completion has not
                // committed. A crash here sends it again with the same key.
                if answer.is_ok() {
                    hookinbox::kill_point!("worker.mid_effect");
                }
                answer
            }
            // Messages name the failure, never the URL (it may carry a token).
            Err(e) if e.is_timeout() => Err(HandlerError::transient(format!(
                "receiver did not answer within {:?}",
                self.timeout
            ))),
            Err(e) => Err(unreachable(&e)),
        }
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
/// log; the rest is never read (the connection is dropped with it).
async fn excerpt(response: &mut reqwest::Response) -> Option<Bytes> {
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
    (!kept.is_empty()).then(|| kept.freeze())
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

/// 2xx is done; 408, 429 and 5xx are worth retrying (honouring
/// `Retry-After`); 401, 403, 404, 405, 410 and redirects say the
/// destination itself is wrong (410: gone for good); every other answer is
/// permanent for this leg.
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
    if status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
    {
        return Err(HandlerError::Transient {
            message,
            retry_after: headers
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| retry_after(v, now)),
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
}
