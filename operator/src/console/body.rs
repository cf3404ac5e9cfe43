//! Request bodies, read with a cap and a deadline: a client that declares
//! more than the call takes is refused before a byte is read (413), and
//! one that trickles its body is cut off when the console's body timeout
//! (`HOOKINBOX_ADMIN_BODY_TIMEOUT_MS`) passes (408), so a slow or huge body
//! can hold neither a connection nor memory for long. (actix-web's own
//! `client_request_timeout` covers the head only.)

use std::time::Duration;

use actix_web::{HttpRequest, web};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;

use super::error::AdminError;

/// The most a form takes: the bulk form's filter is the longest.
pub const FORM_LIMIT: usize = 64 * 1024;

/// The most a JSON call takes: a bulk call's list of ids.
pub const JSON_LIMIT: usize = 4 * 1024 * 1024;

/// Reads the body of `req`, at most `limit` bytes, within `timeout`.
pub async fn read(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, AdminError> {
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(AdminError::TooLarge(limit));
    }
    let whole = async {
        let mut body = BytesMut::new();
        while let Some(chunk) = payload.next().await {
            let chunk =
                chunk.map_err(|_| AdminError::field("body", "the body could not be read"))?;
            if body.len() + chunk.len() > limit {
                return Err(AdminError::TooLarge(limit));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    };
    tokio::time::timeout(timeout, whole)
        .await
        .map_err(|_| AdminError::SlowBody)?
}
