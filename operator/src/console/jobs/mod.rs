//! Bulk replays and purges: filter → count → dry run → a frozen selection
//! → a throttled, cancellable job → an audit record.
//!
//! Confirming freezes the selection: the matching keys become the job's
//! items, in one transaction with the job and its audit row, so the job
//! acts on what was counted, never on what arrives meanwhile. The runner
//! (`runner`) works through the items at the job's rate; each item is one
//! compare-and-set (a delivery replayed or purged meanwhile is skipped,
//! never done twice), in the transaction that records its result.

use hookinbox::LegKey;
use hookinbox::deliveries::{self, Filter, State};

use super::error::AdminError;
use super::params::Checked;
use super::tokens::Identity;

mod runner;
pub(crate) mod store;

pub(crate) use runner::spawn;
pub use store::{Cancelled, Item, Job, Kind, Lineage};

/// The most deliveries one job may take.
pub const MAX_SELECTION: i64 = 100_000;

/// Items per second unless asked.
pub const DEFAULT_PER_SECOND: f64 = 10.0;

/// The most items per second a job may ask for.
pub const MAX_PER_SECOND: f64 = 1000.0;

/// What a job would act on: `kind`'s own states ([`Kind::states`]), or
/// those of them the filter names. A filter naming another state is
/// refused, naming the field.
pub fn selection(kind: Kind, checked: &Checked, field: &str) -> Result<Filter, AdminError> {
    let mut f = checked.filter.clone();
    let own = kind.states();
    if f.states.is_empty() {
        f.states = own.to_vec();
    }
    // A purge takes dead letters only: `failed` (retrying or dead) names
    // them among others.
    if kind == Kind::Purge && f.states.contains(&State::Dead) {
        f.states = vec![State::Dead];
    }
    if f.states.iter().any(|s| !own.contains(s)) {
        let what = match kind {
            Kind::Replay => "failed deliveries (retrying, dead or awaiting_redelivery)",
            Kind::Purge => "dead letters",
        };
        return Err(AdminError::field(
            format!("{field}status"),
            format!("a {} applies to {what} only", kind.as_str()),
        ));
    }
    f.limit = MAX_SELECTION + 1;
    Ok(f)
}

/// A selection by delivery ids: the failed (replay) or dead (purge)
/// deliveries with these ids.
pub fn by_ids(kind: Kind, ids: &[String]) -> Result<Filter, AdminError> {
    if ids.is_empty() || ids.len() as i64 > MAX_SELECTION {
        return Err(AdminError::field(
            "ids",
            format!("1 to {MAX_SELECTION} delivery ids"),
        ));
    }
    if let Some(bad) = ids
        .iter()
        .position(|id| id.is_empty() || id.len() > 128 || !id.bytes().all(|b| b.is_ascii_graphic()))
    {
        return Err(AdminError::field(
            format!("ids[{bad}]"),
            "a delivery id is 1 to 128 visible ASCII characters",
        ));
    }
    Ok(Filter {
        ids: Some(ids.to_vec()),
        states: kind.states().to_vec(),
        limit: MAX_SELECTION + 1,
        ..Filter::default()
    })
}

/// Checks a rate.
pub fn per_second(value: Option<f64>, field: &str) -> Result<f64, AdminError> {
    let rate = value.unwrap_or(DEFAULT_PER_SECOND);
    if rate.is_nan() || rate <= 0.0 || rate > MAX_PER_SECOND {
        return Err(AdminError::field(
            field,
            format!("items per second, above 0 and at most {MAX_PER_SECOND}"),
        ));
    }
    Ok(rate)
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

/// What was started.
#[derive(Clone, Copy, Debug)]
pub struct Started {
    /// How many items the job froze.
    pub count: i64,
    /// The job.
    pub job: i64,
}

/// Freezes the selection of `filter` into a new job, with its audit row,
/// in one transaction. Refuses a selection larger than [`MAX_SELECTION`]
/// and an empty one.
pub async fn start(
    pool: &deadpool_postgres::Pool,
    who: &Identity,
    kind: Kind,
    filter: &Filter,
    target: &serde_json::Value,
    per_second: f64,
) -> Result<Started, AdminError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let rows = deliveries::list(&tx, filter).await?;
    if rows.len() as i64 > MAX_SELECTION {
        return Err(AdminError::field(
            "filter",
            format!("more than {MAX_SELECTION} deliveries match; narrow the filter"),
        ));
    }
    if rows.is_empty() {
        return Err(AdminError::Conflict(format!(
            "nothing to {}: no delivery matches",
            kind.as_str()
        )));
    }
    let keys: Vec<LegKey> = rows.into_iter().map(|d| d.key).collect();
    let filter_json = target.get("filter");
    let job = store::create(&tx, kind, &who.name, filter_json, per_second, &keys).await?;
    let count = keys.len() as i64;
    super::audit::record(
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

/// Cancels a job, with its audit row.
pub async fn cancel(
    pool: &deadpool_postgres::Pool,
    who: &Identity,
    id: i64,
) -> Result<(), AdminError> {
    let client = pool.get().await?;
    match store::cancel(&client, id, &who.name).await? {
        Cancelled::Now => {
            let job = store::get(&client, id).await?;
            let left = job.as_ref().map_or(0, |j| i64::from(j.total) - j.done);
            if let Some(j) = &job {
                // The runner refines this if an item was in flight.
                super::audit::job_ended(&client, id, &summary(j)).await?;
            }
            super::audit::record(
                &client,
                who,
                "cancel",
                &serde_json::json!({"job": id}),
                left,
                &format!("cancelled job {id}; {left} item(s) not done"),
                Some(id),
            )
            .await?;
            Ok(())
        }
        Cancelled::AlreadyEnded(status) => Err(AdminError::Conflict(format!(
            "job {id} is {status} already"
        ))),
        Cancelled::Unknown => Err(AdminError::NotFound(format!("no job {id}"))),
    }
}
