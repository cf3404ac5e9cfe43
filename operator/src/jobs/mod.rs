//! Bulk replays and purges, from the console or the CLI alike: a frozen
//! selection → a throttled, cancellable job → an audit record, and the
//! job's items as each delivery's lineage.
//!
//! Starting freezes the selection: the matching keys become the job's
//! items, in one transaction with the job and its audit row, so the job
//! acts on what was counted, never on what arrives meanwhile. The runner
//! (`runner`) works through the items at the job's rate; each item is one
//! compare-and-set (a delivery replayed or purged meanwhile is skipped,
//! never done twice), in the transaction that records its result.

use hookinbox::LegKey;
use hookinbox::deliveries::{self, Filter};
use hookinbox::postgres::DbError;
use uuid::Uuid;

use crate::actor::Identity;
use crate::audit;

pub mod runner;
pub mod store;

pub use runner::{Runner, run_held, spawn};
pub use store::{Cancelled, Item, Job, Kind, Lineage};

/// Why a job could not be started, run or cancelled.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// More deliveries match than a job may take.
    #[error("more than {0} deliveries match; narrow the filter")]
    TooMany(i64),
    /// No delivery matches.
    #[error("nothing to {0}: no delivery matches")]
    Nothing(&'static str),
    /// The job has ended already.
    #[error("job {0} is {1} already")]
    Ended(i64, String),
    /// No such job.
    #[error("no job {0}")]
    Unknown(i64),
    /// Postgres failed.
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<tokio_postgres::Error> for JobError {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Db(e.into())
    }
}

impl From<deadpool_postgres::PoolError> for JobError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        Self::Db(e.into())
    }
}

/// A job's outcome, for its audit row.
pub fn summary(job: &Job) -> String {
    format!(
        "{}: {} replayed, {} purged, {} skipped, {} failed, {} not done",
        job.status,
        job.replayed,
        job.purged,
        job.skipped,
        job.failed,
        i64::from(job.total) - job.done
    )
}

/// A job as JSON: the API's answer and the CLI's `jobs list --json`.
pub fn to_json(job: &Job, items: &[Item]) -> serde_json::Value {
    let key_field = match job.kind {
        Kind::Replay | Kind::ReplayAny => "replay_of",
        Kind::Purge => "delivery",
    };
    serde_json::json!({
        "id": job.id,
        "kind": job.kind.as_str(),
        "status": job.status,
        "actor": job.actor,
        "filter": job.filter,
        "per_second": job.per_second,
        "total": job.total,
        "done": job.done,
        "replayed": job.replayed,
        "purged": job.purged,
        "skipped": job.skipped,
        "failed": job.failed,
        "created_at": job.created_at,
        "finished_at": job.finished_at,
        "cancelled_by": job.cancelled_by,
        "items": items.iter().map(|i| {
            let [_, source, hook_id, delivery_id, _] = &i.key;
            serde_json::json!({
                "position": i.position,
                key_field: {"source": source, "hook_id": hook_id, "delivery_id": delivery_id},
                "result": i.result,
                "error": i.error,
                "done_at": i.done_at,
            })
        }).collect::<Vec<_>>(),
    })
}

/// What was started.
#[derive(Clone, Copy, Debug)]
pub struct Started {
    /// How many items the job froze.
    pub count: i64,
    /// The job.
    pub job: i64,
}

/// How a job is started.
#[derive(Clone, Debug)]
pub struct Start<'a> {
    /// Replay or purge.
    pub kind: Kind,
    /// Its selection.
    pub filter: &'a Filter,
    /// What the audit row names: `{"filter": …}`, `{"ids": […]}` or
    /// `{"delivery": …}`.
    pub target: &'a serde_json::Value,
    /// Items per second.
    pub per_second: f64,
    /// The most deliveries it may take (none: no limit).
    pub max: Option<i64>,
    /// The runner that holds it from the start (the CLI's, which runs it
    /// in the foreground); none: the console's runners take it.
    pub held_by: Option<Uuid>,
}

/// Freezes the selection of `start.filter` into a new job, with its audit
/// row, in one transaction. Refuses a selection larger than `start.max`
/// and an empty one.
pub async fn start(
    pool: &deadpool_postgres::Pool,
    who: &Identity,
    start: Start<'_>,
) -> Result<Started, JobError> {
    let Start {
        kind,
        filter,
        target,
        per_second,
        max,
        held_by,
    } = start;
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let rows = deliveries::list(&tx, filter).await?;
    if let Some(max) = max.filter(|max| rows.len() as i64 > *max) {
        return Err(JobError::TooMany(max));
    }
    if rows.is_empty() {
        return Err(JobError::Nothing(kind.as_str()));
    }
    let keys: Vec<LegKey> = rows.into_iter().map(|d| d.key).collect();
    let filter_json = target.get("filter");
    let job = store::create(&tx, kind, &who.name, filter_json, per_second, &keys).await?;
    if let Some(runner) = held_by {
        store::hold_new(&tx, job, runner).await?;
    }
    let count = keys.len() as i64;
    audit::record(
        &tx,
        who,
        kind.as_str(),
        target,
        count,
        &format!("started job {job}"),
        Some(job),
    )
    .await?;
    tx.commit().await?;
    Ok(Started { count, job })
}

/// Cancels a job, with its audit row; returns the items left undone.
pub async fn cancel(
    pool: &deadpool_postgres::Pool,
    who: &Identity,
    id: i64,
) -> Result<i64, JobError> {
    let client = pool.get().await?;
    match store::cancel(&client, id, &who.name).await? {
        Cancelled::Now => {
            let job = store::get(&client, id).await?;
            let left = job.as_ref().map_or(0, |j| i64::from(j.total) - j.done);
            if let Some(j) = &job {
                // The runner refines this if an item was in flight.
                audit::job_ended(&client, id, &summary(j)).await?;
            }
            audit::record(
                &client,
                who,
                "cancel",
                &serde_json::json!({"job": id}),
                left,
                &format!("cancelled job {id}; {left} item(s) not done"),
                Some(id),
            )
            .await?;
            Ok(left)
        }
        Cancelled::AlreadyEnded(status) => Err(JobError::Ended(id, status)),
        Cancelled::Unknown => Err(JobError::Unknown(id)),
    }
}
