//! Group commit: many concurrent callers, one statement.
//!
//! Callers hand their item to one collector. While a batch is running, new
//! items queue up; when a slot frees, everything waiting (up to the batch
//! size) goes out as one call, and each caller gets its own answer. An idle
//! system therefore adds no delay (a lone item goes out at once), and a busy
//! one turns many commits, and their fsyncs, into one.
//!
//! Ingest batches its claims ([`ClaimBatcher`], [`deliveries::claim_batch`])
//! and the worker its takes ([`TakeBatcher`], [`deliveries::take_batch`])
//! and completions ([`CompletionBatcher`], [`deliveries::complete_batch`]).

use std::future::Future;
use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::deliveries::{self, Claim, Completing, OwnedClaim, Policy, Take};
use crate::key::{ClaimToken, DeliveryKey};

/// Batches running at once: enough to keep Postgres busy while the next
/// batch fills, few enough that batches stay large under load.
const BATCHES_IN_FLIGHT: usize = 4;

type Reply<O> = oneshot::Sender<Result<O, String>>;

/// Hands items to a collector that runs them in batches.
pub struct Batcher<I, O> {
    tx: mpsc::Sender<(I, Reply<O>)>,
}

impl<I, O> Clone for Batcher<I, O> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
        }
    }
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Starts the collector on the current runtime. `run` gets up to
    /// `max_batch` items and must answer with one output per item, in order;
    /// an error fails every item of that batch.
    pub fn start<F, Fut>(max_batch: usize, run: F) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<O>, String>> + Send + 'static,
    {
        let max_batch = max_batch.max(1);
        let (tx, mut rx) = mpsc::channel::<(I, Reply<O>)>(max_batch * 64);
        let slots = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                // Waiting for a slot is when the next batch fills up.
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let mut batch = vec![first];
                while batch.len() < max_batch {
                    match rx.try_recv() {
                        Ok(item) => batch.push(item),
                        Err(_) => break,
                    }
                }
                let (items, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
                let running = run(items);
                tokio::spawn(async move {
                    let _slot = slot;
                    match running.await {
                        Ok(answers) if answers.len() == replies.len() => {
                            for (reply, answer) in replies.into_iter().zip(answers) {
                                let _ = reply.send(Ok(answer));
                            }
                        }
                        Ok(_) => {
                            for reply in replies {
                                let _ = reply.send(Err("batch answered the wrong count".into()));
                            }
                        }
                        Err(error) => {
                            for reply in replies {
                                let _ = reply.send(Err(error.clone()));
                            }
                        }
                    }
                });
            }
        });
        Self { tx }
    }

    /// Runs one item as part of the next batch.
    pub async fn submit(&self, item: I) -> Result<O, String> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((item, reply))
            .await
            .map_err(|_| "batcher stopped".to_owned())?;
        answer.await.map_err(|_| "batch dropped".to_owned())?
    }
}

/// Ingest's claims, `HOOKINBOX_CLAIM_BATCH` per statement.
pub type ClaimBatcher = Batcher<OwnedClaim, Claim>;

/// Starts the claim collector.
pub fn claims(pool: Pool, policy: Policy, max_batch: usize) -> ClaimBatcher {
    Batcher::start(max_batch, move |claims: Vec<OwnedClaim>| {
        let pool = pool.clone();
        async move {
            let client = pool.get().await.map_err(|e| e.to_string())?;
            deliveries::claim_batch(&client, &policy, &claims)
                .await
                .map_err(|e| e.to_string())
        }
    })
}

/// The worker's takes, `HOOKINBOX_TAKE_BATCH` per statement; `None` means
/// the fast path did not take it (see [`deliveries::take_batch`]).
pub type TakeBatcher = Batcher<(DeliveryKey, ClaimToken), Option<Take>>;

/// Starts the take collector.
pub fn takes(pool: Pool, policy: Policy, max_batch: usize) -> TakeBatcher {
    Batcher::start(max_batch, move |items: Vec<(DeliveryKey, ClaimToken)>| {
        let pool = pool.clone();
        async move {
            let client = pool.get().await.map_err(|e| e.to_string())?;
            deliveries::take_batch(&client, &policy, &items)
                .await
                .map_err(|e| e.to_string())
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
            let client = pool.get().await.map_err(|e| e.to_string())?;
            let result = deliveries::complete_batch(&client, &items).await;
            if result.is_err() {
                // Whether the statement committed is unknown; never hand
                // this session out again.
                drop(deadpool_postgres::Object::take(client));
            }
            result.map_err(|e| e.to_string())
        }
    })
}
