//! Settings of `hookinbox-ingest`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::{CommonArgs, CommonConfig, ConfigError, SecretNeed, Source, SourcesArgs, at_least_one};
use crate::client::{HookRanges, TrustedProxies};
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

    /// Bytes of request bodies held in memory at once, across all
    /// requests (verified or not); past three quarters a new request is
    /// refused with 503 and `Retry-After`. At least what the largest body
    /// takes (`HOOKINBOX_MAX_BODY_BYTES` and about 2 %).
    #[arg(
        long,
        env = "HOOKINBOX_MAX_BUFFERED_BYTES",
        value_name = "HOOKINBOX_MAX_BUFFERED_BYTES",
        value_parser = at_least_one::<usize>,
        default_value_t = 64 * 1024 * 1024
    )]
    pub max_buffered_bytes: usize,

    /// Bodies being received and not yet verified, at once; past it a
    /// request is refused with 503. Separate from
    /// `HOOKINBOX_MAX_IN_FLIGHT`, which counts verified requests only, so
    /// connections that trickle bytes never take a signed delivery's slot.
    #[arg(
        long,
        env = "HOOKINBOX_MAX_RECEIVING",
        value_name = "HOOKINBOX_MAX_RECEIVING",
        value_parser = at_least_one::<usize>,
        default_value_t = 8192
    )]
    pub max_receiving: usize,

    /// Unverified bodies one client may send at once (the peer, or the
    /// client a trusted proxy names); past it 429. Its share of
    /// `HOOKINBOX_MAX_BUFFERED_BYTES` is a quarter.
    #[arg(
        long,
        env = "HOOKINBOX_MAX_UNVERIFIED_PER_CLIENT",
        value_name = "HOOKINBOX_MAX_UNVERIFIED_PER_CLIENT",
        value_parser = at_least_one::<usize>,
        default_value_t = 64
    )]
    pub max_unverified_per_client: usize,

    /// Slowest body accepted, in bytes per second, over every window of
    /// two seconds once the body has started; it also stretches the body's
    /// deadline: `HOOKINBOX_BODY_TIMEOUT_MS` plus the declared length at
    /// this rate.
    #[arg(
        long,
        env = "HOOKINBOX_MIN_BODY_BYTES_PER_SEC",
        value_name = "HOOKINBOX_MIN_BODY_BYTES_PER_SEC",
        value_parser = at_least_one::<u64>,
        default_value_t = 16 * 1024
    )]
    pub min_body_bytes_per_sec: u64,

    /// Proxies whose `X-Forwarded-For` names the client (for the
    /// per-client share of unverified bodies): a comma list of addresses
    /// and CIDRs. Empty: none; the client is the peer.
    #[arg(
        long,
        env = "HOOKINBOX_TRUSTED_PROXIES",
        value_name = "HOOKINBOX_TRUSTED_PROXIES",
        default_value = ""
    )]
    pub trusted_proxies: String,

    /// GitHub's `/meta` answer (JSON): requests from addresses outside its
    /// `hooks` ranges are refused 403 before their body is read (behind a
    /// proxy, the client that `HOOKINBOX_TRUSTED_PROXIES` names). Read at
    /// start. Unset: no allow-list.
    #[arg(
        long,
        env = "HOOKINBOX_GITHUB_META_FILE",
        value_name = "HOOKINBOX_GITHUB_META_FILE"
    )]
    pub github_meta_file: Option<std::path::PathBuf>,
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
    /// Bytes of bodies held at once.
    pub max_buffered_bytes: usize,
    /// Unverified bodies at once.
    pub max_receiving: usize,
    /// Unverified bodies per client at once.
    pub max_unverified_per_client: usize,
    /// Slowest body accepted, bytes per second.
    pub min_body_bytes_per_sec: u64,
    /// Proxies believed about the client.
    pub trusted_proxies: TrustedProxies,
    /// GitHub's webhook ranges, the only clients admitted; `None`: all.
    pub github_hooks: Option<HookRanges>,
}

impl IngestConfig {
    /// The most a body of `max_body_bytes` takes from the budget while it
    /// is received: its bytes, the handles of its parts (at most one per
    /// 4 KiB) and one 16 KiB buffer for its small chunks.
    pub fn held_body_bytes(max_body_bytes: usize) -> usize {
        max_body_bytes
            .saturating_add(max_body_bytes / 64)
            .saturating_add(17 * 1024)
    }
}

impl IngestArgs {
    /// Checks every setting and loads the sources and their secrets.
    pub fn validate(self) -> Result<IngestConfig, ConfigError> {
        let common = self.common.validate()?;
        let sources = self.sources.load(SecretNeed::Required)?;
        let one_body = IngestConfig::held_body_bytes(self.max_body_bytes);
        if self.max_buffered_bytes < one_body {
            return Err(ConfigError::field(
                "HOOKINBOX_MAX_BUFFERED_BYTES",
                format!(
                    "is {} bytes, less than one body of HOOKINBOX_MAX_BODY_BYTES ({}) takes while \
                     it is received ({one_body}): such a body could never be received",
                    self.max_buffered_bytes, self.max_body_bytes
                ),
            ));
        }
        let trusted_proxies = self
            .trusted_proxies
            .parse()
            .map_err(|problem| ConfigError::field("HOOKINBOX_TRUSTED_PROXIES", problem))?;
        let github_hooks = self
            .github_meta_file
            .as_ref()
            .map(|path| {
                let field = |problem: String| {
                    ConfigError::field(
                        "HOOKINBOX_GITHUB_META_FILE",
                        format!("{}: {problem}", path.display()),
                    )
                };
                let bytes = std::fs::read(path).map_err(|e| field(e.to_string()))?;
                HookRanges::from_meta(&bytes).map_err(field)
            })
            .transpose()?;
        Ok(IngestConfig {
            common,
            listen: self.listen,
            metrics_listen: self.metrics_listen,
            sources: Arc::new(sources.into_iter().map(|s| (s.name.clone(), s)).collect()),
            max_body_bytes: self.max_body_bytes,
            body_timeout: Duration::from_millis(self.body_timeout_ms),
            max_in_flight: self.max_in_flight,
            claim_batch: self.claim_batch,
            max_buffered_bytes: self.max_buffered_bytes,
            max_receiving: self.max_receiving,
            max_unverified_per_client: self.max_unverified_per_client,
            min_body_bytes_per_sec: self.min_body_bytes_per_sec,
            trusted_proxies,
            github_hooks,
        })
    }
}
