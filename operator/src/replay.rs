//! Replaying one delivery: the protocol both faces run, through a job's
//! step (`jobs::runner`). First the compare-and-set, in the caller's
//! transaction (which records the item's result beside it); then, after
//! that commit, the publish, undone (token-guarded) if it fails.

use deadpool_postgres::Pool;
use hookinbox::LegKey;
use hookinbox::broker::Publisher;
use hookinbox::deliveries::{self, Policy, Replayed, Republish, Scope};
use hookinbox::postgres::DbError;
use hookinbox::postgres::sql::Session;

/// What a replay of one delivery came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Back to processing under a new token, and its job published.
    Started,
    /// Not a leg its replay takes (any more): in flight (replayed or taken
    /// meanwhile), completed where only failed legs are replayed, filtered,
    /// or gone. Nothing changed.
    NotFailed,
    /// hookinbox holds no body of it: only GitHub can bring it back
    /// ([`deliveries::NO_BODY_TO_REPLAY`]). Nothing changed.
    NoBody,
    /// Its row cannot become a job: back among the dead letters, with the
    /// reason.
    Unreadable(String),
    /// The publish failed: back among the dead letters, with the error.
    PublishFailed(String),
    /// The publish failed, and the leg (a replay of any leg, completed ones
    /// too) is due in Postgres instead: the scheduler publishes it once the
    /// broker takes it. Counted as replayed, with the error.
    Queued(String),
}

impl Outcome {
    /// The result a job's item records: `replayed`, `skipped` or `failed`.
    pub fn result(&self) -> &'static str {
        match self {
            Self::Started | Self::Queued(_) => "replayed",
            Self::NotFailed => "skipped",
            Self::NoBody | Self::Unreadable(_) | Self::PublishFailed(_) => "failed",
        }
    }

    /// Why it failed, for the item.
    pub fn error(&self) -> Option<&str> {
        match self {
            Self::Started | Self::NotFailed => None,
            Self::NoBody => Some(deliveries::NO_BODY_TO_REPLAY),
            Self::Unreadable(why) | Self::PublishFailed(why) | Self::Queued(why) => Some(why),
        }
    }
}

/// The first half of [`replay_one`]: the compare-and-set, in `tx`.
pub enum Begun {
    /// Commit, then [`publish`] this job.
    Publish(Box<Republish>),
    /// Done: nothing to publish.
    Done(Outcome),
}

/// Replays `key` in `tx`, the legs `scope` says: the compare-and-set
/// decides (a leg replayed meanwhile, or no longer one the scope takes, is
/// left alone: never started twice); an unreadable row is dead-lettered
/// with its reason in the same transaction.
pub async fn begin(
    tx: &impl Session,
    policy: &Policy,
    key: &LegKey,
    scope: Scope,
) -> Result<Begun, DbError> {
    Ok(match deliveries::replay(tx, policy, key, scope).await? {
        Replayed::Started(parked) => Begun::Publish(parked),
        Replayed::NotFailed => Begun::Done(Outcome::NotFailed),
        Replayed::NoBody => Begun::Done(Outcome::NoBody),
        Replayed::Unreadable(unreadable) => {
            deliveries::dead_letter_unreadable(tx, &unreadable).await?;
            Begun::Done(Outcome::Unreadable(unreadable.reason))
        }
    })
}

/// The second half: publishes a begun replay once its transaction has
/// committed. When the publish fails, a replay of failed legs puts the
/// delivery back among the dead letters; a replay of any leg (`scope`
/// [`Scope::Ended`]: it may have been completed, and was no dead letter)
/// records it as due, as ingest does a leg it could not publish, so that
/// the scheduler publishes it once the broker is back. Either is guarded
/// by the replay's token: a worker that took it meanwhile keeps it.
pub async fn publish(
    pool: &Pool,
    publisher: &Publisher,
    begun: &Republish,
    scope: Scope,
) -> Result<Outcome, DbError> {
    let job = &begun.envelope;
    match publisher.publish(job).await {
        Ok(()) => Ok(Outcome::Started),
        Err(e) => {
            let error = e.to_string();
            let client = pool.get().await?;
            if scope == Scope::Ended {
                deliveries::publish_failed(&client, &job.key, job.token, &error, 0).await?;
                return Ok(Outcome::Queued(format!(
                    "not published now ({error}): due in Postgres, the scheduler publishes it"
                )));
            }
            deliveries::unreplay(&client, &job.key, job.token, &error).await?;
            Ok(Outcome::PublishFailed(error))
        }
    }
}

/// Replays one delivery: [`begin`] in a transaction of its own, then
/// [`publish`]. A job's step runs the same two halves around its item's
/// record.
pub async fn replay_one(
    pool: &Pool,
    publisher: &Publisher,
    policy: &Policy,
    key: &LegKey,
    scope: Scope,
) -> Result<Outcome, DbError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let begun = begin(&tx, policy, key, scope).await?;
    tx.commit().await?;
    match begun {
        Begun::Done(outcome) => Ok(outcome),
        Begun::Publish(parked) => publish(pool, publisher, &parked, scope).await,
    }
}
