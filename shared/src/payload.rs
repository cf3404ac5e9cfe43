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
    #[serde(default)]
    repository: Option<Repository>,
    #[serde(default)]
    pull_request: Option<Repository>,
    #[serde(default)]
    issue: Option<Repository>,
    #[serde(default)]
    number: Option<Count>,
    #[serde(default)]
    installation: Option<Repository>,
}

/// An object's `full_name`, `id` and `number` (a repository's, a pull
/// request's, an issue's, an installation's id), read leniently: a value that is not an object,
/// or a field of another type, reads as absent rather than refusing a
/// payload ingest accepted before it read the field.
#[derive(Default)]
struct Repository {
    full_name: Option<String>,
    id: Option<u64>,
    number: Option<u64>,
    updated_at: Option<String>,
}

/// A non-negative integer, or anything else read as absent. Read from
/// the raw text, never converted as a number first: a value such as
/// `1e999999` is valid JSON that no number type holds, and must not make
/// the payload unreadable.
struct Count(Option<u64>);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&serde_json::value::RawValue>::deserialize(d)?;
        Ok(Count(raw.get().parse().ok()))
    }
}

impl<'de> Deserialize<'de> for Repository {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RepositoryVisitor)
    }
}

struct RepositoryVisitor;

impl<'de> serde::de::Visitor<'de> for RepositoryVisitor {
    type Value = Repository;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Repository, A::Error> {
        let mut repo = Repository::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == "full_name" {
                repo.full_name = map.next_value::<Text>()?.0;
            } else if key == "id" {
                repo.id = map.next_value::<Count>()?.0;
            } else if key == "number" {
                repo.number = map.next_value::<Count>()?.0;
            } else if key == "updated_at" {
                repo.updated_at = map.next_value::<Text>()?.0;
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(repo)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Repository, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Repository::default())
    }

    fn visit_bool<E>(self, _: bool) -> Result<Repository, E> {
        Ok(Repository::default())
    }
    fn visit_i64<E>(self, _: i64) -> Result<Repository, E> {
        Ok(Repository::default())
    }
    fn visit_u64<E>(self, _: u64) -> Result<Repository, E> {
        Ok(Repository::default())
    }
    fn visit_f64<E>(self, _: f64) -> Result<Repository, E> {
        Ok(Repository::default())
    }
    fn visit_str<E>(self, _: &str) -> Result<Repository, E> {
        Ok(Repository::default())
    }
    fn visit_unit<E>(self) -> Result<Repository, E> {
        Ok(Repository::default())
    }
}

/// A string, or anything else read as absent.
struct Text(Option<String>);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // From the raw text, as `Count`: a number no type holds reads as
        // absent, not as an unreadable payload.
        let raw = <&serde_json::value::RawValue>::deserialize(d)?;
        Ok(Text(serde_json::from_str(raw.get()).ok()))
    }
}

/// The top-level fields ingest stores beside a claim: `action`, the
/// `repository.full_name` operators filter by, and what an ordered
/// destination keys its legs by.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fields {
    /// The payload's `action`, when it has one.
    pub action: Option<String>,
    /// `repository.full_name` (`owner/name`), when the event has a
    /// repository.
    pub repository: Option<String>,
    /// `repository.id`: stable across renames and transfers, unlike the
    /// name.
    pub repository_id: Option<u64>,
    /// The pull request's or issue's number: `pull_request.number`, else
    /// `issue.number`, else the top-level `number` (which `pull_request`
    /// and `issues` events also carry).
    pub number: Option<u64>,
    /// `installation.id`: the GitHub App installation the event is for,
    /// what a fair destination shares its legs out by.
    pub installation_id: Option<u64>,
    /// The pull request's `updated_at`, else the issue's, when it is an
    /// RFC 3339 time: what `skip_stale` compares within a key.
    pub updated_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Keeps a stored label short and printable: it labels logs and pages.
fn label(value: &str, max: usize) -> String {
    value
        .chars()
        .filter(|c| !c.is_control())
        .take(max)
        .collect()
}

/// Checks the payload is a JSON object and returns its `action` and
/// `repository.full_name`, in one parse. Nothing else is read: serde skips
/// the rest without building it.
pub fn fields(json: &str) -> Result<Fields, PayloadError> {
    let head: Head<'_> = serde_json::from_str(json).map_err(|_| PayloadError::NotJson)?;
    let subjects = [head.pull_request, head.issue];
    let number = subjects
        .iter()
        .flatten()
        .find_map(|o| o.number)
        .or(head.number.and_then(|n| n.0));
    let updated_at = subjects
        .iter()
        .flatten()
        .find_map(|o| o.updated_at.as_deref())
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&chrono::Utc));
    let (repository, repository_id) = match head.repository {
        Some(r) => (r.full_name, r.id),
        None => (None, None),
    };
    Ok(Fields {
        action: head.action.map(|a| label(&a, 64)),
        // GitHub's owner (39) + '/' + name (100).
        repository: repository.map(|n| label(&n, 140)).filter(|n| !n.is_empty()),
        repository_id,
        number,
        installation_id: head.installation.and_then(|i| i.id),
        updated_at,
    })
}

/// Checks the payload is a JSON object and returns its top-level `action`.
pub fn action(json: &str) -> Result<Option<String>, PayloadError> {
    fields(json).map(|f| f.action)
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

    #[test]
    fn the_repository_id_and_the_number_are_read_leniently() {
        let f = fields(
            r#"{"number":3,"pull_request":{"number":5,"head":{"repo":{"id":9}}},
                "repository":{"id":42,"full_name":"octo/hello"}}"#,
        )
        .expect("object");
        assert_eq!((f.repository_id, f.number), (Some(42), Some(5)));
        let f = fields(r#"{"issue":{"number":7},"repository":{"id":1}}"#).expect("object");
        assert_eq!((f.repository_id, f.number), (Some(1), Some(7)));
        let f = fields(r#"{"number":8,"repository":{"id":"x"}}"#).expect("object");
        assert_eq!((f.repository_id, f.number), (None, Some(8)));
        let f = fields(r#"{"number":-1,"issue":null,"pull_request":[1]}"#).expect("object");
        assert_eq!((f.repository_id, f.number), (None, None));
        let f = fields(r#"{"number":1e999999,"repository":{"id":1e999999,"full_name":1e999999}}"#)
            .expect("object");
        assert_eq!(
            (f.repository_id, f.number, f.repository),
            (None, None, None)
        );
    }

    #[test]
    fn the_installation_id_is_read_leniently() {
        let f = fields(r#"{"installation":{"id":77,"node_id":"x"}}"#).expect("object");
        assert_eq!(f.installation_id, Some(77));
        for odd in [
            r#"{"installation":{"id":"77"}}"#,
            r#"{"installation":7}"#,
            r#"{"installation":{"id":1e999999}}"#,
            "{}",
        ] {
            assert_eq!(fields(odd).expect("object").installation_id, None, "{odd}");
        }
    }

    #[test]
    fn the_pull_requests_or_issues_updated_at_is_read_leniently() {
        let f = fields(
            r#"{"pull_request":{"number":1,"updated_at":"2026-01-02T03:04:05Z"},"issue":{"updated_at":"2020-01-01T00:00:00Z"}}"#,
        )
        .expect("object");
        assert_eq!(
            f.updated_at.map(|t| t.to_rfc3339()),
            Some("2026-01-02T03:04:05+00:00".to_owned())
        );
        let f = fields(r#"{"issue":{"updated_at":"2026-01-02T04:04:05+01:00"}}"#).expect("object");
        assert_eq!(
            f.updated_at.map(|t| t.to_rfc3339()),
            Some("2026-01-02T03:04:05+00:00".to_owned())
        );
        for odd in [
            r#"{"pull_request":{"updated_at":"yesterday"}}"#,
            r#"{"pull_request":{"updated_at":17}}"#,
            r#"{"updated_at":"2026-01-02T03:04:05Z"}"#,
            "{}",
        ] {
            assert_eq!(fields(odd).expect("object").updated_at, None, "{odd}");
        }
    }

    #[test]
    fn repository_full_name_is_read_when_present() {
        let f = fields(r#"{"action":"opened","repository":{"id":1,"full_name":"octo/hello"}}"#)
            .expect("object");
        assert_eq!(f.repository.as_deref(), Some("octo/hello"));
        assert_eq!(fields(r#"{"zen":"x"}"#).expect("object").repository, None);
        assert_eq!(
            fields(r#"{"repository":{"full_name":""}}"#)
                .expect("object")
                .repository,
            None
        );
        assert_eq!(
            fields(r#"{"repository":null}"#).expect("object").repository,
            None
        );
        assert_eq!(
            fields(r#"{"repository":"x"}"#).expect("object").repository,
            None
        );
        assert_eq!(
            fields(r#"{"repository":{"full_name":7,"a":[1,{"b":2}]}}"#)
                .expect("object")
                .repository,
            None
        );
    }
}
