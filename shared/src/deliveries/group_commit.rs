//! The group commits of the state machine: ingest batches its claims
//! ([`claims`], [`super::claim_batch`]) and the worker its takes
//! ([`takes`], [`super::take_batch`]), its reads of bodies for the
//! one-statement path ([`fetches`], [`super::bodies::fetch_batch`]) and
//! its completions ([`completions`], [`super::complete_batch`]). The
//! mechanism is [`crate::postgres::Batcher`].
//!
//! One row must not fail its neighbours. A batched statement is one
//! statement: a row Postgres refuses (a payload `jsonb` cannot hold, say)
//! fails all of it. Postgres answered, so nothing committed, and the rows
//! are tried again apart: completions in halves until the refused rows
//! stand alone, claims and takes one by one. A statement with no answer
//! (the connection broke) may have committed; that stays an error for the
//! whole batch, and its callers take again.

use deadpool_postgres::Pool;

use crate::postgres::sql::Session;

use super::{AttemptLog, ClaimRequest, Claimed, Completing, Policy, Take, Taking};
use crate::postgres::{BatchShape, Batcher, DbError, Refusal};

/// The destinations' attempt log, many attempts per statement.
pub type AttemptLogBatcher = Batcher<AttemptLog, ()>;

/// Starts the attempt-log collector.
pub fn attempt_log(pool: Pool, shape: BatchShape) -> AttemptLogBatcher {
    Batcher::start(shape, move |items: Vec<AttemptLog>| {
        let pool = pool.clone();
        async move {
            let client = pool.get().await?;
            super::log_attempts(&client, &items).await?;
            Ok(vec![(); items.len()])
        }
    })
}

/// Ingest's claims, `HOOKINBOX_CLAIM_BATCH` per statement, each answered
/// with the traces its request links to; a claim Postgres refused on its
/// own answers its refusal.
pub type ClaimBatcher = Batcher<ClaimRequest, Result<Claimed, Refusal>>;

/// Starts the claim collector.
pub fn claims(pool: Pool, policy: Policy, shape: BatchShape) -> ClaimBatcher {
    Batcher::start(shape, move |claims: Vec<ClaimRequest>| {
        let pool = pool.clone();
        async move {
            let client = pool.get().await?;
            match super::claim_batch_linked(&client, &policy, &claims).await {
                Ok(answers) => Ok(answers.into_iter().map(Ok).collect()),
                Err(e) if e.refusal().is_some() => {
                    let mut answers = Vec::with_capacity(claims.len());
                    for request in &claims {
                        answers.push(refused_alone(
                            super::claim_linked(&client, &policy, request).await,
                        )?);
                    }
                    Ok(answers)
                }
                Err(e) => Err(e),
            }
        }
    })
}

/// The worker's takes, `HOOKINBOX_TAKE_BATCH` per statement; `None` means
/// the fast path did not take it (see [`super::take_batch`]), and the
/// caller takes it on its own. A batch Postgres refused answers `None` for
/// every message, so each finds its own answer.
pub type TakeBatcher = Batcher<Taking, Option<Take>>;

/// Starts the take collector.
pub fn takes(pool: Pool, policy: Policy, shape: BatchShape) -> TakeBatcher {
    Batcher::start(shape, move |items: Vec<Taking>| {
        let pool = pool.clone();
        async move {
            let client = pool.get().await?;
            match super::take_batch(&client, &policy, &items).await {
                Err(e) if e.refusal().is_some() => Ok(vec![None; items.len()]),
                other => other,
            }
        }
    })
}

/// The one-statement path's reads of bodies, `HOOKINBOX_TAKE_BATCH` per
/// statement: each leg's delivery's body and the leg's replays, `None`
/// where the leg or its body is not there.
pub type FetchBatcher = Batcher<crate::key::LegKey, Option<super::bodies::Fetched>>;

/// Starts the body-read collector.
pub fn fetches(pool: Pool, shape: BatchShape) -> FetchBatcher {
    Batcher::start(shape, move |legs: Vec<crate::key::LegKey>| {
        let pool = pool.clone();
        async move {
            let client = pool.get().await?;
            super::bodies::fetch_batch(&client, &legs).await
        }
    })
}

/// The worker's completions, `HOOKINBOX_COMPLETE_BATCH` per statement: for
/// each, when ingest first claimed the delivery if that row's token still
/// held it (`None`: fenced), or Postgres's refusal of that row.
pub type CompletionBatcher = Batcher<Completing, Result<Option<Received>, Refusal>>;

/// When ingest first claimed a delivery (its row's `created_at`).
pub type Received = chrono::DateTime<chrono::Utc>;

/// Starts the completion collector.
pub fn completions(pool: Pool, shape: BatchShape) -> CompletionBatcher {
    Batcher::start(shape, move |items: Vec<Completing>| {
        let pool = pool.clone();
        async move {
            let client = pool.get().await?;
            let result = complete_apart(&client, &items).await;
            if result.is_err() {
                // Whether the statement committed is unknown; never hand
                // this session out again.
                drop(deadpool_postgres::Object::take(client));
            }
            result
        }
    })
}

/// Completes `items`, those that are also the take and the others in
/// statements of their own (see [`super::complete_batch`]); when Postgres
/// refuses a statement, in halves until each refused row stands alone.
/// Every good row completes in this same call.
pub async fn complete_apart(
    client: &impl Session,
    items: &[Completing],
) -> Result<Vec<Result<Option<Received>, Refusal>>, DbError> {
    let taking = |item: &Completing| item.take.is_some();
    // The common case, one kind: no copy.
    if items.iter().all(taking) || !items.iter().any(taking) {
        return complete_one_kind(client, items).await;
    }
    let mut answers = vec![Ok(None); items.len()];
    for kind in [true, false] {
        let (places, picked): (Vec<usize>, Vec<Completing>) = items
            .iter()
            .enumerate()
            .filter(|(_, item)| taking(item) == kind)
            .map(|(i, item)| (i, item.clone()))
            .unzip();
        for (i, answer) in places
            .into_iter()
            .zip(complete_one_kind(client, &picked).await?)
        {
            answers[i] = answer;
        }
    }
    Ok(answers)
}

/// [`complete_apart`] of completions of one kind: one statement, or its
/// halves when Postgres refuses it.
async fn complete_one_kind(
    client: &impl Session,
    items: &[Completing],
) -> Result<Vec<Result<Option<Received>, Refusal>>, DbError> {
    let mut answers: Vec<Option<Result<Option<Received>, Refusal>>> = vec![None; items.len()];
    // The ranges still to try: first the whole batch.
    let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
    ranges.push(0..items.len());
    while let Some(range) = ranges.pop() {
        match super::complete_batch(client, &items[range.clone()]).await {
            Ok(done) => {
                for (i, completed) in range.zip(done) {
                    answers[i] = Some(Ok(completed));
                }
            }
            Err(e) => match e.refusal() {
                Some(refusal) if range.len() == 1 => answers[range.start] = Some(Err(refusal)),
                Some(_) => {
                    let middle = range.start + range.len() / 2;
                    ranges.push(range.start..middle);
                    ranges.push(middle..range.end);
                }
                None => return Err(e),
            },
        }
    }
    Ok(answers.into_iter().map(|a| a.unwrap_or(Ok(None))).collect())
}

/// A statement's own answer: Postgres's refusal becomes the row's answer,
/// an unknown outcome stays an error.
fn refused_alone<T>(result: Result<T, DbError>) -> Result<Result<T, Refusal>, DbError> {
    match result {
        Ok(answer) => Ok(Ok(answer)),
        Err(e) => match e.refusal() {
            Some(refusal) => Ok(Err(refusal)),
            None => Err(e),
        },
    }
}
