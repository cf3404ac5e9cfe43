//! Effects: the [`Handler`] trait, the [`Effect`] a handler writes through,
//! the built-in `store` and `forward` handlers, and the router that gives
//! each source its handler.
//!
//! A handler receives a [`Job`] (key, event, action, raw body, headers) and
//! an [`Effect`]. For a database effect it asks the `Effect` for the
//! transaction that will also mark the delivery completed; the runtime
//! commits it only if the handler returns `Ok`, so the effect and the
//! completion happen together or not at all.
//!
//! ```no_run
//! use hookinbox::Job;
//! use hookinbox_worker::{Effect, Handler, HandlerError};
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

use hookinbox::config::HandlerConfig;
use hookinbox::deliveries::{ErrorClass, Failure};
use hookinbox::job::Job;
use hookinbox::key::SourceName;
use hookinbox::postgres::{DbError, Refusal, describe};
use hookinbox::retry::RetryPolicy;

mod effect;
mod forward;
mod store;

pub use effect::{Completion, Effect};
pub use forward::{Forward, SIGNATURE_HEADER, classify, retry_after};
pub use store::Store;

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
    #[error("database: {}", describe(.0))]
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
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Transient { .. } => ErrorClass::Transient,
            Self::Permanent { .. } => ErrorClass::Permanent,
            Self::Db(e) if Refusal::of(e).is_some_and(|r| r.is_row_level()) => {
                ErrorClass::Permanent
            }
            Self::Db(_) | Self::Unavailable(_) | Self::Fenced => ErrorClass::Db,
        }
    }

    /// Whether a retry may succeed.
    pub fn is_transient(&self) -> bool {
        self.class() != ErrorClass::Permanent
    }

    /// What the handler asked for as the next attempt's delay.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Transient { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// How this error, after `attempts` takes, is recorded (see
    /// [`RetryPolicy::decide`]).
    pub fn failure(&self, policy: &RetryPolicy, attempts: i32) -> Failure {
        policy.decide(self.class(), self.to_string(), self.retry_after(), attempts)
    }
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
/// [`hookinbox::DeliveryKey::idempotency_key`]).
#[async_trait::async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Does the effect of one delivery.
    async fn handle(&self, job: &Job, effect: &mut Effect) -> Result<(), HandlerError>;

    /// Whether this job's whole effect goes through the completing
    /// transaction ([`Effect::store_event`], [`Effect::transaction`]), with
    /// nothing done outside Postgres. The runtime may then run a job that
    /// comes for the first time without a take, a lease or a heartbeat:
    /// its completion takes it, in one statement (see
    /// `hookinbox::deliveries::complete`). Anything else that happens to
    /// such a job (a failure, a timeout, a fence) sends it the full way,
    /// and the handler runs again after a take. False by default: only
    /// say true for a handler that can run twice and change nothing the
    /// first time it did not complete.
    fn database_only(&self, _job: &Job) -> bool {
        false
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

    fn database_only(&self, job: &Job) -> bool {
        self.routes
            .get(&job.key.source)
            .is_some_and(|handler| handler.database_only(job))
    }
}

/// Builds the built-in handler of every configured source (one pooled HTTP
/// client serves all `forward` sources).
pub fn from_config(
    handlers: &BTreeMap<SourceName, HandlerConfig>,
) -> Result<Arc<dyn Handler>, reqwest::Error> {
    let client = forward::client()?;
    let routes = handlers
        .iter()
        .map(|(name, config)| {
            let handler: Arc<dyn Handler> = match config {
                HandlerConfig::Store => Arc::new(Store),
                HandlerConfig::Forward(forward) => Arc::new(Forward::new(client.clone(), forward)),
            };
            (name.clone(), handler)
        })
        .collect();
    Ok(Arc::new(Router { routes }))
}
