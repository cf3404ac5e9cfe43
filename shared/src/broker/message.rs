//! The job as an AMQP message: its envelope (the leg's key, event, action,
//! token, attempts and trace) rides in headers, and the payload is empty.
//! The body is in Postgres (`deliveries::bodies`), and the worker's take
//! returns it: the broker carries a key, so that a message it loses can be
//! published again from Postgres. A dead-letter copy carries the same plus
//! why and when it failed.
//!
//! The one exception: a new `store` leg's first message carries a copy of
//! its body ([`BodyCopy`], packed as Postgres stores it, its packing in
//! headers), which saves the one-statement path a read. Nothing else
//! publishes one.
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
use crate::job::{Body, BodyCopy, Envelope, JobTrace, is_carried_header};
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
/// On a message that carries a copy of its body ([`BodyCopy`]): how the
/// payload is packed (`lz4` or `identity`), the body's length as received,
/// and its carried headers as stored (JSON).
const H_BODY_ENCODING: &str = "hookinbox-body-encoding";
const H_BODY_SIZE: &str = "hookinbox-body-size";
const H_BODY_HEADERS: &str = "hookinbox-body-headers";
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
    let properties = BasicProperties::default()
        // 2 = persistent: written to disk, survives a broker restart.
        .with_delivery_mode(2)
        .with_message_id(ShortString::from(job.key.delivery_id.as_str().to_owned()));
    match &job.copy {
        Some(copy) => {
            headers.insert(H_BODY_ENCODING.into(), long_string(&copy.encoding));
            headers.insert(H_BODY_SIZE.into(), AMQPValue::LongInt(copy.size));
            headers.insert(H_BODY_HEADERS.into(), long_string(&copy.headers));
            properties
                .with_content_type(ShortString::from(copy.content_type.clone()))
                .with_headers(headers)
        }
        None => properties.with_headers(headers),
    }
}

/// A job's payload: its body's copy, or nothing.
pub(super) fn payload(job: &Envelope) -> &[u8] {
    job.copy.as_ref().map_or(&[], |copy| &copy.bytes[..])
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
    let content_type = || {
        properties
            .content_type()
            .as_ref()
            .map(|c| c.as_str().to_owned())
            .unwrap_or_else(|| "application/json".to_owned())
    };
    // A payload with the copy's headers: a copy of the body. A copy whose
    // headers are not readable is dropped: the worker reads the body.
    if headers.inner().contains_key(H_BODY_ENCODING) {
        let size = match headers.inner().get(H_BODY_SIZE) {
            Some(AMQPValue::LongInt(n)) => Some(*n),
            _ => None,
        };
        let copy = match (text(H_BODY_ENCODING), size, text(H_BODY_HEADERS)) {
            (Ok(encoding), Some(size), Ok(body_headers)) if !data.is_empty() => Some(BodyCopy {
                content_type: content_type(),
                headers: body_headers,
                size,
                encoding,
                bytes: Bytes::from(data),
            }),
            _ => None,
        };
        return Ok(Envelope {
            key,
            event,
            action,
            token,
            attempts,
            trace,
            carried: None,
            copy,
        });
    }
    // A payload without them: a message from before bodies lived in
    // Postgres.
    let carried = (!data.is_empty()).then(|| Body {
        content_type: content_type(),
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
        copy: None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deliveries::{Encoded, Stored};

    fn envelope(copy: Option<BodyCopy>) -> Envelope {
        Envelope {
            key: LegKey::from_parts("github", "default", "1", "d-1", "store").expect("key"),
            event: EventName::parse(b"push").expect("event"),
            action: None,
            token: ClaimToken(uuid::Uuid::nil()),
            attempts: Some(0),
            trace: JobTrace::default(),
            carried: None,
            copy,
        }
    }

    fn body() -> Body {
        Body {
            content_type: "application/json".to_owned(),
            github_headers: vec![("x-github-event".to_owned(), "push".to_owned())],
            bytes: Bytes::from_static(b"{\"zen\":\"zen zen zen zen zen zen\"}"),
        }
    }

    #[test]
    fn a_copy_of_the_body_goes_and_comes_back_as_packed() {
        let copy = Encoded::of(&body()).copy();
        let job = envelope(Some(copy.clone()));
        let read = decode(&properties(&job), payload(&job).to_vec()).expect("a job");
        assert_eq!(read.copy.as_ref(), Some(&copy));
        assert!(read.carried.is_none());
        let unpacked = Stored::from_copy(copy).expect("headers").decode();
        assert_eq!(unpacked, Ok(body()));
    }

    #[test]
    fn a_message_without_a_copy_has_no_payload() {
        let job = envelope(None);
        assert!(payload(&job).is_empty());
        let read = decode(&properties(&job), Vec::new()).expect("a job");
        assert!(read.copy.is_none() && read.carried.is_none());
    }

    #[test]
    fn a_copy_that_does_not_say_its_size_is_dropped_not_taken_for_an_old_body() {
        let job = envelope(Some(Encoded::of(&body()).copy()));
        let mut properties = properties(&job);
        let mut headers = properties.headers().clone().unwrap_or_default();
        headers.insert(H_BODY_SIZE.into(), long_string("many"));
        properties = properties.with_headers(headers);
        let read = decode(&properties, payload(&job).to_vec()).expect("a job");
        assert!(read.copy.is_none(), "the worker reads the body instead");
        assert!(read.carried.is_none(), "packed bytes are not a body");
    }
}
