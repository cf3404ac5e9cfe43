//! The library both hookinbox binaries use: `hookinbox-ingest` (the HTTP
//! edge, crate `hookinbox_ingest`) and `hookinbox-worker` (the runtime,
//! maintenance, handlers and operator commands, crate `hookinbox_worker`).
//!
//! hookinbox is an idempotent inbox for GitHub webhooks: ingest verifies a
//! delivery, claims its key in Postgres and publishes it to RabbitMQ; a worker
//! takes the claim with a fencing token, runs the effect and completes the
//! delivery in the same transaction. The promise is at-least-once delivery
//! plus idempotent effects.
//!
//! # Layout
//!
//! The nouns:
//! - [`key`]: what names a delivery (`DeliveryKey`, `DeliveryId`, `HookId`,
//!   `EventName`, `SourceName`, `ClaimToken`) and their validation.
//! - [`signature`]: `X-Hub-Signature-256` parsing and constant-time checks.
//! - [`payload`]: the JSON and form body shapes, and the `action` field.
//! - [`job`]: `Envelope`, one leg on its way to a worker (its key; its
//!   body only as a `BodyCopy` that saves a read), and `Job`, what a
//!   handler receives (the envelope with its `Body`).
//! - [`egress`]: which addresses a `forward` destination may connect to.
//!
//! The state machine and the adapters:
//! - [`deliveries`]: the delivery state machine, one module. `mod.rs` is
//!   the map; each transition sits beside the one SQL statement that
//!   decides it, in a file per caller, and each batched statement beside
//!   the single one it must agree with.
//! - [`postgres`]: the pool, the watchdog for half-open connections, the
//!   migrations, advisory locks, and the group-commit mechanism.
//! - [`broker`]: RabbitMQ topology, the job as a message, and the
//!   confirming publisher.
//! - [`retry`]: the retry policy (exponential backoff with jitter, capped).
//! - [`config`]: settings of both binaries and of the webhook sources, and
//!   the checks that make a binary refuse to start on a bad one.
//!
//! Around them: [`metrics`] (names, recorder, the metrics listener),
//! [`telemetry`] (logging), [`shutdown`] (signals), [`failpoints`] (kill
//! points of the fault suite), and [`cli`] (how both binaries enter: the
//! health check, logging and kill points first, then the command).
//!
//! Imports inside this crate point down its layers only, the nouns at the
//! bottom and the settings at the top. Which module may import which is
//! the table of the test `tests/tests/layers.rs` (its one home), which
//! reads every `crate::` path and fails on an edge the table does not list;
//! CI runs it (`scripts/check-layers.sh`).
//!
//! # Invariants, and where they are enforced
//!
//! - Signature before claim: ingest touches Postgres only after
//!   [`signature::Secrets::verify`] accepted the raw body
//!   (`hookinbox_ingest`'s `receive`).
//! - Body before 202: the claim writes the delivery's body in its own
//!   statement ([`deliveries::claim`]), so whatever happens to its
//!   messages, Postgres can publish each leg again.
//! - Confirm before 202: ingest answers `accepted` only after the broker
//!   confirmed the job ([`broker::Publisher::publish`]), or after the leg
//!   is recorded as due in Postgres ([`deliveries::publish_failed`]).
//! - Fence before effect: a database effect runs in a transaction that
//!   first locks the row under the worker's token ([`deliveries::fence`]),
//!   or is written by the completing statement itself, only for a row its
//!   token still holds ([`deliveries::complete_batch`]).
//! - Commit before ack: the worker acks a message only after the transition
//!   that resolves it has committed (`hookinbox_worker`'s runtime).

pub mod broker;
pub mod cli;
pub mod client;
pub mod config;
pub mod deliveries;
pub mod egress;
pub mod failpoints;
pub mod job;
pub mod key;
pub mod metrics;
pub mod payload;
pub mod postgres;
pub mod retry;
pub mod shutdown;
pub mod signature;
pub mod telemetry;

pub use job::{Body, BodyCopy, Envelope, Job, JobTrace};
pub use key::{
    ClaimToken, DeliveryId, DeliveryKey, DestinationName, EventName, HookId, LegKey, SourceName,
};
