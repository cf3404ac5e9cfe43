//! One delivery as operators see it, for the API and the page alike: its
//! row, its headers without anything signature-like, its timeline (built
//! from the row's own timestamps and counters plus the jobs that acted on
//! it: nothing is written on the hot path for it), and, for operators only,
//! its payload, pretty-printed.

use chrono::{DateTime, Utc};
use hookinbox::deliveries::{self, Delivery, ErrorClass, PayloadOrigin, Status, StoredPayload};
use hookinbox::payload::{ContentType, json_text};
use hookinbox::postgres::sql::Session;
use serde_json::{Value, json};

use super::error::AdminError;
use super::jobs::{Kind, Lineage, store};
use super::tokens::{Identity, Role};
use crate::view::DeliveryView;

/// One step of a delivery's life.
#[derive(Clone, Debug)]
pub struct Step {
    /// When.
    pub at: DateTime<Utc>,
    /// What: `received`, `claimed`, `first failure`, `failed`, …
    pub what: &'static str,
    /// More, when there is more to say.
    pub detail: Option<String>,
}

/// A payload, shown.
#[derive(Clone, Debug)]
pub struct Payload {
    /// `event` (the stored event) or `parked` (the raw body kept for a
    /// retry or a replay).
    pub origin: &'static str,
    /// The payload as JSON, when it parses.
    pub json: Option<Value>,
    /// Pretty-printed (or, if it is not JSON, the text as it came).
    pub pretty: String,
}

/// Everything the page and the API show of one delivery.
#[derive(Clone, Debug)]
pub struct Detail {
    /// The row.
    pub delivery: Delivery,
    /// The original `X-GitHub-*` headers kept with a parked body, without
    /// any signature-like header.
    pub headers: Vec<(String, String)>,
    /// Its steps, oldest first.
    pub timeline: Vec<Step>,
    /// The jobs that replayed or purged it.
    pub lineage: Vec<Lineage>,
    /// The payload: operators only, `None` for a viewer (never read).
    pub payload: Option<Payload>,
    /// Whether a body is parked, so that a replay can publish it. A failed
    /// delivery without one is awaiting a redelivery from GitHub.
    pub parked: bool,
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

fn timeline(d: &Delivery, lineage: &[Lineage]) -> Vec<Step> {
    let mut steps = vec![Step {
        at: d.created_at,
        what: "received",
        detail: Some(format!("{} claimed by ingest", d.key.delivery_id.as_str())),
    }];
    if let Some(at) = d.first_failed_at.filter(|at| Some(*at) != d.failed_at) {
        steps.push(Step {
            at,
            what: "first failure",
            detail: None,
        });
    }
    if let Some(at) = d.failed_at {
        let class = d.last_error_class.map_or("unknown", ErrorClass::as_str);
        let message = d.last_error.as_deref().unwrap_or("");
        steps.push(Step {
            at,
            what: "failed",
            detail: Some(format!("{class}: {message}")),
        });
    }
    if let Some(at) = d.dead_lettered_at {
        steps.push(Step {
            at,
            what: "dead-lettered",
            detail: Some("copy confirmed in the dead-letter queue".to_owned()),
        });
    }
    for l in lineage {
        steps.push(Step {
            at: l.at,
            what: match (l.kind, l.result.as_str()) {
                (Kind::Replay, "replayed") => "replayed",
                (Kind::Purge, "purged") => "purged",
                (Kind::Replay, "failed") => "replay failed",
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
        });
    }
    if let (Status::Failed, true, Some(at)) = (d.status, d.retryable, d.next_attempt_at) {
        steps.push(Step {
            at,
            what: "retry due",
            detail: Some(format!("attempt {} of the retries", d.attempts + 1)),
        });
    }
    if let (Status::Processing, Some(at)) = (d.status, d.lease_until) {
        steps.push(Step {
            at,
            what: "lease ends",
            detail: None,
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
        PayloadOrigin::Parked => "parked",
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
/// hooks got the same id). Reads the payload only for an operator.
pub async fn load(
    client: &impl Session,
    who: &Identity,
    source: &str,
    delivery_id: &str,
    hook_id: Option<&str>,
) -> Result<Detail, AdminError> {
    super::params::delivery_path(source, delivery_id)?;
    if let Some(h) = hook_id {
        super::params::hook_id("hook_id", h)?;
    }
    let mut found = deliveries::find(client, source, delivery_id, hook_id).await?;
    let delivery = match found.len() {
        0 => {
            return Err(AdminError::NotFound(format!(
                "no delivery {delivery_id} in source {source}"
            )));
        }
        1 => found.remove(0),
        _ => {
            let hooks: Vec<&str> = found.iter().map(|d| d.key.hook_id.as_str()).collect();
            return Err(AdminError::field(
                "hook_id",
                format!(
                    "{} deliveries have this id (hook ids {}); name one",
                    hooks.len(),
                    hooks.join(", ")
                ),
            ));
        }
    };
    let lineage = store::lineage(client, &delivery.key).await?;
    let stored = deliveries::stored_payload(client, &delivery.key).await?;
    let parked = stored
        .as_ref()
        .is_some_and(|s| s.origin == PayloadOrigin::Parked);
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
        timeline: timeline(&delivery, &lineage),
        delivery,
        headers,
        lineage,
        payload,
        parked,
    })
}

/// The detail as the API answers it; `payload` only for operators.
pub fn to_json(d: &Detail) -> Value {
    let mut out = json!({
        "delivery": summary(&d.delivery),
        "headers": d.headers.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
        "timeline": d.timeline.iter().map(|s| json!({"at": s.at, "event": s.what, "detail": s.detail})).collect::<Vec<_>>(),
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
