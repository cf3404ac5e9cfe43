//! The request's bytes and headers before anything is trusted: framing
//! (encoding, content type, declared length), the body read bounded in size
//! and time, and the headers a job carries along.

use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderMap};
use actix_web::web;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use hookinbox::job::is_carried_header;
use hookinbox::key::KeyError;
use hookinbox::payload::ContentType;

use crate::admission::Ticket;
use crate::answer::{Outcome, Reject};

/// The value of a header that must appear at most once.
pub(crate) fn single<'a>(
    headers: &'a HeaderMap,
    name: &'static str,
) -> Result<Option<&'a [u8]>, KeyError> {
    let mut values = headers.get_all(name);
    let first = values.next();
    if values.next().is_some() {
        return Err(KeyError::Duplicated(name));
    }
    Ok(first.map(|v| v.as_bytes()))
}

pub(crate) fn content_type_header(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_default()
}

/// The original `X-GitHub-*` headers and `User-Agent`, carried with the
/// job so a handler can pass them on (see `hookinbox::job::is_carried_header`).
pub(crate) fn github_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| is_carried_header(name.as_str()))
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
pub(crate) fn check_framing(headers: &HeaderMap) -> Result<ContentType, Reject> {
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
                Outcome::Encoded,
                "Content-Encoding is not supported: the signature covers the bytes as sent",
            ));
        }
    }
    let content_type = single(headers, "content-type")
        .map_err(|_| {
            Reject::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                Outcome::BadContentType,
                "Content-Type sent more than once",
            )
        })?
        .and_then(|v| std::str::from_utf8(v).ok())
        .filter(|v| v.len() <= 255)
        .and_then(ContentType::parse)
        .ok_or_else(|| {
            Reject::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                Outcome::BadContentType,
                "Content-Type must be application/json or application/x-www-form-urlencoded",
            )
        })?;
    Ok(content_type)
}

fn too_large(cap: usize) -> Reject {
    Reject::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        Outcome::TooLarge,
        format!("body larger than {cap} bytes"),
    )
}

/// The `Content-Length` the client declared, if any.
pub(crate) fn declared_length(headers: &HeaderMap) -> Option<usize> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
}

/// How a body must arrive.
pub(crate) struct BodyLimits {
    /// The largest body.
    pub(crate) cap: usize,
    /// The time allowed for any body; a declared length adds its time at
    /// `min_rate`.
    pub(crate) timeout: Duration,
    /// The slowest pace, in bytes per second, over every [`PACE_WINDOW`].
    pub(crate) min_rate: u64,
}

/// The window over which a body's pace is measured once it has started.
pub(crate) const PACE_WINDOW: Duration = Duration::from_secs(2);

/// Chunks smaller than this are copied into a shared tail buffer of
/// [`TAIL`] bytes instead of being kept one by one, so a client that sends
/// a byte at a time cannot make the list of parts outgrow its bytes.
const SMALL_CHUNK: usize = 4 * 1024;

/// The tail buffer small chunks are gathered in.
const TAIL: usize = 16 * 1024;

/// What one kept part costs beyond its bytes (its handle in the list).
const PART_OVERHEAD: usize = std::mem::size_of::<Bytes>();

/// A body as it arrived: the chunks the server read, kept as they are (no
/// buffer that grows and copies), small ones gathered. Its bytes are
/// verified part by part, and assembled only once verified.
pub(crate) struct Received {
    parts: Vec<Bytes>,
    len: usize,
    /// What the parts took from the budget (bytes and handles).
    held: usize,
}

impl Received {
    /// The parts, in order.
    pub(crate) fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// One contiguous body, for a verified request: the single part as
    /// it is, or the parts copied into one buffer. The copy is counted in
    /// the budget while both exist, and never refused: the body is
    /// verified and must not be lost for want of room (the verified
    /// requests in flight are bounded by `HOOKINBOX_MAX_IN_FLIGHT`).
    pub(crate) fn assemble(self, ticket: &mut Ticket) -> Bytes {
        if self.parts.len() == 1 {
            return self.parts.into_iter().next().unwrap_or_default();
        }
        ticket.force(self.len);
        let mut whole = BytesMut::with_capacity(self.len);
        for part in &self.parts {
            whole.extend_from_slice(part);
        }
        drop(self.parts);
        ticket.release(self.held);
        whole.freeze()
    }
}

fn slow(message: String) -> Reject {
    Reject::new(StatusCode::REQUEST_TIMEOUT, Outcome::SlowBody, message)
}

/// Reads the body, refusing it as soon as it passes the cap (a declared
/// `Content-Length` over the cap is refused before reading), when it falls
/// below the minimum pace over a window, and when it does not arrive by its
/// deadline (`timeout` plus the declared length at the minimum pace). Every
/// byte kept is taken from `ticket` before it is kept: memory follows the
/// bytes that arrived, never a declared length.
pub(crate) async fn read_body(
    mut body: web::Payload,
    headers: &HeaderMap,
    limits: &BodyLimits,
    ticket: &mut Ticket,
) -> Result<Received, Reject> {
    let cap = limits.cap;
    let declared = declared_length(headers);
    if declared.is_some_and(|n| n > cap) {
        return Err(too_large(cap));
    }
    let expected = declared.unwrap_or(cap);
    let mut received = Received {
        parts: Vec::new(),
        len: 0,
        held: 0,
    };
    let mut tail = BytesMut::new();
    let started = Instant::now();
    let allowed =
        limits.timeout + Duration::from_secs_f64(expected as f64 / limits.min_rate.max(1) as f64);
    let deadline = started + allowed;
    let mut window_start = started;
    let mut window_bytes = 0u64;
    loop {
        let check_at = (window_start + PACE_WINDOW).min(deadline);
        match tokio::time::timeout_at(check_at.into(), body.next()).await {
            Ok(None) => break,
            Ok(Some(Err(_))) => {
                return Err(Reject::new(
                    StatusCode::BAD_REQUEST,
                    Outcome::BadBody,
                    "the body could not be read",
                ));
            }
            Ok(Some(Ok(chunk))) => {
                if received.len + chunk.len() > cap {
                    return Err(too_large(cap));
                }
                received.len += chunk.len();
                window_bytes += chunk.len() as u64;
                if chunk.len() < SMALL_CHUNK {
                    if tail.capacity() - tail.len() < chunk.len() {
                        // A new tail is taken from the budget before it is
                        // allocated; the full one becomes a part.
                        ticket.reserve(TAIL + PART_OVERHEAD)?;
                        received.held += TAIL + PART_OVERHEAD;
                        keep(
                            &mut received,
                            std::mem::replace(&mut tail, BytesMut::with_capacity(TAIL)),
                        );
                    }
                    tail.extend_from_slice(&chunk);
                } else {
                    ticket.reserve(chunk.len() + PART_OVERHEAD)?;
                    received.held += chunk.len() + PART_OVERHEAD;
                    keep(&mut received, std::mem::take(&mut tail));
                    received.parts.push(chunk);
                }
            }
            Err(_) => {}
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(slow(format!("the body did not arrive within {allowed:?}")));
        }
        let window = now - window_start;
        if window >= PACE_WINDOW {
            let required = (limits.min_rate as f64 * window.as_secs_f64()) as u64;
            let remaining = expected.saturating_sub(received.len) as u64;
            if window_bytes < required.min(remaining) {
                return Err(slow(format!(
                    "the body arrived slower than {} bytes per second",
                    limits.min_rate
                )));
            }
            window_start = now;
            window_bytes = 0;
        }
    }
    keep(&mut received, tail);
    Ok(received)
}

/// Keeps a gathered tail as a part (its bytes were taken from the budget
/// with its buffer); nothing if it is empty.
fn keep(received: &mut Received, tail: BytesMut) {
    if !tail.is_empty() {
        received.parts.push(tail.freeze());
    }
}
