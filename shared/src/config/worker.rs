//! Settings of `hookinbox-worker`.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::builder::BoolishValueParser;

use super::forward::signature_of;
use super::{
    CommonArgs, CommonConfig, ConfigError, DEFAULT_FORWARD_SCHEDULE, DEFAULT_FORWARD_TIMEOUT,
    Destination, DestinationKind, EventFilter, ForwardConfig, GithubSettings, IdValue, Reconcile,
    SecretNeed, SourcesArgs, at_least_one, inline_secret, invalid, parse_duration,
    parse_forward_url,
};
use crate::deliveries::Retention;
use crate::egress::AllowNetworks;
use crate::key::{DestinationName, SourceName};
use crate::retry::{Retries, RetryPolicy, Schedule};

/// Which built-in handler the single-source variables' destination is
/// (`HOOKINBOX_HANDLER`); the destination is named after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HandlerKind {
    /// Write each event into `github_events`, in the completing statement.
    Store,
    /// POST each event to `HOOKINBOX_FORWARD_URL`.
    Forward,
}

impl HandlerKind {
    /// The name of the destination it describes.
    pub fn destination_name(self) -> DestinationName {
        let name = match self {
            Self::Store => "store",
            Self::Forward => "forward",
        };
        DestinationName::parse(name).unwrap_or_default()
    }
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

    /// A job whose handler writes only to Postgres (`store`) is taken and
    /// completed by one statement when its message comes for the first
    /// time (false: every job is taken first, then completed).
    #[arg(
        long,
        env = "HOOKINBOX_FUSED_TAKE",
        value_name = "HOOKINBOX_FUSED_TAKE",
        default_value_t = true,
        value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub fused_take: bool,

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

    /// Where the `forward` handler POSTs.
    #[arg(
        long,
        env = "HOOKINBOX_FORWARD_URL",
        value_name = "HOOKINBOX_FORWARD_URL"
    )]
    pub forward_url: Option<String>,

    /// Signs forwarded requests (`X-Hookinbox-Signature-256`, or as
    /// HOOKINBOX_FORWARD_SIGNATURE says) when set.
    #[arg(
        long,
        env = "HOOKINBOX_FORWARD_SECRET",
        value_name = "HOOKINBOX_FORWARD_SECRET",
        hide_env_values = true
    )]
    pub forward_secret: Option<String>,

    /// How forwarded requests are signed with HOOKINBOX_FORWARD_SECRET, as
    /// a destination's `signature`: `github` (`X-Hub-Signature-256` and
    /// GitHub's User-Agent, for an unmodified octokit or Probot app),
    /// `hookinbox` (`X-Hookinbox-Signature-256`) or `none`. Default:
    /// `hookinbox` with a secret, `none` without.
    #[arg(
        long,
        env = "HOOKINBOX_FORWARD_SIGNATURE",
        value_name = "HOOKINBOX_FORWARD_SIGNATURE"
    )]
    pub forward_signature: Option<String>,

    /// Milliseconds a forwarded request may take.
    #[arg(
        long,
        env = "HOOKINBOX_FORWARD_TIMEOUT_MS",
        value_name = "HOOKINBOX_FORWARD_TIMEOUT_MS",
        value_parser = at_least_one::<u64>,
        default_value_t = DEFAULT_FORWARD_TIMEOUT.as_millis() as u64
    )]
    pub forward_timeout_ms: u64,

    /// Networks every `forward` destination may reach in spite of the
    /// egress policy (loopback, private, link-local, … are refused by
    /// default): comma-separated CIDRs, e.g. `127.0.0.0/8` for local
    /// development. A destination's `allow_networks` adds its own.
    #[arg(
        long,
        env = "HOOKINBOX_FORWARD_ALLOW_NETWORKS",
        value_name = "HOOKINBOX_FORWARD_ALLOW_NETWORKS"
    )]
    pub forward_allow_networks: Option<String>,

    /// A hosts file (`ADDRESS NAME…` lines) that `forward` consults before
    /// DNS, re-read at every resolution; its answers pass the same egress
    /// policy. For tests and air-gapped setups.
    #[arg(
        long,
        env = "HOOKINBOX_FORWARD_HOSTS_FILE",
        value_name = "HOOKINBOX_FORWARD_HOSTS_FILE"
    )]
    pub forward_hosts_file: Option<PathBuf>,

    /// The webhook sources (the same group as ingest's).
    #[command(flatten)]
    pub sources: SourcesArgs,

    /// Seconds in-flight jobs get to finish after SIGTERM.
    #[arg(
        long,
        env = "HOOKINBOX_SHUTDOWN_GRACE_SECS",
        value_name = "HOOKINBOX_SHUTDOWN_GRACE_SECS",
        default_value_t = 20
    )]
    pub shutdown_grace_secs: u64,

    /// First retry delay in milliseconds (doubles each attempt, plus
    /// jitter; default 1000).
    #[arg(
        long,
        env = "HOOKINBOX_RETRY_BASE_MS",
        value_name = "HOOKINBOX_RETRY_BASE_MS",
        value_parser = at_least_one::<u64>
    )]
    pub retry_base_ms: Option<u64>,

    /// Longest retry delay in milliseconds; also caps a handler's
    /// Retry-After (default 600000).
    #[arg(
        long,
        env = "HOOKINBOX_RETRY_MAX_MS",
        value_name = "HOOKINBOX_RETRY_MAX_MS"
    )]
    pub retry_max_ms: Option<u64>,

    /// The default source's GitHub hook, for the reconciler:
    /// `repo:OWNER/REPO/HOOK_ID`, `org:ORG/HOOK_ID` or `app`. Unset: no
    /// reconciling.
    #[arg(
        long,
        env = "HOOKINBOX_RECONCILE_HOOK",
        value_name = "HOOKINBOX_RECONCILE_HOOK"
    )]
    pub reconcile_hook: Option<String>,

    /// GitHub's API base URL (default `https://api.github.com`; GitHub
    /// Enterprise Server: `https://HOST/api/v3`).
    #[arg(
        long,
        env = "HOOKINBOX_GITHUB_API_URL",
        value_name = "HOOKINBOX_GITHUB_API_URL"
    )]
    pub github_api_url: Option<String>,

    /// A hosts file (`ADDRESS NAME…` lines) the reconciler's client of
    /// GitHub's API consults before DNS, re-read at every resolution; for
    /// every source, beside HOOKINBOX_CONFIG too. For tests (a GHE.com
    /// API name served locally) and air-gapped setups.
    #[arg(
        long,
        env = "HOOKINBOX_GITHUB_API_HOSTS_FILE",
        value_name = "HOOKINBOX_GITHUB_API_HOSTS_FILE"
    )]
    pub github_api_hosts_file: Option<PathBuf>,

    /// A file holding the token that reads the hook's deliveries.
    #[arg(
        long,
        env = "HOOKINBOX_GITHUB_TOKEN_FILE",
        value_name = "HOOKINBOX_GITHUB_TOKEN_FILE"
    )]
    pub github_token_file: Option<PathBuf>,

    /// A GitHub App's id, instead of a token.
    #[arg(
        long,
        env = "HOOKINBOX_GITHUB_APP_ID",
        value_name = "HOOKINBOX_GITHUB_APP_ID"
    )]
    pub github_app_id: Option<String>,

    /// The App's private key (a PEM file).
    #[arg(
        long,
        env = "HOOKINBOX_GITHUB_APP_KEY_FILE",
        value_name = "HOOKINBOX_GITHUB_APP_KEY_FILE"
    )]
    pub github_app_key_file: Option<PathBuf>,

    /// The App's installation that reads a repository or organization hook.
    #[arg(
        long,
        env = "HOOKINBOX_GITHUB_INSTALLATION_ID",
        value_name = "HOOKINBOX_GITHUB_INSTALLATION_ID"
    )]
    pub github_installation_id: Option<String>,

    /// Seconds between reconciler passes (default 300).
    #[arg(
        long,
        env = "HOOKINBOX_RECONCILE_INTERVAL_SECS",
        value_name = "HOOKINBOX_RECONCILE_INTERVAL_SECS"
    )]
    pub reconcile_interval_secs: Option<u64>,

    /// Redeliveries asked for one delivery across all passes (default 3).
    #[arg(
        long,
        env = "HOOKINBOX_RECONCILE_MAX_REDELIVERIES",
        value_name = "HOOKINBOX_RECONCILE_MAX_REDELIVERIES"
    )]
    pub reconcile_max_redeliveries: Option<u32>,

    /// Seconds a delivery must be old before it is judged (default 300: it
    /// may still be in flight).
    #[arg(
        long,
        env = "HOOKINBOX_RECONCILE_MIN_AGE_SECS",
        value_name = "HOOKINBOX_RECONCILE_MIN_AGE_SECS"
    )]
    pub reconcile_min_age_secs: Option<u64>,

    /// Seconds between reconciler passes that walk GitHub's whole log,
    /// successes too (default 3600); the passes between ask for failed
    /// deliveries only. 0: every pass walks the whole log.
    #[arg(
        long,
        env = "HOOKINBOX_RECONCILE_FULL_EVERY_SECS",
        value_name = "HOOKINBOX_RECONCILE_FULL_EVERY_SECS"
    )]
    pub reconcile_full_every_secs: Option<u64>,

    /// Redeliveries asked per second at most (default 1).
    #[arg(
        long,
        env = "HOOKINBOX_RECONCILE_PER_SECOND",
        value_name = "HOOKINBOX_RECONCILE_PER_SECOND"
    )]
    pub reconcile_per_second: Option<f64>,

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

    /// How long each delivery's body (as received, with its headers) is
    /// kept after its first claim, for replays and the operators' views
    /// (e.g. `7d`). The bodies of deliveries with a leg not yet ended
    /// (processing, retrying, waiting, or a dead letter) are kept whatever
    /// their age. Bodies go a whole day at a time: up to a day longer.
    #[arg(
        long,
        env = "HOOKINBOX_RETENTION_BODIES",
        value_name = "HOOKINBOX_RETENTION_BODIES",
        default_value = "7d"
    )]
    pub retention_bodies: String,

    /// Accept a completed retention under 7 days (redeliveries of older
    /// deliveries would then run again).
    #[arg(long, env = "HOOKINBOX_ALLOW_SHORT_RETENTION",
        value_name = "HOOKINBOX_ALLOW_SHORT_RETENTION", default_value = "false",
        value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub allow_short_retention: bool,

    /// Days the `store` handler's events (`github_events`, full payloads)
    /// are kept; 0 keeps them. Default: 30, or the completed retention if
    /// that is longer. Never shorter than the completed retention.
    #[arg(
        long,
        env = "HOOKINBOX_EVENTS_RETENTION_DAYS",
        value_name = "HOOKINBOX_EVENTS_RETENTION_DAYS"
    )]
    pub events_retention_days: Option<u64>,

    /// Seconds past its lease after which a processing claim is reaped as `lost`.
    #[arg(
        long,
        env = "HOOKINBOX_REAP_AFTER_SECS",
        value_name = "HOOKINBOX_REAP_AFTER_SECS",
        default_value_t = 600
    )]
    pub reap_after_secs: u64,

    /// Only these destinations' queues are consumed by this worker: a comma
    /// list of SOURCE/NAME (default: every configured destination), so that
    /// a destination can have workers of its own, scaled on its queue.
    #[arg(
        long,
        env = "HOOKINBOX_DESTINATIONS",
        value_name = "HOOKINBOX_DESTINATIONS",
        default_value = ""
    )]
    pub destinations: String,

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
    /// Whether database-only jobs are taken by their completion.
    pub fused_take: bool,
    /// Metrics listener address (served while the worker runs).
    pub metrics_listen: SocketAddr,
    /// Handler time limit.
    pub handler_timeout: Duration,
    /// Drain time after SIGTERM.
    pub shutdown_grace: Duration,
    /// Backoff and attempts of the exponential policy (`store`, and
    /// destinations of other kinds without a schedule).
    pub retry: RetryPolicy,
    /// How long completed and failed rows, the replay guard's bodies and
    /// stored events are kept.
    pub retention: Retention,
    /// Processing rows this long past their lease are reaped.
    pub reap_after: Duration,
    /// Pause between scheduler passes.
    pub scheduler_interval: Duration,
    /// Every configured destination, source by source, in the order
    /// configured (a source's first runs the legs claimed before
    /// destinations existed).
    pub routes: Arc<Vec<Route>>,
    /// The destinations whose queues this worker consumes
    /// (`HOOKINBOX_DESTINATIONS`); `None`: all of them.
    pub consumes: Option<Arc<Consumed>>,
    /// The sources that name a GitHub hook to reconcile.
    pub reconcile: Arc<Vec<ReconcileTarget>>,
    /// A hosts file the reconciler's client of GitHub's API consults
    /// before DNS (`HOOKINBOX_GITHUB_API_HOSTS_FILE`).
    pub github_api_hosts_file: Option<PathBuf>,
    /// The sources ingest rate-limits that name no hook to reconcile: a
    /// `429` ingest answers them is final from GitHub's side (GitHub does
    /// not retry a failed delivery), so the worker warns of each at start.
    pub rate_limited_unreconciled: Arc<Vec<SourceName>>,
}

/// A destination as a worker runs it: its source, its settings, and what
/// its defaults resolve to.
#[derive(Clone, Debug)]
pub struct Route {
    /// The source whose deliveries it takes.
    pub source: SourceName,
    /// As configured.
    pub destination: Destination,
    /// Handlers at once per worker, and its queue's prefetch.
    pub concurrency: u16,
    /// How its legs are retried.
    pub retries: Retries,
}

impl WorkerConfig {
    /// The route of a leg: its source's destination of that name, or, for
    /// a leg claimed before destinations existed (the empty name), its
    /// source's first destination.
    pub fn route(&self, source: &SourceName, destination: &DestinationName) -> Option<&Route> {
        let mut of_source = self.routes.iter().filter(|r| &r.source == source);
        if destination.is_legacy() {
            return of_source.next();
        }
        of_source.find(|r| &r.destination.name == destination)
    }
}

/// A source the reconciler reads GitHub's delivery log for.
#[derive(Clone, Debug)]
pub struct ReconcileTarget {
    /// The source.
    pub source: SourceName,
    /// The events it takes: the reconciler leaves the others alone.
    pub events: EventFilter,
    /// The hook, the credentials and the pace.
    pub settings: Reconcile,
}

/// Destinations by source and name.
pub type Consumed = BTreeSet<(SourceName, DestinationName)>;

/// `HOOKINBOX_DESTINATIONS`: each `SOURCE/NAME` must be a configured
/// destination; empty means all.
fn consumed(list: &str, routes: &[Route]) -> Result<Option<Arc<Consumed>>, ConfigError> {
    let mut chosen = BTreeSet::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let known = entry.split_once('/').and_then(|(s, d)| {
            routes
                .iter()
                .find(|r| r.source.as_str() == s && r.destination.name.as_str() == d)
        });
        let Some(route) = known else {
            return Err(invalid(
                "HOOKINBOX_DESTINATIONS",
                format!("'{entry}' is not SOURCE/NAME of a configured destination"),
            ));
        };
        chosen.insert((route.source.clone(), route.destination.name.clone()));
    }
    Ok((!chosen.is_empty()).then(|| Arc::new(chosen)))
}

/// `HOOKINBOX_RETRY_BASE_MS` when unset.
const DEFAULT_RETRY_BASE_MS: u64 = 1000;
/// `HOOKINBOX_RETRY_MAX_MS` when unset.
const DEFAULT_RETRY_MAX_MS: u64 = 600_000;

/// The events' retention when none is set, unless the completed
/// retention is longer.
const DEFAULT_EVENTS_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// `HOOKINBOX_EVENTS_RETENTION_DAYS` checked against the completed
/// retention, the window in which a redelivery is answered as a duplicate:
/// an event swept inside it would be gone while its delivery still says it
/// was stored. `None` keeps events.
fn events_retention(
    days: Option<u64>,
    completed: Duration,
) -> Result<Option<Duration>, ConfigError> {
    let kept = match days {
        None => return Ok(Some(DEFAULT_EVENTS_RETENTION.max(completed))),
        Some(0) => return Ok(None),
        Some(days) => days
            .checked_mul(24 * 3600)
            .map(Duration::from_secs)
            .ok_or_else(|| invalid("HOOKINBOX_EVENTS_RETENTION_DAYS", "is too large"))?,
    };
    if kept < completed {
        return Err(invalid(
            "HOOKINBOX_EVENTS_RETENTION_DAYS",
            format!(
                "is shorter than HOOKINBOX_RETENTION_COMPLETED ({} days): events would be \
                 swept while their deliveries are still answered as duplicates; set at least \
                 that, or 0 to keep events",
                completed.as_secs().div_ceil(24 * 3600)
            ),
        ));
    }
    Ok(Some(kept))
}

/// The shortest completed retention accepted without consent: GitHub lets
/// an operator redeliver for 3 days (7 on GitHub Enterprise Server), and a
/// redelivery of a swept delivery would run its effect again.
pub const MIN_COMPLETED_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

impl WorkerArgs {
    /// The default source's GitHub settings, from the variables.
    fn github_settings(&self) -> GithubSettings {
        GithubSettings {
            reconcile_hook: self.reconcile_hook.clone(),
            github_api_url: self.github_api_url.clone(),
            github_token_file: self.github_token_file.clone(),
            github_app_id: self.github_app_id.clone().map(IdValue::Text),
            github_app_key_file: self.github_app_key_file.clone(),
            github_installation_id: self.github_installation_id.clone().map(IdValue::Text),
            reconcile_interval_secs: self.reconcile_interval_secs,
            reconcile_max_redeliveries: self.reconcile_max_redeliveries,
            reconcile_min_age_secs: self.reconcile_min_age_secs,
            reconcile_per_second: self.reconcile_per_second,
            reconcile_full_every_secs: self.reconcile_full_every_secs,
        }
    }

    /// The `default` source's handler, from the variables.
    fn default_handler(&self) -> Result<DestinationKind, ConfigError> {
        Ok(match self.sources.handler {
            HandlerKind::Store => DestinationKind::Store,
            HandlerKind::Forward => {
                let url = self.forward_url.as_deref().ok_or_else(|| {
                    invalid(
                        "HOOKINBOX_FORWARD_URL",
                        "is required with HOOKINBOX_HANDLER=forward",
                    )
                })?;
                let mut forward = ForwardConfig::new(
                    parse_forward_url("HOOKINBOX_FORWARD_URL", url)?,
                    self.forward_secret
                        .as_deref()
                        .map(|s| inline_secret("HOOKINBOX_FORWARD_SECRET", s))
                        .transpose()?,
                    Duration::from_millis(self.forward_timeout_ms),
                );
                if let Some(signature) = &self.forward_signature {
                    forward.signature = signature_of(
                        "HOOKINBOX_FORWARD_SIGNATURE",
                        signature.trim(),
                        forward.secret.is_some(),
                        "HOOKINBOX_FORWARD_SECRET",
                    )?;
                }
                DestinationKind::Forward(forward)
            }
        })
    }

    /// Checks every setting.
    pub fn validate(self) -> Result<WorkerConfig, ConfigError> {
        let github = self.github_settings();
        let from_file = self.sources.config.is_some();
        let default_handler = (!from_file).then(|| self.default_handler()).transpose()?;
        let common = self.common.validate()?;
        let retry_base_ms = self.retry_base_ms.unwrap_or(DEFAULT_RETRY_BASE_MS);
        let retry_max_ms = self.retry_max_ms.unwrap_or(DEFAULT_RETRY_MAX_MS);
        if retry_max_ms < retry_base_ms {
            return Err(invalid(
                "HOOKINBOX_RETRY_MAX_MS",
                "must be at least HOOKINBOX_RETRY_BASE_MS",
            ));
        }
        let retry = RetryPolicy {
            base: Duration::from_millis(retry_base_ms),
            max: Duration::from_millis(retry_max_ms),
            max_attempts: common.max_attempts,
        };
        // A forward destination of the single-source variables keeps the
        // exponential policy its operator tuned; untouched, it gets the
        // schedule meant to outlast an outage.
        let exponential_forward = !from_file
            && (self.retry_base_ms.is_some()
                || self.retry_max_ms.is_some()
                || common.max_attempts_set);
        let idle_in_transaction = common.db_idle_in_transaction;
        if !idle_in_transaction.is_zero()
            && idle_in_transaction <= Duration::from_millis(self.handler_timeout_ms)
        {
            return Err(invalid(
                "HOOKINBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS",
                "must be longer than HOOKINBOX_HANDLER_TIMEOUT_MS: a handler may keep its \
                 transaction open that long (or 0 to leave Postgres's setting)",
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
        let retention = Retention {
            completed: retention_completed,
            failed: retention_failed,
            events: events_retention(self.events_retention_days, retention_completed)?,
            bodies: parse_duration("HOOKINBOX_RETENTION_BODIES", &self.retention_bodies)?,
        };
        if from_file && !github.is_empty() {
            return Err(invalid(
                "HOOKINBOX_CONFIG",
                "defines each source's GitHub hook in its [sources.github] table; unset \
                 HOOKINBOX_RECONCILE_HOOK and the other HOOKINBOX_GITHUB_* settings",
            ));
        }
        let mut sources = Vec::new();
        let mut reconcile = Vec::new();
        let mut rate_limited_unreconciled = Vec::new();
        for (i, source) in self
            .sources
            .load(SecretNeed::Optional)?
            .into_iter()
            .enumerate()
        {
            // A file's source names its hook in its own table; the
            // `default` source, in the variables.
            let settings = if from_file {
                let name = |key: &str| format!("sources[{i}].github.{key}");
                source
                    .github
                    .as_ref()
                    .map(|g| g.load(&name))
                    .transpose()?
                    .flatten()
            } else {
                github.load(&|key: &str| format!("HOOKINBOX_{}", key.to_uppercase()))?
            };
            match settings {
                Some(settings) => reconcile.push(ReconcileTarget {
                    source: source.name.clone(),
                    events: source.events.clone(),
                    settings,
                }),
                None if source.rate_limit.is_some() => {
                    rate_limited_unreconciled.push(source.name.clone());
                }
                None => {}
            }
            // The single-source variables' destination: named after its
            // kind by the sources' settings, built here with its settings.
            let destinations = match &default_handler {
                Some(kind) => vec![Destination::of_kind(kind.clone())],
                None => source.destinations,
            };
            sources.push((source.name, destinations));
        }
        let allow_networks: AllowNetworks = self
            .forward_allow_networks
            .as_deref()
            .unwrap_or("")
            .parse()
            .map_err(|e| invalid("HOOKINBOX_FORWARD_ALLOW_NETWORKS", e))?;
        let hosts_file = self.forward_hosts_file.clone();
        let routes = sources
            .into_iter()
            .flat_map(|(source, destinations)| {
                destinations.into_iter().map(move |d| (source.clone(), d))
            })
            .map(|(source, mut destination)| {
                // The worker's egress settings apply to every forward
                // destination, beside its own allowed networks.
                if let DestinationKind::Forward(forward) = &mut destination.kind {
                    forward.allow_networks = forward.allow_networks.union(&allow_networks);
                    forward.hosts_file = hosts_file.clone();
                }
                let retries = match (&destination.retry, &destination.kind) {
                    (Some(schedule), _) => Retries::Schedule(schedule.clone()),
                    (None, DestinationKind::Forward(_)) if !exponential_forward => {
                        Retries::Schedule(Schedule::of(DEFAULT_FORWARD_SCHEDULE))
                    }
                    (None, _) => Retries::Exponential(retry),
                };
                Route {
                    concurrency: destination
                        .concurrency
                        .map_or(self.concurrency, |c| c.get()),
                    retries,
                    source,
                    destination,
                }
            })
            .collect::<Vec<Route>>();
        let consumes = consumed(&self.destinations, &routes)?;
        Ok(WorkerConfig {
            consumes,
            routes: Arc::new(routes),
            reconcile: Arc::new(reconcile),
            github_api_hosts_file: self.github_api_hosts_file.clone(),
            rate_limited_unreconciled: Arc::new(rate_limited_unreconciled),
            retry,
            common,
            concurrency: self.concurrency,
            complete_batch: self.complete_batch,
            take_batch: self.take_batch,
            fused_take: self.fused_take,
            metrics_listen: self.metrics_listen,
            handler_timeout: Duration::from_millis(self.handler_timeout_ms),
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
            retention,
            reap_after: Duration::from_secs(self.reap_after_secs),
            scheduler_interval: Duration::from_millis(self.scheduler_interval_ms),
        })
    }
}
