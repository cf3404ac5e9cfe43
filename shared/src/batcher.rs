//! Group commit of ingest's claims.
//!
//! Concurrent requests hand their claims to one collector. While a batch is
//! running, new claims queue up; when a slot frees, everything waiting (up
//! to `HOOKINBOX_CLAIM_BATCH`) goes out as one statement
//! ([`deliveries::claim_batch`]), and each request gets its own answer. An
//! idle system therefore adds no delay (a lone claim goes out at once), and
//! a busy one turns many commits, and their fsyncs, into one.

use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::deliveries::{self, Claim, OwnedClaim, Policy};

/// Batches running at once: enough to keep Postgres busy while the next
/// batch fills, few enough that batches stay large under load.
const BATCHES_IN_FLIGHT: usize = 4;

type Reply = oneshot::Sender<Result<Claim, String>>;

/// Hands claims to the collector.
#[derive(Clone)]
pub struct ClaimBatcher {
    tx: mpsc::Sender<(OwnedClaim, Reply)>,
}

impl ClaimBatcher {
    /// Starts the collector on the current runtime.
    pub fn start(pool: Pool, policy: Policy, max_batch: usize) -> Self {
        let (tx, mut rx) = mpsc::channel::<(OwnedClaim, Reply)>(max_batch.max(1) * 64);
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
                let pool = pool.clone();
                tokio::spawn(async move {
                    let _slot = slot;
                    let (claims, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
                    let result = match pool.get().await {
                        Ok(client) => deliveries::claim_batch(&client, &policy, &claims)
                            .await
                            .map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    match result {
                        Ok(answers) => {
                            for (reply, answer) in replies.into_iter().zip(answers) {
                                let _ = reply.send(Ok(answer));
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

    /// Claims one delivery as part of the next batch.
    pub async fn claim(&self, claim: OwnedClaim) -> Result<Claim, String> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((claim, reply))
            .await
            .map_err(|_| "claim batcher stopped".to_owned())?;
        answer.await.map_err(|_| "claim batch dropped".to_owned())?
    }
}
