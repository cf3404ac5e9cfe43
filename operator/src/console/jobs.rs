//! The console's side of bulk jobs (`crate::jobs`): its selections (a
//! filter with the job's own states, or ids), its rates and its limit,
//! and the core's errors as the console answers them.

use hookinbox::deliveries::{Filter, State};

pub use crate::jobs::{Item, Job, Kind, Lineage, Started, store};
use crate::jobs::{JobError, Start};

use super::error::AdminError;
use super::params::Checked;
use super::state::State as Shared;
use super::tokens::Identity;

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
    // A purge takes dead letters only: `failed` (retrying, waiting or dead) names
    // them among others.
    if kind == Kind::Purge && f.states.contains(&State::Dead) {
        f.states = vec![State::Dead];
    }
    if f.states.iter().any(|s| !own.contains(s)) {
        let what = match kind {
            Kind::Replay => "failed deliveries (retrying, waiting, dead or awaiting_redelivery)",
            Kind::ReplayAny => {
                "deliveries not in flight (completed, retrying, waiting, dead or awaiting_redelivery)"
            }
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

impl From<JobError> for AdminError {
    fn from(e: JobError) -> Self {
        match e {
            JobError::TooMany(_) => AdminError::field("filter", e.to_string()),
            JobError::Nothing(_) | JobError::Ended(..) => AdminError::Conflict(e.to_string()),
            JobError::Unknown(_) => AdminError::NotFound(e.to_string()),
            JobError::Db(e) => e.into(),
        }
    }
}

/// Freezes the selection of `filter` into a new job for the console's
/// runners (at most [`MAX_SELECTION`] deliveries), with its audit row.
pub async fn start(
    state: &Shared,
    who: &Identity,
    kind: Kind,
    filter: &Filter,
    target: &serde_json::Value,
    per_second: f64,
) -> Result<Started, AdminError> {
    let start = Start {
        kind,
        filter,
        target,
        per_second,
        max: Some(MAX_SELECTION),
        held_by: None,
    };
    let started = crate::jobs::start(&state.pool, who, start).await?;
    state.wake_runner.notify_waiters();
    Ok(started)
}

/// Cancels a job, with its audit row.
pub async fn cancel(state: &Shared, who: &Identity, id: i64) -> Result<(), AdminError> {
    crate::jobs::cancel(&state.pool, who, id).await?;
    state.wake_runner.notify_waiters();
    Ok(())
}
