//! Settings of both binaries, read from the environment (or flags), and the
//! checks that make a binary refuse to start on a bad one, naming it.
//!
//! Every setting has a default for a local machine except the webhook
//! secret. `--help` on either binary lists them with their variables. Each
//! binary's arguments (`*Args`, parsed by clap) validate into its settings
//! (`*Config`), which hold typed values: durations, not milliseconds.

use std::fmt::Display;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// How long a migration's statement may go unanswered before its connection
/// counts as dead.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

use clap::builder::BoolishValueParser;
use deadpool_postgres::Pool;

use crate::broker::{DEFAULT_PUBLISH_WINDOW, Publisher, Topology};
use crate::deliveries::Policy;
use crate::postgres::{DEFAULT_REQUEST_TIMEOUT, DbError, PoolOptions, Pooler};

mod destinations;
mod forward;
mod github;
mod ingest;
mod secrets;
mod sources;
mod sources_args;
mod worker;

pub use destinations::{
    Breaker, DEFAULT_DISABLE_AFTER, DEFAULT_FORWARD_SCHEDULE, Destination, DestinationKind,
    Filtered, Ordering, RepositoryFilter,
};
pub use forward::{
    DEFAULT_FORWARD_TIMEOUT, ExtraHeader, ForwardConfig, ForwardSignature, ForwardTls, REDACTED,
    mask_secret_values, parse_forward_url, sort_secret_values,
};
pub use github::{
    DEFAULT_API_URL, DEFAULT_INTERVAL_SECS, DEFAULT_MAX_REDELIVERIES, DEFAULT_MIN_AGE_SECS,
    DEFAULT_PER_SECOND, GithubAuth, GithubSettings, HookKind, IdValue, Reconcile,
};
pub use ingest::{IngestArgs, IngestConfig};
pub use secrets::{inline_secret, load_secrets, secrets_from_lines};
pub use sources::{EventFilter, RateLimit, Source, from_file, from_toml};
pub use sources_args::{SecretNeed, SourcesArgs};
pub use worker::{
    HandlerKind, MIN_COMPLETED_RETENTION, ReconcileTarget, Route, WorkerArgs, WorkerConfig,
};

/// A setting that makes a binary refuse to start. The message names the
/// variable and never contains a secret.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A setting is invalid.
    #[error("{name}: {problem}")]
    Invalid {
        /// The environment variable (or field) at fault.
        name: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A field of the config file is invalid.
    #[error("{name}: {problem}")]
    Field {
        /// The field, e.g. `sources[1].handler.url`.
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A file named by a setting cannot be read.
    #[error("{name}: cannot read {path}: {source}")]
    Unreadable {
        /// The setting (variable or config field) that names the file.
        name: String,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl ConfigError {
    /// An invalid field of the config file (or any setting named at run time).
    pub fn field(name: &str, problem: impl Into<String>) -> Self {
        Self::Field {
            name: name.to_owned(),
            problem: problem.into(),
        }
    }
}

pub(crate) fn invalid(name: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        name,
        problem: problem.into(),
    }
}

/// A clap value parser for a whole number of at least 1, so that every
/// such setting says the same thing when it is 0.
fn at_least_one<T>(value: &str) -> Result<T, String>
where
    T: FromStr + PartialOrd + From<u8>,
    T::Err: Display,
{
    let n: T = value
        .trim()
        .parse()
        .map_err(|e| format!("'{value}' is not a whole number ({e})"))?;
    if n < T::from(1) {
        return Err("must be at least 1".to_owned());
    }
    Ok(n)
}

/// A duration such as `90s`, `12h` or `30d` (also a clap value parser).
pub fn parse_duration_text(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value.trim())
        .map_err(|e| format!("'{value}' is not a duration like 90s, 12h or 30d ({e})"))
}

/// A duration setting; `name` names it in errors.
fn parse_duration(name: &'static str, value: &str) -> Result<Duration, ConfigError> {
    parse_duration_text(value).map_err(|problem| invalid(name, problem))
}

/// `HOOKINBOX_MAX_ATTEMPTS` when unset.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 8;

/// Direct connections a worker's leaders use when DATABASE_URL points at a
/// transaction pooler (see [`CommonConfig::leaders`]).
pub const LEADER_CONNECTIONS: usize = 3;

/// Settings both binaries share.
#[derive(clap::Args, Clone)]
pub struct CommonArgs {
    /// Postgres connection URL.
    #[arg(
        long,
        env = "DATABASE_URL",
        value_name = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres",
        hide_env_values = true
    )]
    pub database_url: String,

    /// RabbitMQ connection URL.
    #[arg(
        long,
        env = "AMQP_URL",
        value_name = "AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f",
        hide_env_values = true
    )]
    pub amqp_url: String,

    /// Prefix of every exchange and queue; isolates deployments and test runs.
    #[arg(
        long,
        env = "HOOKINBOX_QUEUE_PREFIX",
        value_name = "HOOKINBOX_QUEUE_PREFIX",
        default_value = "hookinbox"
    )]
    pub queue_prefix: String,

    /// Apply pending migrations at start, under an advisory lock.
    #[arg(long, env = "HOOKINBOX_AUTO_MIGRATE",
        value_name = "HOOKINBOX_AUTO_MIGRATE", default_value = "true",
          value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub auto_migrate: bool,

    /// Seconds a claim or take is held without renewal.
    #[arg(
        long,
        env = "HOOKINBOX_LEASE_SECS",
        value_name = "HOOKINBOX_LEASE_SECS",
        value_parser = at_least_one::<u64>,
        default_value_t = 60
    )]
    pub lease_secs: u64,

    /// Takes allowed before a delivery is dead-lettered (default 8). A
    /// `forward` destination set by the single-source variables uses it
    /// (with HOOKINBOX_RETRY_BASE_MS and HOOKINBOX_RETRY_MAX_MS) only when
    /// one of the three is set; otherwise its own 24-hour schedule.
    #[arg(
        long,
        env = "HOOKINBOX_MAX_ATTEMPTS",
        value_name = "HOOKINBOX_MAX_ATTEMPTS",
        value_parser = at_least_one::<i32>
    )]
    pub max_attempts: Option<i32>,

    /// Milliseconds to wait for a publisher confirm.
    #[arg(
        long,
        env = "HOOKINBOX_PUBLISH_TIMEOUT_MS",
        value_name = "HOOKINBOX_PUBLISH_TIMEOUT_MS",
        value_parser = at_least_one::<u64>,
        default_value_t = 5000
    )]
    pub publish_timeout_ms: u64,

    /// Publishes awaiting their confirm at once (pipelined confirms; 1
    /// confirms one publish at a time).
    #[arg(
        long,
        env = "HOOKINBOX_PUBLISH_WINDOW",
        value_name = "HOOKINBOX_PUBLISH_WINDOW",
        value_parser = at_least_one::<usize>,
        default_value_t = DEFAULT_PUBLISH_WINDOW
    )]
    pub publish_window: usize,

    /// Maximum Postgres connections of this process.
    #[arg(
        long,
        env = "HOOKINBOX_DB_POOL_SIZE",
        value_name = "HOOKINBOX_DB_POOL_SIZE",
        value_parser = at_least_one::<usize>,
        default_value_t = 16
    )]
    pub db_pool_size: usize,

    /// Milliseconds a Postgres request may go without any answer before its
    /// connection is dropped (finds half-open connections).
    #[arg(
        long,
        env = "HOOKINBOX_DB_TIMEOUT_MS",
        value_name = "HOOKINBOX_DB_TIMEOUT_MS",
        value_parser = at_least_one::<u64>,
        default_value_t = DEFAULT_REQUEST_TIMEOUT.as_millis() as u64
    )]
    pub db_timeout_ms: u64,

    /// What DATABASE_URL points at: `none` (Postgres) or `transaction` (a
    /// pooler such as PgBouncer in transaction mode: unnamed statements,
    /// no startup options, and the leader locks and migrations through
    /// HOOKINBOX_DIRECT_DATABASE_URL).
    #[arg(
        long,
        env = "HOOKINBOX_DB_POOLER",
        value_name = "HOOKINBOX_DB_POOLER",
        default_value = "none",
        value_parser = parse_pooler
    )]
    pub db_pooler: Pooler,

    /// A direct (or session-pooled) Postgres URL for migrations and the
    /// leader locks, which are session advisory locks. Required with
    /// HOOKINBOX_DB_POOLER=transaction; default DATABASE_URL.
    #[arg(
        long,
        env = "HOOKINBOX_DIRECT_DATABASE_URL",
        value_name = "HOOKINBOX_DIRECT_DATABASE_URL",
        hide_env_values = true
    )]
    pub direct_database_url: Option<String>,

    /// Milliseconds a session may sit idle inside a transaction before
    /// Postgres ends it and releases its locks (0: Postgres's own setting).
    /// The worker needs more than HOOKINBOX_HANDLER_TIMEOUT_MS.
    #[arg(
        long,
        env = "HOOKINBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS",
        value_name = "HOOKINBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS",
        default_value_t = crate::postgres::DEFAULT_IDLE_IN_TRANSACTION.as_millis() as u64
    )]
    pub db_idle_in_transaction_timeout_ms: u64,

    /// Microseconds a group commit (claims, takes, completions) may wait
    /// for more rows while another of its statements is in flight and
    /// rows have come at least every two lingers on average; 0 sends at once.
    /// Up to 100000.
    #[arg(
        long,
        env = "HOOKINBOX_BATCH_LINGER_US",
        value_name = "HOOKINBOX_BATCH_LINGER_US",
        default_value_t = DEFAULT_BATCH_LINGER.as_micros() as u64
    )]
    pub batch_linger_us: u64,
}

/// `HOOKINBOX_BATCH_LINGER_US` when unset: long enough that batches form at
/// a thousand deliveries a second (claims 4 rows a statement, completions
/// 5, against under 2 and 3 without; Postgres 485 µs a delivery against
/// 723), short against a claim's time (docs/benchmarks.md).
pub const DEFAULT_BATCH_LINGER: Duration = Duration::from_millis(3);

/// The longest linger accepted: more would only add latency.
const MAX_BATCH_LINGER: Duration = Duration::from_millis(100);

/// `none` or `transaction`.
fn parse_pooler(value: &str) -> Result<Pooler, String> {
    match value.trim() {
        "none" => Ok(Pooler::None),
        "transaction" => Ok(Pooler::Transaction),
        other => Err(format!(
            "'{other}' is not a pooler mode (none or transaction)"
        )),
    }
}

/// Validated settings both binaries share.
#[derive(Clone, Debug)]
pub struct CommonConfig {
    /// Postgres connection URL (may carry a password: never log it).
    pub database_url: String,
    /// RabbitMQ connection URL (likewise).
    pub amqp_url: String,
    /// Prefix of every exchange and queue.
    pub queue_prefix: String,
    /// Apply pending migrations at start.
    pub auto_migrate: bool,
    /// How long a claim or take holds without renewal.
    pub lease: Duration,
    /// Takes allowed before a delivery is poison.
    pub max_attempts: i32,
    /// Whether `HOOKINBOX_MAX_ATTEMPTS` was given (rather than defaulted).
    pub max_attempts_set: bool,
    /// How long to wait for a publisher confirm.
    pub publish_timeout: Duration,
    /// Publishes awaiting their confirm at once.
    pub publish_window: usize,
    /// Postgres connections of this process.
    pub db_pool_size: usize,
    /// How long a Postgres request may go unanswered.
    pub db_timeout: Duration,
    /// What DATABASE_URL points at.
    pub db_pooler: Pooler,
    /// Where migrations and leader locks connect (may carry a password:
    /// never log it); DATABASE_URL when unset.
    pub direct_database_url: Option<String>,
    /// Postgres's `idle_in_transaction_session_timeout` for our sessions.
    pub db_idle_in_transaction: Duration,
    /// How long a group commit may wait for more rows.
    pub batch_linger: Duration,
}

impl CommonArgs {
    /// Checks the URLs and the queue prefix, naming the first bad one.
    pub fn validate(self) -> Result<CommonConfig, ConfigError> {
        crate::postgres::parse_url(&self.database_url).map_err(|e| {
            invalid(
                "DATABASE_URL",
                format!("not a valid Postgres URL ({})", inner(&e)),
            )
        })?;
        if let Some(url) = &self.direct_database_url {
            crate::postgres::parse_url(url).map_err(|e| {
                invalid(
                    "HOOKINBOX_DIRECT_DATABASE_URL",
                    format!("not a valid Postgres URL ({})", inner(&e)),
                )
            })?;
        } else if self.db_pooler == Pooler::Transaction {
            return Err(invalid(
                "HOOKINBOX_DIRECT_DATABASE_URL",
                "required with HOOKINBOX_DB_POOLER=transaction: migrations and the leader locks \
                 are session advisory locks, which a transaction pooler does not keep",
            ));
        }
        crate::broker::check_url(&self.amqp_url)
            .map_err(|e| invalid("AMQP_URL", format!("not a valid AMQP URL ({})", inner(&e))))?;
        if self.queue_prefix.is_empty()
            || self.queue_prefix.len() > 100
            || !self
                .queue_prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            return Err(invalid(
                "HOOKINBOX_QUEUE_PREFIX",
                "must be 1 to 100 characters of letters, digits, '-', '_' and '.'",
            ));
        }
        let batch_linger = Duration::from_micros(self.batch_linger_us);
        if batch_linger > MAX_BATCH_LINGER {
            return Err(invalid(
                "HOOKINBOX_BATCH_LINGER_US",
                "must be at most 100000 (100 ms)",
            ));
        }
        Ok(CommonConfig {
            database_url: self.database_url,
            amqp_url: self.amqp_url,
            queue_prefix: self.queue_prefix,
            auto_migrate: self.auto_migrate,
            lease: Duration::from_secs(self.lease_secs),
            max_attempts: self.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS),
            max_attempts_set: self.max_attempts.is_some(),
            publish_timeout: Duration::from_millis(self.publish_timeout_ms),
            publish_window: self.publish_window,
            db_pool_size: self.db_pool_size,
            db_timeout: Duration::from_millis(self.db_timeout_ms),
            db_pooler: self.db_pooler,
            direct_database_url: self.direct_database_url,
            db_idle_in_transaction: Duration::from_millis(self.db_idle_in_transaction_timeout_ms),
            batch_linger,
        })
    }
}

impl CommonConfig {
    /// This process's Postgres pool (`HOOKINBOX_DB_POOL_SIZE` connections).
    pub fn pool(&self) -> Result<Pool, DbError> {
        self.pool_of(self.db_pool_size)
    }

    /// A pool of `size` connections with every other Postgres setting, for
    /// commands that need only a few (the operator commands).
    pub fn pool_of(&self, size: usize) -> Result<Pool, DbError> {
        let options = self.pool_options(size, self.db_pooler);
        if self.db_pooler == Pooler::Transaction {
            // One more connection through the pooler, where the parameter
            // types of unnamed statements are learned.
            let learn = crate::postgres::pool_with(
                &self.database_url,
                &PoolOptions {
                    max_size: 1,
                    ..options
                },
            )?;
            crate::postgres::sql::use_unnamed_statements(learn);
        }
        crate::postgres::pool_with(&self.database_url, &options)
    }

    /// A pool of `size` connections that keep their sessions (the direct
    /// URL when one is set): for migrations and the leader locks.
    pub fn direct_pool_of(&self, size: usize) -> Result<Pool, DbError> {
        let (url, pooler) = self.direct();
        crate::postgres::pool_with(url, &self.pool_options(size, pooler))
    }

    /// Where direct connections go, and through what.
    fn direct(&self) -> (&str, Pooler) {
        let url = self
            .direct_database_url
            .as_deref()
            .unwrap_or(&self.database_url);
        let pooler = if self.direct_database_url.is_some() {
            Pooler::None
        } else {
            self.db_pooler
        };
        (url, pooler)
    }

    /// The pool the leader locks are taken on: `app` itself, unless
    /// DATABASE_URL does not keep sessions; then [`LEADER_CONNECTIONS`]
    /// direct ones (the sampler keeps one, a sweep or a reconciler pass
    /// takes another for a while).
    pub fn leaders(&self, app: &Pool) -> Result<Pool, DbError> {
        if self.db_pooler == Pooler::Transaction {
            self.direct_pool_of(LEADER_CONNECTIONS)
        } else {
            Ok(app.clone())
        }
    }

    /// This process's Postgres pool, after logging what a transaction
    /// pooler left out of its sessions ([`crate::postgres::pooled_session_warnings`]).
    pub async fn checked_pool(&self) -> Result<Pool, DbError> {
        let pool = self.pool()?;
        if self.db_pooler == Pooler::Transaction {
            match crate::postgres::pooled_session_warnings(&pool).await {
                Ok(warnings) => {
                    for warning in warnings {
                        tracing::warn!("{warning}");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot read the pooled session's settings"),
            }
        }
        Ok(pool)
    }

    /// Applies pending migrations over a direct connection of its own
    /// (their lock is a session lock), and returns how many it applied.
    pub async fn migrate(&self) -> Result<usize, DbError> {
        let (url, pooler) = self.direct();
        let mut options = self.pool_options(1, pooler);
        // A migration may read or index a large table, the server silent
        // until it ends (0022 reads the stored events):
        // HOOKINBOX_DB_TIMEOUT_MS would take that silence for a dead connection
        // and roll it back, at every start.
        options.request_timeout = MIGRATION_TIMEOUT;
        crate::postgres::migrate(&crate::postgres::pool_with(url, &options)?).await
    }

    fn pool_options(&self, max_size: usize, pooler: Pooler) -> PoolOptions {
        PoolOptions {
            max_size,
            request_timeout: self.db_timeout,
            pooler,
            idle_in_transaction: self.db_idle_in_transaction,
        }
    }

    /// The exchanges and queues under `HOOKINBOX_QUEUE_PREFIX`.
    pub fn topology(&self) -> Topology {
        Topology::new(&self.queue_prefix)
    }

    /// A confirming publisher; `name` names its connection in RabbitMQ.
    pub fn publisher(&self, name: &str) -> Publisher {
        Publisher::new(&self.amqp_url, name, self.topology(), self.publish_timeout)
            .with_window(self.publish_window)
    }

    /// The state machine's knobs.
    pub fn policy(&self) -> Policy {
        Policy {
            lease: self.lease,
            max_attempts: self.max_attempts,
            publish_timeout: self.publish_timeout,
        }
    }
}

/// The message of an error without the URL it may quote (URLs can carry
/// passwords).
fn inner(e: &dyn std::error::Error) -> String {
    e.source()
        .map(|s| s.to_string())
        .unwrap_or_else(|| "parse error".to_owned())
}
