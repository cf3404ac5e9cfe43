//! `destinations [--json]`, `destinations pause SOURCE/NAME` and
//! `destinations resume SOURCE/NAME`: each destination's state, waiting
//! legs, last error and settings; an operator's pause and resume, audited
//! like `dlq replay` (`--as NAME`, by default the OS user). For an ordered
//! destination, `destinations halted SOURCE/NAME` lists its halted keys,
//! and `destinations skip|retry SOURCE/NAME KEY` acts on one, audited.

use std::io::Write;
use std::time::Duration;

use deadpool_postgres::Pool;
use hookinbox::config::WorkerConfig;
use hookinbox::postgres::DbError;

use super::args::ActorArgs;
use super::{Found, OpsError};
use crate::destinations::{
    self, Action, DestinationView, KeyAction, RetrySetting, Settings, Target,
};

/// `destinations …`
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DestinationsArgs {
    /// Pause or resume one (none: list them).
    #[command(subcommand)]
    pub command: Option<DestinationsCommand>,
    /// Print JSON (the console API's `GET /api/v1/destinations` items).
    #[arg(long)]
    pub json: bool,
}

/// `destinations pause|resume|list`
#[derive(clap::Subcommand, Debug)]
pub enum DestinationsCommand {
    /// List the destinations (as with no subcommand). Exits 1 when there
    /// is none.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Pause a destination: its legs wait (none attempted, no probe)
    /// until it is resumed. Audited. Exits 1 when it was paused already.
    #[command(after_help = "Example:\n  hookinbox-worker destinations pause default/ci --as alice")]
    Pause {
        /// The destination: SOURCE/NAME.
        #[arg(value_name = "SOURCE/NAME", value_parser = parse_target)]
        target: Target,
        /// Who pauses.
        #[command(flatten)]
        actor: ActorArgs,
    },
    /// Resume a destination: back to closed from any state (paused, open,
    /// half_open, or disabled after a 410 or a long outage), and its
    /// waiting legs go again. Audited. Exits 1 when it was closed already.
    #[command(
        after_help = "Example:\n  hookinbox-worker destinations resume default/ci --as alice"
    )]
    Resume {
        /// The destination: SOURCE/NAME.
        #[arg(value_name = "SOURCE/NAME", value_parser = parse_target)]
        target: Target,
        /// Who resumes.
        #[command(flatten)]
        actor: ActorArgs,
    },
    /// List an ordered destination's halted keys: each with the leg that
    /// failed for good ahead of the others (its delivery, event, error)
    /// and how many legs wait behind it. Exits 1 when none is halted.
    #[command(after_help = "Example:\n  hookinbox-worker destinations halted default/ci --json")]
    Halted {
        /// The destination: SOURCE/NAME.
        #[arg(value_name = "SOURCE/NAME", value_parser = parse_target)]
        target: Target,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Skip the leg that halts a key: it stays failed (a dead letter, still
    /// replayable), and the key resumes with its next leg. Audited.
    #[command(
        after_help = "Example:\n  hookinbox-worker destinations skip default/ci 1296269 --as alice"
    )]
    Skip {
        /// The destination: SOURCE/NAME.
        #[arg(value_name = "SOURCE/NAME", value_parser = parse_target)]
        target: Target,
        /// The key, as `halted` lists it: a repository's id, or `ID#NUMBER`.
        key: String,
        /// Who skips.
        #[command(flatten)]
        actor: ActorArgs,
    },
    /// Retry the leg that halts a key, in its place and with fresh
    /// attempts: the scheduler publishes it, and the key's later legs wait
    /// for it as before. Audited.
    #[command(
        after_help = "Example:\n  hookinbox-worker destinations retry default/ci 1296269#7 --as alice"
    )]
    Retry {
        /// The destination: SOURCE/NAME.
        #[arg(value_name = "SOURCE/NAME", value_parser = parse_target)]
        target: Target,
        /// The key, as `halted` lists it.
        key: String,
        /// Who retries.
        #[command(flatten)]
        actor: ActorArgs,
    },
}

/// `SOURCE/NAME`, each name checked.
pub fn parse_target(s: &str) -> Result<Target, String> {
    Target::parse(s).map_err(|e| e.to_string())
}

impl From<destinations::DestinationError> for OpsError {
    fn from(e: destinations::DestinationError) -> Self {
        match e {
            destinations::DestinationError::Db(e) => e.into(),
            other => Self::Usage(other.to_string()),
        }
    }
}

/// Runs one `destinations` command.
pub(super) async fn run(
    args: DestinationsArgs,
    pool: &Pool,
    config: &WorkerConfig,
    out: &mut impl Write,
) -> Result<Found, OpsError> {
    let (action, target, actor) = match args.command {
        None => return list(pool, config, args.json, out).await,
        Some(DestinationsCommand::List { json }) => {
            return list(pool, config, json || args.json, out).await;
        }
        Some(DestinationsCommand::Pause { target, actor }) => (Action::Pause, target, actor),
        Some(DestinationsCommand::Resume { target, actor }) => (Action::Resume, target, actor),
        Some(DestinationsCommand::Halted { target, json }) => {
            return halted(pool, config, &target, json || args.json, out).await;
        }
        Some(DestinationsCommand::Skip { target, key, actor }) => {
            return act(pool, config, &target, &key, &actor, KeyAction::Skip, out).await;
        }
        Some(DestinationsCommand::Retry { target, key, actor }) => {
            return act(pool, config, &target, &key, &actor, KeyAction::Retry, out).await;
        }
    };
    let who = actor.identity()?;
    let changed = destinations::change(pool, &config.routes, &who, &target, action).await?;
    match (action, changed.changed()) {
        (Action::Pause, true) => writeln!(
            out,
            "paused {target} (was {}): its legs wait until it is resumed",
            changed.from.as_str()
        )?,
        (Action::Resume, true) => writeln!(
            out,
            "resumed {target} (was {}): closed, its waiting legs go again",
            changed.from.as_str()
        )?,
        (_, false) => writeln!(out, "{target} is {} already", changed.to.as_str())?,
    }
    Ok(if changed.changed() {
        Found::Some
    } else {
        Found::Nothing
    })
}

/// `destinations halted SOURCE/NAME [--json]`.
async fn halted(
    pool: &Pool,
    config: &WorkerConfig,
    target: &Target,
    json: bool,
    out: &mut impl Write,
) -> Result<Found, OpsError> {
    let keys = destinations::halted(pool, &config.routes, target).await?;
    if json {
        let items: Vec<_> = keys.iter().map(destinations::halted_json).collect();
        writeln!(out, "{}", serde_json::Value::Array(items))?;
        return Ok(Found::from_count(keys.len()));
    }
    if keys.is_empty() {
        writeln!(out, "no key of {target} is halted")?;
        return Ok(Found::Nothing);
    }
    writeln!(
        out,
        "{:<24} {:<38} {:<28} {:>7} {:<10} ERROR",
        "KEY", "HALTED BY", "EVENT", "WAITING", "FOR"
    )?;
    for k in &keys {
        let event = match &k.action {
            Some(action) => format!("{}.{action}", k.event),
            None => k.event.clone(),
        };
        writeln!(
            out,
            "{:<24} {:<38} {:<28} {:>7} {:<10} {}: {}",
            k.key,
            k.halted_by.delivery_id.as_str(),
            event,
            k.waiting,
            k.failed_at
                .map_or("-".to_owned(), |t| short_secs(seconds_since(t))),
            k.error_class.as_deref().unwrap_or("-"),
            k.error.as_deref().unwrap_or(""),
        )?;
    }
    if keys.len() as i64 >= destinations::HALTED_LIMIT {
        writeln!(out, "(the first {} only)", destinations::HALTED_LIMIT)?;
    }
    Ok(Found::Some)
}

/// `destinations skip|retry SOURCE/NAME KEY`.
async fn act(
    pool: &Pool,
    config: &WorkerConfig,
    target: &Target,
    key: &str,
    actor: &ActorArgs,
    action: KeyAction,
    out: &mut impl Write,
) -> Result<Found, OpsError> {
    let who = actor.identity()?;
    let leg = destinations::act(pool, &config.routes, &who, target, key, action).await?;
    match action {
        KeyAction::Skip => writeln!(
            out,
            "skipped delivery {} of {target} key {key}: it stays failed, and the key resumes \
             with its next leg",
            leg.delivery_id.as_str()
        )?,
        KeyAction::Retry => writeln!(
            out,
            "retrying delivery {} of {target} key {key} in its place: the key's later legs wait \
             for it",
            leg.delivery_id.as_str()
        )?,
    }
    Ok(Found::Some)
}

async fn list(
    pool: &Pool,
    config: &WorkerConfig,
    json: bool,
    out: &mut impl Write,
) -> Result<Found, OpsError> {
    let client = pool.get().await.map_err(DbError::from)?;
    let all = destinations::list(&client, &config.routes).await?;
    if json {
        let items: Vec<_> = all.iter().map(DestinationView::json).collect();
        writeln!(out, "{}", serde_json::Value::Array(items))?;
        return Ok(Found::from_count(all.len()));
    }
    writeln!(
        out,
        "{:<32} {:<9} {:<10} {:>7} {:<10} {:<10} {:<12} LAST ERROR",
        "SOURCE/NAME", "KIND", "STATE", "WAITING", "OLDEST", "SINCE", "CHANGED BY"
    )?;
    for d in &all {
        writeln!(
            out,
            "{:<32} {:<9} {:<10} {:>7} {:<10} {:<10} {:<12} {}",
            d.target(),
            d.kind,
            d.state,
            d.waiting,
            d.oldest_waiting_secs.map_or("-".to_owned(), short_secs),
            d.state_since
                .map_or("-".to_owned(), |t| short_secs(seconds_since(t))),
            d.changed_by.as_deref().unwrap_or("-"),
            d.last_error.as_deref().unwrap_or(""),
        )?;
    }
    if !all.is_empty() {
        writeln!(out)?;
    }
    for d in &all {
        match &d.settings {
            Some(s) => writeln!(out, "{}: {}", d.target(), settings_line(s))?,
            None => writeln!(
                out,
                "{}: {} (registered by a worker; not in this configuration)",
                d.target(),
                d.kind
            )?,
        }
    }
    Ok(Found::from_count(all.len()))
}

fn seconds_since(t: chrono::DateTime<chrono::Utc>) -> f64 {
    (chrono::Utc::now() - t).num_milliseconds().max(0) as f64 / 1000.0
}

/// An age, to its two largest units (`2h 5m`).
fn short_secs(secs: f64) -> String {
    humantime::format_duration(Duration::from_secs(secs.max(0.0) as u64))
        .to_string()
        .split(' ')
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

fn duration(secs: u64) -> String {
    humantime::format_duration(Duration::from_secs(secs)).to_string()
}

/// A destination's settings on one line: never a secret or a header's
/// value.
fn settings_line(s: &Settings) -> String {
    let mut parts = vec![s.kind.clone()];
    if let Some(url) = &s.url {
        parts.push(url.clone());
    }
    let list = |v: &[String]| {
        if v.is_empty() {
            "all".to_owned()
        } else {
            v.join(", ")
        }
    };
    parts.push(format!("events {}", list(&s.events)));
    parts.push(format!("repositories {}", list(&s.repositories)));
    if let Some(ms) = s.timeout_ms {
        parts.push(format!(
            "timeout {}",
            humantime::format_duration(Duration::from_millis(ms))
        ));
    }
    parts.push(format!("concurrency {}", s.concurrency));
    parts.push(match s.rate_limit {
        Some(r) => format!("rate {}/s (burst {})", r.per_second, r.burst),
        None => "rate unlimited".to_owned(),
    });
    parts.push(match &s.retry {
        RetrySetting::Schedule {
            delays,
            max_attempts,
        } => format!("retry {} ({max_attempts} attempts)", delays.join(", ")),
        RetrySetting::Exponential {
            base_ms,
            max_ms,
            max_attempts,
        } => format!(
            "retry exponential from {} to {} ({max_attempts} attempts)",
            humantime::format_duration(Duration::from_millis(*base_ms)),
            humantime::format_duration(Duration::from_millis(*max_ms))
        ),
    });
    parts.push(match s.breaker {
        Some(b) => format!(
            "breaker at {}% of at least {} in {}, probe every {}, disabled after {} open",
            (b.failure_ratio * 100.0).round(),
            b.min_requests,
            duration(b.window_secs),
            duration(b.probe_secs),
            duration(s.disable_after_secs)
        ),
        None => "breaker off".to_owned(),
    });
    if let (Some(signature), Some(secret)) = (s.signature, s.secret) {
        parts.push(format!("signature {signature}, secret {secret}"));
    }
    if !s.headers.is_empty() {
        let names: Vec<String> = s
            .headers
            .iter()
            .map(|h| {
                if h.secret {
                    format!("{} (set, from a file)", h.name)
                } else {
                    format!("{} (set)", h.name)
                }
            })
            .collect();
        parts.push(format!("headers {}", names.join(", ")));
    }
    parts.join("  ")
}
