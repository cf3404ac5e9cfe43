//! What the runtime and the maintenance share: the settings, the Postgres
//! pool and the publisher, built once per worker.

use deadpool_postgres::Pool;
use hookinbox::broker::{BrokerError, Publisher, Topology};
use hookinbox::config::WorkerConfig;
use hookinbox::deliveries::Policy;
use hookinbox::postgres::DbError;

/// Why the worker could not start, or a pass of its work failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Postgres failed.
    #[error(transparent)]
    Db(#[from] DbError),
    /// RabbitMQ failed.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// A channel operation failed.
    #[error("RabbitMQ: {0}")]
    Channel(#[from] lapin::Error),
    /// The metrics listener could not be bound.
    #[error("cannot bind the metrics listener: {0}")]
    MetricsListener(#[source] std::io::Error),
}

/// The settings and connections of one worker.
pub(crate) struct Context {
    pub(crate) config: WorkerConfig,
    /// The state machine's knobs, from the settings.
    pub(crate) policy: Policy,
    pub(crate) pool: Pool,
    /// Where the leader locks are taken: `pool`, or direct connections
    /// when `pool` goes through a transaction pooler.
    pub(crate) leaders: Pool,
    /// Publishes dead-letter copies and scheduled retries.
    pub(crate) publisher: Publisher,
    pub(crate) topology: Topology,
    /// The fair destinations, as `(source, destination)`, with legs
    /// waiting for their installation's turn, as the scheduler's last wake
    /// found them or this worker's takes made them: a leg of one of them
    /// that ends releases its installation's next (see
    /// `scheduler::publish_next_fair`); the others skip that statement.
    pub(crate) fair_waiting: std::sync::RwLock<std::collections::HashSet<(String, String)>>,
}

impl Context {
    /// Builds the pool (migrated when `HOOKINBOX_AUTO_MIGRATE` is on) and
    /// the publisher; nothing is consumed yet.
    pub(crate) async fn build(config: WorkerConfig) -> Result<Self, RuntimeError> {
        let common = &config.common;
        if common.auto_migrate {
            common.migrate().await?;
        }
        let pool = common.checked_pool().await?;
        Ok(Self {
            leaders: common.leaders(&pool)?,
            policy: common.policy(),
            publisher: common.publisher("hookinbox-worker"),
            topology: common.topology(),
            fair_waiting: Default::default(),
            pool,
            config,
        })
    }
}
