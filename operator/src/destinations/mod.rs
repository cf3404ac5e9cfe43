//! Destinations as operators see and steer them, for both faces: each
//! one's state (its circuit breaker's, or an operator's pause), the legs
//! waiting for it, its last error and its settings ([`view`]); pause and
//! resume, each with its audit row ([`change`]); an ordered destination's
//! halted keys, and their skip and retry ([`ordering`]); and the secret values a
//! destination's answer must never show ([`mask`]).
//!
//! A destination is known by its row in `destinations` (every worker
//! registers its configured ones at start) or by this process's
//! configuration; it is named `SOURCE/NAME` ([`Target`]).

mod change;
mod mask;
mod ordering;
mod settings;
mod view;

use hookinbox::key::{DestinationName, SourceName};
use hookinbox::postgres::DbError;

pub use change::{Action, Changed, change};
pub use mask::SecretValues;
pub use ordering::{HALTED_LIMIT, KeyAction, act, halted, halted_json, parse_key};
pub use settings::{BreakerSetting, HeaderSetting, RateSetting, RetrySetting, Settings};
pub use view::{DestinationView, list};

/// Why a destination could not be shown or changed.
#[derive(Debug, thiserror::Error)]
pub enum DestinationError {
    /// Not `SOURCE/NAME` of valid names.
    #[error("{0}")]
    BadTarget(String),
    /// Neither registered by a worker nor configured here.
    #[error(
        "no destination {0}: no worker registered one by that name and none is configured here \
         (hookinbox-worker destinations lists them)"
    )]
    Unknown(String),
    /// The key names no halted key of the destination.
    #[error(
        "{0} is not halted: no leg of it failed for good ahead of the others \
         (`destinations halted SOURCE/NAME` lists the halted keys)"
    )]
    NotHalted(String),
    /// The halting leg has no parked body to retry with.
    #[error(
        "the leg that halts this key (delivery {0}) has no body to retry with (a redelivery \
         from GitHub does not revive a dead leg): skip the key"
    )]
    NoBody(String),
    /// Postgres failed.
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<tokio_postgres::Error> for DestinationError {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Db(e.into())
    }
}

impl From<deadpool_postgres::PoolError> for DestinationError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        Self::Db(e.into())
    }
}

/// A destination by name: its source's and its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The source.
    pub source: SourceName,
    /// The destination's name in it.
    pub name: DestinationName,
}

impl Target {
    /// A target from its two names, each checked by the configuration's
    /// rules.
    pub fn new(source: &str, name: &str) -> Result<Self, DestinationError> {
        let source = SourceName::parse(source).map_err(|_| {
            DestinationError::BadTarget(
                "the source is 1 to 64 characters of a-z, 0-9, '-' and '_'".to_owned(),
            )
        })?;
        let name = DestinationName::parse(name).map_err(|_| {
            DestinationError::BadTarget(
                "the destination's name is 1 to 64 characters of a-z, 0-9, '-' and '_'".to_owned(),
            )
        })?;
        Ok(Self { source, name })
    }

    /// Reads `SOURCE/NAME`, as `HOOKINBOX_DESTINATIONS` names them.
    pub fn parse(text: &str) -> Result<Self, DestinationError> {
        let Some((source, name)) = text.split_once('/') else {
            return Err(DestinationError::BadTarget(
                "a destination is SOURCE/NAME, e.g. default/ci".to_owned(),
            ));
        };
        Self::new(source, name)
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.source, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_source_slash_name_of_valid_names() {
        let t = Target::parse("default/ci").expect("valid");
        assert_eq!(t.to_string(), "default/ci");
        for bad in [
            "ci",
            "",
            "/",
            "default/",
            "/ci",
            "Default/ci",
            "default/c i",
            "a/b/c",
        ] {
            let err = Target::parse(bad).expect_err(bad).to_string();
            assert!(
                err.contains("SOURCE/NAME") || err.contains("1 to 64"),
                "{bad}: {err}"
            );
        }
    }
}
