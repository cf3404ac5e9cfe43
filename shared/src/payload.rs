//! The two body shapes GitHub sends, and the one field ingest reads.
//!
//! `application/json` carries the JSON payload as the body;
//! `application/x-www-form-urlencoded` carries it as `payload=<json>`. The
//! signature covers the raw body either way; decoding happens only after it
//! verified.

use std::borrow::Cow;

use serde::Deserialize;

/// The body's content type, from `Content-Type` without its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentType {
    /// `application/json`.
    Json,
    /// `application/x-www-form-urlencoded` with a `payload` field.
    Form,
}

impl ContentType {
    /// Classifies a `Content-Type` header value; `None` for any other type.
    pub fn parse(value: &str) -> Option<Self> {
        let essence = value.split(';').next().unwrap_or("").trim();
        if essence.eq_ignore_ascii_case("application/json") {
            Some(Self::Json)
        } else if essence.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
            Some(Self::Form)
        } else {
            None
        }
    }
}

/// Why a verified body cannot be read as a GitHub payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// The JSON body is not UTF-8.
    #[error("body is not UTF-8")]
    NotUtf8,
    /// A form body has no `payload` field.
    #[error("form body has no 'payload' field")]
    NoFormPayload,
    /// The payload is not a JSON object.
    #[error("payload is not a JSON object")]
    NotJson,
}

/// The JSON text of a payload: the body itself, or the decoded `payload`
/// field of a form body. Borrows when it can, so a JSON body is not copied.
pub fn json_text(content_type: ContentType, body: &[u8]) -> Result<Cow<'_, str>, PayloadError> {
    match content_type {
        ContentType::Json => std::str::from_utf8(body)
            .map(Cow::Borrowed)
            .map_err(|_| PayloadError::NotUtf8),
        ContentType::Form => form_urlencoded::parse(body)
            .find(|(name, _)| name == "payload")
            .map(|(_, value)| value)
            .ok_or(PayloadError::NoFormPayload),
    }
}

#[derive(Deserialize)]
struct Head<'a> {
    #[serde(borrow, default)]
    action: Option<Cow<'a, str>>,
}

/// Checks the payload is a JSON object and returns its top-level `action`.
/// Nothing else is read: serde skips the rest without building it.
pub fn action(json: &str) -> Result<Option<String>, PayloadError> {
    let head: Head<'_> = serde_json::from_str(json).map_err(|_| PayloadError::NotJson)?;
    Ok(head.action.map(|a| {
        // Keep the stored action short and printable: it labels logs.
        let a: String = a.chars().filter(|c| !c.is_control()).take(64).collect();
        a
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        assert_eq!(
            ContentType::parse("application/json"),
            Some(ContentType::Json)
        );
        assert_eq!(
            ContentType::parse("Application/JSON; charset=utf-8"),
            Some(ContentType::Json)
        );
        assert_eq!(
            ContentType::parse("application/x-www-form-urlencoded"),
            Some(ContentType::Form)
        );
        assert_eq!(ContentType::parse("text/plain"), None);
        assert_eq!(ContentType::parse(""), None);
    }

    #[test]
    fn form_payload_is_decoded() {
        let body = b"payload=%7B%22action%22%3A%22opened%22%7D";
        let json = json_text(ContentType::Form, body).expect("has payload");
        assert_eq!(json, r#"{"action":"opened"}"#);
        assert_eq!(action(&json), Ok(Some("opened".to_owned())));
        assert_eq!(
            json_text(ContentType::Form, b"other=1"),
            Err(PayloadError::NoFormPayload)
        );
    }

    #[test]
    fn action_is_optional_but_the_body_must_be_an_object() {
        assert_eq!(action(r#"{"zen":"x"}"#), Ok(None));
        assert_eq!(action("[1]"), Err(PayloadError::NotJson));
        assert_eq!(action("{"), Err(PayloadError::NotJson));
        assert_eq!(action(r#"{"action":"a\nb"}"#), Ok(Some("ab".to_owned())));
    }
}
