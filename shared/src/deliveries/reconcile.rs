//! What the reconciler reads: what hookinbox holds of the deliveries in
//! GitHub's log. A delivery hookinbox holds needs no redelivery; one it
//! cannot finish on its own (a claim with no body and no job) does.

use std::collections::HashMap;

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
    /// A claim with no body parked and no job: its ingest died between the
    /// claim and the publish (reaped `lost`, or untaken with its lease
    /// expired). Only a redelivery from GitHub can finish it.
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
        held.insert(row.get(0), state);
    }
    Ok(held)
}
