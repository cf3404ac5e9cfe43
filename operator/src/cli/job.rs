//! A bulk replay or purge from the command line: the same kind of job as
//! the console's (its audit row, its items as each delivery's lineage, the
//! console's jobs page shows it), run here in the foreground by a runner
//! of this process. Ctrl-C cancels the job (audited, as a cancel from the
//! console is) and says so; a process killed outright leaves the job to a
//! console's runner once its hold lapses.

use std::io::Write;

use deadpool_postgres::Pool;
use hookinbox::config::WorkerConfig;
use hookinbox::deliveries::Filter;
use hookinbox::postgres::DbError;
use tokio_util::sync::CancellationToken;

use super::OpsError;
use crate::actor::Identity;
use crate::jobs::{self, Item, Job, JobError, Kind, Runner, Start};

/// What a foreground job came to.
pub(super) struct Ran {
    /// The job, as it ended.
    pub job: Job,
    /// Its items, in order.
    pub items: Vec<Item>,
}

impl From<JobError> for OpsError {
    fn from(e: JobError) -> Self {
        match e {
            JobError::Db(e) => e.into(),
            other => Self::Usage(other.to_string()),
        }
    }
}

/// Starts a job over `filter` held by this process, runs it at
/// `per_second` until it ends or Ctrl-C cancels it, and returns it with
/// its items. `None` when nothing matches (no job, no audit row).
pub(super) async fn run(
    pool: &Pool,
    config: &WorkerConfig,
    who: &Identity,
    kind: Kind,
    filter: &Filter,
    target: &serde_json::Value,
    per_second: f64,
) -> Result<Option<Ran>, OpsError> {
    let runner = Runner::new(pool.clone(), config.clone());
    let start = Start {
        kind,
        filter,
        target,
        per_second,
        max: None,
        held_by: Some(runner.id),
    };
    let started = match jobs::start(pool, who, start).await {
        Ok(started) => started,
        Err(JobError::Nothing(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let id = started.job;
    let stop = CancellationToken::new();
    let ran = jobs::run_held(&runner, id, kind, per_second, &stop);
    tokio::pin!(ran);
    tokio::select! {
        done = &mut ran => done?,
        _ = tokio::signal::ctrl_c() => {
            // Cancel while the runner goes on: the cancel waits for the item
            // in flight, which needs the runner polled to commit.
            let cancel = async {
                let left = jobs::cancel(pool, who, id).await;
                stop.cancel();
                left
            };
            let (left, done) = tokio::join!(cancel, &mut ran);
            done?;
            let left = match left {
                Ok(left) => left,
                // It ended on its own meanwhile.
                Err(JobError::Ended(..)) => 0,
                Err(e) => return Err(e.into()),
            };
            let mut err = std::io::stderr().lock();
            writeln!(
                err,
                "interrupted: cancelled job {id} ({} by {}); {left} item(s) not done",
                kind.as_str(),
                who.name
            )?;
        }
    }
    let client = pool.get().await.map_err(DbError::from)?;
    let Some(job) = jobs::store::get(&client, id).await? else {
        return Ok(None);
    };
    let items = jobs::store::items(&client, id, i64::from(job.total)).await?;
    Ok(Some(Ran { job, items }))
}
