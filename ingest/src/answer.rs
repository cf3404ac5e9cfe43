//! What ingest answers: a status, a JSON body, and the outcome that labels
//! the request's log line and `hookinbox_ingest_requests_total`.

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use actix_web::http::header;
use hookinbox::key::KeyError;
use hookinbox::signature::SignatureError;
use serde_json::json;

/// How a request ended: its log field and metric label. Bounded, so it can
/// label a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Claimed and published (202).
    Accepted,
    /// An untaken claim older than the publish timeout, published again (202).
    Republished,
    /// Claimed; the publish failed, so the body was parked for the scheduler (202).
    Parked,
    /// The key was claimed before (200 completed, 202 otherwise).
    Duplicate,
    /// The key was claimed before with another body (409).
    Conflict,
    /// The same event (delivery id and body) came before under another
    /// hook id of a source that does not pin its hooks: a copy, answered
    /// as a duplicate without a claim (200).
    Copy,
    /// A `ping` (200).
    Pong,
    /// Claimed, and no destination's filters took it: recorded, nothing to
    /// run (200).
    Filtered,
    /// An event the source does not take (200).
    Ignored,
    /// No such source (404).
    UnknownSource,
    /// The signature is missing, malformed or wrong (401).
    BadSignature,
    /// A GitHub header is missing, repeated or malformed (400).
    BadHeader,
    /// A content type other than JSON or form (415).
    BadContentType,
    /// A `Content-Encoding` other than identity (415).
    Encoded,
    /// The body passed the cap (413).
    TooLarge,
    /// The body did not arrive in time (408).
    SlowBody,
    /// The body could not be read (400).
    BadBody,
    /// The payload is not a JSON object (400).
    BadPayload,
    /// A hook id the source does not pin (403).
    UnknownHook,
    /// A client outside GitHub's webhook ranges, with the allow-list on
    /// (403).
    NotGithub,
    /// Postgres (or Postgres and the broker) unavailable (503).
    Unavailable,
    /// The in-flight limit of verified requests was reached (429).
    Overloaded,
    /// Every receiving slot for unverified bodies was taken (503).
    ReceivingFull,
    /// The client already sends its share of unverified bodies or bytes (429).
    ClientShare,
    /// The memory budget for bodies would pass (503).
    OverBudget,
    /// The source's rate limit was reached (429).
    RateLimited,
    /// The body was received before under another delivery id: a replayed
    /// capture (409).
    ReplayedBody,
}

impl Outcome {
    /// Shed by a limit before any work: counted, not logged.
    pub(crate) fn is_shed(self) -> bool {
        matches!(
            self,
            Self::Overloaded | Self::ReceivingFull | Self::ClientShare | Self::OverBudget
        )
    }

    /// The label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Republished => "republished",
            Self::Parked => "parked",
            Self::Duplicate => "duplicate",
            Self::Conflict => "conflict",
            Self::Copy => "copy",
            Self::Pong => "pong",
            Self::Filtered => "filtered",
            Self::Ignored => "ignored",
            Self::UnknownSource => "unknown_source",
            Self::BadSignature => "bad_signature",
            Self::BadHeader => "bad_header",
            Self::BadContentType => "bad_content_type",
            Self::Encoded => "encoded",
            Self::TooLarge => "too_large",
            Self::SlowBody => "slow_body",
            Self::BadBody => "bad_body",
            Self::BadPayload => "bad_payload",
            Self::UnknownHook => "unknown_hook",
            Self::NotGithub => "not_github",
            Self::Unavailable => "unavailable",
            Self::Overloaded => "overloaded",
            Self::ReceivingFull => "receiving_full",
            Self::ClientShare => "client_share",
            Self::OverBudget => "over_budget",
            Self::RateLimited => "rate_limited",
            Self::ReplayedBody => "replayed_body",
        }
    }
}

/// An answer to a webhook request.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The HTTP status.
    pub(crate) status: StatusCode,
    /// The outcome label.
    pub(crate) outcome: Outcome,
    /// The JSON body.
    pub(crate) body: serde_json::Value,
    /// Seconds for `Retry-After`, on a 429 or 503.
    pub(crate) retry_after: Option<u64>,
}

impl Answer {
    pub(crate) fn new(status: StatusCode, outcome: Outcome, body: serde_json::Value) -> Self {
        Self {
            status,
            outcome,
            body,
            retry_after: None,
        }
    }

    /// 202 `accepted`, with `extra` fields (`parked`, `republished`).
    pub(crate) fn accepted(outcome: Outcome, extra: Option<(&str, bool)>) -> Self {
        let mut body = json!({"status": "accepted"});
        if let Some((field, value)) = extra {
            body[field] = value.into();
        }
        Self::new(StatusCode::ACCEPTED, outcome, body)
    }

    /// The error text, when the answer is a refusal.
    pub(crate) fn error(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }

    pub(crate) fn into_response(self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status);
        if let Some(seconds) = self.retry_after {
            response.insert_header((header::RETRY_AFTER, seconds.to_string()));
        }
        response.json(self.body)
    }
}

/// A refusal: a status and a message that names what was wrong and never
/// echoes a secret, a signature or the payload.
#[derive(Debug)]
pub(crate) struct Reject {
    pub(crate) status: StatusCode,
    pub(crate) outcome: Outcome,
    pub(crate) message: String,
    pub(crate) retry_after: Option<u64>,
}

impl Reject {
    pub(crate) fn new(status: StatusCode, outcome: Outcome, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            outcome,
            retry_after: None,
        }
    }

    /// With `Retry-After: seconds`.
    pub(crate) fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// 503: `what` is unavailable, retry later.
    pub(crate) fn unavailable(what: &str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Outcome::Unavailable,
            format!("{what} unavailable, retry later"),
        )
    }
}

impl From<Reject> for Answer {
    fn from(reject: Reject) -> Self {
        Answer {
            retry_after: reject.retry_after,
            ..Answer::new(
                reject.status,
                reject.outcome,
                json!({"status": "error", "error": reject.message}),
            )
        }
    }
}

impl From<KeyError> for Reject {
    fn from(e: KeyError) -> Self {
        Self::new(StatusCode::BAD_REQUEST, Outcome::BadHeader, e.to_string())
    }
}

impl From<SignatureError> for Reject {
    fn from(e: SignatureError) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            Outcome::BadSignature,
            e.to_string(),
        )
    }
}
