//! The handler's access to the completing transaction: *fence before
//! effect* and *complete in the same transaction*.

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use hookinbox::deliveries::group_commit::{self, CompletionBatcher};
use hookinbox::deliveries::{self, Completing, StoredEvent};
use hookinbox::key::{ClaimToken, LegKey};
use hookinbox::postgres::{Client, DbError, Refusal};

use super::HandlerError;

/// What the runtime found when it tried to complete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The delivery is completed (and the effect committed with it).
    Completed {
        /// When ingest first claimed the delivery.
        received_at: DateTime<Utc>,
    },
    /// The token no longer held the delivery; the effect was rolled back.
    Fenced,
    /// Postgres refused the completion (a payload `jsonb` cannot hold, say):
    /// nothing committed, and the runtime records the failure.
    Refused(Refusal),
}

/// The handler's access to the completing transaction, and facts about the
/// attempt.
pub struct Effect {
    pool: Pool,
    key: LegKey,
    token: ClaimToken,
    attempt: i32,
    /// Set when the completion is also the take (see [`Effect::taking`]).
    take: Option<FirstTake>,
    /// Set once the transaction began (and the row was fenced).
    tx: Option<Client>,
    /// An event to write with the completion (see [`Effect::store_event`]).
    staged: Option<StoredEvent>,
    /// Group commit of completions, when the runtime runs one.
    completions: Option<CompletionBatcher>,
    /// What the destination answered, for the attempt log.
    answer: Option<Answer>,
}

/// What a destination answered an attempt, as a handler notes it
/// ([`Effect::note_answer`]).
#[derive(Clone, Debug, Default)]
pub struct Answer {
    /// The status code, when there was an answer.
    pub status: Option<u16>,
    /// The first 4 KiB of the answer's body.
    pub excerpt: Option<bytes::Bytes>,
}

/// A completion that is also the take: the row must still have `attempts`
/// takes, fewer than `max_attempts`.
#[derive(Clone, Copy, Debug)]
struct FirstTake {
    attempts: i32,
    max_attempts: i32,
}

impl Effect {
    /// The effect of one attempt at `key` under `token`.
    pub fn new(pool: Pool, key: LegKey, token: ClaimToken, attempt: i32) -> Self {
        Self {
            pool,
            key,
            token,
            attempt,
            take: None,
            tx: None,
            staged: None,
            completions: None,
            answer: None,
        }
    }

    /// Notes what the destination answered (its status code, the first
    /// bytes of its body), for the attempt log and the console. A handler
    /// that calls something over the network calls it once per attempt;
    /// never pass a secret or a signature.
    pub fn note_answer(&mut self, status: Option<u16>, excerpt: Option<bytes::Bytes>) {
        self.answer = Some(Answer { status, excerpt });
    }

    /// What [`Effect::note_answer`] noted.
    pub fn answer(&self) -> Option<&Answer> {
        self.answer.as_ref()
    }

    /// The effect of a job run without a take: `token` is the one the job
    /// was published with, and `attempts` the takes the row had then. The
    /// completion takes the delivery and completes it in one statement,
    /// counting this attempt, only while the row still has `attempts`
    /// takes (fewer than `max_attempts`) under `token`; otherwise it is
    /// fenced and nothing is written.
    pub fn taking(
        pool: Pool,
        key: LegKey,
        token: ClaimToken,
        attempts: i32,
        max_attempts: i32,
    ) -> Self {
        let mut effect = Self::new(pool, key, token, attempts + 1);
        effect.take = Some(FirstTake {
            attempts,
            max_attempts,
        });
        effect
    }

    /// Completes through `batcher` (group commit) instead of a statement of
    /// its own.
    pub fn with_completions(mut self, batcher: CompletionBatcher) -> Self {
        self.completions = Some(batcher);
        self
    }

    /// Writes `event` into `github_events` as this delivery's effect.
    ///
    /// Without an open transaction, the row is written by the completing
    /// statement itself ([`deliveries::complete_batch`]): the fence, the
    /// effect and the completion are one statement, batched with other
    /// jobs' completions, and the row is written only if this attempt's
    /// token still holds the delivery. Inside a transaction the handler
    /// opened, it is written there, after that transaction's fence.
    pub async fn store_event(&mut self, event: StoredEvent) -> Result<(), HandlerError> {
        let Some(tx) = self.tx.as_ref() else {
            self.staged = Some(event);
            return Ok(());
        };
        deliveries::store_event(tx, &self.key, &event).await?;
        Ok(())
    }

    /// This attempt's number, starting at 1.
    pub fn attempt(&self) -> i32 {
        self.attempt
    }

    /// The transaction that will also complete the delivery. The first call
    /// begins it and locks the delivery's row under this worker's token
    /// (*fence before effect*): if the token no longer holds the row it
    /// returns [`HandlerError::Fenced`] and nothing has been written. While
    /// the lock is held, no other worker can take the delivery over.
    pub async fn transaction(&mut self) -> Result<&Client, HandlerError> {
        if self.tx.is_none() {
            let client = self.pool.get().await.map_err(DbError::from)?;
            client.batch_execute("begin").await?;
            // From here on, dropping `self` closes this connection instead
            // of returning it to the pool mid-transaction (see Drop).
            self.tx = Some(client);
            let client = self.tx.as_ref().ok_or(HandlerError::Fenced)?;
            if !deliveries::fence(client, &self.key, self.token).await? {
                self.rollback().await;
                return Err(HandlerError::Fenced);
            }
            // An event staged before the transaction began joins it.
            if let Some(event) = self.staged.take() {
                self.store_event(event).await?;
            }
        }
        self.tx
            .as_ref()
            .ok_or_else(|| HandlerError::Unavailable("transaction closed".to_owned()))
    }

    /// Completes the delivery: inside the handler's transaction when it
    /// opened one (then commits both), otherwise in one statement.
    pub async fn complete(mut self) -> Result<Completion, DbError> {
        let take = self.take.map(|t| t.attempts);
        let max_attempts = self.take.map_or(0, |t| t.max_attempts);
        match self.tx.take() {
            Some(client) => {
                let completed = async {
                    let completed =
                        deliveries::complete(&client, &self.key, self.token, take, max_attempts)
                            .await?;
                    client
                        .batch_execute(if completed.is_some() {
                            "commit"
                        } else {
                            "rollback"
                        })
                        .await?;
                    Ok::<_, DbError>(completed)
                }
                .await;
                match completed {
                    Ok(Some(received_at)) => Ok(Completion::Completed { received_at }),
                    Ok(None) => Ok(Completion::Fenced),
                    // Postgres answered: nothing committed. End the
                    // transaction and report the refusal.
                    Err(e) if e.refusal().is_some() => {
                        if client.batch_execute("rollback").await.is_err() {
                            drop(deadpool_postgres::Object::take(client));
                        }
                        Ok(e.refusal().map_or(Completion::Fenced, Completion::Refused))
                    }
                    Err(e) => {
                        // The commit's fate is unknown; never reuse this session.
                        drop(deadpool_postgres::Object::take(client));
                        Err(e)
                    }
                }
            }
            None => {
                let item = Completing {
                    key: self.key.clone(),
                    token: self.token,
                    take,
                    max_attempts,
                    store: self.staged.take(),
                };
                let completed = match &self.completions {
                    Some(batcher) => batcher.submit(item).await?,
                    None => {
                        let client = self.pool.get().await?;
                        group_commit::complete_apart(&client, std::slice::from_ref(&item))
                            .await?
                            .pop()
                            .unwrap_or(Ok(None))
                    }
                };
                Ok(match completed {
                    Ok(Some(received_at)) => Completion::Completed { received_at },
                    Ok(None) => Completion::Fenced,
                    Err(refusal) => Completion::Refused(refusal),
                })
            }
        }
    }

    /// Rolls back the handler's transaction, if it opened one.
    pub async fn rollback(&mut self) {
        if let Some(client) = self.tx.take()
            && client.batch_execute("rollback").await.is_err()
        {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

impl Drop for Effect {
    fn drop(&mut self) {
        // Dropped with a transaction open (the handler was cancelled, timed
        // out or panicked): detach the connection from the pool so that it
        // closes and Postgres rolls the transaction back, instead of handing
        // a half-done transaction to the next job.
        if let Some(client) = self.tx.take() {
            // A statement may still be running (blocked on a lock, say); a
            // backend busy with it would not notice the closed socket and
            // would keep its row locks. Cancel it first.
            let cancel = client.cancel_token();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = cancel.cancel_query(tokio_postgres::NoTls).await;
                });
            }
            drop(deadpool_postgres::Object::take(client));
        }
    }
}
