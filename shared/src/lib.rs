//! The library behind `hookinbox-ingest` and `hookinbox-worker`.
//!
//! hookinbox is an idempotent inbox for GitHub webhooks: ingest verifies a
//! delivery, claims its key in Postgres and publishes it to RabbitMQ; a worker
//! takes the claim with a fencing token, runs the effect and completes the
//! delivery in the same transaction. The promise is at-least-once delivery
//! plus idempotent effects.
//!
//! # Layout
//!
//! - [`config`]: settings of both binaries, read from the environment, and
//!   the checks that make a binary refuse to start on a bad one.
//! - [`sources`]: webhook sources (TOML or env): secrets, pins, events, handlers.
//! - [`signature`]: `X-Hub-Signature-256` parsing and constant-time checks.
//! - [`key`]: the nouns that name a delivery (`DeliveryKey`, `DeliveryId`,
//!   `HookId`, `EventName`) and their validation.
//! - [`deliveries`]: the delivery state machine. Every transition (`claim`,
//!   `release`, `take`, `renew`, `complete`, `fail`, ...) sits beside the one
//!   SQL statement that decides it.
//! - [`batcher`]: group commit of ingest's claims.
//! - [`db`]: the Postgres pool and the versioned migrations.
//! - [`broker`]: RabbitMQ topology, the job message and the confirming
//!   publisher.
//! - [`payload`]: the JSON and form body shapes, and the `action` field.
//! - [`retry`]: the retry policy (exponential backoff with jitter, capped).
//! - [`forward`]: the `forward` handler (POST with an idempotency key).
//! - [`handler`]: the `Handler` trait that effects implement, and `store`.
//! - [`runtime`]: the worker runtime: consume, take, lease, fence, complete.
//! - [`metrics`]: Prometheus names, the recorder and the metrics listener.
//! - [`ops`]: the operator commands (list, show, replay, purge, sweep).
//! - [`ingest`]: the actix-web application of `hookinbox-ingest`.
//! - [`telemetry`]: tracing setup; [`shutdown`]: signal handling.
//!
//! # Invariants, and where they are enforced
//!
//! - Signature before claim: [`ingest`] touches Postgres only after
//!   [`signature::Secrets::verify`] accepted the raw body.
//! - Confirm before 202: [`ingest`] answers `accepted` only after the
//!   broker confirmed the job ([`broker::Publisher::publish`]).
//! - Fence before effect: [`handler::Effect::transaction`] locks the row under
//!   the worker's token before the handler writes anything.
//! - Commit before ack: [`runtime`] acks a message only after the
//!   transition that resolves it has committed.

pub mod batcher;
pub mod broker;
pub mod config;
pub mod db;
pub mod deliveries;
pub mod failpoints;
pub mod forward;
pub mod handler;
pub mod ingest;
pub mod key;
pub mod metrics;
pub mod ops;
pub mod payload;
pub mod retry;
pub mod runtime;
pub mod shutdown;
pub mod signature;
pub mod sources;
pub mod telemetry;

pub use key::{ClaimToken, DeliveryId, DeliveryKey, EventName, HookId, SourceName};
