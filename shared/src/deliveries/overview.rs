//! The console's overview: deliveries by source and state, the oldest
//! stuck work, dead letters by class, and the last hour's traffic; and the
//! state gauges the sampler exports. Each figure is read through an index:
//! the small states (processing, retrying, waiting, dead) whole, through their
//! partial indexes; completed deliveries over the last day
//! (`deliveries_completed`), or, for the gauge, exactly only while they
//! are few (see [`gauges`]). A due retry and a claim awaiting a redelivery
//! are the rules of `deliveries/mod.rs` (`due_retry!`,
//! `awaiting_redelivery!`), the same as the lists', the scheduler's and
//! the alerts'.

use crate::postgres::sql::{self, Session};

use super::state::State;
use crate::postgres::DbError;

/// Deliveries of one source, by state ([`State`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceCounts {
    /// The source.
    pub source: String,
    /// [`State::Processing`].
    pub processing: i64,
    /// [`State::Completed`] in the last 24 hours.
    pub completed: i64,
    /// [`State::Retrying`].
    pub retrying: i64,
    /// [`State::Waiting`].
    pub waiting: i64,
    /// [`State::Dead`]: dead letters.
    pub dead: i64,
    /// [`State::AwaitingRedelivery`].
    pub awaiting_redelivery: i64,
}

impl SourceCounts {
    /// Each count with its state.
    pub fn by_state(&self) -> [(State, i64); 6] {
        [
            (State::Processing, self.processing),
            (State::Completed, self.completed),
            (State::Retrying, self.retrying),
            (State::Waiting, self.waiting),
            (State::Dead, self.dead),
            (State::AwaitingRedelivery, self.awaiting_redelivery),
        ]
    }
}

/// What the overview shows.
#[derive(Clone, Debug, Default)]
pub struct Overview {
    /// Per source, by state, sorted by source.
    pub sources: Vec<SourceCounts>,
    /// Seconds since the oldest processing claim was made (`claimed_at`).
    pub oldest_processing_secs: Option<f64>,
    /// Seconds the oldest due retry (one the scheduler can publish: its
    /// delivery's body is kept) has been waiting past its time. A claim
    /// reaped `lost` counts here only with a body; without one it waits
    /// for a redelivery, and only [`Overview::oldest_lost_secs`] ages it.
    pub oldest_due_secs: Option<f64>,
    /// Seconds since the oldest delivery reaped as `lost` failed, with a
    /// body kept or not.
    pub oldest_lost_secs: Option<f64>,
    /// Dead letters by error class, most first.
    pub dead_by_class: Vec<(String, i64)>,
    /// Deliveries first claimed in the last hour.
    pub accepted_last_hour: i64,
    /// Deliveries completed in the last hour.
    pub completed_last_hour: i64,
    /// Deliveries that failed (an attempt, or for good) in the last hour.
    pub failed_last_hour: i64,
}

/// Each state by its rule ([`State::predicate`]): processing, retrying,
/// waiting, dead and awaiting a redelivery counted whole (they are the work to look
/// at, and few); completed over the last day, so that the figure costs what
/// a day's traffic does, not what the retention keeps. The second column is
/// the state's word.
const BY_SOURCE: &str = concat!(
    "
select source, 'processing' as state, count(*) from deliveries
where status = 'processing' and ",
    processing_state!(),
    " group by source
union all
select source, 'retrying', count(*) from deliveries
where status <> 'processing' and ",
    retrying_state!(),
    " group by source
union all
select source, 'waiting', count(*) from deliveries
where status <> 'processing' and ",
    waiting_state!(),
    " group by source
union all
select source, 'dead', count(*) from deliveries
where status <> 'processing' and ",
    dead_state!(),
    " group by source
union all
select source, 'awaiting_redelivery', count(*) from deliveries where ",
    awaiting_redelivery_state!(),
    " group by source
union all
select source, 'completed', count(*) from deliveries
where status = 'completed' and completed_at >= now() - interval '1 day'
group by source"
);

const AGES: &str = concat!(
    "
select (select extract(epoch from now() - min(claimed_at))::float8
          from deliveries where status = 'processing' and ",
    processing_state!(),
    "),
       (select extract(epoch from now() - min(d.next_attempt_at))::float8
          from deliveries d where ",
    due_retry!("d"),
    "),
       (select extract(epoch from now() - min(failed_at))::float8
          from deliveries where status = 'failed' and retryable and last_error_class = ",
    class!(lost),
    ")"
);

const DEAD_BY_CLASS: &str = concat!(
    "
select coalesce(last_error_class, ",
    class!(permanent),
    "), count(*) from deliveries
where status <> 'processing' and ",
    dead_state!(),
    "
group by 1 order by 2 desc, 1"
);

const LAST_HOUR: &str = "
select (select count(*) from deliveries
          where status = 'processing' and created_at >= now() - interval '1 hour')
     + (select count(*) from deliveries
          where status <> 'processing' and created_at >= now() - interval '1 hour'),
       (select count(*) from deliveries
          where status = 'completed' and completed_at >= now() - interval '1 hour'),
       (select count(*) from deliveries
          where status = 'processing' and failed_at >= now() - interval '1 hour')
     + (select count(*) from deliveries
          where status <> 'processing' and failed_at is not null
            and failed_at >= now() - interval '1 hour')";

/// Reads the overview (four statements, each through indexes).
pub async fn overview(client: &impl Session) -> Result<Overview, DbError> {
    let mut out = Overview::default();
    let mut sources: std::collections::BTreeMap<String, SourceCounts> = Default::default();
    for row in sql::query(client, BY_SOURCE, &[]).await? {
        let source: String = row.get(0);
        let state: State = row
            .get::<_, &str>(1)
            .parse()
            .map_err(|_| DbError::BadRow("state"))?;
        let n: i64 = row.get(2);
        let counts = sources
            .entry(source.clone())
            .or_insert_with(|| SourceCounts {
                source,
                ..SourceCounts::default()
            });
        match state {
            State::Processing => counts.processing += n,
            State::Completed => counts.completed += n,
            State::Retrying => counts.retrying += n,
            State::Waiting => counts.waiting += n,
            State::Dead => counts.dead += n,
            State::AwaitingRedelivery => counts.awaiting_redelivery += n,
            State::Filtered => {}
        }
    }
    out.sources = sources.into_values().collect();
    let ages = sql::query_one(client, AGES, &[]).await?;
    out.oldest_processing_secs = ages.get(0);
    out.oldest_due_secs = ages.get(1);
    out.oldest_lost_secs = ages.get(2);
    out.dead_by_class = sql::query(client, DEAD_BY_CLASS, &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let hour = sql::query_one(client, LAST_HOUR, &[]).await?;
    out.accepted_last_hour = hour.get(0);
    out.completed_last_hour = hour.get(1);
    out.failed_last_hour = hour.get(2);
    Ok(out)
}

/// The state gauges: deliveries by state ([`State`], each by its rule),
/// the oldest processing claim, due retry and claim awaiting a redelivery.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gauges {
    /// [`State::Processing`].
    pub processing: i64,
    /// [`State::Completed`]: exact up to [`EXACT_COMPLETED_UP_TO`],
    /// Postgres's estimate past it.
    pub completed: i64,
    /// [`State::Retrying`].
    pub retrying: i64,
    /// [`State::Waiting`].
    pub waiting: i64,
    /// [`State::Dead`]: dead letters.
    pub dead: i64,
    /// Seconds since the oldest [`State::Processing`] claim was made; 0
    /// when none.
    pub oldest_processing_secs: f64,
    /// Seconds the oldest due retry the scheduler can publish has waited
    /// past its time; 0 when none.
    pub oldest_due_retry_secs: f64,
    /// [`State::AwaitingRedelivery`]: claims only a redelivery from GitHub
    /// can finish (what `--status awaiting_redelivery` lists).
    pub awaiting_redelivery: i64,
    /// Seconds since the lease of the oldest of them ran out (nothing has
    /// held it since); 0 when none.
    pub oldest_awaiting_redelivery_secs: f64,
}

/// Completed deliveries are counted exactly up to this many. Past it the
/// gauge is Postgres's estimate of the rows of `deliveries_completed` (its
/// partial index of completed rows, `reltuples`, kept current by
/// autovacuum), so that a sample every ten seconds costs what ten thousand
/// index entries do whatever the retention keeps, not a count of every
/// completed row (about a second per five million; docs/operations.md).
pub const EXACT_COMPLETED_UP_TO: i64 = 10_000;

/// Every gauge in one statement, each through an index and each state by
/// its rule (`processing_state!` and its siblings, [`State::predicate`]):
/// processing rows through theirs, failures through the failed rows' index
/// (one scan for both states), completed rows by a bounded index-only
/// count, and the due retries by theirs.
pub const GAUGES: &str = concat!(
    "
select p.n, c.n, f.retrying, f.dead, coalesce(p.oldest, 0), coalesce(due.oldest, 0),
       a.n, coalesce(a.oldest, 0), f.waiting
from (select count(*) as n, extract(epoch from now() - min(claimed_at))::float8 as oldest
        from deliveries where status = 'processing' and ",
    processing_state!(),
    ") p,
     (select case when n <= $1::int8 then n
                  else greatest(n, (select reltuples::int8 from pg_class
                                    where oid = to_regclass('deliveries_completed')))
             end as n
        from (select count(*) as n from (select from deliveries where status = 'completed'
                                         limit $1::int8 + 1) l) l) c,
     (select count(*) filter (where ",
    retrying_state!(),
    ") as retrying,
             count(*) filter (where ",
    waiting_state!(),
    ") as waiting,
             count(*) filter (where ",
    dead_state!(),
    ") as dead
        from deliveries where status = 'failed') f,
     (select extract(epoch from now() - min(d.next_attempt_at))::float8 as oldest
        from deliveries d where ",
    due_retry!("d"),
    ") due,
     (select count(*) as n,
             extract(epoch from now() - min(deliveries.lease_until))::float8 as oldest
        from deliveries where ",
    awaiting_redelivery_state!(),
    ") a"
);

/// Reads the state gauges (one statement).
pub async fn gauges(client: &impl Session) -> Result<Gauges, DbError> {
    let row = sql::query_one(client, GAUGES, &[&EXACT_COMPLETED_UP_TO]).await?;
    Ok(Gauges {
        processing: row.get(0),
        completed: row.get(1),
        retrying: row.get(2),
        waiting: row.get(8),
        dead: row.get(3),
        oldest_processing_secs: row.get(4),
        oldest_due_retry_secs: row.get(5),
        awaiting_redelivery: row.get(6),
        oldest_awaiting_redelivery_secs: row.get(7),
    })
}

/// The overview's statements, for `EXPLAIN` in tests.
#[doc(hidden)]
pub const STATEMENTS: [&str; 4] = [BY_SOURCE, AGES, DEAD_BY_CLASS, LAST_HOUR];
