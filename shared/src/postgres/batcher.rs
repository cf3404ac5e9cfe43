//! Group commit: many concurrent callers, one statement.
//!
//! Callers hand their item to one collector. While a batch is running, new
//! items queue up; when a slot frees, everything waiting (up to the batch
//! size) goes out as one call, and each caller gets its own answer. An idle
//! system therefore adds no delay (a lone item goes out at once), and a busy
//! one turns many commits, and their fsyncs, into one.
//!
//! The statements themselves belong to the state machine
//! (`deliveries::group_commit`); this is only the mechanism.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};

use super::DbError;

/// Batches running at once: enough to keep Postgres busy while the next
/// batch fills, few enough that batches stay large under load.
const BATCHES_IN_FLIGHT: usize = 4;

/// Why a batched call has no answer.
#[derive(Clone, Debug, thiserror::Error)]
pub enum BatchError {
    /// The collector is gone (the runtime is shutting down).
    #[error("the batch collector stopped")]
    Stopped,
    /// The batch was dropped before it answered.
    #[error("the batch was dropped before it answered")]
    Dropped,
    /// The batch answered another number of results than it was given
    /// items (a bug in its statement's caller).
    #[error("the batch answered {answered} results for {items} items")]
    WrongCount {
        /// Items sent.
        items: usize,
        /// Results received.
        answered: usize,
    },
    /// Postgres failed the batch's statement; every item of it shares the
    /// error. Whether it committed is unknown unless the error says so.
    #[error(transparent)]
    Failed(Arc<DbError>),
}

type Reply<O> = oneshot::Sender<Result<O, BatchError>>;

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
        Fut: Future<Output = Result<Vec<O>, DbError>> + Send + 'static,
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
                        Ok(answers) => {
                            let error = BatchError::WrongCount {
                                items: replies.len(),
                                answered: answers.len(),
                            };
                            for reply in replies {
                                let _ = reply.send(Err(error.clone()));
                            }
                        }
                        Err(error) => {
                            let error = BatchError::Failed(Arc::new(error));
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
    pub async fn submit(&self, item: I) -> Result<O, BatchError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((item, reply))
            .await
            .map_err(|_| BatchError::Stopped)?;
        answer.await.map_err(|_| BatchError::Dropped)?
    }
}
