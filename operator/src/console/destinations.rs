//! The console's side of destinations (`crate::destinations`, shared with
//! the CLI): a destination named by a path's two segments, each checked
//! and named when bad; the list; pause and resume as the caller, audited.

use hookinbox::key::{DestinationName, SourceName};

use crate::destinations::{self, DestinationError, Target};
pub use crate::destinations::{Action, Changed, DestinationView};

use super::error::AdminError;
use super::state::State;
use super::tokens::Identity;

impl From<DestinationError> for AdminError {
    fn from(e: DestinationError) -> Self {
        match e {
            DestinationError::BadTarget(problem) => AdminError::field("destination", problem),
            DestinationError::Unknown(_) => AdminError::NotFound(e.to_string()),
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
