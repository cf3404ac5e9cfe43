//! One delivery as operators see it, for the API and the page alike: its
//! legs (one per destination, each a row), each with its attempt log, its
//! headers without anything signature-like, its timeline (built from the
//! rows' own timestamps and counters plus the jobs that acted on them:
//! nothing is written on the hot path for it), and, for operators only,
//! its payload, pretty-printed. A destination's answers are shown with
//! every secret header value masked.

use chrono::{DateTime, Utc};
use hookinbox::deliveries::{
    self, Delivery, ErrorClass, LoggedAttempt, PayloadOrigin, State, Status, StoredPayload,
};
use hookinbox::payload::{ContentType, json_text};
use hookinbox::postgres::sql::Session;
use serde_json::{Value, json};

use super::error::AdminError;
use super::jobs::{Kind, Lineage, store};
use super::tokens::{Identity, Role};
use crate::destinations::SecretValues;
use crate::view::DeliveryView;

/// The attempts shown per leg, newest first.
pub const ATTEMPTS_SHOWN: i64 = 50;

/// The most legs read of one delivery: one per destination of its source.
const MAX_LEGS: usize = 100;

/// One step of a delivery's life.
#[derive(Clone, Debug)]
pub struct Step {
    /// When.
    pub at: DateTime<Utc>,
    /// What: `received`, `claimed`, `first failure`, `failed`, …
    pub what: &'static str,
    /// More, when there is more to say.
    pub detail: Option<String>,
    /// The leg's destination (empty for a leg claimed before destinations
    /// existed).
    pub destination: String,
}

/// One attempt of a leg, as shown: its error and the answer's excerpt
/// with every secret header value masked.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// When it started.
    pub at: DateTime<Utc>,
    /// Its number.
    pub attempt: i32,
    /// Whether it was its destination's probe.
    pub probe: bool,
    /// How it ended: `ok`, `transient`, `permanent`, `destination`,
    /// `blocked`.
    pub result: String,
    /// The answer's status code.
    pub status_code: Option<i32>,
    /// What went wrong.
    pub error: Option<String>,
    /// How long it took, in milliseconds.
    pub duration_ms: f64,
    /// The first 4 KiB of the answer's body, as text (invalid UTF-8
    /// replaced); escaped wherever it is shown.
    pub excerpt: Option<String>,
}

impl Attempt {
    fn of(a: LoggedAttempt, secrets: &SecretValues) -> Self {
        Self {
            at: a.at,
            attempt: a.attempt,
            probe: a.probe,
            result: a.result,
            status_code: a.status_code,
            error: a.error.map(|e| secrets.mask(&e)),
            duration_ms: a.duration_ms,
            excerpt: a.excerpt.map(|b| secrets.mask_bytes(&b)),
        }
    }
}

/// One leg of a delivery: its row, whether a replay could publish it, and
/// its attempt log.
#[derive(Clone, Debug)]
pub struct Leg {
    /// The row.
    pub delivery: Delivery,
    /// Whether its delivery's body is kept, so that a replay can publish
    /// it (the same for every leg of a delivery).
    pub body_kept: bool,
    /// Its attempts, newest first (at most [`ATTEMPTS_SHOWN`]).
    pub attempts: Vec<Attempt>,
}

/// A payload, shown.
#[derive(Clone, Debug)]
pub struct Payload {
    /// `received` (the raw body as received, kept for retries and replays)
    /// or `event` (the stored event, once the body is past its retention).
    pub origin: &'static str,
    /// The payload as JSON, when it parses.
    pub json: Option<Value>,
    /// Pretty-printed (or, if it is not JSON, the text as it came).
    pub pretty: String,
}

/// Everything the page and the API show of one delivery.
#[derive(Clone, Debug)]
pub struct Detail {
    /// The leg it is summed up by: its first failed leg, else its first
    /// (a delivery with one leg: that leg).
    pub delivery: Delivery,
    /// Every leg, by destination.
    pub legs: Vec<Leg>,
    /// The carried request headers (`X-GitHub-*`, `User-Agent`) kept with
    /// the body, without any signature-like header.
    pub headers: Vec<(String, String)>,
    /// Its steps, oldest first.
    pub timeline: Vec<Step>,
    /// The jobs that replayed or purged its legs.
    pub lineage: Vec<Lineage>,
    /// The payload: operators only, `None` for a viewer (never read).
    pub payload: Option<Payload>,
}

impl Detail {
    /// Whether a replay of its failed legs has something to do: a failed
    /// leg with a body.
    pub fn replayable(&self) -> bool {
        self.legs
            .iter()
            .any(|l| l.delivery.status == Status::Failed && l.body_kept)
    }

    /// Whether a purge may have something to do: a leg failed for good.
    pub fn purgeable(&self) -> bool {
        self.legs
            .iter()
            .any(|l| l.delivery.status == Status::Failed && !l.delivery.retryable)
    }

    /// Whether a failed leg has no body: only GitHub can bring it back.
    pub fn failed_without_body(&self) -> bool {
        self.legs
            .iter()
            .any(|l| l.delivery.status == Status::Failed && !l.body_kept)
    }
}

/// A header that may carry a signature or a credential is never shown,
/// whatever its prefix.
pub fn shown_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    !["signature", "authorization", "cookie", "secret", "token"]
        .iter()
        .any(|word| name.contains(word))
}

/// A delivery as an item of a list: the one JSON of a delivery.
pub fn summary(d: &Delivery) -> Value {
    DeliveryView::json(d)
}

/// The steps of one leg, `received` first.
fn timeline(d: &Delivery, lineage: &[Lineage]) -> Vec<Step> {
    let destination = d.key.destination.as_str().to_owned();
    let mut steps = vec![Step {
        at: d.created_at,
        what: "received",
        detail: Some(format!("{} claimed by ingest", d.key.delivery_id.as_str())),
        destination: destination.clone(),
    }];
    if let Some(at) = d.first_failed_at.filter(|at| Some(*at) != d.failed_at) {
        steps.push(Step {
            at,
            what: "first failure",
            detail: None,
            destination: destination.clone(),
        });
    }
    if let Some(at) = d.failed_at {
        let class = d.last_error_class.map_or("unknown", ErrorClass::as_str);
        let message = d.last_error.as_deref().unwrap_or("");
        steps.push(Step {
            at,
            what: "failed",
            detail: Some(format!("{class}: {message}")),
            destination: destination.clone(),
        });
    }
    if let Some(at) = d.dead_lettered_at {
        steps.push(Step {
            at,
            what: "dead-lettered",
            detail: Some("copy confirmed in the dead-letter queue".to_owned()),
            destination: destination.clone(),
        });
    }
    for l in lineage {
        steps.push(Step {
            at: l.at,
            what: match (l.kind, l.result.as_str()) {
                (Kind::Replay | Kind::ReplayAny, "replayed") => "replayed",
                (Kind::Purge, "purged") => "purged",
                (Kind::Replay | Kind::ReplayAny, "failed") => "replay failed",
                (Kind::Purge, "failed") => "purge failed",
                _ => "job skipped it",
            },
            detail: Some(format!(
                "job {} by {}{}",
                l.job_id,
                l.actor,
                l.error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            )),
            destination: destination.clone(),
        });
    }
    if d.claimed_at != d.created_at {
        steps.push(Step {
            at: d.claimed_at,
            what: "claimed",
            detail: Some(format!(
                "current token installed (by a claim, a retry or a replay); {} attempt(s) so far",
                d.attempts
            )),
            destination: destination.clone(),
        });
    }
    if let (Status::Failed, true, Some(at)) = (d.status, d.retryable, d.next_attempt_at) {
        steps.push(Step {
            at,
            what: "retry due",
            detail: Some(format!("attempt {} of the retries", d.attempts + 1)),
            destination: destination.clone(),
        });
    }
    if let (Status::Processing, Some(at)) = (d.status, d.lease_until) {
        steps.push(Step {
            at,
            what: "lease ends",
            detail: None,
            destination: destination.clone(),
        });
    }
    if let Some(at) = d.completed_at {
        steps.push(Step {
            at,
            what: "completed",
            detail: Some(format!(
                "after {} attempt(s), {} replay(s)",
                d.attempts, d.replays
            )),
            destination: destination.clone(),
        });
    }
    // Stable: steps at the same instant keep the order above (a replay's
    // job item and its new token are written by one transaction).
    steps.sort_by_key(|s| s.at);
    steps
}

fn show(stored: StoredPayload) -> Payload {
    let origin = match stored.origin {
        PayloadOrigin::Event => "event",
        PayloadOrigin::Received => "received",
    };
    let json = stored.json.or_else(|| {
        let raw = stored.raw.as_deref()?;
        let kind = ContentType::parse(stored.content_type.as_deref().unwrap_or(""))?;
        let text = json_text(kind, raw).ok()?;
        serde_json::from_str(&text).ok()
    });
    let pretty = match &json {
        Some(v) => serde_json::to_string_pretty(v).unwrap_or_default(),
        None => String::from_utf8_lossy(stored.raw.as_deref().unwrap_or_default()).into_owned(),
    };
    Payload {
        origin,
        json,
        pretty,
    }
}

/// The delivery `source`/`delivery_id` (of `hook_id`, needed when several
/// hooks got the same id), with each of its legs. Reads the payload only
/// for an operator; masks `secrets` in the destinations' answers.
pub async fn load(
    client: &impl Session,
    who: &Identity,
    source: &str,
    delivery_id: &str,
    hook_id: Option<&str>,
    secrets: &SecretValues,
) -> Result<Detail, AdminError> {
    super::params::delivery_path(source, delivery_id)?;
    if let Some(h) = hook_id {
        super::params::hook_id("hook_id", h)?;
    }
    let found = deliveries::find(client, source, delivery_id, hook_id).await?;
    // One row per leg: several rows are several destinations of one
    // delivery, unless they are of several hooks (GitHub gives one id to
    // an event delivered to several hooks), which only a hook id tells
    // apart.
    let mut hooks: Vec<&str> = found.iter().map(|d| d.key.hook_id.as_str()).collect();
    hooks.sort_unstable();
    hooks.dedup();
    if hooks.len() > 1 {
        return Err(AdminError::field(
            "hook_id",
            format!(
                "{} hooks have a delivery with this id (hook ids {}); name one",
                hooks.len(),
                hooks.join(", ")
            ),
        ));
    }
    let mut rows = found;
    if rows.is_empty() {
        return Err(AdminError::NotFound(format!(
            "no delivery {delivery_id} in source {source}"
        )));
    }
    rows.sort_by(|a, b| a.key.destination.as_str().cmp(b.key.destination.as_str()));
    rows.truncate(MAX_LEGS);
    let mut legs = Vec::with_capacity(rows.len());
    let mut lineage = Vec::new();
    let mut timeline_steps = Vec::new();
    let mut stored = None;
    for (i, row) in rows.into_iter().enumerate() {
        let leg_lineage = store::lineage(client, &row.key).await?;
        let mut steps = timeline(&row, &leg_lineage);
        // The delivery was received once, whatever its legs: one step, of
        // no leg.
        if i > 0 {
            steps.retain(|s| s.what != "received");
        }
        for step in steps.iter_mut().filter(|s| s.what == "received") {
            step.destination.clear();
        }
        timeline_steps.extend(steps);
        lineage.extend(leg_lineage);
        // One body per delivery: read once, through its first leg.
        if i == 0 {
            stored = deliveries::stored_payload(client, &row.key).await?;
        }
        let body_kept = stored
            .as_ref()
            .is_some_and(|s| s.origin == PayloadOrigin::Received);
        let attempts = deliveries::leg_attempts(client, &row.key, ATTEMPTS_SHOWN)
            .await?
            .into_iter()
            .map(|a| Attempt::of(a, secrets))
            .collect();
        legs.push(Leg {
            delivery: row,
            body_kept,
            attempts,
        });
    }
    // Stable: steps at the same instant keep the order above.
    timeline_steps.sort_by_key(|s| s.at);
    let headline = legs
        .iter()
        .position(|l| l.delivery.status == Status::Failed)
        .unwrap_or(0);
    let headers = stored
        .as_ref()
        .map(|s| {
            s.headers
                .iter()
                .filter(|(name, _)| shown_header(name))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let payload = match who.role {
        Role::Operator => stored.map(show),
        Role::Viewer => None,
    };
    Ok(Detail {
        delivery: legs[headline].delivery.clone(),
        legs,
        timeline: timeline_steps,
        headers,
        lineage,
        payload,
    })
}

/// One attempt as the API answers it.
fn attempt_json(a: &Attempt) -> Value {
    json!({
        "at": a.at,
        "attempt": a.attempt,
        "probe": a.probe,
        "result": a.result,
        "status_code": a.status_code,
        "error": a.error,
        "duration_ms": a.duration_ms,
        "response_excerpt": a.excerpt,
    })
}

/// One leg as the API answers it.
fn leg_json(l: &Leg) -> Value {
    let d = &l.delivery;
    json!({
        "destination": d.key.destination.as_str(),
        "status": d.status.as_str(),
        "state": State::of(d).as_str(),
        "retryable": d.retryable,
        "attempts": d.attempts,
        "max_attempts": d.max_attempts,
        "replays": d.replays,
        "next_attempt_at": d.next_attempt_at,
        "completed_at": d.completed_at,
        "failed_at": d.failed_at,
        "error_class": d.last_error_class.map(ErrorClass::as_str),
        "error": d.last_error,
        "filter_reason": d.filter_reason,
        "body_kept": l.body_kept,
        "attempt_log": l.attempts.iter().map(attempt_json).collect::<Vec<_>>(),
    })
}

/// The detail as the API answers it; `payload` only for operators.
pub fn to_json(d: &Detail) -> Value {
    let mut out = json!({
        "delivery": summary(&d.delivery),
        "legs": d.legs.iter().map(leg_json).collect::<Vec<_>>(),
        "headers": d.headers.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
        "timeline": d.timeline.iter().map(|s| json!({
            "at": s.at, "event": s.what, "detail": s.detail, "destination": s.destination,
        })).collect::<Vec<_>>(),
        "lineage": d.lineage.iter().map(|l| json!({
            "job": l.job_id, "kind": l.kind.as_str(), "by": l.actor,
            "result": l.result, "error": l.error, "at": l.at,
        })).collect::<Vec<_>>(),
    });
    if let Some(p) = &d.payload {
        out["payload_origin"] = json!(p.origin);
        out["payload"] = p.json.clone().unwrap_or_else(|| json!(p.pretty));
    }
    out
}
