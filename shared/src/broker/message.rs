//! The job as an AMQP message: its envelope (the leg's key, event, action,
//! token, attempts and trace) rides in headers, and the payload is empty.
//! The body is in Postgres (`deliveries::bodies`), and the worker's take
//! returns it: the broker carries a key, so that a message it loses can be
//! published again from Postgres. A dead-letter copy carries the same plus
//! why and when it failed.
//!
//! A message published before bodies lived in Postgres carries the raw
//! body as its payload, its `Content-Type` and its `X-GitHub-*` headers:
//! [`decode`] keeps them as the envelope's `carried` body, which the
//! worker uses only when Postgres holds none.

use bytes::Bytes;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};

use super::long_string;
use crate::deliveries::DeadLetter;
use crate::job::{Body, Envelope, JobTrace, is_carried_header};
use crate::key::{ClaimToken, EventName, LegKey};

const H_PROVIDER: &str = "hookinbox-provider";
const H_SOURCE: &str = "hookinbox-source";
const H_HOOK_ID: &str = "hookinbox-hook-id";
const H_DELIVERY_ID: &str = "hookinbox-delivery-id";
/// The leg's destination; absent on a message of a leg claimed before
/// destinations existed (the empty, legacy destination).
const H_DESTINATION: &str = "hookinbox-destination";
const H_EVENT: &str = "hookinbox-event";
const H_ACTION: &str = "hookinbox-action";
/// The claim token. Named anew when messages stopped carrying the body: a
/// worker of the version before, which would run a message without a
/// payload as an empty body, finds no token and dead-letters it as
/// malformed instead; its leg, still processing in Postgres, is reaped
/// and published again once a worker of this version runs.
const H_TOKEN: &str = "hookinbox-claim-token";
/// The claim token on a message published before ([`H_TOKEN`]).
const H_TOKEN_BEFORE: &str = "hookinbox-token";
/// Takes so far: when the job was published, or, on the worker's own
/// dead-letter copy, when it failed (a message the broker dead-letters
/// keeps the count it was published with).
const H_ATTEMPTS: &str = "hookinbox-attempts";
/// The W3C trace context of the span that published the job (the AMQP
/// binding of trace context names it as HTTP does).
const H_TRACEPARENT: &str = "traceparent";
/// The delivery's first trace, on a job published again (see
/// [`JobTrace::origin`]).
const H_TRACE_ORIGIN: &str = "hookinbox-trace-origin";
/// A `traceparent` is 55 characters; anything much longer is not one.
const MAX_TRACEPARENT: usize = 128;

/// Why a message could not be read as a job.
#[derive(Debug, thiserror::Error)]
#[error("malformed job message: {0}")]
pub struct MalformedJob(&'static str);

/// The properties a job is published with.
pub(super) fn properties(job: &Envelope) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(H_PROVIDER.into(), long_string(&job.key.provider));
    headers.insert(H_SOURCE.into(), long_string(job.key.source.as_str()));
    headers.insert(H_HOOK_ID.into(), long_string(job.key.hook_id.as_str()));
    headers.insert(
        H_DELIVERY_ID.into(),
        long_string(job.key.delivery_id.as_str()),
    );
    if !job.key.destination.is_legacy() {
        headers.insert(
            H_DESTINATION.into(),
            long_string(job.key.destination.as_str()),
        );
    }
    headers.insert(H_EVENT.into(), long_string(job.event.as_str()));
    if let Some(action) = &job.action {
        headers.insert(H_ACTION.into(), long_string(action));
    }
    headers.insert(H_TOKEN.into(), long_string(&job.token.to_string()));
    if let Some(attempts) = job.attempts {
        headers.insert(H_ATTEMPTS.into(), AMQPValue::LongInt(attempts));
    }
    if let Some(parent) = &job.trace.parent {
        headers.insert(H_TRACEPARENT.into(), long_string(parent));
    }
    if let Some(origin) = &job.trace.origin {
        headers.insert(H_TRACE_ORIGIN.into(), long_string(origin));
    }
    BasicProperties::default()
        // 2 = persistent: written to disk, survives a broker restart.
        .with_delivery_mode(2)
        .with_message_id(ShortString::from(job.key.delivery_id.as_str().to_owned()))
        .with_headers(headers)
}

/// Reads a job's envelope back from a consumed message.
pub fn decode(properties: &BasicProperties, data: Vec<u8>) -> Result<Envelope, MalformedJob> {
    let headers = properties
        .headers()
        .as_ref()
        .ok_or(MalformedJob("no headers"))?;
    let text = |name: &'static str| -> Result<String, MalformedJob> {
        match headers.inner().get(name) {
            Some(AMQPValue::LongString(s)) => std::str::from_utf8(s.as_bytes())
                .map(str::to_owned)
                .map_err(|_| MalformedJob(name)),
            _ => Err(MalformedJob(name)),
        }
    };
    let destination = match headers.inner().get(H_DESTINATION) {
        None => String::new(),
        Some(_) => text(H_DESTINATION)?,
    };
    let key = LegKey::from_parts(
        &text(H_PROVIDER)?,
        &text(H_SOURCE)?,
        &text(H_HOOK_ID)?,
        &text(H_DELIVERY_ID)?,
        &destination,
    )
    .map_err(|e| {
        MalformedJob(match e.part() {
            "source" => H_SOURCE,
            "hook_id" => H_HOOK_ID,
            "destination" => H_DESTINATION,
            _ => H_DELIVERY_ID,
        })
    })?;
    let event = EventName::parse(text(H_EVENT)?.as_bytes()).map_err(|_| MalformedJob(H_EVENT))?;
    let action = text(H_ACTION).ok();
    let token = text(H_TOKEN)
        .or_else(|_| text(H_TOKEN_BEFORE))?
        .parse()
        .map(ClaimToken)
        .map_err(|_| MalformedJob(H_TOKEN))?;
    // Absent or of another type: the message does not say, and the worker
    // takes the job before running it.
    let attempts = match headers.inner().get(H_ATTEMPTS) {
        Some(AMQPValue::LongInt(n)) => Some(*n),
        _ => None,
    };
    // A trace context that is not text of a sane length is dropped: the
    // job runs all the same, in a trace of its own.
    let trace_header = |name: &'static str| text(name).ok().filter(|v| v.len() <= MAX_TRACEPARENT);
    let trace = JobTrace {
        parent: trace_header(H_TRACEPARENT),
        origin: trace_header(H_TRACE_ORIGIN),
    };
    // A payload: a message from before bodies lived in Postgres.
    let carried = (!data.is_empty()).then(|| Body {
        content_type: properties
            .content_type()
            .as_ref()
            .map(|c| c.as_str().to_owned())
            .unwrap_or_else(|| "application/json".to_owned()),
        github_headers: headers
            .inner()
            .iter()
            .filter(|(name, _)| is_carried_header(name.as_str()))
            .filter_map(|(name, value)| match value {
                AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes())
                    .ok()
                    .map(|v| (name.as_str().to_owned(), v.to_owned())),
                _ => None,
            })
            .collect(),
        bytes: Bytes::from(data),
    });
    Ok(Envelope {
        key,
        event,
        action,
        token,
        attempts,
        trace,
        carried,
    })
}

/// The properties of a job's dead-letter copy: the job's, plus the class,
/// the attempts, the first and last failure and the idempotency key.
pub(super) fn dead_letter_properties(job: &Envelope, dead: &DeadLetter) -> BasicProperties {
    let properties = properties(job);
    let mut headers = properties.headers().clone().unwrap_or_default();
    headers.insert(
        "hookinbox-error-class".into(),
        long_string(dead.class.as_str()),
    );
    headers.insert(H_ATTEMPTS.into(), AMQPValue::LongInt(dead.attempts));
    headers.insert(
        "hookinbox-first-failed-at".into(),
        long_string(&dead.first_failed_at.to_rfc3339()),
    );
    headers.insert(
        "hookinbox-last-failed-at".into(),
        long_string(&dead.last_failed_at.to_rfc3339()),
    );
    headers.insert(
        "hookinbox-idempotency-key".into(),
        long_string(&job.key.idempotency_key()),
    );
    properties.with_headers(headers)
}
