//! The operator's commands: list, show, replay and purge deliveries and
//! dead letters, and sweep. `hookinbox-worker` exposes them as
//! subcommands. They read Postgres (the record) and keep the dead-letter
//! queue's copies in step with it.
//!
//! Exit codes: 0 done, 1 nothing matched, 2 usage or connection error.

use std::io::Write;
use std::time::Duration;

use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde_json::json;

use crate::broker::{self, BrokerError, Job, Publisher, Topology};
use crate::config::WorkerConfig;
use crate::db::{self, DbError};
use crate::deliveries::{self, Delivery, Filter, Status};

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

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("'{s}' is not a duration like 90s, 2h or 7d ({e})"))
}

fn parse_status(s: &str) -> Result<Status, String> {
    match s {
        "processing" => Ok(Status::Processing),
        "completed" => Ok(Status::Completed),
        "failed" => Ok(Status::Failed),
        _ => Err("status is one of processing, completed, failed".to_owned()),
    }
}

/// Filters shared by the listing commands.
#[derive(clap::Args, Clone, Debug)]
pub struct FilterArgs {
    /// Only this status: processing, completed or failed.
    #[arg(long, value_parser = parse_status)]
    pub status: Option<Status>,
    /// Only this source.
    #[arg(long)]
    pub source: Option<String>,
    /// Only this event, e.g. push.
    #[arg(long)]
    pub event: Option<String>,
    /// Only this error class, e.g. permanent, poison, max_attempts.
    #[arg(long)]
    pub error_class: Option<String>,
    /// Only deliveries active within this long, e.g. 2h or 7d.
    #[arg(long, value_parser = parse_duration)]
    pub since: Option<Duration>,
    /// At most this many rows, newest first (0: no limit).
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
}

impl FilterArgs {
    fn filter(&self, dead: bool, ids: Option<Vec<String>>) -> Filter {
        Filter {
            status: self.status,
            dead,
            source: self.source.clone(),
            event: self.event.clone(),
            error_class: self.error_class.clone(),
            since: self.since,
            ids,
            failed_before: None,
            limit: if self.limit <= 0 {
                i64::MAX
            } else {
                self.limit
            },
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
    List {
        /// Filters.
        #[command(flatten)]
        filter: FilterArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show every delivery with this X-GitHub-Delivery id.
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
    List {
        /// Filters.
        #[command(flatten)]
        filter: FilterArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
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
        #[arg(long, value_parser = parse_duration)]
        older_than: Duration,
        /// Show what would be purged; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn age(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    let Some(t) = t else { return "-".to_owned() };
    let secs = (chrono::Utc::now() - t).num_seconds().max(0) as u64;
    humantime::format_duration(Duration::from_secs(secs))
        .to_string()
        .split(' ')
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

fn to_json(d: &Delivery) -> serde_json::Value {
    json!({
        "provider": d.key.provider,
        "source": d.key.source.as_str(),
        "hook_id": d.key.hook_id.as_str(),
        "delivery_id": d.key.delivery_id.as_str(),
        "event": d.event,
        "action": d.action,
        "status": d.status.as_str(),
        "retryable": d.retryable,
        "attempts": d.attempts,
        "replays": d.replays,
        "lease_until": d.lease_until,
        "next_attempt_at": d.next_attempt_at,
        "created_at": d.created_at,
        "completed_at": d.completed_at,
        "first_failed_at": d.first_failed_at,
        "failed_at": d.failed_at,
        "dead_lettered": d.dead_lettered,
        "error_class": d.last_error_class,
        "error": d.last_error,
    })
}

fn print_table(out: &mut impl Write, rows: &[Delivery]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<38} {:<10} {:<12} {:<24} {:<10} {:>3} {:>3} {:<12} {:<9} ERROR",
        "DELIVERY_ID", "SOURCE", "HOOK_ID", "EVENT.ACTION", "STATUS", "ATT", "REP", "CLASS", "AGE"
    )?;
    for d in rows {
        let event = match &d.action {
            Some(a) => format!("{}.{a}", d.event),
            None => d.event.clone(),
        };
        let when = d.failed_at.or(d.completed_at).or(Some(d.created_at));
        writeln!(
            out,
            "{:<38} {:<10} {:<12} {:<24} {:<10} {:>3} {:>3} {:<12} {:<9} {}",
            d.key.delivery_id.as_str(),
            d.key.source.as_str(),
            d.key.hook_id.as_str(),
            event,
            if d.status == Status::Failed && d.retryable {
                "retrying"
            } else {
                d.status.as_str()
            },
            d.attempts,
            d.replays,
            d.last_error_class.as_deref().unwrap_or("-"),
            age(when),
            d.last_error.as_deref().unwrap_or(""),
        )?;
    }
    Ok(())
}

fn print_rows(out: &mut impl Write, rows: &[Delivery], json: bool) -> std::io::Result<()> {
    if json {
        let list: Vec<_> = rows.iter().map(to_json).collect();
        writeln!(out, "{}", serde_json::Value::Array(list))
    } else {
        print_table(out, rows)
    }
}

/// Runs one operator command, writing its report to `out`.
pub async fn run(
    command: OpsCommand,
    config: &WorkerConfig,
    out: &mut impl Write,
) -> Result<Found, OpsError> {
    let pool = db::pool(&config.common.database_url, 2)?;
    match command {
        OpsCommand::Deliveries(DeliveriesCommand::List { filter, json }) => {
            let client = pool.get().await.map_err(DbError::from)?;
            let rows = deliveries::list(&client, &filter.filter(false, None)).await?;
            print_rows(out, &rows, json)?;
            Ok(Found::from_count(rows.len()))
        }
        OpsCommand::Deliveries(DeliveriesCommand::Show { id, json }) => {
            let client = pool.get().await.map_err(DbError::from)?;
            let filter = Filter {
                ids: Some(vec![id]),
                limit: i64::MAX,
                ..Filter::default()
            };
            let rows = deliveries::list(&client, &filter).await?;
            if json {
                print_rows(out, &rows, true)?;
            } else {
                for d in &rows {
                    for (k, v) in to_json(d).as_object().into_iter().flatten() {
                        writeln!(
                            out,
                            "{k:>16}: {}",
                            v.as_str()
                                .map(str::to_owned)
                                .unwrap_or_else(|| v.to_string())
                        )?;
                    }
                    writeln!(out)?;
                }
            }
            Ok(Found::from_count(rows.len()))
        }
        OpsCommand::Dlq(DlqCommand::List { filter, json }) => {
            let client = pool.get().await.map_err(DbError::from)?;
            let rows = deliveries::list(&client, &filter.filter(true, None)).await?;
            print_rows(out, &rows, json)?;
            Ok(Found::from_count(rows.len()))
        }
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
            replay(&pool, config, &filter, dry_run, rate, json, out).await
        }
        OpsCommand::Dlq(DlqCommand::Purge {
            older_than,
            dry_run,
            json,
        }) => {
            let client = pool.get().await.map_err(DbError::from)?;
            let doomed = deliveries::list(
                &client,
                &Filter {
                    dead: true,
                    failed_before: Some(older_than),
                    limit: i64::MAX,
                    ..Filter::default()
                },
            )
            .await?
            .len();
            let purged = if dry_run {
                doomed as u64
            } else {
                let n = deliveries::purge_dead(&client, older_than, None).await?;
                reconcile_dead_letter_queue(&pool, config).await?;
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
        OpsCommand::Sweep => match crate::runtime::sweep(&pool, config).await {
            Ok(Some(swept)) => {
                writeln!(
                    out,
                    "swept {} completed and {} failed deliveries",
                    swept.completed, swept.failed
                )?;
                Ok(Found::from_count((swept.completed + swept.failed) as usize))
            }
            Ok(None) => {
                writeln!(out, "another sweeper holds the lock; nothing done")?;
                Ok(Found::Nothing)
            }
            Err(e) => Err(OpsError::Usage(e.to_string())),
        },
    }
}

async fn replay(
    pool: &deadpool_postgres::Pool,
    config: &WorkerConfig,
    filter: &Filter,
    dry_run: bool,
    rate: Option<f64>,
    json: bool,
    out: &mut impl Write,
) -> Result<Found, OpsError> {
    let client = pool.get().await.map_err(DbError::from)?;
    let targets = deliveries::list(&client, filter).await?;
    if dry_run {
        if json {
            writeln!(
                out,
                "{}",
                json!({"dry_run": true, "would_replay": targets.iter().map(to_json).collect::<Vec<_>>()})
            )?;
        } else {
            print_table(out, &targets)?;
            writeln!(out, "would replay {} dead letter(s)", targets.len())?;
        }
        return Ok(Found::from_count(targets.len()));
    }
    let publisher = Publisher::new(
        &config.common.amqp_url,
        "hookinbox-ops",
        Topology::new(&config.common.queue_prefix),
        Duration::from_millis(config.common.publish_timeout_ms),
    );
    publisher.connect().await?;
    let policy = config.common.policy();
    let mut ticker = rate.map(|r| {
        let mut t = tokio::time::interval(Duration::from_secs_f64(1.0 / r));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    let (mut replayed, mut skipped, mut failed) = (Vec::new(), 0usize, 0usize);
    for target in &targets {
        if let Some(t) = ticker.as_mut() {
            t.tick().await;
        }
        // The compare-and-set decides: a delivery replayed meanwhile (or by
        // a second run of this command) is skipped, never started twice.
        let Some(parked) = deliveries::replay(&client, &policy, &target.key).await? else {
            skipped += 1;
            continue;
        };
        let token = parked.token;
        let published = match Job::from_parked(parked) {
            Ok(job) => publisher.publish(&job).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match published {
            Ok(()) => replayed.push(target.key.delivery_id.as_str().to_owned()),
            Err(error) => {
                deliveries::unreplay(&client, &target.key, token, &error).await?;
                failed += 1;
            }
        }
    }
    publisher.close().await;
    if !replayed.is_empty() {
        reconcile_dead_letter_queue(pool, config).await?;
    }
    if json {
        writeln!(
            out,
            "{}",
            json!({"replayed": replayed, "skipped": skipped, "failed": failed})
        )?;
    } else {
        writeln!(
            out,
            "replayed {}, skipped {skipped} (no longer dead), failed {failed}",
            replayed.len()
        )?;
    }
    if failed > 0 {
        return Err(OpsError::Usage(format!(
            "{failed} replay(s) could not be published; they stay dead letters"
        )));
    }
    Ok(Found::from_count(replayed.len()))
}

/// Rewrites the dead-letter queue so that it holds one copy per dead
/// letter in Postgres: copies of replayed, purged or completed deliveries
/// are dropped, duplicates folded, unknown messages kept. Each kept copy is
/// republished (with a confirm) before its original is acked, so a crash
/// half way leaves a duplicate, never a loss.
pub async fn reconcile_dead_letter_queue(
    pool: &deadpool_postgres::Pool,
    config: &WorkerConfig,
) -> Result<(), OpsError> {
    let timeout = Duration::from_millis(config.common.publish_timeout_ms);
    let topology = Topology::new(&config.common.queue_prefix);
    let connection = broker::connect(&config.common.amqp_url, "hookinbox-ops", timeout).await?;
    let channel = connection.create_channel().await?;
    topology.declare(&channel).await?;
    let queue = channel
        .queue_declare(
            &topology.dead_letter_queue(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    let publisher = Publisher::new(
        &config.common.amqp_url,
        "hookinbox-ops",
        topology.clone(),
        timeout,
    );
    let client = pool.get().await.map_err(DbError::from)?;
    let mut seen = std::collections::HashSet::new();
    for _ in 0..queue.message_count() {
        let Some(message) = channel
            .basic_get(&topology.dead_letter_queue(), BasicGetOptions::default())
            .await?
        else {
            break;
        };
        let delivery = message.delivery;
        let keep = match Job::from_message(&delivery.properties, delivery.data.clone()) {
            Err(_) => true,
            Ok(job) => {
                let row = deliveries::get(&client, &job.key).await?;
                let dead = row.is_some_and(|r| r.status == Status::Failed && !r.retryable);
                dead && seen.insert(job.key)
            }
        };
        if keep {
            publisher
                .republish_dead_letter(&delivery.data, delivery.properties.clone())
                .await?;
        }
        delivery.acker.ack(BasicAckOptions::default()).await?;
    }
    publisher.close().await;
    let _ = connection.close(200, "reconciled").await;
    Ok(())
}
