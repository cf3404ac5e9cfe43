//! The one JSON shape of a delivery (one leg of it, to one destination):
//! the CLI's `--json` and the console's API (`docs/admin-openapi.json`,
//! `Delivery`) both print it.

use chrono::{DateTime, Utc};
use hookinbox::deliveries::{Delivery, ErrorClass, State};
use serde::Serialize;

/// A delivery as operators read it.
#[derive(Clone, Debug, Serialize)]
pub struct DeliveryView<'a> {
    /// The provider (`github`).
    pub provider: &'a str,
    /// The source that received it.
    pub source: &'a str,
    /// `X-GitHub-Hook-ID` (empty when it had none).
    pub hook_id: &'a str,
    /// `X-GitHub-Delivery`.
    pub delivery_id: &'a str,
    /// The leg's destination (empty for a leg claimed before destinations
    /// existed).
    pub destination: &'a str,
    /// `X-GitHub-Event`.
    pub event: &'a str,
    /// The payload's `action`.
    pub action: Option<&'a str>,
    /// The payload's `repository.full_name`.
    pub repository: Option<&'a str>,
    /// `X-GitHub-Tenant`: the GHE.com enterprise that sent it (`None` for
    /// github.com and GitHub Enterprise Server).
    pub github_tenant: Option<&'a str>,
    /// The stored status (`processing`, `completed`, `failed`, `filtered`).
    pub status: &'static str,
    /// The operator's state ([`State`]).
    pub state: &'static str,
    /// Whether a failed delivery will be tried again.
    pub retryable: bool,
    /// Takes so far.
    pub attempts: i32,
    /// Operator replays so far.
    pub replays: i32,
    /// When the current lease ends.
    pub lease_until: Option<DateTime<Utc>>,
    /// When a retry is due.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// First claim.
    pub created_at: DateTime<Utc>,
    /// Completion.
    pub completed_at: Option<DateTime<Utc>>,
    /// First failure.
    pub first_failed_at: Option<DateTime<Utc>>,
    /// Last failure.
    pub failed_at: Option<DateTime<Utc>>,
    /// Whether its dead-letter copy was confirmed.
    pub dead_lettered: bool,
    /// The last failure's class.
    pub error_class: Option<&'static str>,
    /// The last failure, short and redacted.
    pub error: Option<&'a str>,
}

impl<'a> DeliveryView<'a> {
    /// The view of `d`.
    pub fn of(d: &'a Delivery) -> Self {
        Self {
            provider: &d.key.provider,
            source: d.key.source.as_str(),
            hook_id: d.key.hook_id.as_str(),
            delivery_id: d.key.delivery_id.as_str(),
            destination: d.key.destination.as_str(),
            event: &d.event,
            action: d.action.as_deref(),
            repository: d.repository.as_deref(),
            github_tenant: d.github_tenant.as_deref(),
            status: d.status.as_str(),
            state: State::of(d).as_str(),
            retryable: d.retryable,
            attempts: d.attempts,
            replays: d.replays,
            lease_until: d.lease_until,
            next_attempt_at: d.next_attempt_at,
            created_at: d.created_at,
            completed_at: d.completed_at,
            first_failed_at: d.first_failed_at,
            failed_at: d.failed_at,
            dead_lettered: d.dead_lettered,
            error_class: d.last_error_class.map(ErrorClass::as_str),
            error: d.last_error.as_deref(),
        }
    }

    /// The view of `d`, as JSON.
    pub fn json(d: &Delivery) -> serde_json::Value {
        serde_json::to_value(DeliveryView::of(d)).unwrap_or_default()
    }
}
