//! The operator's commands: list, show, replay and purge deliveries and
//! dead letters, and sweep. `hookinbox-worker` exposes them as
//! subcommands. They read Postgres (the record) and keep the dead-letter
//! queue's copies in step with it.
//!
//! Exit codes: 0 done, 1 nothing matched, 2 usage or connection error.

use std::io::Write;
use std::time::Duration;

use hookinbox::broker::BrokerError;
use hookinbox::config::{WorkerConfig, parse_duration_text};
use hookinbox::deliveries::{self, ErrorClass, Filter, Order, Status};
use hookinbox::postgres::DbError;
use serde_json::json;

use crate::context::RuntimeError;
use crate::maintenance;

mod print;
mod replay;

use print::{print_fields, print_rows};
pub use replay::reconcile_dead_letter_queue;

/// Why an operator command failed (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// Postgres failed.
    #[error(transparent)]
    Db(#[from] DbError),
    /// RabbitMQ failed.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// A channel operation failed.
    #[error("RabbitMQ: {0}")]
    Channel(#[from] lapin::Error),
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
    /// The retention sweep failed.
    #[error("sweep failed: {0}")]
    Sweep(#[source] RuntimeError),
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
    fn from_count(n: usize) -> Self {
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

/// `--status`: a stored status, or the claims awaiting a redelivery from
/// GitHub.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusFilter {
    /// `processing`, `completed` or `failed`.
    Is(Status),
    /// `awaiting_redelivery`: claims with no body and no job, which only a
    /// redelivery from GitHub finishes (the reconciler asks for it).
    AwaitingRedelivery,
}

impl std::str::FromStr for StatusFilter {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "awaiting_redelivery" {
            return Ok(Self::AwaitingRedelivery);
        }
        s.parse().map(Self::Is).map_err(|_| {
            "status is one of processing, completed, failed, awaiting_redelivery".to_owned()
        })
    }
}

/// Filters shared by the listing commands.
#[derive(clap::Args, Clone, Debug)]
pub struct FilterArgs {
    /// Only this status: processing, completed, failed, or
    /// awaiting_redelivery (claims with no body and no job, which only a
    /// redelivery from GitHub can finish).
    #[arg(long)]
    pub status: Option<StatusFilter>,
    /// Only this source.
    #[arg(long)]
    pub source: Option<String>,
    /// Only this event, e.g. push.
    #[arg(long)]
    pub event: Option<String>,
    /// Only this error class, e.g. permanent, poison, max_attempts.
    #[arg(long)]
    pub error_class: Option<ErrorClass>,
    /// Only deliveries active within this long, e.g. 2h or 7d.
    #[arg(long, value_parser = parse_duration_text)]
    pub since: Option<Duration>,
    /// At most this many rows, newest first (0: no limit).
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
}

impl FilterArgs {
    fn filter(&self, dead: bool, ids: Option<Vec<String>>) -> Filter {
        Filter {
            status: match self.status {
                Some(StatusFilter::Is(status)) => Some(status),
                _ => None,
            },
            awaiting_redelivery: self.status == Some(StatusFilter::AwaitingRedelivery),
            dead,
            source: self.source.clone(),
            event: self.event.clone(),
            error_class: self.error_class,
            active_within: self.since,
            ids,
            limit: if self.limit <= 0 {
                i64::MAX
            } else {
                self.limit
            },
            order: Order::RecentlyActive,
            ..Filter::default()
        }
    }

    fn is_set(&self) -> bool {
        self.status.is_some()
            || self.source.is_some()
            || self.event.is_some()
            || self.error_class.is_some()
            || self.since.is_some()
    }
}

/// What the `list` commands take: the filters, and the output form.
#[derive(clap::Args, Clone, Debug)]
pub struct ListArgs {
    /// Filters.
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Operator subcommands of `hookinbox-worker`.
#[derive(clap::Subcommand, Debug)]
pub enum OpsCommand {
    /// Inspect deliveries.
    #[command(subcommand)]
    Deliveries(DeliveriesCommand),
    /// Inspect, replay and purge dead letters (failed, not retryable).
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Delete completed and failed deliveries past their retention, then exit
    /// (for a CronJob; workers also sweep on their own).
    Sweep,
}

/// `deliveries …`
#[derive(clap::Subcommand, Debug)]
pub enum DeliveriesCommand {
    /// List deliveries.
    #[command(
        after_help = "Examples:\n  hookinbox-worker deliveries list --status failed --since 2h\n  hookinbox-worker deliveries list --event push --limit 20 --json"
    )]
    List(ListArgs),
    /// Show every delivery with this X-GitHub-Delivery id. Exits 1 when
    /// none has it.
    #[command(
        after_help = "Example:\n  hookinbox-worker deliveries show 72d3162e-cc78-11e3-81ab-4c9367dc0958"
    )]
    Show {
        /// The X-GitHub-Delivery id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `dlq …`
#[derive(clap::Subcommand, Debug)]
pub enum DlqCommand {
    /// List dead letters.
    #[command(
        after_help = "Examples:\n  hookinbox-worker dlq list\n  hookinbox-worker dlq list --error-class permanent --since 1d --json"
    )]
    List(ListArgs),
    /// Replay dead letters from their parked bodies: attempts back to 0,
    /// replays + 1. Atomic and idempotent: replaying one twice starts one job.
    #[command(
        after_help = "Examples:\n  hookinbox-worker dlq replay 72d3162e-cc78-11e3-81ab-4c9367dc0958\n  hookinbox-worker dlq replay --error-class transient --since 1d --dry-run\n  hookinbox-worker dlq replay --all --rate 20"
    )]
    Replay {
        /// Delivery ids to replay.
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
        /// At most this many replays per second.
        #[arg(long)]
        rate: Option<f64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete dead letters older than a duration, with their parked bodies.
    #[command(after_help = "Example:\n  hookinbox-worker dlq purge --older-than 14d")]
    Purge {
        /// Age, e.g. 14d.
        #[arg(long, value_parser = parse_duration_text)]
        older_than: Duration,
        /// Show what would be purged; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
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
    if filter.awaiting_redelivery && !list.json && !rows.is_empty() {
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
    let pool = config.common.pool_of(2)?;
    match command {
        OpsCommand::Deliveries(DeliveriesCommand::List(list)) => {
            list_rows(&pool, &list, false, out).await
        }
        OpsCommand::Deliveries(DeliveriesCommand::Show { id, json }) => {
            let client = pool.get().await.map_err(DbError::from)?;
            let filter = Filter {
                ids: Some(vec![id.clone()]),
                limit: i64::MAX,
                order: Order::RecentlyActive,
                ..Filter::default()
            };
            let rows = deliveries::list(&client, &filter).await?;
            if json {
                print_rows(out, &rows, true)?;
            } else if rows.is_empty() {
                writeln!(out, "no delivery has the X-GitHub-Delivery id '{id}'")?;
            } else {
                print_fields(out, &rows)?;
            }
            Ok(Found::from_count(rows.len()))
        }
        OpsCommand::Dlq(DlqCommand::List(list)) => list_rows(&pool, &list, true, out).await,
        OpsCommand::Dlq(DlqCommand::Replay {
            ids,
            all,
            filter,
            dry_run,
            rate,
            json,
        }) => {
            if ids.is_empty() && !all && !filter.is_set() {
                return Err(OpsError::Usage(
                    "name delivery ids, or pass --all or a filter".to_owned(),
                ));
            }
            if rate.is_some_and(|r| r.is_nan() || r <= 0.0 || r.is_infinite()) {
                return Err(OpsError::Usage("--rate must be above 0".to_owned()));
            }
            let mut filter = filter.filter(true, (!ids.is_empty()).then_some(ids));
            if all || filter.ids.is_some() {
                filter.limit = i64::MAX;
            }
            replay::replay(&pool, config, &filter, dry_run, rate, json, out).await
        }
        OpsCommand::Dlq(DlqCommand::Purge {
            older_than,
            dry_run,
            json,
        }) => {
            let client = pool.get().await.map_err(DbError::from)?;
            let doomed = deliveries::count(
                &client,
                &Filter {
                    dead: true,
                    failed_before: Some(older_than),
                    ..Filter::default()
                },
            )
            .await?;
            let purged = if dry_run {
                doomed as u64
            } else {
                let n = deliveries::purge_dead(&client, older_than, None).await?;
                replay::reconcile_dead_letter_queue(&pool, config).await?;
                n
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
        OpsCommand::Sweep => match maintenance::sweep(&pool, config).await {
            Ok(Some(swept)) => {
                writeln!(
                    out,
                    "swept {} completed and {} failed deliveries, {} remembered bodies and {} \
                     stored events",
                    swept.completed, swept.failed, swept.seen_bodies, swept.events
                )?;
                Ok(Found::from_count(swept.total() as usize))
            }
            Ok(None) => {
                writeln!(out, "another sweeper holds the lock; nothing done")?;
                Ok(Found::Nothing)
            }
            Err(e) => Err(OpsError::Sweep(e)),
        },
    }
}
