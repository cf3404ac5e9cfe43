//! Settings of `hookinbox-ingest`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::{CommonArgs, CommonConfig, ConfigError, SecretNeed, Source, SourcesArgs, at_least_one};
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

    /// The webhook sources.
    #[command(flatten)]
    pub sources: SourcesArgs,

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
        let sources = self.sources.load(SecretNeed::Required)?;
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
