//! The console's side of destinations (`crate::destinations`, shared with
//! the CLI): a destination named by a path's two segments, each checked
//! and named when bad; the list; pause and resume as the caller, audited;
//! an ordered destination's halted keys, and the skip or retry of one.

use hookinbox::LegKey;
use hookinbox::deliveries::HaltedKey;
use hookinbox::key::{DestinationName, SourceName};

use crate::destinations::{self, DestinationError, Target};
pub use crate::destinations::{Action, Changed, DestinationView, KeyAction, halted_json};

use super::error::AdminError;
use super::state::State;
use super::tokens::Identity;

impl From<DestinationError> for AdminError {
    fn from(e: DestinationError) -> Self {
        match e {
            DestinationError::BadTarget(problem) => AdminError::field("destination", problem),
            DestinationError::Unknown(_) => AdminError::NotFound(e.to_string()),
            DestinationError::NotHalted(_) | DestinationError::NoBody(_) => {
                AdminError::Conflict(e.to_string())
            }
            DestinationError::Db(e) => e.into(),
        }
    }
}

/// The destination a path names, each segment checked by the
/// configuration's rules (a bad one is a 400 naming `source` or
/// `destination`).
pub fn target(source: &str, name: &str) -> Result<Target, AdminError> {
    let source = SourceName::parse(source).map_err(|_| {
        AdminError::field(
            "source",
            "a source name: 1 to 64 characters of a-z, 0-9, '-' and '_'",
        )
    })?;
    let name = DestinationName::parse(name).map_err(|_| {
        AdminError::field(
            "destination",
            "a destination's name: 1 to 64 characters of a-z, 0-9, '-' and '_'",
        )
    })?;
    Ok(Target { source, name })
}

/// Every destination, registered or configured.
pub async fn list(state: &State) -> Result<Vec<DestinationView>, AdminError> {
    let client = state.pool.get().await?;
    Ok(destinations::list(&client, &state.routes).await?)
}

/// Pauses or resumes `target` as `who` (an operator), audited.
pub async fn change(
    state: &State,
    who: &Identity,
    target: &Target,
    action: Action,
) -> Result<Changed, AdminError> {
    Ok(destinations::change(&state.pool, &state.routes, who, target, action).await?)
}

/// The halted keys of `target`, oldest halt first (404 when it is unknown
/// or not ordered).
pub async fn halted(state: &State, target: &Target) -> Result<Vec<HaltedKey>, AdminError> {
    Ok(destinations::halted(&state.pool, &state.routes, target).await?)
}

/// The halted keys of each destination this console's configuration
/// orders, and of any other configured one that has some (it was ordered
/// before), in the configuration's order (for the page).
pub async fn halted_by_destination(
    state: &State,
) -> Result<Vec<(Target, Vec<HaltedKey>)>, AdminError> {
    let mut all = Vec::new();
    for route in state.routes.iter() {
        let target = Target {
            source: route.source.clone(),
            name: route.destination.name.clone(),
        };
        let keys = halted(state, &target).await?;
        if route.destination.ordering.is_some() || !keys.is_empty() {
            all.push((target, keys));
        }
    }
    Ok(all)
}

/// A key as a path names it (`123` or `123#45`), checked (a bad one is a
/// 400 naming `key`).
pub fn key(key: &str) -> Result<&str, AdminError> {
    destinations::parse_key(key).map_err(|e| match e {
        DestinationError::BadTarget(problem) => AdminError::field("key", problem),
        other => other.into(),
    })
}

/// Skips or retries the leg that halts `key` of `target` as `who` (an
/// operator), audited; returns that leg (409 when the key is not halted,
/// or, retried, its leg has no body).
pub async fn act(
    state: &State,
    who: &Identity,
    target: &Target,
    key_text: &str,
    action: KeyAction,
) -> Result<LegKey, AdminError> {
    let key_text = key(key_text)?;
    Ok(destinations::act(&state.pool, &state.routes, who, target, key_text, action).await?)
}
