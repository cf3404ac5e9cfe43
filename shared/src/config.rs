//! Settings of both binaries, read from the environment (or flags), and the
//! checks that make a binary refuse to start on a bad one, naming it.
//!
//! Every setting has a default for a local machine except the webhook
//! secret. `--help` on either binary lists them with their variables.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::builder::BoolishValueParser;

use crate::deliveries::Policy;
use crate::key::SourceName;
use crate::retry::RetryPolicy;
use crate::signature::{Secret, Secrets};
use crate::sources::{
    EventFilter, ForwardConfig, HandlerConfig, Source, inline_secret, parse_forward_url,
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
        /// The environment variable that names the file.
        name: &'static str,
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

fn invalid(name: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        name,
        problem: problem.into(),
    }
}

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
        default_value_t = 60
    )]
    pub lease_secs: u64,

    /// Takes allowed before a delivery is dead-lettered as poison.
    #[arg(
        long,
        env = "HOOKINBOX_MAX_ATTEMPTS",
        value_name = "HOOKINBOX_MAX_ATTEMPTS",
        default_value_t = 8
    )]
    pub max_attempts: i32,

    /// Milliseconds to wait for a publisher confirm.
    #[arg(
        long,
        env = "HOOKINBOX_PUBLISH_TIMEOUT_MS",
        value_name = "HOOKINBOX_PUBLISH_TIMEOUT_MS",
        default_value_t = 5000
    )]
    pub publish_timeout_ms: u64,

    /// Publishes awaiting their confirm at once (pipelined confirms; 1
    /// confirms one publish at a time).
    #[arg(
        long,
        env = "HOOKINBOX_PUBLISH_WINDOW",
        value_name = "HOOKINBOX_PUBLISH_WINDOW",
        default_value_t = crate::broker::DEFAULT_PUBLISH_WINDOW
    )]
    pub publish_window: usize,

    /// Maximum Postgres connections of this process.
    #[arg(
        long,
        env = "HOOKINBOX_DB_POOL_SIZE",
        value_name = "HOOKINBOX_DB_POOL_SIZE",
        default_value_t = 16
    )]
    pub db_pool_size: usize,

    /// Milliseconds a Postgres request may go without any answer before its
    /// connection is dropped (finds half-open connections).
    #[arg(
        long,
        env = "HOOKINBOX_DB_TIMEOUT_MS",
        value_name = "HOOKINBOX_DB_TIMEOUT_MS",
        default_value_t = 30_000
    )]
    pub db_timeout_ms: u64,
}

impl CommonArgs {
    /// Checks the URLs and numbers, naming the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        crate::db::parse_url(&self.database_url).map_err(|e| {
            invalid(
                "DATABASE_URL",
                format!("not a valid Postgres URL ({})", inner(&e)),
            )
        })?;
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
        if self.lease_secs == 0 {
            return Err(invalid("HOOKINBOX_LEASE_SECS", "must be at least 1"));
        }
        if self.max_attempts < 1 {
            return Err(invalid("HOOKINBOX_MAX_ATTEMPTS", "must be at least 1"));
        }
        if self.publish_timeout_ms == 0 {
            return Err(invalid(
                "HOOKINBOX_PUBLISH_TIMEOUT_MS",
                "must be at least 1",
            ));
        }
        if self.db_pool_size == 0 {
            return Err(invalid("HOOKINBOX_DB_POOL_SIZE", "must be at least 1"));
        }
        if self.publish_window == 0 {
            return Err(invalid("HOOKINBOX_PUBLISH_WINDOW", "must be at least 1"));
        }
        if self.db_timeout_ms == 0 {
            return Err(invalid("HOOKINBOX_DB_TIMEOUT_MS", "must be at least 1"));
        }
        Ok(())
    }

    /// A bounded Postgres pool of this process (see
    /// [`crate::db::pool_with_timeout`]).
    pub fn db_pool(&self) -> Result<deadpool_postgres::Pool, crate::db::DbError> {
        crate::db::pool_with_timeout(
            &self.database_url,
            self.db_pool_size,
            Duration::from_millis(self.db_timeout_ms),
        )
    }

    /// The state machine's knobs.
    pub fn policy(&self) -> Policy {
        Policy {
            lease: Duration::from_secs(self.lease_secs),
            max_attempts: self.max_attempts,
            publish_timeout: Duration::from_millis(self.publish_timeout_ms),
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

/// Settings of `hookinbox-ingest`.
#[derive(clap::Args, Clone)]
pub struct IngestArgs {
    /// Shared settings.
    #[command(flatten)]
    pub common: CommonArgs,

    /// Address the webhook listener binds.
    #[arg(
        long,
        env = "HOOKINBOX_LISTEN",
        value_name = "HOOKINBOX_LISTEN",
        default_value = "0.0.0.0:8080"
    )]
    pub listen: SocketAddr,

    /// Address of the metrics listener (`/metrics`, `/healthz`, `/readyz`).
    #[arg(
        long,
        env = "HOOKINBOX_METRICS_LISTEN",
        value_name = "HOOKINBOX_METRICS_LISTEN",
        default_value = "0.0.0.0:9898"
    )]
    pub metrics_listen: SocketAddr,

    /// The webhook secret of the `default` source.
    #[arg(
        long,
        env = "HOOKINBOX_GITHUB_SECRET",
        value_name = "HOOKINBOX_GITHUB_SECRET",
        hide_env_values = true
    )]
    pub github_secret: Option<String>,

    /// A TOML file defining several sources (see config.example.toml);
    /// replaces the single-source variables.
    #[arg(long, env = "HOOKINBOX_CONFIG", value_name = "HOOKINBOX_CONFIG")]
    pub config: Option<PathBuf>,

    /// A file with one secret per line (any one verifies; for rotation).
    #[arg(
        long,
        env = "HOOKINBOX_GITHUB_SECRET_FILE",
        value_name = "HOOKINBOX_GITHUB_SECRET_FILE"
    )]
    pub github_secret_file: Option<PathBuf>,

    /// Comma-separated events to take; empty means all. `ping` is always
    /// answered.
    #[arg(
        long,
        env = "HOOKINBOX_ALLOWED_EVENTS",
        value_name = "HOOKINBOX_ALLOWED_EVENTS",
        default_value = ""
    )]
    pub allowed_events: String,

    /// Largest body accepted, in bytes (GitHub caps payloads at 25 MiB).
    #[arg(long, env = "HOOKINBOX_MAX_BODY_BYTES",
        value_name = "HOOKINBOX_MAX_BODY_BYTES", default_value_t = 25 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Requests handled at once; past it ingest answers 429 at once
    /// instead of queueing.
    #[arg(
        long,
        env = "HOOKINBOX_MAX_IN_FLIGHT",
        value_name = "HOOKINBOX_MAX_IN_FLIGHT",
        default_value_t = 1024
    )]
    pub max_in_flight: usize,

    /// Claims per statement when requests arrive together (group commit);
    /// 1 claims each request on its own.
    #[arg(
        long,
        env = "HOOKINBOX_CLAIM_BATCH",
        value_name = "HOOKINBOX_CLAIM_BATCH",
        default_value_t = 64
    )]
    pub claim_batch: usize,

    /// Milliseconds allowed to receive a whole body.
    #[arg(
        long,
        env = "HOOKINBOX_BODY_TIMEOUT_MS",
        value_name = "HOOKINBOX_BODY_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub body_timeout_ms: u64,
}

/// Validated settings of `hookinbox-ingest`.
#[derive(Clone)]
pub struct IngestConfig {
    /// Shared settings.
    pub common: CommonArgs,
    /// Listener address.
    pub listen: SocketAddr,
    /// Metrics listener address.
    pub metrics_listen: SocketAddr,
    /// Configured sources by name.
    pub sources: Arc<BTreeMap<SourceName, Source>>,
    /// Body cap in bytes.
    pub max_body_bytes: usize,
    /// Time allowed for a whole body.
    pub body_timeout: Duration,
    /// Requests handled at once.
    pub max_in_flight: usize,
    /// Claims per statement (1: no batching).
    pub claim_batch: usize,
}

impl IngestArgs {
    /// Checks every setting and loads the sources and their secrets.
    pub fn validate(self) -> Result<IngestConfig, ConfigError> {
        self.common.validate()?;
        let sources = match &self.config {
            Some(path) => {
                if self.github_secret.is_some() || self.github_secret_file.is_some() {
                    return Err(invalid(
                        "HOOKINBOX_CONFIG",
                        "defines the sources' secrets; unset HOOKINBOX_GITHUB_SECRET(_FILE)",
                    ));
                }
                if !self.allowed_events.trim().is_empty() {
                    return Err(invalid(
                        "HOOKINBOX_CONFIG",
                        "defines each source's events; unset HOOKINBOX_ALLOWED_EVENTS",
                    ));
                }
                crate::sources::from_file(path)?
            }
            None => vec![Source {
                name: SourceName::default_source(),
                secrets: load_secrets(
                    self.github_secret.as_deref(),
                    self.github_secret_file.as_deref(),
                )?,
                hook_ids: None,
                events: EventFilter::parse(
                    "HOOKINBOX_ALLOWED_EVENTS",
                    self.allowed_events
                        .split(',')
                        .filter(|e| !e.trim().is_empty()),
                )?,
                // Ingest does not run handlers.
                handler: HandlerConfig::Store,
            }],
        };
        if self.max_body_bytes == 0 {
            return Err(invalid("HOOKINBOX_MAX_BODY_BYTES", "must be at least 1"));
        }
        if self.body_timeout_ms == 0 {
            return Err(invalid("HOOKINBOX_BODY_TIMEOUT_MS", "must be at least 1"));
        }
        if self.claim_batch == 0 {
            return Err(invalid("HOOKINBOX_CLAIM_BATCH", "must be at least 1"));
        }
        if self.max_in_flight == 0 {
            return Err(invalid("HOOKINBOX_MAX_IN_FLIGHT", "must be at least 1"));
        }
        Ok(IngestConfig {
            common: self.common,
            listen: self.listen,
            metrics_listen: self.metrics_listen,
            sources: Arc::new(sources.into_iter().map(|s| (s.name.clone(), s)).collect()),
            max_body_bytes: self.max_body_bytes,
            body_timeout: Duration::from_millis(self.body_timeout_ms),
            max_in_flight: self.max_in_flight,
            claim_batch: self.claim_batch,
        })
    }
}

/// Strips one trailing line ending (`\n` or `\r\n`), as editors and
/// `echo` add them to secret files and variables.
fn strip_line_ending(s: &str) -> &str {
    let s = s.strip_suffix('\n').unwrap_or(s);
    s.strip_suffix('\r').unwrap_or(s)
}

/// Loads the secrets from the variable or the file. An empty secret, or an
/// empty line in the file, is refused: an empty HMAC key lets anyone sign.
pub fn load_secrets(inline: Option<&str>, file: Option<&Path>) -> Result<Secrets, ConfigError> {
    match (inline, file) {
        (Some(_), Some(_)) => Err(invalid(
            "HOOKINBOX_GITHUB_SECRET",
            "set either HOOKINBOX_GITHUB_SECRET or HOOKINBOX_GITHUB_SECRET_FILE, not both",
        )),
        (None, None) => Err(invalid(
            "HOOKINBOX_GITHUB_SECRET",
            "required (or HOOKINBOX_GITHUB_SECRET_FILE)",
        )),
        (Some(value), None) => {
            let value = strip_line_ending(value);
            if value.is_empty() {
                return Err(invalid(
                    "HOOKINBOX_GITHUB_SECRET",
                    "is empty; an empty secret lets anyone sign",
                ));
            }
            Ok(Secrets::new(vec![Secret::new(value)]))
        }
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Unreadable {
                name: "HOOKINBOX_GITHUB_SECRET_FILE",
                path: path.to_owned(),
                source,
            })?;
            secrets_from_lines("HOOKINBOX_GITHUB_SECRET_FILE", &text)
        }
    }
}

/// Parses one secret per line; the file's final line ending is optional.
pub fn secrets_from_lines(name: &str, text: &str) -> Result<Secrets, ConfigError> {
    let body = strip_line_ending(text);
    if body.is_empty() {
        return Err(ConfigError::field(
            name,
            "holds no secret; an empty secret lets anyone sign",
        ));
    }
    let mut secrets = Vec::new();
    for (i, line) in body.split('\n').enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            return Err(ConfigError::field(
                name,
                format!("line {} is empty; an empty secret lets anyone sign", i + 1),
            ));
        }
        secrets.push(Secret::new(line));
    }
    Ok(Secrets::new(secrets))
}

/// Which built-in handler a worker runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HandlerKind {
    /// Write each event into `github_events`, in the completing statement.
    Store,
    /// POST each event to `HOOKINBOX_FORWARD_URL`.
    Forward,
}

/// Settings of `hookinbox-worker`.
#[derive(clap::Args, Clone)]
pub struct WorkerArgs {
    /// Shared settings.
    #[command(flatten)]
    pub common: CommonArgs,

    /// Jobs run at once; also the consumer prefetch.
    #[arg(
        long,
        env = "HOOKINBOX_CONCURRENCY",
        value_name = "HOOKINBOX_CONCURRENCY",
        default_value_t = 16
    )]
    pub concurrency: u16,

    /// Completions per statement (1: no batching). Each row stays fenced by
    /// its own token.
    #[arg(
        long,
        env = "HOOKINBOX_COMPLETE_BATCH",
        value_name = "HOOKINBOX_COMPLETE_BATCH",
        default_value_t = 64
    )]
    pub complete_batch: usize,

    /// Takes per statement (1: no batching).
    #[arg(
        long,
        env = "HOOKINBOX_TAKE_BATCH",
        value_name = "HOOKINBOX_TAKE_BATCH",
        default_value_t = 64
    )]
    pub take_batch: usize,

    /// Address of the metrics listener (`/metrics`, `/healthz`, `/readyz`).
    #[arg(
        long,
        env = "HOOKINBOX_METRICS_LISTEN",
        value_name = "HOOKINBOX_METRICS_LISTEN",
        default_value = "0.0.0.0:9899"
    )]
    pub metrics_listen: SocketAddr,

    /// Milliseconds a handler may run before it is cancelled.
    #[arg(
        long,
        env = "HOOKINBOX_HANDLER_TIMEOUT_MS",
        value_name = "HOOKINBOX_HANDLER_TIMEOUT_MS",
        default_value_t = 30_000
    )]
    pub handler_timeout_ms: u64,

    /// The built-in handler to run.
    #[arg(
        long,
        env = "HOOKINBOX_HANDLER",
        value_name = "HOOKINBOX_HANDLER",
        value_enum,
        default_value = "store"
    )]
    pub handler: HandlerKind,

    /// Where the `forward` handler POSTs.
    #[arg(
        long,
        env = "HOOKINBOX_FORWARD_URL",
        value_name = "HOOKINBOX_FORWARD_URL"
    )]
    pub forward_url: Option<String>,

    /// Signs forwarded requests (`X-Hookinbox-Signature-256`) when set.
    #[arg(
        long,
        env = "HOOKINBOX_FORWARD_SECRET",
        value_name = "HOOKINBOX_FORWARD_SECRET",
        hide_env_values = true
    )]
    pub forward_secret: Option<String>,

    /// Milliseconds a forwarded request may take.
    #[arg(
        long,
        env = "HOOKINBOX_FORWARD_TIMEOUT_MS",
        value_name = "HOOKINBOX_FORWARD_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub forward_timeout_ms: u64,

    /// A TOML file defining several sources and their handlers; replaces
    /// the single-source variables.
    #[arg(long, env = "HOOKINBOX_CONFIG", value_name = "HOOKINBOX_CONFIG")]
    pub config: Option<PathBuf>,

    /// Seconds in-flight jobs get to finish after SIGTERM.
    #[arg(
        long,
        env = "HOOKINBOX_SHUTDOWN_GRACE_SECS",
        value_name = "HOOKINBOX_SHUTDOWN_GRACE_SECS",
        default_value_t = 20
    )]
    pub shutdown_grace_secs: u64,

    /// First retry delay in milliseconds (doubles each attempt, plus jitter).
    #[arg(
        long,
        env = "HOOKINBOX_RETRY_BASE_MS",
        value_name = "HOOKINBOX_RETRY_BASE_MS",
        default_value_t = 1000
    )]
    pub retry_base_ms: u64,

    /// Longest retry delay in milliseconds; also caps a handler's Retry-After.
    #[arg(
        long,
        env = "HOOKINBOX_RETRY_MAX_MS",
        value_name = "HOOKINBOX_RETRY_MAX_MS",
        default_value_t = 600_000
    )]
    pub retry_max_ms: u64,

    /// How long completed deliveries are kept (e.g. `30d`). At least 7 days:
    /// GitHub redelivers for 3 days (7 on GHES).
    #[arg(
        long,
        env = "HOOKINBOX_RETENTION_COMPLETED",
        value_name = "HOOKINBOX_RETENTION_COMPLETED",
        default_value = "30d"
    )]
    pub retention_completed: String,

    /// How long failed deliveries (and dead letters) are kept.
    #[arg(
        long,
        env = "HOOKINBOX_RETENTION_FAILED",
        value_name = "HOOKINBOX_RETENTION_FAILED",
        default_value = "28d"
    )]
    pub retention_failed: String,

    /// Accept a completed retention under 7 days (redeliveries of older
    /// deliveries would then run again).
    #[arg(long, env = "HOOKINBOX_ALLOW_SHORT_RETENTION",
        value_name = "HOOKINBOX_ALLOW_SHORT_RETENTION", default_value = "false",
        value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub allow_short_retention: bool,

    /// Seconds past its lease after which a processing claim is reaped as `lost`.
    #[arg(
        long,
        env = "HOOKINBOX_REAP_AFTER_SECS",
        value_name = "HOOKINBOX_REAP_AFTER_SECS",
        default_value_t = 600
    )]
    pub reap_after_secs: u64,

    /// Milliseconds between retry-scheduler passes.
    #[arg(
        long,
        env = "HOOKINBOX_SCHEDULER_INTERVAL_MS",
        value_name = "HOOKINBOX_SCHEDULER_INTERVAL_MS",
        default_value_t = 500
    )]
    pub scheduler_interval_ms: u64,
}

/// Validated settings of the worker runtime.
#[derive(Clone)]
pub struct WorkerConfig {
    /// Shared settings.
    pub common: CommonArgs,
    /// Jobs at once, and the prefetch.
    pub concurrency: u16,
    /// Completions per statement.
    pub complete_batch: usize,
    /// Takes per statement.
    pub take_batch: usize,
    /// Metrics listener address (served while the worker runs).
    pub metrics_listen: SocketAddr,
    /// Handler time limit.
    pub handler_timeout: Duration,
    /// Drain time after SIGTERM.
    pub shutdown_grace: Duration,
    /// Backoff and attempts.
    pub retry: RetryPolicy,
    /// Completed rows older than this are swept.
    pub retention_completed: Duration,
    /// Failed rows older than this are swept.
    pub retention_failed: Duration,
    /// Processing rows this long past their lease are reaped.
    pub reap_after: Duration,
    /// Pause between scheduler passes.
    pub scheduler_interval: Duration,
    /// The handler of each configured source.
    pub handlers: Arc<BTreeMap<SourceName, HandlerConfig>>,
}

/// The shortest completed retention accepted without consent: GitHub lets
/// an operator redeliver for 3 days (7 on GitHub Enterprise Server), and a
/// redelivery of a swept delivery would run its effect again.
pub const MIN_COMPLETED_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

fn parse_duration(name: &'static str, value: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(value.trim()).map_err(|e| {
        invalid(
            name,
            format!("'{value}' is not a duration like 30d or 12h ({e})"),
        )
    })
}

impl WorkerArgs {
    /// Checks every setting.
    pub fn validate(self) -> Result<WorkerConfig, ConfigError> {
        self.common.validate()?;
        if self.concurrency == 0 {
            return Err(invalid("HOOKINBOX_CONCURRENCY", "must be at least 1"));
        }
        if self.complete_batch == 0 {
            return Err(invalid("HOOKINBOX_COMPLETE_BATCH", "must be at least 1"));
        }
        if self.take_batch == 0 {
            return Err(invalid("HOOKINBOX_TAKE_BATCH", "must be at least 1"));
        }
        if self.handler_timeout_ms == 0 {
            return Err(invalid(
                "HOOKINBOX_HANDLER_TIMEOUT_MS",
                "must be at least 1",
            ));
        }
        if self.retry_base_ms == 0 {
            return Err(invalid("HOOKINBOX_RETRY_BASE_MS", "must be at least 1"));
        }
        if self.retry_max_ms < self.retry_base_ms {
            return Err(invalid(
                "HOOKINBOX_RETRY_MAX_MS",
                "must be at least HOOKINBOX_RETRY_BASE_MS",
            ));
        }
        let retention_completed =
            parse_duration("HOOKINBOX_RETENTION_COMPLETED", &self.retention_completed)?;
        if retention_completed < MIN_COMPLETED_RETENTION && !self.allow_short_retention {
            return Err(invalid(
                "HOOKINBOX_RETENTION_COMPLETED",
                "is under 7 days: GitHub can redeliver for up to 7 days and a swept delivery \
                 would run again; set HOOKINBOX_ALLOW_SHORT_RETENTION=true to accept that",
            ));
        }
        let retention_failed =
            parse_duration("HOOKINBOX_RETENTION_FAILED", &self.retention_failed)?;
        if self.scheduler_interval_ms == 0 {
            return Err(invalid(
                "HOOKINBOX_SCHEDULER_INTERVAL_MS",
                "must be at least 1",
            ));
        }
        let handlers: BTreeMap<SourceName, HandlerConfig> = match &self.config {
            Some(path) => crate::sources::from_file(path)?
                .into_iter()
                .map(|s| (s.name, s.handler))
                .collect(),
            None => {
                let handler = match self.handler {
                    HandlerKind::Store => HandlerConfig::Store,
                    HandlerKind::Forward => {
                        let url = self.forward_url.as_deref().ok_or_else(|| {
                            invalid(
                                "HOOKINBOX_FORWARD_URL",
                                "is required with HOOKINBOX_HANDLER=forward",
                            )
                        })?;
                        if self.forward_timeout_ms == 0 {
                            return Err(invalid(
                                "HOOKINBOX_FORWARD_TIMEOUT_MS",
                                "must be at least 1",
                            ));
                        }
                        HandlerConfig::Forward(ForwardConfig {
                            url: parse_forward_url("HOOKINBOX_FORWARD_URL", url)?,
                            secret: self
                                .forward_secret
                                .as_deref()
                                .map(|s| inline_secret("HOOKINBOX_FORWARD_SECRET", s))
                                .transpose()?,
                            timeout: Duration::from_millis(self.forward_timeout_ms),
                        })
                    }
                };
                [(SourceName::default_source(), handler)]
                    .into_iter()
                    .collect()
            }
        };
        Ok(WorkerConfig {
            handlers: Arc::new(handlers),
            retry: RetryPolicy {
                base: Duration::from_millis(self.retry_base_ms),
                max: Duration::from_millis(self.retry_max_ms),
                max_attempts: self.common.max_attempts,
            },
            common: self.common,
            concurrency: self.concurrency,
            complete_batch: self.complete_batch,
            take_batch: self.take_batch,
            metrics_listen: self.metrics_listen,
            handler_timeout: Duration::from_millis(self.handler_timeout_ms),
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
            retention_completed,
            retention_failed,
            reap_after: Duration::from_secs(self.reap_after_secs),
            scheduler_interval: Duration::from_millis(self.scheduler_interval_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_line_endings_are_stripped_and_empty_secrets_refused() {
        assert_eq!(
            load_secrets(Some("abc\r\n"), None).map(|s| s.len()).ok(),
            Some(1)
        );
        for empty in ["", "\n", "\r\n"] {
            let err = load_secrets(Some(empty), None).err().map(|e| e.to_string());
            assert!(err.is_some_and(|e| e.starts_with("HOOKINBOX_GITHUB_SECRET:")));
        }
    }

    #[test]
    fn secret_file_takes_one_per_line_and_refuses_empty_lines() {
        let s = secrets_from_lines("F", "new\nold\n").map(|s| s.len());
        assert_eq!(s.ok(), Some(2));
        let s = secrets_from_lines("F", "new\r\nold").map(|s| s.len());
        assert_eq!(s.ok(), Some(2));
        let err = secrets_from_lines("F", "new\n\nold\n")
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("F: line 2 is empty; an empty secret lets anyone sign")
        );
        assert!(secrets_from_lines("F", "\n").is_err());
    }
}
