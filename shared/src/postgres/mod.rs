//! Postgres: the pool (its only builder), the errors, readiness, and the
//! pieces underneath: a watchdog for half-open connections, the versioned
//! migrations, advisory locks, the vacuum horizon's age, and the
//! group-commit mechanism. This module knows nothing of deliveries.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

pub mod advisory;
mod batcher;
pub mod horizon;
mod migrate;
mod refusal;
pub mod sql;
mod watchdog;

pub use batcher::{BatchError, BatchShape, Batcher};
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

/// What stands between hookinbox and Postgres.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooler {
    /// Postgres itself (or a pooler in session mode).
    #[default]
    None,
    /// A pooler in transaction mode (PgBouncer): each transaction may run
    /// on another server connection, so no named prepared statements (see
    /// [`sql`]), no startup `options` (PgBouncer refuses them: the session
    /// settings below must come from the pooler's `connect_query` or from
    /// `ALTER ROLE … SET`), and no session advisory locks (the leader
    /// locks and migrations use a direct connection instead).
    Transaction,
}

/// How a pool's connections are made and kept.
#[derive(Clone, Copy, Debug)]
pub struct PoolOptions {
    /// Connections at most.
    pub max_size: usize,
    /// A request whose answer has not ended and that got no byte of it for
    /// this long fails its connection (see [`pool_with`]).
    pub request_timeout: Duration,
    /// What the URL points at.
    pub pooler: Pooler,
    /// `idle_in_transaction_session_timeout`: Postgres ends a session left
    /// idle inside a transaction for this long, releasing its locks (a
    /// process frozen mid-transaction, say). Zero leaves Postgres's own.
    pub idle_in_transaction: Duration,
}

/// The default `idle_in_transaction_session_timeout` of hookinbox's
/// sessions; `HOOKINBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS`.
pub const DEFAULT_IDLE_IN_TRANSACTION: Duration = Duration::from_secs(60);

impl PoolOptions {
    /// `max_size` connections with every other option at its default.
    pub fn new(max_size: usize) -> Self {
        Self {
            max_size,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            pooler: Pooler::None,
            idle_in_transaction: DEFAULT_IDLE_IN_TRANSACTION,
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
    // Several hosts (a primary and its standbys, `postgres://h1,h2/db`):
    // every connection writes, so it goes only to the one that takes
    // writes, whatever the URL's `target_session_attrs` says. After a
    // failover, each new connection finds the promoted standby by itself.
    if config.get_hosts().len() > 1 {
        config.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
    }
    // Keepalives find a peer that vanished from an idle connection: the
    // first probe after 30 s of silence, then every 10 s, given up after
    // 3 unanswered (about a minute in all).
    config.keepalives(true);
    config.keepalives_idle(Duration::from_secs(30));
    config.keepalives_interval(Duration::from_secs(10));
    config.keepalives_retries(3);
    Ok(config)
}

/// The connection settings of a pool: the URL's, and the session settings
/// below unless a transaction pooler stands in between.
fn connect_config(url: &str, options: &PoolOptions) -> Result<tokio_postgres::Config, DbError> {
    let mut config = parse_url(url)?;
    if options.pooler == Pooler::Transaction {
        return Ok(config);
    }
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
    // cost more CPU than running the statements. A scan that no index can
    // replace (a small table without one) then carries the planner's
    // penalty for disabled paths in its estimate, which is far past the
    // JIT threshold: JIT is off, or such a statement would spend tens of
    // milliseconds compiling itself on every execution.
    let mut session =
        "-c enable_seqscan=off -c plan_cache_mode=force_generic_plan -c jit=off".to_owned();
    if !options.idle_in_transaction.is_zero() {
        session.push_str(&format!(
            " -c idle_in_transaction_session_timeout={}",
            options.idle_in_transaction.as_millis()
        ));
    }
    let all = match config.get_options() {
        Some(own) => format!("{own} {session}"),
        None => session,
    };
    config.options(all);
    Ok(config)
}

/// How long a Postgres request may go unanswered by default before its
/// connection is given up (see [`pool`]); `HOOKINBOX_DB_TIMEOUT_MS`.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A pooled connection unused for longer than this is checked (a round
/// trip) before it is handed out; busier ones are not.
pub const CHECK_IDLE_AFTER: Duration = Duration::from_secs(1);

/// How long that check may take before the connection is given up.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// [`pool_with`] with the default options but these.
pub fn pool(url: &str, max_size: usize, request_timeout: Duration) -> Result<Pool, DbError> {
    pool_with(
        url,
        &PoolOptions {
            request_timeout,
            ..PoolOptions::new(max_size)
        },
    )
}

/// Builds a bounded pool. Waiting for a connection and creating one are
/// both bounded, so a request fails with 503 instead of queueing without
/// end.
///
/// Every TCP connection also carries a watchdog: a request whose answer has
/// not ended (no `ReadyForQuery` yet) and that got no byte of it for
/// `request_timeout` fails the connection, also when the answer stopped
/// half-way. Keepalives
/// cannot find a half-open connection whose far end still acknowledges
/// packets (a stuck proxy, a frozen peer), and without the watchdog a query
/// on it would wait forever while holding a pool slot and a job.
///
/// A connection that sat idle for longer than [`CHECK_IDLE_AFTER`] is
/// checked with a round trip before it is handed out, and dropped if the
/// check fails or takes longer than 2 s: a half-open idle connection is
/// found before a request uses it. A busy connection (handed out again
/// within the second, as under load) is not checked, so the hot path pays
/// nothing.
pub fn pool_with(url: &str, options: &PoolOptions) -> Result<Pool, DbError> {
    let config = connect_config(url, options)?;
    let manager = Manager::from_connect(
        config,
        watchdog::Connect {
            request_timeout: options.request_timeout,
        },
        ManagerConfig {
            // The checkout itself only looks at whether the connection is
            // closed (the watchdog closes a stuck one); the idle check
            // below does the rest.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Ok(Pool::builder(manager)
        .max_size(options.max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(5)))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .post_recycle(Hook::async_fn(|client, metrics| {
            Box::pin(check_if_idle(client, metrics.last_used()))
        }))
        .build()?)
}

/// The idle check of [`pool_with`].
async fn check_if_idle(
    client: &mut deadpool_postgres::ClientWrapper,
    idle: Duration,
) -> Result<(), HookError> {
    if idle < CHECK_IDLE_AFTER {
        return Ok(());
    }
    match tokio::time::timeout(CHECK_TIMEOUT, client.simple_query("")).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(HookError::Backend(e)),
        Err(_) => Err(HookError::message(
            "an idle connection did not answer its check",
        )),
    }
}

/// Behind a transaction pooler, the session settings hookinbox would send
/// at connect must come from the pooler (`connect_query`) or the role
/// (`ALTER ROLE … SET`). Returns a warning for each one that did not.
pub async fn pooled_session_warnings(pool: &Pool) -> Result<Vec<String>, DbError> {
    let client = pool.get().await?;
    let mut warnings = Vec::new();
    for (setting, wanted) in [
        ("enable_seqscan", "off"),
        // With enable_seqscan off and JIT on, a statement left with a scan
        // compiles itself at every execution (a second and more on a busy
        // machine, past the request timeout).
        ("jit", "off"),
        ("idle_in_transaction_session_timeout", ""),
    ] {
        let rows = client.simple_query(&format!("show {setting}")).await?;
        let value = rows.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        });
        let ok = match wanted {
            "" => value.as_deref().is_some_and(|v| v != "0"),
            wanted => value.as_deref() == Some(wanted),
        };
        if !ok {
            warnings.push(format!(
                "behind the pooler, {setting} is {}: set it in the pooler's connect_query or \
                 with ALTER ROLE … SET (see docs/operations.md)",
                value.as_deref().unwrap_or("unknown")
            ));
        }
    }
    Ok(warnings)
}

/// True when a query can run now (used by `/readyz`).
pub async fn ping(pool: &Pool) -> bool {
    match pool.get().await {
        Ok(client) => client.simple_query("select 1").await.is_ok(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_hosts_connect_only_to_the_one_that_takes_writes() {
        use tokio_postgres::config::TargetSessionAttrs;
        let one = parse_url("postgres://u@127.0.0.1:5432/db").expect("url");
        assert_eq!(one.get_target_session_attrs(), TargetSessionAttrs::Any);
        for url in [
            "postgres://u@127.0.0.1:5432,127.0.0.1:5433/db",
            "postgres://u@127.0.0.1:5432,127.0.0.1:5433/db?target_session_attrs=any",
        ] {
            let config = parse_url(url).expect("url");
            assert_eq!(config.get_hosts().len(), 2);
            assert_eq!(
                config.get_target_session_attrs(),
                TargetSessionAttrs::ReadWrite
            );
        }
    }

    #[test]
    fn sessions_get_keepalives_and_their_settings_unless_behind_a_transaction_pooler() {
        let url = "postgres://u@127.0.0.1:5432/db";
        let config = parse_url(url).expect("url");
        assert!(config.get_keepalives());
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(30));
        assert_eq!(
            config.get_keepalives_interval(),
            Some(Duration::from_secs(10))
        );
        assert_eq!(config.get_keepalives_retries(), Some(3));

        let direct = connect_config(url, &PoolOptions::new(1)).expect("config");
        let options = direct.get_options().expect("options");
        assert!(options.contains("enable_seqscan=off"), "{options}");
        assert!(options.contains("jit=off"), "{options}");
        assert!(
            options.contains("idle_in_transaction_session_timeout=60000"),
            "{options}"
        );
        let pooled = PoolOptions {
            pooler: Pooler::Transaction,
            ..PoolOptions::new(1)
        };
        let behind = connect_config(url, &pooled).expect("config");
        assert_eq!(behind.get_options(), None, "PgBouncer refuses options");
        assert!(behind.get_keepalives());
    }
}
