//! Effects: the [`Handler`] trait and the built-in `store` handler.
//!
//! A handler receives a [`Job`] (key, event, action, raw body, headers) and
//! an [`Effect`]. For a database effect it asks the `Effect` for the
//! transaction that will also mark the delivery completed; the runtime
//! commits it only if the handler returns `Ok`, so the effect and the
//! completion happen together or not at all.
//!
//! ```no_run
//! use hookinbox::broker::Job;
//! use hookinbox::handler::{Effect, Handler, HandlerError};
//!
//! struct CountPushes;
//!
//! #[async_trait::async_trait]
//! impl Handler for CountPushes {
//!     async fn handle(&self, job: &Job, effect: &mut Effect) -> Result<(), HandlerError> {
//!         if job.event.as_str() != "push" {
//!             return Ok(());
//!         }
//!         // Locked and fenced: nobody else can complete this delivery now.
//!         let tx = effect.transaction().await?;
//!         tx.execute("update push_count set n = n + 1", &[]).await?;
//!         Ok(())
//!     }
//! }
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;

use crate::batcher::CompletionBatcher;
use crate::broker::Job;
use crate::db::{Client, DbError};
use crate::deliveries::{self, Completing, StoredEvent};
use crate::key::{ClaimToken, DeliveryKey, SourceName};
use crate::payload::{self, ContentType};
use crate::sources::HandlerConfig;

/// How a handler failed. The runtime records it and decides what follows:
/// a transient error is retried, a permanent one is dead-lettered.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// Worth retrying (a timeout, a 503, a lost connection).
    #[error("{message}")]
    Transient {
        /// Short description; redacted before it is stored.
        message: String,
        /// When the far side asked to be retried (`Retry-After`); bounded by
        /// the retry cap.
        retry_after: Option<Duration>,
    },
    /// No retry can fix it (a 400, a payload the effect cannot take).
    #[error("{message}")]
    Permanent {
        /// Short description; redacted before it is stored.
        message: String,
    },
    /// A database error under the effect. Data and constraint errors are
    /// treated as permanent; the rest as transient.
    #[error("database: {0}")]
    Db(#[from] tokio_postgres::Error),
    /// The delivery is held by someone else now: stop, change nothing.
    #[error("fenced: the claim token no longer holds the delivery")]
    Fenced,
    /// Postgres could not be reached for the transaction.
    #[error("database unavailable: {0}")]
    Unavailable(String),
}

impl HandlerError {
    /// A transient error.
    pub fn transient(message: impl Into<String>) -> Self {
        Self::Transient {
            message: message.into(),
            retry_after: None,
        }
    }

    /// A permanent error.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::Permanent {
            message: message.into(),
        }
    }

    /// The error class recorded in `last_error_class`.
    pub fn class(&self) -> deliveries::ErrorClass {
        use deliveries::ErrorClass;
        match self {
            Self::Transient { .. } => ErrorClass::Transient,
            Self::Permanent { .. } => ErrorClass::Permanent,
            Self::Db(e) if is_data_error(e) => ErrorClass::Permanent,
            Self::Db(_) | Self::Unavailable(_) | Self::Fenced => ErrorClass::Db,
        }
    }

    /// Whether a retry may succeed.
    pub fn is_transient(&self) -> bool {
        self.class() != deliveries::ErrorClass::Permanent
    }

    /// What the handler asked for as the next attempt's delay.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Transient { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// SQLSTATE classes 22 (data exception) and 23 (integrity violation): the
/// same statement on the same payload fails again, so retrying is useless.
fn is_data_error(e: &tokio_postgres::Error) -> bool {
    e.code()
        .is_some_and(|c| c.code().starts_with("22") || c.code().starts_with("23"))
}

impl From<DbError> for HandlerError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Query(e) => Self::Db(e),
            other => Self::Unavailable(other.to_string()),
        }
    }
}

/// Runs a delivery's effect. Implement it to build your own worker around
/// the same runtime (see `worker/examples/`).
///
/// The runtime guarantees: the handler runs only while the worker holds the
/// delivery's claim (its lease is renewed in the background); it is
/// cancelled at `HOOKINBOX_HANDLER_TIMEOUT_MS` or when the claim is lost; and
/// the delivery is completed only if it returns `Ok`. Effects outside
/// Postgres can run again after a crash, so make them idempotent (use
/// [`DeliveryKey::idempotency_key`]).
#[async_trait::async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Does the effect of one delivery.
    async fn handle(&self, job: &Job, effect: &mut Effect) -> Result<(), HandlerError>;
}

/// What the runtime found when it tried to complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The delivery is completed (and the effect committed with it).
    Completed,
    /// The token no longer held the delivery; the effect was rolled back.
    Fenced,
}

/// The handler's access to the completing transaction, and facts about the
/// attempt.
pub struct Effect {
    pool: Pool,
    key: DeliveryKey,
    token: ClaimToken,
    attempt: i32,
    received_at: DateTime<Utc>,
    /// Set once the transaction began (and the row was fenced).
    tx: Option<Client>,
    /// An event to write with the completion (see [`Effect::store_event`]).
    staged: Option<StoredEvent>,
    /// Group commit of completions, when the runtime runs one.
    completions: Option<CompletionBatcher>,
}

impl Effect {
    /// The effect of one attempt at `key` under `token`.
    pub fn new(
        pool: Pool,
        key: DeliveryKey,
        token: ClaimToken,
        attempt: i32,
        received_at: DateTime<Utc>,
    ) -> Self {
        Self {
            pool,
            key,
            token,
            attempt,
            received_at,
            tx: None,
            staged: None,
            completions: None,
        }
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
        let stmt = tx.prepare_cached(STORE_EVENT).await?;
        // `on conflict do nothing`: the fence already makes a second effect
        // impossible; this keeps a replayed request, claimed anew after its
        // delivery row was swept, from failing forever.
        tx.execute(
            &stmt,
            &[
                &self.key.provider,
                &self.key.source.as_str(),
                &self.key.hook_id.as_str(),
                &self.key.delivery_id.as_str(),
                &event.event,
                &event.action,
                &String::from_utf8_lossy(&event.payload),
                &event.received_at,
            ],
        )
        .await?;
        // The fault-injection suite counts effects in a log without a
        // unique key, so that a second effect would show.
        #[cfg(feature = "failpoints")]
        tx.execute(
            "insert into hookinbox_effect_log (provider, source, hook_id, delivery_id) values ($1, $2, $3, $4)",
            &[&self.key.provider, &self.key.source, &self.key.hook_id, &self.key.delivery_id],
        )
        .await?;
        Ok(())
    }

    /// This attempt's number, starting at 1.
    pub fn attempt(&self) -> i32 {
        self.attempt
    }

    /// When ingest first claimed the delivery.
    pub fn received_at(&self) -> DateTime<Utc> {
        self.received_at
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
        match self.tx.take() {
            Some(client) => {
                let result = async {
                    if deliveries::complete(&client, &self.key, self.token).await? {
                        client.batch_execute("commit").await?;
                        Ok(Completion::Completed)
                    } else {
                        client.batch_execute("rollback").await?;
                        Ok(Completion::Fenced)
                    }
                }
                .await;
                if result.is_err() {
                    // The commit's fate is unknown; never reuse this session.
                    drop(deadpool_postgres::Object::take(client));
                }
                result
            }
            None => {
                let item = Completing {
                    key: self.key.clone(),
                    token: self.token,
                    store: self.staged.take(),
                };
                let completed = match &self.completions {
                    Some(batcher) => batcher.submit(item).await.map_err(DbError::Batch)?,
                    None => {
                        let client = self.pool.get().await?;
                        deliveries::complete_batch(&client, std::slice::from_ref(&item))
                            .await?
                            .first()
                            .copied()
                            .unwrap_or(false)
                    }
                };
                Ok(if completed {
                    Completion::Completed
                } else {
                    Completion::Fenced
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

/// The `store` handler: writes the event into `github_events`, one row per
/// delivery key, in the transaction that completes the delivery. Exactly one
/// effect, always.
#[derive(Clone, Copy, Debug, Default)]
pub struct Store;

const STORE_EVENT: &str = "
insert into github_events
    (provider, source, hook_id, delivery_id, event, action, payload, received_at)
values ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8)
on conflict do nothing";

#[async_trait::async_trait]
impl Handler for Store {
    async fn handle(&self, job: &Job, effect: &mut Effect) -> Result<(), HandlerError> {
        let content_type = ContentType::parse(&job.content_type)
            .ok_or_else(|| HandlerError::permanent("unsupported content type"))?;
        let json = payload::json_text(content_type, &job.body)
            .map_err(|e| HandlerError::permanent(e.to_string()))?;
        effect
            .store_event(StoredEvent {
                event: job.event.as_str().to_owned(),
                action: job.action.clone(),
                // A JSON body (or a form field read in place) is a slice of
                // the job's body; only a decoded form field is new bytes.
                payload: match json {
                    std::borrow::Cow::Borrowed(text) => job.body.slice_ref(text.as_bytes()),
                    std::borrow::Cow::Owned(text) => bytes::Bytes::from(text),
                },
                received_at: effect.received_at(),
            })
            .await?;
        // Staged (or written in the handler's transaction), not committed.
        crate::kill_point!("worker.mid_effect");
        Ok(())
    }
}

/// Sends each delivery to the handler of its source.
pub struct Router {
    routes: BTreeMap<SourceName, Arc<dyn Handler>>,
}

#[async_trait::async_trait]
impl Handler for Router {
    async fn handle(&self, job: &Job, effect: &mut Effect) -> Result<(), HandlerError> {
        match self.routes.get(&job.key.source) {
            Some(handler) => handler.handle(job, effect).await,
            None => Err(HandlerError::permanent(format!(
                "no handler is configured for source '{}'",
                job.key.source
            ))),
        }
    }
}

/// Builds the built-in handler of every configured source (one pooled HTTP
/// client serves all `forward` sources).
pub fn from_config(
    handlers: &BTreeMap<SourceName, HandlerConfig>,
) -> Result<Arc<dyn Handler>, reqwest::Error> {
    let client = crate::forward::client()?;
    let routes = handlers
        .iter()
        .map(|(name, config)| {
            let handler: Arc<dyn Handler> = match config {
                HandlerConfig::Store => Arc::new(Store),
                HandlerConfig::Forward(forward) => {
                    Arc::new(crate::forward::Forward::new(client.clone(), forward))
                }
            };
            (name.clone(), handler)
        })
        .collect();
    Ok(Arc::new(Router { routes }))
}
