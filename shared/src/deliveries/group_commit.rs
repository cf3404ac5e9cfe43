//! The three group commits of the state machine: ingest batches its claims
//! ([`claims`], [`super::claim_batch`]) and the worker its takes
//! ([`takes`], [`super::take_batch`]) and completions ([`completions`],
//! [`super::complete_batch`]). The mechanism is
//! [`crate::postgres::Batcher`].

use deadpool_postgres::Pool;

use super::{Claim, ClaimRequest, Completing, Policy, Take};
use crate::key::{ClaimToken, DeliveryKey};
use crate::postgres::Batcher;

/// Ingest's claims, `HOOKINBOX_CLAIM_BATCH` per statement.
pub type ClaimBatcher = Batcher<ClaimRequest, Claim>;

/// Starts the claim collector.
pub fn claims(pool: Pool, policy: Policy, max_batch: usize) -> ClaimBatcher {
    Batcher::start(max_batch, move |claims: Vec<ClaimRequest>| {
        let pool = pool.clone();
        async move {
            let client = pool.get().await?;
            super::claim_batch(&client, &policy, &claims).await
        }
    })
}

/// The worker's takes, `HOOKINBOX_TAKE_BATCH` per statement; `None` means
/// the fast path did not take it (see [`super::take_batch`]).
pub type TakeBatcher = Batcher<(DeliveryKey, ClaimToken), Option<Take>>;

/// Starts the take collector.
pub fn takes(pool: Pool, policy: Policy, max_batch: usize) -> TakeBatcher {
    Batcher::start(max_batch, move |items: Vec<(DeliveryKey, ClaimToken)>| {
        let pool = pool.clone();
        async move {
            let client = pool.get().await?;
            super::take_batch(&client, &policy, &items).await
        }
    })
}

/// The worker's completions, `HOOKINBOX_COMPLETE_BATCH` per statement; the
/// answer says whether that row's token still held it (false: fenced).
pub type CompletionBatcher = Batcher<Completing, bool>;

/// Starts the completion collector.
pub fn completions(pool: Pool, max_batch: usize) -> CompletionBatcher {
    Batcher::start(max_batch, move |items: Vec<Completing>| {
        let pool = pool.clone();
        async move {
            let client = pool.get().await?;
            let result = super::complete_batch(&client, &items).await;
            if result.is_err() {
                // Whether the statement committed is unknown; never hand
                // this session out again.
                drop(deadpool_postgres::Object::take(client));
            }
            result
        }
    })
}
