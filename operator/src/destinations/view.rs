//! The one JSON of a destination: the CLI's `destinations --json` and the
//! console's API (`docs/admin-openapi.json`, `Destination`) both print it,
//! and the console's page shows it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use hookinbox::config::Route;
use hookinbox::deliveries::{self, BreakerState};
use hookinbox::postgres::DbError;
use hookinbox::postgres::sql::Session;
use serde::Serialize;

use super::mask::SecretValues;
use super::settings::Settings;

/// A destination as operators read it.
#[derive(Clone, Debug, Serialize)]
pub struct DestinationView {
    /// Its source.
    pub source: String,
    /// Its name.
    pub name: String,
    /// Its kind: `forward`, `store`, a handler's name.
    pub kind: String,
    /// `closed`, `open`, `half_open`, `paused` or `disabled`. A
    /// destination no worker registered yet is `closed`, as it will start.
    pub state: &'static str,
    /// Since when (none before a worker registered it).
    pub state_since: Option<DateTime<Utc>>,
    /// Who changed it last: `breaker`, or an operator's name.
    pub changed_by: Option<String>,
    /// When its breaker opened.
    pub opened_at: Option<DateTime<Utc>>,
    /// While open: when the next probe may go.
    pub probe_at: Option<DateTime<Utc>>,
    /// Legs waiting for it: in its queue untaken, retrying, or held.
    pub waiting: i64,
    /// How long the oldest of them has waited, in seconds (since it was
    /// first claimed).
    pub oldest_waiting_secs: Option<f64>,
    /// The last error that moved its breaker (short, redacted).
    pub last_error: Option<String>,
    /// When.
    pub last_error_at: Option<DateTime<Utc>>,
    /// Whether a worker registered it (it has a row).
    pub registered: bool,
    /// Whether this process's configuration has it; its settings are
    /// shown only then.
    pub configured: bool,
    /// Its settings, as this process's configuration has them.
    pub settings: Option<Settings>,
}

impl DestinationView {
    /// `SOURCE/NAME`.
    pub fn target(&self) -> String {
        format!("{}/{}", self.source, self.name)
    }

    /// The view as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// Every destination registered in Postgres or configured in `routes`,
/// by source and name, with the legs waiting for each. Legs claimed before
/// destinations existed (the empty name) count for their source's first
/// configured destination, which runs them. A last error is shown with
/// every secret header value masked ([`SecretValues`]).
pub async fn list(
    client: &impl Session,
    routes: &[Route],
) -> Result<Vec<DestinationView>, DbError> {
    let rows = deliveries::rows(client).await?;
    let waiting = deliveries::waiting(client).await?;
    let secrets = SecretValues::of(routes);
    let mut all: BTreeMap<(String, String), DestinationView> = BTreeMap::new();
    for row in rows {
        let key = (row.source.clone(), row.name.clone());
        all.insert(
            key,
            DestinationView {
                source: row.source,
                name: row.name,
                kind: row.kind,
                state: row.state.as_str(),
                state_since: Some(row.state_since),
                changed_by: row.changed_by,
                opened_at: row.opened_at,
                probe_at: row.probe_at,
                waiting: 0,
                oldest_waiting_secs: None,
                last_error: row.last_error.map(|e| secrets.mask(&e)),
                last_error_at: row.last_error_at,
                registered: true,
                configured: false,
                settings: None,
            },
        );
    }
    for route in routes {
        let key = (
            route.source.as_str().to_owned(),
            route.destination.name.as_str().to_owned(),
        );
        let view = all.entry(key).or_insert_with(|| DestinationView {
            source: route.source.as_str().to_owned(),
            name: route.destination.name.as_str().to_owned(),
            kind: route.destination.kind.name().to_owned(),
            state: BreakerState::Closed.as_str(),
            state_since: None,
            changed_by: None,
            opened_at: None,
            probe_at: None,
            waiting: 0,
            oldest_waiting_secs: None,
            last_error: None,
            last_error_at: None,
            registered: false,
            configured: false,
            settings: None,
        });
        view.configured = true;
        view.settings = Some(Settings::of(route));
    }
    for w in waiting {
        let name = if w.destination.is_empty() {
            match routes.iter().find(|r| r.source.as_str() == w.source) {
                Some(first) => first.destination.name.as_str().to_owned(),
                None => continue,
            }
        } else {
            w.destination
        };
        if let Some(view) = all.get_mut(&(w.source, name)) {
            view.waiting += w.legs;
            view.oldest_waiting_secs = Some(
                view.oldest_waiting_secs
                    .map_or(w.oldest_secs, |o| o.max(w.oldest_secs)),
            );
        }
    }
    Ok(all.into_values().collect())
}
