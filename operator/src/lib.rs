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
//!
//! The faces:
//! - [`cli`]: the operator commands (`deliveries`, `dlq`).
//! - [`console`]: the admin console (`hookinbox-worker admin`): the web
//!   page and the JSON API, its sign-in, bulk jobs and audit log.
//!
//! Which of these modules may import which is the table of the test
//! `tests/tests/layers.rs` (CI runs it: `scripts/check-layers.sh`): the
//! faces use the core, never each other.

mod age;
pub mod cli;
pub mod console;
mod dlq;

pub use dlq::reconcile_dead_letter_queue;

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
