//! `jobs list` and `jobs cancel ID`: the bulk jobs of the console and of
//! the CLI, one kind of job.

use std::io::Write;

use deadpool_postgres::Pool;
use hookinbox::postgres::DbError;

use super::args::ActorArgs;
use super::{Found, OpsError};
use crate::jobs::{self, JobError};

/// `jobs …`
#[derive(clap::Subcommand, Debug)]
pub enum JobsCommand {
    /// List the newest bulk replays and purges, from the console and the
    /// CLI. Exits 1 when there is none.
    #[command(
        after_help = "Examples:\n  hookinbox-worker jobs list\n  hookinbox-worker jobs list --limit 5 --json"
    )]
    List {
        /// At most this many, newest first.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i64).range(1..=1000))]
        limit: i64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a running job: no item starts after it (the one in flight
    /// ends first). Audited. Exits 1 when it had ended already.
    #[command(after_help = "Example:\n  hookinbox-worker jobs cancel 42 --as alice")]
    Cancel {
        /// The job's id.
        #[arg(value_parser = clap::value_parser!(i64).range(0..))]
        id: i64,
        /// Who cancels.
        #[command(flatten)]
        actor: ActorArgs,
    },
}

/// Runs one `jobs` command.
pub(super) async fn run(
    command: JobsCommand,
    pool: &Pool,
    out: &mut impl Write,
) -> Result<Found, OpsError> {
    match command {
        JobsCommand::List { limit, json } => {
            let client = pool.get().await.map_err(DbError::from)?;
            let list = jobs::store::recent(&client, limit).await?;
            if json {
                let items: Vec<_> = list.iter().map(|j| jobs::to_json(j, &[])).collect();
                writeln!(out, "{}", serde_json::Value::Array(items))?;
            } else {
                writeln!(
                    out,
                    "{:>6} {:<7} {:<9} {:<16} {:>6} {:>6} {:>8} {:>6} {:>7} {:>6}  CREATED",
                    "ID",
                    "KIND",
                    "STATUS",
                    "ACTOR",
                    "TOTAL",
                    "DONE",
                    "REPLAYED",
                    "PURGED",
                    "SKIPPED",
                    "FAILED"
                )?;
                for j in &list {
                    writeln!(
                        out,
                        "{:>6} {:<7} {:<9} {:<16} {:>6} {:>6} {:>8} {:>6} {:>7} {:>6}  {}",
                        j.id,
                        j.kind.as_str(),
                        j.status,
                        j.actor,
                        j.total,
                        j.done,
                        j.replayed,
                        j.purged,
                        j.skipped,
                        j.failed,
                        j.created_at.format("%Y-%m-%d %H:%M:%S"),
                    )?;
                }
            }
            Ok(Found::from_count(list.len()))
        }
        JobsCommand::Cancel { id, actor } => {
            let who = actor.identity()?;
            match jobs::cancel(pool, &who, id).await {
                Ok(left) => {
                    writeln!(out, "cancelled job {id}; {left} item(s) not done")?;
                    Ok(Found::Some)
                }
                Err(JobError::Ended(_, status)) => {
                    writeln!(out, "job {id} is {status} already")?;
                    Ok(Found::Nothing)
                }
                Err(e) => Err(e.into()),
            }
        }
    }
}
