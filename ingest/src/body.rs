//! The request's bytes and headers before anything is trusted: framing
//! (encoding, content type, declared length), the body read bounded in size
//! and time, and the headers a job carries along.

use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderMap};
use actix_web::web;
use bytes::Bytes;
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

/// The buffer a body starts with, whatever length it declares: a declared
/// length is a promise from an unverified client, so memory is taken only
/// as bytes arrive.
const FIRST_BUFFER: usize = 16 * 1024;

fn slow(message: String) -> Reject {
    Reject::new(StatusCode::REQUEST_TIMEOUT, Outcome::SlowBody, message)
}

/// Reads the body, refusing it as soon as it passes the cap (a declared
/// `Content-Length` over the cap is refused before reading), when it falls
/// below the minimum pace over a window, and when it does not arrive by its
/// deadline (`timeout` plus the declared length at the minimum pace). Every
/// byte of buffer is taken from `ticket` before it is allocated.
pub(crate) async fn read_body(
    mut body: web::Payload,
    headers: &HeaderMap,
    limits: &BodyLimits,
    ticket: &mut Ticket,
) -> Result<Bytes, Reject> {
    let cap = limits.cap;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > cap) {
        return Err(too_large(cap));
    }
    let expected = declared.unwrap_or(cap);
    let first = expected.clamp(1, FIRST_BUFFER);
    ticket.reserve(first)?;
    let mut buf: Vec<u8> = Vec::with_capacity(first);
    let mut held = first;
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
                let needed = buf.len() + chunk.len();
                if needed > cap {
                    return Err(too_large(cap));
                }
                if needed > buf.capacity() {
                    // Grow as a vector would (doubling), but never past the
                    // declared length or the cap, and take the bytes first.
                    let target = needed.max((buf.capacity() * 2).min(expected.max(needed)));
                    ticket.reserve(target - held)?;
                    held = target;
                    buf.reserve_exact(target - buf.len());
                }
                buf.extend_from_slice(&chunk);
                window_bytes += chunk.len() as u64;
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
            let remaining = expected.saturating_sub(buf.len()) as u64;
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
    Ok(Bytes::from(buf))
}
