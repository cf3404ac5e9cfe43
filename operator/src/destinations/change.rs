//! An operator's pause or resume of a destination, with its audit row, in
//! one transaction: the row is locked and its state read, changed, and
//! the change recorded naming who made it and the state it left. A change
//! that changes nothing (pausing a paused destination) writes nothing.

use deadpool_postgres::Pool;
use hookinbox::config::Route;
use hookinbox::deliveries::{self, BreakerState, Registration};
use serde_json::json;

use super::{DestinationError, Target};
use crate::actor::Identity;
use crate::audit;

/// What an operator does to a destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Hold its legs (no attempt, no probe) until resumed.
    Pause,
    /// Back to `closed`, from any state: a paused, open or disabled
    /// destination's waiting legs go again.
    Resume,
}

impl Action {
    /// The audit row's action.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pause => "pause_destination",
            Self::Resume => "resume_destination",
        }
    }

    /// The state it leads to.
    pub fn state(self) -> BreakerState {
        match self {
            Self::Pause => BreakerState::Paused,
            Self::Resume => BreakerState::Closed,
        }
    }
}

/// What came of a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Changed {
    /// The state before.
    pub from: BreakerState,
    /// The state now.
    pub to: BreakerState,
}

impl Changed {
    /// Whether the state changed (else it was in that state already, and
    /// nothing was written).
    pub fn changed(&self) -> bool {
        self.from != self.to
    }
}

/// Pauses or resumes `target`, audited as `who`. A destination configured
/// here that no worker registered yet is registered first (as a worker
/// would at start), so that it can be paused before it ever runs. Refuses
/// a destination neither registered nor configured.
pub async fn change(
    pool: &Pool,
    routes: &[Route],
    who: &Identity,
    target: &Target,
    action: Action,
) -> Result<Changed, DestinationError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let mut from = deliveries::lock_destination(&tx, &target.source, &target.name).await?;
    if from.is_none() {
        let configured = routes
            .iter()
            .find(|r| r.source == target.source && r.destination.name == target.name);
        let Some(route) = configured else {
            return Err(DestinationError::Unknown(target.to_string()));
        };
        let d = &route.destination;
        let registration = Registration {
            source: route.source.clone(),
            name: d.name.clone(),
            kind: d.kind.name().to_owned(),
            probe: d.breaker.unwrap_or_default().probe,
            disable_after: d.disable_after,
        };
        deliveries::register(&tx, &[registration]).await?;
        from = deliveries::lock_destination(&tx, &target.source, &target.name).await?;
    }
    let from = from.ok_or_else(|| DestinationError::Unknown(target.to_string()))?;
    let to = action.state();
    if from == to {
        return Ok(Changed { from, to });
    }
    deliveries::set_by_operator(&tx, &target.source, &target.name, to, &who.name).await?;
    audit::record(
        &tx,
        who,
        action.as_str(),
        &json!({"destination": {"source": target.source.as_str(), "name": target.name.as_str()}}),
        1,
        &format!("{} (was {})", to.as_str(), from.as_str()),
        None,
    )
    .await?;
    tx.commit().await?;
    Ok(Changed { from, to })
}
