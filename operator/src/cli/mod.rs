//! The operator's commands: list, show, replay and purge deliveries and
//! dead letters; list, pause and resume destinations. `hookinbox-worker` exposes them as subcommands (with
//! `sweep`, which is the worker's own maintenance). They read Postgres (the record) and keep the dead-letter
//! queue's copies in step with it.
//!
//! Exit codes: 0 done, 1 nothing matched (or, for `dlq replay`, nothing
//! could be replayed: the output says why), 2 usage or connection error
//! (and a replay that could not be published).

use std::io::Write;
use std::time::Duration;

use hookinbox::config::WorkerConfig;
use hookinbox::deliveries::{self, Filter, State};
use hookinbox::postgres::DbError;
use serde_json::json;

use crate::OperatorError;
use crate::jobs::Kind;

mod args;
mod deliveries_cmd;
mod destinations_cmd;
mod job;
mod jobs_cmd;
mod print;
mod replay;

pub use args::{
    ActorArgs, FilterArgs, ListArgs, MAX_AGE, MAX_AGE_TEXT, MatchArgs, StatusFilter, parse_action,
    parse_age, parse_delivery_id, parse_hook_id, parse_rate, parse_repository,
};
pub use destinations_cmd::{DestinationsArgs, DestinationsCommand, parse_target};
pub use jobs_cmd::JobsCommand;
use print::print_rows;

/// Why an operator command failed (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// Postgres or RabbitMQ failed.
    #[error(transparent)]
    Operator(#[from] OperatorError),
    /// Writing the output failed.
    #[error("output: {0}")]
    Io(#[from] std::io::Error),
    /// Bad arguments.
    #[error("{0}")]
    Usage(String),
    /// Replays could not be published; those deliveries stay dead letters.
    #[error("{failed} replay(s) could not be published; they stay dead letters")]
    Publish {
        /// How many.
        failed: usize,
    },
}

impl From<DbError> for OpsError {
    fn from(e: DbError) -> Self {
        Self::Operator(e.into())
    }
}

/// Whether a command found anything to act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// Something matched (exit 0).
    Some,
    /// Nothing matched (exit 1).
    Nothing,
}

impl Found {
    /// `Some` unless `n` is 0.
    pub fn from_count(n: usize) -> Self {
        if n == 0 { Self::Nothing } else { Self::Some }
    }

    /// The process exit code.
    pub fn exit_code(self) -> u8 {
        match self {
            Self::Some => 0,
            Self::Nothing => 1,
        }
    }
}

/// Operator subcommands of `hookinbox-worker`.
#[derive(clap::Subcommand, Debug)]
pub enum OpsCommand {
    /// Inspect deliveries.
    #[command(subcommand)]
    Deliveries(DeliveriesCommand),
    /// Inspect, replay and purge dead letters (state dead: failed, not
    /// retryable).
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// List and cancel bulk replays and purges: the console's and the
    /// CLI's, one kind of job.
    #[command(subcommand)]
    Jobs(JobsCommand),
    /// List destinations (state, waiting legs, last error, settings); pause
    /// or resume one. Exits 1 when there is none (or, for pause and
    /// resume, when it was in that state already).
    #[command(
        after_help = "Examples:\n  hookinbox-worker destinations\n  hookinbox-worker destinations --json\n  hookinbox-worker destinations pause default/ci --as alice\n  hookinbox-worker destinations resume default/ci --as alice"
    )]
    Destinations(DestinationsArgs),
}

/// `deliveries …`
#[derive(clap::Subcommand, Debug)]
pub enum DeliveriesCommand {
    /// List deliveries, most recently active first. Exits 1 when none
    /// matches.
    #[command(
        after_help = "Examples:\n  hookinbox-worker deliveries list --status failed --since 2h\n  hookinbox-worker deliveries list --event push --limit 20 --json\n  hookinbox-worker deliveries list --repository octo-org/octo-repo --action opened\n  hookinbox-worker deliveries list --status awaiting_redelivery"
    )]
    List(ListArgs),
    /// Show every delivery with this X-GitHub-Delivery id: each leg, then
    /// the request headers and the raw body kept of it (until
    /// HOOKINBOX_RETENTION_BODIES). Exits 1 when none has it.
    #[command(
        after_help = "Example:\n  hookinbox-worker deliveries show 72d3162e-cc78-11e3-81ab-4c9367dc0958"
    )]
    Show {
        /// The X-GitHub-Delivery id.
        #[arg(value_parser = parse_delivery_id)]
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Replay a delivery, a completed one too, from the body Postgres keeps
    /// of it: each of its legs that is completed or failed (or the one
    /// --destination names) goes back to processing under a new token,
    /// attempts back to 0, replays + 1, and is published again. A forward
    /// destination receives it with the same Idempotency-Key and
    /// X-Hookinbox-Replay: N. Runs as a job in the foreground (audited,
    /// shown by the console and `jobs list`); each leg left alone is named
    /// with why. Exits 0 when a leg was (or, with --dry-run, would be)
    /// replayed, 1 when none was, 2 on a usage error or when a replay could
    /// not be published.
    #[command(
        after_help = "Examples:\n  hookinbox-worker deliveries replay 72d3162e-cc78-11e3-81ab-4c9367dc0958 --dry-run\n  hookinbox-worker deliveries replay 72d3162e-cc78-11e3-81ab-4c9367dc0958 --destination ci --as alice"
    )]
    Replay {
        /// The X-GitHub-Delivery id.
        #[arg(value_parser = parse_delivery_id)]
        id: String,
        /// The source it came to (needed when several have this id).
        #[arg(long)]
        source: Option<String>,
        /// The hook it came through (needed when several hooks of a source
        /// that pins them have this id).
        #[arg(long, value_parser = parse_hook_id)]
        hook_id: Option<String>,
        /// Only its leg to this destination.
        #[arg(long)]
        destination: Option<String>,
        /// Show what would be replayed; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Who replays.
        #[command(flatten)]
        actor: ActorArgs,
    },
}

/// `dlq …`
#[derive(clap::Subcommand, Debug)]
pub enum DlqCommand {
    /// List dead letters. Exits 1 when none matches.
    #[command(
        after_help = "Examples:\n  hookinbox-worker dlq list\n  hookinbox-worker dlq list --error-class permanent --since 1d --json\n  hookinbox-worker dlq list --repository octo-org/octo-repo --event issues --action opened"
    )]
    List(ListArgs),
    /// Replay dead letters from their bodies kept in Postgres: attempts back to 0,
    /// replays + 1. Atomic and idempotent: replaying one twice starts one job.
    /// Runs as a bulk job in the foreground (audited, shown by the console
    /// and `jobs list`); Ctrl-C cancels it.
    /// A delivery hookinbox holds no body of (awaiting redelivery) is not
    /// replayed: the output names it and says what brings it back. Exits 0
    /// when something was (or, with --dry-run, would be) replayed, 1 when
    /// nothing was, 2 on a usage error or when a replay could not be
    /// published.
    #[command(
        after_help = "Examples:\n  hookinbox-worker dlq replay 72d3162e-cc78-11e3-81ab-4c9367dc0958\n  hookinbox-worker dlq replay --error-class transient --since 1d --dry-run\n  hookinbox-worker dlq replay --repository octo-org/octo-repo --action opened --dry-run\n  hookinbox-worker dlq replay --all --rate 20"
    )]
    Replay {
        /// Delivery ids to replay.
        #[arg(value_parser = parse_delivery_id)]
        ids: Vec<String>,
        /// Replay every dead letter.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
        /// Filters (instead of ids or --all).
        #[command(flatten)]
        filter: FilterArgs,
        /// Show what would be replayed; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// At most this many replays per second (0.001 to 10000).
        #[arg(long, value_parser = parse_rate)]
        rate: Option<f64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Who replays.
        #[command(flatten)]
        actor: ActorArgs,
    },
    /// Delete dead letters older than a duration (their bodies go with
    /// HOOKINBOX_RETENTION_BODIES); the filters narrow them. Runs as a bulk job in the foreground
    /// (audited); Ctrl-C cancels it. Exits 1 when none matches.
    #[command(
        after_help = "Examples:\n  hookinbox-worker dlq purge --older-than 14d\n  hookinbox-worker dlq purge --older-than 2d --repository octo-org/octo-repo --error-class permanent --dry-run"
    )]
    Purge {
        /// Age, e.g. 14d (at most 3650d).
        #[arg(long, value_parser = parse_age)]
        older_than: Duration,
        /// Filters.
        #[command(flatten)]
        matching: MatchArgs,
        /// Show what would be purged; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Who purges.
        #[command(flatten)]
        actor: ActorArgs,
    },
}

/// `deliveries list` and (`dead`) `dlq list`.
async fn list_rows(
    pool: &deadpool_postgres::Pool,
    list: &ListArgs,
    dead: bool,
    out: &mut impl Write,
) -> Result<Found, OpsError> {
    let client = pool.get().await.map_err(DbError::from)?;
    let filter = list.filter.filter(dead, None);
    let rows = deliveries::list(&client, &filter).await?;
    print_rows(out, &rows, list.json)?;
    if filter.states == [State::AwaitingRedelivery] && !list.json && !rows.is_empty() {
        writeln!(
            out,
            "{} claim(s) with no body and no job here: awaiting redelivery from GitHub \
             (the reconciler asks for it: hookinbox-worker reconcile)",
            rows.len()
        )?;
    }
    Ok(Found::from_count(rows.len()))
}

/// Runs one operator command, writing its report to `out`.
pub async fn run(
    command: OpsCommand,
    config: &WorkerConfig,
    out: &mut impl Write,
) -> Result<Found, OpsError> {
    // The command's reads, a job's item, its publish's undo and the
    // dead-letter queue's reconciliation at once.
    let pool = config.common.pool_of(4)?;
    match command {
        OpsCommand::Deliveries(DeliveriesCommand::List(list)) => {
            list_rows(&pool, &list, false, out).await
        }
        OpsCommand::Deliveries(DeliveriesCommand::Show { id, json }) => {
            deliveries_cmd::show(&pool, &id, json, out).await
        }
        OpsCommand::Deliveries(DeliveriesCommand::Replay {
            id,
            source,
            hook_id,
            destination,
            dry_run,
            json,
            actor,
        }) => {
            let who = actor.identity()?;
            let replay = deliveries_cmd::Replay {
                id: &id,
                source: source.as_deref(),
                hook_id: hook_id.as_deref(),
                destination: destination.as_deref(),
                dry_run,
                json,
                who: &who,
            };
            deliveries_cmd::replay(&pool, config, replay, out).await
        }
        OpsCommand::Dlq(DlqCommand::List(list)) => list_rows(&pool, &list, true, out).await,
        OpsCommand::Dlq(DlqCommand::Replay {
            ids,
            all,
            filter,
            dry_run,
            rate,
            json,
            actor,
        }) => {
            if ids.is_empty() && !all && !filter.is_set() {
                return Err(OpsError::Usage(
                    "name delivery ids, or pass --all or a filter".to_owned(),
                ));
            }
            let who = actor.identity()?;
            let named = (!ids.is_empty()).then_some(ids);
            let mut targets = filter.filter(true, named.clone());
            if all || named.is_some() {
                targets.limit = i64::MAX;
            }
            let no_body = replay::no_body_filter(&filter, named.clone(), targets.limit);
            let target = match &named {
                Some(ids) => json!({"ids": ids}),
                None => json!({"filter": filter.given(true, all)}),
            };
            let options = replay::Options {
                who: &who,
                target: &target,
                dry_run,
                rate,
                json,
            };
            let filters = replay::Filters {
                targets: &targets,
                no_body: &no_body,
            };
            replay::replay(&pool, config, filters, named.as_deref(), options, out).await
        }
        OpsCommand::Dlq(DlqCommand::Purge {
            older_than,
            matching,
            dry_run,
            json,
            actor,
        }) => {
            let client = pool.get().await.map_err(DbError::from)?;
            let filter = matching.narrow(Filter {
                states: vec![State::Dead],
                failed_before: Some(older_than),
                limit: i64::MAX,
                ..Filter::default()
            });
            let purged = if dry_run {
                deliveries::count(&client, &filter).await? as u64
            } else {
                let who = actor.identity()?;
                let mut given = matching.given();
                given.insert("status".to_owned(), "dead".to_owned());
                given.insert(
                    "older_than".to_owned(),
                    humantime::format_duration(older_than).to_string(),
                );
                let target = json!({ "filter": given });
                // As fast as it goes: a purge publishes nothing.
                let per_second = *args::RATE_RANGE.end();
                let ran = job::run(
                    &pool,
                    config,
                    &who,
                    Kind::Purge,
                    &filter,
                    &target,
                    per_second,
                )
                .await?;
                ran.map_or(0, |r| r.job.purged as u64)
            };
            if json {
                writeln!(out, "{}", json!({"purged": purged, "dry_run": dry_run}))?;
            } else {
                writeln!(
                    out,
                    "{} {purged} dead letter(s)",
                    if dry_run { "would purge" } else { "purged" }
                )?;
            }
            Ok(Found::from_count(purged as usize))
        }
        OpsCommand::Jobs(command) => jobs_cmd::run(command, &pool, out).await,
        OpsCommand::Destinations(args) => destinations_cmd::run(args, &pool, config, out).await,
    }
}
