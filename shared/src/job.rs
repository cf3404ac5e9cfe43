//! A job: one delivery on its way from ingest to a worker, and what a
//! handler receives. It knows nothing of the broker that carries it (see
//! `broker::message`) nor of the table that parks it (see
//! `deliveries::parked`).

use bytes::Bytes;

use crate::key::{ClaimToken, EventName, LegKey};

/// The prefix of the request headers a job carries along (`X-GitHub-*`),
/// lower case.
pub const GITHUB_HEADER_PREFIX: &str = "x-github-";

/// Whether a request header (lower-case name) travels with the job: the
/// `X-GitHub-*` headers, and the sender's `User-Agent` (GitHub's
/// `GitHub-Hookshot/…`), which a destination signed the GitHub way passes
/// on as received. Never a signature header: those were made with the
/// source's secret.
pub fn is_carried_header(name: &str) -> bool {
    name.starts_with(GITHUB_HEADER_PREFIX) || name == "user-agent"
}

/// One leg to run: its key (the delivery's and the destination), what
/// GitHub said about the delivery, the claim token it was published with,
/// and the raw body as signed.
#[derive(Clone, Debug)]
pub struct Job {
    /// The leg's key; it derefs to the delivery's.
    pub key: LegKey,
    /// `X-GitHub-Event`.
    pub event: EventName,
    /// The payload's `action`, when it has one.
    pub action: Option<String>,
    /// The claim token the job was published with.
    pub token: ClaimToken,
    /// Takes the delivery had when the job was published, when its message
    /// says (every job hookinbox publishes does). A worker may take and
    /// complete such a job in one statement, guarded by this count (see
    /// the worker's runtime).
    pub attempts: Option<i32>,
    /// The original `Content-Type`.
    pub content_type: String,
    /// The original `X-GitHub-*` request headers and `User-Agent`
    /// (lower-case names; see [`is_carried_header`]).
    pub github_headers: Vec<(String, String)>,
    /// The raw body, as signed.
    pub body: Bytes,
    /// Where the job sits in a trace; empty when traces are off.
    pub trace: JobTrace,
}

/// A job's place in a trace, as W3C `traceparent` values.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobTrace {
    /// The span that published the job (ingest's request): the worker's
    /// span is its child, in the same trace.
    pub parent: Option<String>,
    /// The delivery's first trace (ingest's request span), on a job
    /// published again by the scheduler, the breaker's probe or a replay:
    /// the worker's span starts a trace of its own, linked to it.
    pub origin: Option<String>,
}
