//! The request's bytes and headers before anything is trusted: framing
//! (encoding, content type, declared length), the body read bounded in size
//! and time, and the headers a job carries along.

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderMap};
use actix_web::web;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use hookinbox::job::GITHUB_HEADER_PREFIX;
use hookinbox::key::KeyError;
use hookinbox::payload::ContentType;

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

/// The original `X-GitHub-*` headers, carried with the job so a handler can
/// pass them on.
pub(crate) fn github_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| name.as_str().starts_with(GITHUB_HEADER_PREFIX))
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

/// Reads the body, refusing it as soon as it passes the cap (a declared
/// `Content-Length` over the cap is refused before reading) and when it does
/// not arrive within `timeout`.
pub(crate) async fn read_body(
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
                    Outcome::BadBody,
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
            Outcome::SlowBody,
            format!("the body did not arrive within {timeout:?}"),
        )),
    }
}
