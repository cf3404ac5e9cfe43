//! Postgres: the pool (its only builder), the errors, readiness, and the
//! pieces underneath: a watchdog for half-open connections, the versioned
//! migrations, advisory locks, and the group-commit mechanism. This module
//! knows nothing of deliveries.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

pub mod advisory;
mod batcher;
mod migrate;
mod refusal;
mod watchdog;

pub use batcher::{BatchError, Batcher};
pub use migrate::migrate;
pub use refusal::{Refusal, describe};

/// A pooled Postgres client.
pub type Client = deadpool_postgres::Object;

/// Errors of the database layer.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// `DATABASE_URL` does not parse.
    #[error("DATABASE_URL is not a valid Postgres URL: {0}")]
    BadUrl(#[source] tokio_postgres::Error),
    /// No connection could be had from the pool.
    #[error("Postgres unavailable: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// A statement failed: refused by Postgres (see [`DbError::refusal`]),
    /// or unanswered.
    #[error("Postgres: {}", refusal::describe(.0))]
    Query(#[from] tokio_postgres::Error),
    /// The pool could not be built.
    #[error("cannot build the Postgres pool: {0}")]
    Build(#[from] deadpool_postgres::BuildError),
    /// A batched statement (group commit) has no answer.
    #[error("batched Postgres statement failed: {0}")]
    Batch(#[from] BatchError),
    /// A stored row no longer parses (edited by hand?).
    #[error("a stored delivery has an invalid {0}")]
    BadRow(&'static str),
    /// A migration already applied has been edited since.
    #[error("migration {version} ({name}) was changed after it was applied")]
    MigrationChanged {
        /// Its version number.
        version: i32,
        /// Its file name.
        name: &'static str,
    },
}

impl DbError {
    /// Postgres's answer, when it refused the statement: then the
    /// statement certainly did not commit. `None`: no answer (the outcome
    /// is unknown) or not a statement's error.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Self::Query(e) => Refusal::of(e),
            Self::Batch(BatchError::Failed(inner)) => inner.refusal(),
            _ => None,
        }
    }
}

/// Parses `DATABASE_URL`, adding a connect timeout when the URL has none so
/// that an unreachable database fails fast instead of hanging a request.
pub fn parse_url(url: &str) -> Result<tokio_postgres::Config, DbError> {
    let mut config = tokio_postgres::Config::from_str(url).map_err(DbError::BadUrl)?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    // Keepalives find a half-open connection instead of waiting forever.
    config.keepalives(true);
    config.keepalives_idle(Duration::from_secs(30));
    // Every statement hookinbox runs finds its rows through an index (the
    // key, or a partial index for the sweeps and gauges). A pooled
    // connection keeps the generic plan it made for a prepared statement
    // after five executions, and when that happened while `deliveries` was
    // small (a new deployment, autovacuum off, no ANALYZE yet) the plan is
    // a sequential scan joined by hash: every take and claim then reads the
    // whole table, and the pipeline slows as the table grows. Scans are
    // therefore ruled out for our sessions, which makes the generic plan an
    // index plan whatever the statistics say, and that plan is used from
    // the first execution: planning each execution anew, the other way out,
    // cost more CPU than running the statements.
    const PLANNER: &str = "-c enable_seqscan=off -c plan_cache_mode=force_generic_plan";
    let options = match config.get_options() {
        Some(own) => format!("{own} {PLANNER}"),
        None => PLANNER.to_owned(),
    };
    config.options(options);
    Ok(config)
}

/// How long a Postgres request may go unanswered by default before its
/// connection is given up (see [`pool`]); `HOOKINBOX_DB_TIMEOUT_MS`.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Builds a bounded pool of at most `max_size` connections. Waiting for a
/// connection and creating one are both bounded, so a request fails with
/// 503 instead of queueing without end.
///
/// Every TCP connection also carries a watchdog: a request that gets no byte
/// of answer within `request_timeout` fails the connection. Keepalives
/// cannot find a half-open connection whose far end still acknowledges
/// packets (a stuck proxy, a frozen peer), and without the watchdog a query
/// on it would wait forever while holding a pool slot and a job.
pub fn pool(url: &str, max_size: usize, request_timeout: Duration) -> Result<Pool, DbError> {
    let config = parse_url(url)?;
    let manager = Manager::from_connect(
        config,
        watchdog::Connect { request_timeout },
        ManagerConfig {
            // Fast recycling skips a round trip per checkout; a broken
            // connection shows up as an error on first use instead, and a
            // closed one (the watchdog fired) is never handed out again.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Ok(Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(5)))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .build()?)
}

/// True when a query can run now (used by `/readyz`).
pub async fn ping(pool: &Pool) -> bool {
    match pool.get().await {
        Ok(client) => client.simple_query("select 1").await.is_ok(),
        Err(_) => false,
    }
}
