//! A job: one leg on its way to a worker ([`Envelope`], what its message
//! carries), and what a handler receives ([`Job`], the envelope with its
//! delivery's [`Body`]). It knows nothing of the broker that carries the
//! envelope (see `broker::message`) nor of the table that holds the body
//! (see `deliveries::bodies`).

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

/// What a job's message carries (`broker::message`): the leg's key, what
/// GitHub said about the delivery, the claim token and attempts it was
/// published with, and its place in a trace. Not its body: Postgres holds
/// that (`deliveries::bodies`), and the worker's take returns it with the
/// row, so a message the broker loses is published again from Postgres
/// (a new `store` leg's first message may carry a [`BodyCopy`]).
#[derive(Clone, Debug)]
pub struct Envelope {
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
    /// Where the job sits in a trace; empty when traces are off.
    pub trace: JobTrace,
    /// The body a message published before bodies lived in Postgres
    /// carries as its payload: the worker uses it only when Postgres holds
    /// no body of the delivery. `None` on every message published now.
    pub carried: Option<Body>,
    /// A copy of the body, packed as Postgres stores it, that ingest puts
    /// on a new leg's first message when the leg's worker would otherwise
    /// read the body in a statement of its own (a `store` leg on the
    /// one-statement path). `None` on every other message.
    pub copy: Option<BodyCopy>,
}

/// A copy of a delivery's body on a job's message, packed as Postgres
/// stores it (`deliveries::bodies`). It saves a worker a read; it is never
/// the record: every recovery path (a republish, a retry, a replay) reads
/// the body from Postgres, and its messages carry no copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BodyCopy {
    /// The original `Content-Type`.
    pub content_type: String,
    /// The carried headers as stored: JSON text of `[name, value]` pairs.
    pub headers: String,
    /// The body's length as received.
    pub size: i32,
    /// How `bytes` are encoded (`lz4` or `identity`).
    pub encoding: String,
    /// The packed bytes.
    pub bytes: Bytes,
}

/// A delivery's body as it was received: what a handler sends on or
/// stores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Body {
    /// The original `Content-Type`.
    pub content_type: String,
    /// The original `X-GitHub-*` request headers and `User-Agent`
    /// (lower-case names; see [`is_carried_header`]).
    pub github_headers: Vec<(String, String)>,
    /// The raw body, as signed.
    pub bytes: Bytes,
}

/// One leg to run, as a handler receives it: its key (the delivery's and
/// the destination), what GitHub said about the delivery, the claim token
/// it was published with, and the raw body as signed.
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
    /// says.
    pub attempts: Option<i32>,
    /// Operator replays of this leg so far: 0 for a leg running for the
    /// first time (or retried); `forward` sends it as `X-Hookinbox-Replay`.
    pub replays: i32,
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

impl Job {
    /// The job of `envelope` with its delivery's `body`, replayed `replays`
    /// times.
    pub fn new(envelope: Envelope, body: Body, replays: i32) -> Self {
        Self {
            key: envelope.key,
            event: envelope.event,
            action: envelope.action,
            token: envelope.token,
            attempts: envelope.attempts,
            replays,
            content_type: body.content_type,
            github_headers: body.github_headers,
            body: body.bytes,
            trace: envelope.trace,
        }
    }

    /// Its message: everything but the body.
    pub fn envelope(&self) -> Envelope {
        Envelope {
            key: self.key.clone(),
            event: self.event.clone(),
            action: self.action.clone(),
            token: self.token,
            attempts: self.attempts,
            trace: self.trace.clone(),
            carried: None,
            copy: None,
        }
    }

    /// Its body.
    pub fn body(&self) -> Body {
        Body {
            content_type: self.content_type.clone(),
            github_headers: self.github_headers.clone(),
            bytes: self.body.clone(),
        }
    }
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
