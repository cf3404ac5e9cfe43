//! Settings of `hookinbox-worker`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::builder::BoolishValueParser;

use super::{
    CommonArgs, CommonConfig, ConfigError, DEFAULT_FORWARD_TIMEOUT, ForwardConfig, HandlerConfig,
    at_least_one, from_file, inline_secret, invalid, parse_duration, parse_forward_url,
};
use crate::key::SourceName;
use crate::retry::RetryPolicy;

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
        value_parser = at_least_one::<u16>,
        default_value_t = 16
    )]
    pub concurrency: u16,

    /// Completions per statement (1: no batching). Each row stays fenced by
    /// its own token.
    #[arg(
        long,
        env = "HOOKINBOX_COMPLETE_BATCH",
        value_name = "HOOKINBOX_COMPLETE_BATCH",
        value_parser = at_least_one::<usize>,
        default_value_t = 64
    )]
    pub complete_batch: usize,

    /// Takes per statement (1: no batching).
    #[arg(
        long,
        env = "HOOKINBOX_TAKE_BATCH",
        value_name = "HOOKINBOX_TAKE_BATCH",
        value_parser = at_least_one::<usize>,
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
        value_parser = at_least_one::<u64>,
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
        value_parser = at_least_one::<u64>,
        default_value_t = DEFAULT_FORWARD_TIMEOUT.as_millis() as u64
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
        value_parser = at_least_one::<u64>,
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
        value_parser = at_least_one::<u64>,
        default_value_t = 500
    )]
    pub scheduler_interval_ms: u64,
}

/// Validated settings of the worker runtime.
#[derive(Clone)]
pub struct WorkerConfig {
    /// Shared settings.
    pub common: CommonConfig,
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

impl WorkerArgs {
    /// Checks every setting.
    pub fn validate(self) -> Result<WorkerConfig, ConfigError> {
        let common = self.common.validate()?;
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
        let handlers: BTreeMap<SourceName, HandlerConfig> = match &self.config {
            Some(path) => from_file(path)?
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
                max_attempts: common.max_attempts,
            },
            common,
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
