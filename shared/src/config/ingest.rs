//! Settings of `hookinbox-ingest`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::builder::BoolishValueParser;

use super::{
    CommonArgs, CommonConfig, ConfigError, Destination, DestinationKind, EventFilter, HandlerKind,
    RateLimit, Source, at_least_one, from_file, invalid, load_secrets,
};
use crate::key::SourceName;

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

    /// The kind of the `default` source's one destination, which names its
    /// legs: set it as the workers' HOOKINBOX_HANDLER is set.
    #[arg(
        long,
        env = "HOOKINBOX_HANDLER",
        value_name = "HOOKINBOX_HANDLER",
        value_enum,
        default_value = "store"
    )]
    pub handler: HandlerKind,

    /// Largest body accepted, in bytes (GitHub caps payloads at 25 MiB).
    #[arg(long, env = "HOOKINBOX_MAX_BODY_BYTES",
        value_name = "HOOKINBOX_MAX_BODY_BYTES", value_parser = at_least_one::<usize>,
        default_value_t = 25 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Requests handled at once; past it ingest answers 429 at once
    /// instead of queueing.
    #[arg(
        long,
        env = "HOOKINBOX_MAX_IN_FLIGHT",
        value_name = "HOOKINBOX_MAX_IN_FLIGHT",
        value_parser = at_least_one::<usize>,
        default_value_t = 1024
    )]
    pub max_in_flight: usize,

    /// Claims per statement when requests arrive together (group commit);
    /// 1 claims each request on its own.
    #[arg(
        long,
        env = "HOOKINBOX_CLAIM_BATCH",
        value_name = "HOOKINBOX_CLAIM_BATCH",
        value_parser = at_least_one::<usize>,
        default_value_t = 64
    )]
    pub claim_batch: usize,

    /// Milliseconds allowed to receive a whole body.
    #[arg(
        long,
        env = "HOOKINBOX_BODY_TIMEOUT_MS",
        value_name = "HOOKINBOX_BODY_TIMEOUT_MS",
        value_parser = at_least_one::<u64>,
        default_value_t = 10_000
    )]
    pub body_timeout_ms: u64,

    /// Refuse a body the `default` source received before under another
    /// delivery id or hook id (a replayed capture). Default true; turn it
    /// off only for a sender that legitimately repeats bodies.
    #[arg(long, env = "HOOKINBOX_REPLAY_GUARD", value_name = "HOOKINBOX_REPLAY_GUARD",
          value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub replay_guard: Option<bool>,

    /// Signed deliveries per second the `default` source admits; past it,
    /// 429 with Retry-After. Unset: no limit.
    #[arg(
        long,
        env = "HOOKINBOX_RATE_LIMIT_PER_SECOND",
        value_name = "HOOKINBOX_RATE_LIMIT_PER_SECOND"
    )]
    pub rate_limit_per_second: Option<u32>,

    /// Deliveries the `default` source admits at once after a quiet
    /// spell. Default: the per-second rate.
    #[arg(
        long,
        env = "HOOKINBOX_RATE_LIMIT_BURST",
        value_name = "HOOKINBOX_RATE_LIMIT_BURST"
    )]
    pub rate_limit_burst: Option<u32>,
}

/// Validated settings of `hookinbox-ingest`.
#[derive(Clone)]
pub struct IngestConfig {
    /// Shared settings.
    pub common: CommonConfig,
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
        let common = self.common.validate()?;
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
                if self.replay_guard.is_some()
                    || self.rate_limit_per_second.is_some()
                    || self.rate_limit_burst.is_some()
                {
                    return Err(invalid(
                        "HOOKINBOX_CONFIG",
                        "defines each source's replay_guard and rate_limit; unset \
                         HOOKINBOX_REPLAY_GUARD and HOOKINBOX_RATE_LIMIT_*",
                    ));
                }
                from_file(path)?
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
                // Ingest names the legs and runs no handler: the
                // destination's name is all it needs (the forward settings
                // are the workers').
                destinations: vec![Destination::of_kind(DestinationKind::Custom(
                    self.handler.destination_name().as_str().to_owned(),
                ))],
                github: None,
                replay_guard: self.replay_guard.unwrap_or(true),
                rate_limit: RateLimit::from_settings(
                    (
                        "HOOKINBOX_RATE_LIMIT_PER_SECOND",
                        self.rate_limit_per_second,
                    ),
                    ("HOOKINBOX_RATE_LIMIT_BURST", self.rate_limit_burst),
                )?,
            }],
        };
        Ok(IngestConfig {
            common,
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
