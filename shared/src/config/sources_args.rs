//! The webhook sources' settings, one argument group both binaries
//! flatten, so that each reads them, and refuses them, the same way: a
//! TOML file of sources (`HOOKINBOX_CONFIG`), or the variables of the one
//! source named `default`. The worker's own settings of that source (its
//! handler, its GitHub hook) are in [`super::WorkerArgs`].

use std::path::PathBuf;

use clap::builder::BoolishValueParser;

use super::{
    ConfigError, Destination, DestinationKind, EventFilter, HandlerKind, RateLimit, Source,
    from_file, invalid, load_secrets,
};
use crate::key::SourceName;
use crate::signature::Secrets;

/// Settings of the webhook sources, the same in both binaries.
#[derive(clap::Args, Clone, Debug)]
pub struct SourcesArgs {
    /// A TOML file defining several sources (see config.example.toml);
    /// replaces the single-source variables, which are then refused.
    #[arg(long, env = "HOOKINBOX_CONFIG", value_name = "HOOKINBOX_CONFIG")]
    pub config: Option<PathBuf>,

    /// The webhook secret of the `default` source (ingest requires it, or
    /// the file).
    #[arg(
        long,
        env = "HOOKINBOX_GITHUB_SECRET",
        value_name = "HOOKINBOX_GITHUB_SECRET",
        hide_env_values = true
    )]
    pub github_secret: Option<String>,

    /// A file with one secret per line (any one verifies; for rotation).
    #[arg(
        long,
        env = "HOOKINBOX_GITHUB_SECRET_FILE",
        value_name = "HOOKINBOX_GITHUB_SECRET_FILE"
    )]
    pub github_secret_file: Option<PathBuf>,

    /// Comma-separated events the `default` source takes (`push`,
    /// `pull_request.opened`); empty means all. Ingest answers the others
    /// `200 ignored` and `ping` always; the reconciler leaves the others
    /// alone.
    #[arg(
        long,
        env = "HOOKINBOX_ALLOWED_EVENTS",
        value_name = "HOOKINBOX_ALLOWED_EVENTS",
        default_value = ""
    )]
    pub allowed_events: String,

    /// Refuse a body the `default` source received before under another
    /// delivery id (a replayed capture); the same delivery id and body
    /// under another hook id is a copy of the event, answered as a
    /// duplicate without a claim. Default true; turn it off only for a
    /// sender that legitimately repeats bodies.
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

    /// The kind of the `default` source's one destination, which names its
    /// legs (`store` or `forward`): give ingest and the workers the same.
    /// Beside HOOKINBOX_CONFIG it is ignored.
    #[arg(
        long,
        env = "HOOKINBOX_HANDLER",
        value_name = "HOOKINBOX_HANDLER",
        value_enum,
        default_value = "store"
    )]
    pub handler: HandlerKind,

    /// Deliveries the `default` source admits at once after a quiet
    /// spell. Default: the per-second rate.
    #[arg(
        long,
        env = "HOOKINBOX_RATE_LIMIT_BURST",
        value_name = "HOOKINBOX_RATE_LIMIT_BURST"
    )]
    pub rate_limit_burst: Option<u32>,
}

/// Whether a binary needs the `default` source's secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretNeed {
    /// Ingest verifies signatures with it: without one it refuses to start.
    Required,
    /// The worker verifies nothing: a secret given is checked all the same
    /// (an empty one is refused), and none leaves the source without any.
    Optional,
}

impl SourcesArgs {
    /// The sources: those of `HOOKINBOX_CONFIG`, beside which every
    /// variable of the `default` source is refused, naming it (it would be
    /// ignored); or the `default` source alone, from the variables, with
    /// its one destination named after `HOOKINBOX_HANDLER` and no GitHub
    /// hook (the worker sets its own).
    pub fn load(&self, secret: SecretNeed) -> Result<Vec<Source>, ConfigError> {
        match &self.config {
            Some(path) => {
                self.refuse_beside_the_file()?;
                from_file(path)
            }
            None => Ok(vec![self.default_source(secret)?]),
        }
    }

    fn refuse_beside_the_file(&self) -> Result<(), ConfigError> {
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
        Ok(())
    }

    fn default_source(&self, secret: SecretNeed) -> Result<Source, ConfigError> {
        let (inline, file) = (
            self.github_secret.as_deref(),
            self.github_secret_file.as_deref(),
        );
        let secrets = match secret {
            SecretNeed::Optional if inline.is_none() && file.is_none() => Secrets::new(Vec::new()),
            _ => load_secrets(inline, file)?,
        };
        Ok(Source {
            name: SourceName::default_source(),
            secrets,
            hook_ids: None,
            events: EventFilter::parse(
                "HOOKINBOX_ALLOWED_EVENTS",
                self.allowed_events
                    .split(',')
                    .filter(|e| !e.trim().is_empty()),
            )?,
            // Named after HOOKINBOX_HANDLER: ingest names the legs with it;
            // the worker builds the destination with its own settings.
            // `store` has none, so ingest knows it whole (and sends its
            // legs a copy of the body: `Destination::reads_body_apart`).
            destinations: vec![Destination::of_kind(match self.handler {
                HandlerKind::Store => DestinationKind::Store,
                other => DestinationKind::Custom(other.destination_name().as_str().to_owned()),
            })],
            github: None,
            replay_guard: self.replay_guard.unwrap_or(true),
            rate_limit: RateLimit::from_settings(
                (
                    "HOOKINBOX_RATE_LIMIT_PER_SECOND",
                    self.rate_limit_per_second,
                ),
                ("HOOKINBOX_RATE_LIMIT_BURST", self.rate_limit_burst),
            )?,
        })
    }
}
