//! Rows read back into the nouns, and the helpers the batched statements
//! share to address many keys at once.

use std::collections::BTreeMap;

use super::{ErrorClass, Param, Status};
use crate::job::Envelope;
use crate::key::{ClaimToken, EventName, LegKey};
use crate::postgres::DbError;

/// A leg's key as five owned strings, the shape a batched statement
/// returns.
pub(super) type KeyTuple = (String, String, String, String, String);

/// `key` as a [`KeyTuple`].
pub(super) fn key_tuple(key: &LegKey) -> KeyTuple {
    (
        key.provider.clone(),
        key.source.as_str().to_owned(),
        key.hook_id.as_str().to_owned(),
        key.delivery_id.as_str().to_owned(),
        key.destination.as_str().to_owned(),
    )
}

/// The first position of each distinct key, in key order. One statement
/// cannot update a row twice, so a batch sends each key once; and batches
/// that send their keys in one order lock rows in one order, so concurrent
/// batches cannot deadlock.
pub(super) fn firsts_by_key<'a>(
    keys: impl Iterator<Item = &'a LegKey>,
) -> BTreeMap<&'a LegKey, usize> {
    let mut firsts = BTreeMap::new();
    for (i, key) in keys.enumerate() {
        firsts.entry(key).or_insert(i);
    }
    firsts
}

/// The five key columns of many legs, for
/// `unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])`.
pub(super) struct KeyColumns<'a> {
    pub(super) provider: Vec<&'a str>,
    pub(super) source: Vec<&'a str>,
    pub(super) hook_id: Vec<&'a str>,
    pub(super) delivery_id: Vec<&'a str>,
    pub(super) destination: Vec<&'a str>,
}

impl<'a> KeyColumns<'a> {
    /// The five columns as `$1`–`$5`, then `rest`.
    pub(super) fn params<'p>(&'p self, rest: &[Param<'p>]) -> Vec<Param<'p>> {
        let mut all: Vec<Param<'p>> = vec![
            &self.provider,
            &self.source,
            &self.hook_id,
            &self.delivery_id,
            &self.destination,
        ];
        all.extend_from_slice(rest);
        all
    }

    pub(super) fn of(keys: impl Iterator<Item = &'a LegKey>) -> Self {
        let mut columns = Self {
            provider: Vec::new(),
            source: Vec::new(),
            hook_id: Vec::new(),
            delivery_id: Vec::new(),
            destination: Vec::new(),
        };
        for key in keys {
            columns.provider.push(&key.provider);
            columns.source.push(key.source.as_str());
            columns.hook_id.push(key.hook_id.as_str());
            columns.delivery_id.push(key.delivery_id.as_str());
            columns.destination.push(key.destination.as_str());
        }
        columns
    }
}

/// A stored status; anything else is a row that no longer parses.
pub(super) fn status_of(stored: &str) -> Result<Status, DbError> {
    stored.parse().map_err(|_| DbError::BadRow("status"))
}

/// A stored error class.
pub(super) fn class_of(stored: Option<&str>) -> Result<Option<ErrorClass>, DbError> {
    stored
        .map(|c| c.parse().map_err(|_| DbError::BadRow("last_error_class")))
        .transpose()
}

/// The five key columns of a row, as stored.
pub(super) fn key_parts(row: &tokio_postgres::Row) -> [String; 5] {
    [
        row.get("provider"),
        row.get("source"),
        row.get("hook_id"),
        row.get("delivery_id"),
        row.get("destination"),
    ]
}

/// The key of a row. Rows are written from validated keys; a row that no
/// longer parses is reported rather than trusted.
pub(super) fn key_from_parts(parts: &[String; 5]) -> Result<LegKey, DbError> {
    let [provider, source, hook_id, delivery_id, destination] = parts;
    LegKey::from_parts(provider, source, hook_id, delivery_id, destination)
        .map_err(|e| DbError::BadRow(e.part()))
}

/// A leg moved back to `processing` (by the scheduler, a release, a probe
/// or a replay), or found dead without its broker copy: the job to
/// publish, a key and no body (the worker's take reads the body).
#[derive(Clone, Debug)]
pub struct Republish {
    /// The job, carrying the row's current token.
    pub envelope: Envelope,
    /// Takes so far.
    pub attempts: i32,
}

/// A row that cannot become a job: a key part or the event no longer
/// parses (the row was edited by hand). It is dead-lettered with the reason
/// ([`super::dead_letter_unreadable`]) rather than skipped or retried
/// forever.
#[derive(Clone, Debug)]
pub struct Unreadable {
    /// The leg's five key parts, as stored.
    pub parts: Box<[String; 5]>,
    /// The token the row carries now.
    pub token: ClaimToken,
    /// What does not parse.
    pub reason: String,
}

/// A row of the statements that publish a leg again (`…, event, action,
/// claim_token, attempts`, and `traceparent` where the statement returns
/// it) as the job to publish, or as [`Unreadable`] when its key or event no
/// longer parses.
pub(super) fn republish(row: &tokio_postgres::Row) -> Result<Republish, Unreadable> {
    let parts = key_parts(row);
    let token = ClaimToken(row.get("claim_token"));
    let unreadable = |reason: String| Unreadable {
        parts: Box::new(parts.clone()),
        token,
        reason,
    };
    let key = key_from_parts(&parts).map_err(|e| unreadable(e.to_string()))?;
    let event: &str = row.get("event");
    let event = EventName::parse(event.as_bytes())
        .map_err(|_| unreadable(DbError::BadRow("event").to_string()))?;
    let attempts: i32 = row.get("attempts");
    Ok(Republish {
        envelope: Envelope {
            key,
            event,
            action: row.get("action"),
            token,
            attempts: Some(attempts),
            // The statements that publish again return the row's first
            // trace; the worker's span links to it.
            trace: crate::job::JobTrace {
                parent: None,
                origin: row.try_get("traceparent").ok().flatten(),
            },
            carried: None,
            copy: None,
        },
        attempts,
    })
}
