//! An ordered destination's halted keys, for both faces: the list, and an
//! operator's skip or retry of the leg that halts one, each with its audit
//! row in the same transaction.

use deadpool_postgres::Pool;
use hookinbox::LegKey;
use hookinbox::config::Route;
use hookinbox::deliveries::{self, HaltedKey};
use hookinbox::postgres::sql;
use serde_json::json;

use super::{DestinationError, Target};
use crate::actor::Identity;
use crate::audit;

/// At most this many halted keys are listed.
pub const HALTED_LIMIT: i64 = 1000;

/// The longest key: a repository's id, `#`, and an issue's number.
const MAX_KEY: usize = 64;

/// What an operator does to a halted key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyAction {
    /// The halting leg stays dead; the key resumes with its next leg.
    Skip,
    /// The halting leg goes again, in its place, with fresh attempts.
    Retry,
}

impl KeyAction {
    /// The audit row's action.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip_halted_key",
            Self::Retry => "retry_halted_key",
        }
    }
}

/// Checks a key as typed: what `halted` lists (digits, optionally `#` and
/// digits).
pub fn parse_key(key: &str) -> Result<&str, DestinationError> {
    let well_formed = !key.is_empty()
        && key.len() <= MAX_KEY
        && key
            .split_once('#')
            .map_or(all_digits(key), |(r, n)| all_digits(r) && all_digits(n));
    if well_formed {
        Ok(key)
    } else {
        Err(DestinationError::BadTarget(format!(
            "'{}' is not a key: a repository's id (123), or ordered by pull request its id and \
             number (123#45), as `destinations halted` lists them",
            key.escape_debug()
        )))
    }
}

fn all_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// A halted key as the CLI's `--json` and the console's API show it.
pub fn halted_json(k: &HaltedKey) -> serde_json::Value {
    json!({
        "key": k.key,
        "delivery_id": k.halted_by.delivery_id.as_str(),
        "hook_id": k.halted_by.hook_id.as_str(),
        "event": k.event,
        "action": k.action,
        "failed_at": k.failed_at.map(|t| t.to_rfc3339()),
        "error_class": k.error_class,
        "error": k.error,
        "waiting": k.waiting,
    })
}

/// Refuses a destination neither registered by a worker nor configured
/// here. One configured without `ordering` is not refused: its legs keep
/// the keys they were claimed with (it may have been ordered before), and
/// they are what says which keys are halted.
async fn check(
    client: &impl sql::Session,
    routes: &[Route],
    target: &Target,
) -> Result<(), DestinationError> {
    let configured = routes
        .iter()
        .any(|r| r.source == target.source && r.destination.name == target.name);
    if configured {
        return Ok(());
    }
    let registered = sql::query_opt(
        client,
        "select 1 from destinations where source = $1 and name = $2",
        &[&target.source.as_str(), &target.name.as_str()],
    )
    .await?;
    match registered {
        Some(_) => Ok(()),
        None => Err(DestinationError::Unknown(target.to_string())),
    }
}

/// The halted keys of `target`, oldest halt first.
pub async fn halted(
    pool: &Pool,
    routes: &[Route],
    target: &Target,
) -> Result<Vec<HaltedKey>, DestinationError> {
    let client = pool.get().await?;
    check(&client, routes, target).await?;
    Ok(deliveries::halted(&client, &target.source, &target.name, None, HALTED_LIMIT).await?)
}

/// Skips or retries the leg that halts `key` of `target`, audited as
/// `who`. Returns the leg it acted on; a key that is not halted (or,
/// retried, whose leg has no body) is an error that says so, and nothing
/// is written.
pub async fn act(
    pool: &Pool,
    routes: &[Route],
    who: &Identity,
    target: &Target,
    key: &str,
    action: KeyAction,
) -> Result<LegKey, DestinationError> {
    let key = parse_key(key)?;
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    check(&tx, routes, target).await?;
    let acted = match action {
        KeyAction::Skip => {
            deliveries::skip(&tx, &target.source, &target.name, key, &who.name).await?
        }
        KeyAction::Retry => deliveries::retry(&tx, &target.source, &target.name, key).await?,
    };
    let Some(leg) = acted else {
        let halted = deliveries::halted(&tx, &target.source, &target.name, Some(key), 1).await?;
        return Err(match halted.first() {
            Some(h) => DestinationError::NoBody(h.halted_by.delivery_id.to_string()),
            None => DestinationError::NotHalted(format!("{target} {key}")),
        });
    };
    audit::record(
        &tx,
        who,
        action.as_str(),
        &json!({
            "destination": {"source": target.source.as_str(), "name": target.name.as_str()},
            "key": key,
            "delivery_id": leg.delivery_id.as_str(),
            "hook_id": leg.hook_id.as_str(),
        }),
        1,
        match action {
            KeyAction::Skip => "skipped: the key resumes with its next leg",
            KeyAction::Retry => "retried in its place: the key waits for it",
        },
        None,
    )
    .await?;
    tx.commit().await?;
    Ok(leg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_an_id_or_an_id_and_a_number() {
        for good in ["1", "123456789", "12#3"] {
            assert_eq!(parse_key(good).ok(), Some(good));
        }
        for bad in ["", "#", "1#", "#2", "a", "1#2#3", "1 2", &"9".repeat(65)] {
            assert!(parse_key(bad).is_err(), "{bad}");
        }
    }
}
