//! What the reconciler reads: what hookinbox holds of the deliveries in
//! GitHub's log. A delivery hookinbox holds needs no redelivery; one it
//! cannot finish on its own (a claim with no body and no job) does. And
//! what operators read of the reconciler: each source's last pass.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use crate::postgres::sql::{self, Session};

use super::Status;
use super::row::status_of;
use crate::key::{PROVIDER_GITHUB, SourceName};
use crate::postgres::DbError;

/// What hookinbox holds of one delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Completed: the effect happened.
    Completed,
    /// In flight, retrying, or dead-lettered with its body: hookinbox
    /// finishes it (or an operator replays it) without GitHub.
    Durable(Status),
    /// A claim with no body kept and no job (a leg claimed before the claim
    /// wrote bodies, reaped `lost` or untaken with its lease expired).
    /// Only a redelivery from GitHub can finish it.
    AwaitingRedelivery,
}

const HELD: &str = concat!(
    "
select d.delivery_id, d.status, ",
    awaiting_redelivery!("d"),
    "
from deliveries d
where d.provider = $1 and d.source = $2 and d.hook_id = $3 and d.delivery_id = any($4)"
);

/// What hookinbox holds of each of `guids` received by `source` from the
/// hook `hook_id`; a GUID it never claimed is absent. One statement, by the
/// primary key.
pub async fn held(
    client: &impl Session,
    source: &SourceName,
    hook_id: &str,
    guids: &[&str],
) -> Result<HashMap<String, Held>, DbError> {
    let rows = sql::query(client, HELD, &[&PROVIDER_GITHUB, source, &hook_id, &guids]).await?;
    let mut held = HashMap::with_capacity(rows.len());
    for row in rows {
        let status = status_of(row.get(1))?;
        let awaiting: bool = row.get(2);
        let state = match status {
            _ if awaiting => Held::AwaitingRedelivery,
            Status::Completed => Held::Completed,
            other => Held::Durable(other),
        };
        // A row per leg: the delivery is what its neediest leg is. One leg
        // awaiting a redelivery needs it however many others completed
        // (its ingest may die after publishing some legs and before the
        // rest).
        held.entry(row.get(0))
            .and_modify(|known: &mut Held| {
                if state.need() > known.need() {
                    *known = state;
                }
            })
            .or_insert(state);
    }
    Ok(held)
}

impl Held {
    /// How much a delivery in this state needs from the reconciler:
    /// completed nothing, durable a watch, awaiting a redelivery.
    fn need(self) -> u8 {
        match self {
            Self::Completed => 0,
            Self::Durable(_) => 1,
            Self::AwaitingRedelivery => 2,
        }
    }
}

/// One source's reconciler state (`reconcile_state`, written by the
/// reconciler), as operators see it.
#[derive(Clone, Debug)]
pub struct ReconcilerState {
    /// The source.
    pub source: String,
    /// The hook.
    pub hook: String,
    /// Every delivery logged before this was judged.
    pub watermark: Option<DateTime<Utc>>,
    /// The last complete pass.
    pub last_pass_at: Option<DateTime<Utc>>,
    /// The last pass, complete or not.
    pub last_attempt_at: Option<DateTime<Utc>>,
    /// Why the last pass did not complete, if it did not.
    pub last_error: Option<String>,
    /// The last complete pass's counts.
    pub last_counts: Option<serde_json::Value>,
}

const RECONCILER_STATES: &str = "
select source, hook, watermark, last_pass_at, last_attempt_at, last_error, last_counts
from reconcile_state order by source";

/// Every source's reconciler state.
pub async fn reconciler_states(client: &impl Session) -> Result<Vec<ReconcilerState>, DbError> {
    Ok(sql::query(client, RECONCILER_STATES, &[])
        .await?
        .iter()
        .map(|row| ReconcilerState {
            source: row.get(0),
            hook: row.get(1),
            watermark: row.get(2),
            last_pass_at: row.get(3),
            last_attempt_at: row.get(4),
            last_error: row.get(5),
            last_counts: row.get(6),
        })
        .collect())
}
