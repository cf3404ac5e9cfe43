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
use std::time::{Duration, SystemTime};

use hookinbox::config::{DestinationKind, Route};
use hookinbox::deliveries::{ErrorClass, Failure};
use hookinbox::job::Job;
use hookinbox::key::{DestinationName, LegKey, SourceName};
use hookinbox::postgres::{DbError, Refusal, describe};
use hookinbox::retry::Retries;

mod effect;
mod egress;
mod forward;
mod store;

pub use effect::{Answer, Completion, Effect};
pub use forward::{
    Forward, GITHUB_SIGNATURE_HEADER, REPLAY_HEADER, SIGNATURE_HEADER, classify, github_rate_limit,
    retry_after,
};
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
    /// The destination itself is wrong or gone, not this delivery: an
    /// answer such as `401`, `403`, `404`, `405`, `410` or a redirect, or a
    /// DNS or TLS failure. With a breaker, the attempt is given back, the
    /// leg waits for its destination (held) and the breaker opens at once;
    /// `gone` (`410`) disables the destination. Without one, it is a
    /// permanent failure when the destination answered and a transient one
    /// when it could not be reached.
    #[error("{message}")]
    Destination {
        /// Short description; redacted before it is stored.
        message: String,
        /// The destination answered (a status), rather than being out of
        /// reach.
        answered: bool,
        /// It said it is gone for good (`410 Gone`).
        gone: bool,
    },
    /// Not now: try again at `until` (a `429` or `503` with `Retry-After`,
    /// or GitHub's `403`/`429` with `x-ratelimit-reset` in a handler that
    /// calls GitHub). No attempt is spent and nothing is dead-lettered: the
    /// leg is due at `until`. Bounded: a leg whose `until` falls past its
    /// destination's retry horizon, counted from its first deferral, fails
    /// as `deferred_too_long`.
    #[error("{message}")]
    Defer {
        /// Short description; redacted before it is stored.
        message: String,
        /// When to try again.
        until: SystemTime,
    },
    /// The egress policy refused every address of the destination
    /// (`hookinbox::egress`): nothing was sent. A failure of the
    /// destination, as an unreachable one: with a breaker, the attempt is
    /// given back, the leg held and the breaker opens at once; without
    /// one, it is transient.
    #[error("{message}")]
    Blocked {
        /// What was refused and why (the address, never the URL).
        message: String,
    },
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
            Self::Destination { .. } | Self::Blocked { .. } => ErrorClass::Held,
            Self::Defer { .. } => ErrorClass::Deferred,
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

    /// A deferral until `until` (see [`HandlerError::Defer`]).
    pub fn defer(message: impl Into<String>, until: SystemTime) -> Self {
        Self::Defer {
            message: message.into(),
            until,
        }
    }

    /// How this error, after `attempts` takes, is recorded under the
    /// destination's retries (see [`Retries::decide`]). A destination
    /// failure of a destination with a breaker holds the leg (due now,
    /// gated by the breaker, its attempt given back); without a breaker it
    /// is recorded as what it would otherwise be.
    pub fn failure(&self, retries: &Retries, attempts: i32, breaker: bool) -> Failure {
        match self {
            // Recorded by `deliveries::defer`, which bounds it; this is
            // what the log says of it.
            Self::Defer { message, until } => Failure {
                class: ErrorClass::Deferred,
                message: message.clone(),
                retry_in: Some(until_now(*until)),
            },
            Self::Destination { message, .. } | Self::Blocked { message } if breaker => Failure {
                class: ErrorClass::Held,
                message: message.clone(),
                retry_in: Some(Duration::ZERO),
            },
            Self::Blocked { .. } => {
                retries.decide(ErrorClass::Transient, self.to_string(), None, attempts)
            }
            Self::Destination { answered, .. } => {
                let class = if *answered {
                    ErrorClass::Permanent
                } else {
                    ErrorClass::Transient
                };
                retries.decide(class, self.to_string(), None, attempts)
            }
            _ => retries.decide(self.class(), self.to_string(), self.retry_after(), attempts),
        }
    }
}

/// The time from now until `until`; zero when it has passed.
fn until_now(until: SystemTime) -> Duration {
    until
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO)
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

    /// [`Handler::database_only`] for every job of the leg `key`, when the
    /// handler knows it from the leg alone: the runtime then reads no body
    /// for the one-statement path of a job it would not run there. `None`
    /// (the default): it asks `database_only` with the job, body and all.
    fn database_only_leg(&self, _key: &LegKey) -> Option<bool> {
        None
    }
}

/// Sends each leg to the handler of its destination (a leg claimed before
/// destinations existed to its source's first destination's).
pub struct Router {
    routes: BTreeMap<(SourceName, DestinationName), Arc<dyn Handler>>,
    /// Each source's first destination, for legacy legs.
    firsts: BTreeMap<SourceName, DestinationName>,
}

impl Router {
    fn handler(&self, job: &Job) -> Option<&Arc<dyn Handler>> {
        self.route(&job.key)
    }

    fn route(&self, key: &LegKey) -> Option<&Arc<dyn Handler>> {
        let source = &key.source;
        let destination = if key.destination.is_legacy() {
            self.firsts.get(source)?
        } else {
            &key.destination
        };
        self.routes.get(&(source.clone(), destination.clone()))
    }
}

#[async_trait::async_trait]
impl Handler for Router {
    async fn handle(&self, job: &Job, effect: &mut Effect) -> Result<(), HandlerError> {
        match self.handler(job) {
            Some(handler) => handler.handle(job, effect).await,
            None => Err(HandlerError::permanent(format!(
                "no destination '{}' is configured for source '{}'",
                job.key.destination, job.key.source
            ))),
        }
    }

    fn database_only(&self, job: &Job) -> bool {
        self.handler(job)
            .is_some_and(|handler| handler.database_only(job))
    }

    fn database_only_leg(&self, key: &LegKey) -> Option<bool> {
        match self.route(key) {
            Some(handler) => handler.database_only_leg(key),
            None => Some(false),
        }
    }
}

/// Handlers a worker binary registers by name, for destinations of that
/// kind (`kind = "<name>"`).
pub type Registry = BTreeMap<String, Arc<dyn Handler>>;

/// Why the handlers could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// A destination names a kind no handler is registered for.
    #[error(
        "destination {of_source}/{destination}: no handler '{kind}' is registered in this worker \
         binary (built in: store, forward)"
    )]
    UnknownKind {
        /// The source.
        of_source: SourceName,
        /// The destination.
        destination: DestinationName,
        /// The kind it names.
        kind: String,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// Builds the handler of every configured destination: the built-in ones,
/// and `registry`'s for the kinds it names (each `forward` destination has
/// a pooled HTTP client of its own: its TLS and egress settings are its
/// own).
pub fn from_config(routes: &[Route], registry: &Registry) -> Result<Arc<dyn Handler>, RouterError> {
    let mut handlers = BTreeMap::new();
    let mut firsts = BTreeMap::new();
    for route in routes {
        let d = &route.destination;
        let handler: Arc<dyn Handler> = match &d.kind {
            DestinationKind::Store => Arc::new(Store),
            DestinationKind::Forward(forward) => {
                Arc::new(Forward::new(&route.source, &d.name, forward)?)
            }
            DestinationKind::Custom(kind) => {
                registry
                    .get(kind)
                    .cloned()
                    .ok_or_else(|| RouterError::UnknownKind {
                        of_source: route.source.clone(),
                        destination: d.name.clone(),
                        kind: kind.clone(),
                    })?
            }
        };
        firsts
            .entry(route.source.clone())
            .or_insert_with(|| d.name.clone());
        handlers.insert((route.source.clone(), d.name.clone()), handler);
    }
    Ok(Arc::new(Router {
        routes: handlers,
        firsts,
    }))
}
