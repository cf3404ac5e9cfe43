//! Parked bodies: Postgres, not the broker, is the record of every delivery
//! that is not in flight. A failure writes the raw body, content type and
//! original headers to `parked_bodies` in the same statement as the
//! failure; the scheduler and operator replays publish from there, and
//! completion, retention and purge delete it.

use crate::job::Job;
use crate::key::ClaimToken;

/// A raw body to park with a failure: what the scheduler and replays
/// publish again.
#[derive(Clone, Copy, Debug)]
pub struct ParkedBody<'a> {
    /// The original `Content-Type`.
    pub content_type: &'a str,
    /// The original `X-GitHub-*` headers.
    pub headers: &'a [(String, String)],
    /// The raw body, as signed.
    pub body: &'a [u8],
}

impl<'a> From<&'a Job> for ParkedBody<'a> {
    fn from(job: &'a Job) -> Self {
        Self {
            content_type: &job.content_type,
            headers: &job.github_headers,
            body: &job.body,
        }
    }
}

impl ParkedBody<'_> {
    /// The headers as stored: a JSON array of `[name, value]` pairs.
    pub(super) fn headers_json(&self) -> serde_json::Value {
        serde_json::Value::Array(
            self.headers
                .iter()
                .map(|(k, v)| serde_json::json!([k, v]))
                .collect(),
        )
    }
}

/// Reads parked headers back; a pair that is not two strings is dropped.
pub(super) fn headers_from_json(value: &serde_json::Value) -> Vec<(String, String)> {
    value
        .as_array()
        .map(|pairs| {
            pairs
                .iter()
                .filter_map(|p| {
                    Some((
                        p.get(0)?.as_str()?.to_owned(),
                        p.get(1)?.as_str()?.to_owned(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A delivery moved to `processing` (or found dead) with its parked body,
/// as the job to publish.
#[derive(Clone, Debug)]
pub struct Parked {
    /// The job, carrying the row's current token.
    pub job: Job,
    /// Takes so far.
    pub attempts: i32,
}

/// A parked row that cannot become a job: a key part or the event no longer
/// parses (the row was edited by hand). It is dead-lettered with the reason
/// ([`super::dead_letter_unreadable`]) rather than skipped or retried
/// forever.
#[derive(Clone, Debug)]
pub struct Unreadable {
    /// The leg's five key parts, as stored.
    pub parts: Box<[String; 5]>,
    /// The token the row carries now.
    pub token: ClaimToken,
    /// What does not parse.
    pub reason: String,
}
