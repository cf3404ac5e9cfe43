//! `hookinbox-operator`: what an operator can do with hookinbox's
//! deliveries, and its two faces. `hookinbox-worker` wires both into its
//! command line (`deliveries …`, `dlq …`, `jobs …`, `admin`); this crate
//! depends on the library (`hookinbox`) only, so the console and its web
//! stack stay out of the runtime.
//!
//! # Layout
//!
//! The core, used by both faces:
//! - `dlq`: the dead-letter queue kept in step with Postgres after a
//!   replay or a purge.
//! - `age`: ages as operators give them, bounded.
//! - `view`: [`DeliveryView`], the one JSON of a delivery.
//! - [`replay`]: one delivery's replay (compare-and-set, publish, undo on
//!   a failed publish) with its typed [`replay::Outcome`].
//! - [`jobs`]: bulk replays and purges as jobs (a frozen selection, paced,
//!   cancellable, their items each delivery's lineage) and their runner,
//!   in the background for the console or in the foreground for the CLI;
//!   purge is a job's kind.
//! - [`audit`]: the audit log both faces write; `actor`: who acts.
//! - [`destinations`]: each destination's state, waiting legs and
//!   settings ([`destinations::DestinationView`], the one JSON of a
//!   destination), and an operator's pause and resume, audited.
//!
//! The faces:
//! - [`cli`]: the operator commands (`deliveries`, `dlq`, `jobs`,
//!   `destinations`).
//! - [`console`]: the admin console (`hookinbox-worker admin`): the web
//!   page and the JSON API, its sign-in, bulk jobs and audit log.
//!
//! Which of these modules may import which is the table of the test
//! `tests/tests/layers.rs` (CI runs it: `scripts/check-layers.sh`): the
//! faces use the core, never each other.

mod actor;
mod age;
pub mod audit;
pub mod cli;
pub mod console;
pub mod destinations;
mod dlq;
pub mod jobs;
pub mod replay;
mod view;

pub use actor::{Identity, Role};
pub use dlq::reconcile_dead_letter_queue;
pub use view::DeliveryView;

use hookinbox::broker::BrokerError;
use hookinbox::postgres::DbError;

/// Why an operator's action failed.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// Postgres failed.
    #[error(transparent)]
    Db(#[from] DbError),
    /// RabbitMQ failed.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// A channel operation failed.
    #[error("RabbitMQ: {0}")]
    Channel(#[from] lapin::Error),
}
