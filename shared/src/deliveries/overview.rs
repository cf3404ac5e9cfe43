//! The console's overview: deliveries by source and state, the oldest
//! stuck work, dead letters by class, and the last hour's traffic. Each
//! figure is read through an index: the small states (processing, retrying,
//! dead) whole, through their partial indexes; completed deliveries over
//! the last day, through `deliveries_completed`.

use crate::postgres::sql::{self, Session};

use crate::postgres::DbError;

/// Deliveries of one source, by state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceCounts {
    /// The source.
    pub source: String,
    /// Claimed or taken, not yet settled.
    pub processing: i64,
    /// Completed in the last 24 hours.
    pub completed: i64,
    /// Failed, waiting for a retry.
    pub retrying: i64,
    /// Failed for good: dead letters.
    pub dead: i64,
}

/// What the overview shows.
#[derive(Clone, Debug, Default)]
pub struct Overview {
    /// Per source, by state, sorted by source.
    pub sources: Vec<SourceCounts>,
    /// Seconds since the oldest processing claim was made (`claimed_at`).
    pub oldest_processing_secs: Option<f64>,
    /// Seconds the oldest due retry has been waiting past its time.
    pub oldest_due_secs: Option<f64>,
    /// Seconds since the oldest delivery reaped as `lost` failed.
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

/// Processing, retrying and dead are counted whole (they are the work to
/// look at, and few); completed over the last day, so that the figure
/// costs what a day's traffic does, not what the retention keeps.
const BY_SOURCE: &str = "
select source, 'processing' as state, count(*) from deliveries
where status = 'processing' group by source
union all
select source, case when retryable then 'retrying' else 'dead' end, count(*)
from deliveries where status = 'failed'
group by 1, 2
union all
select source, 'completed', count(*) from deliveries
where status = 'completed' and completed_at >= now() - interval '1 day'
group by source";

const AGES: &str = "
select (select extract(epoch from now() - min(claimed_at))::float8
          from deliveries where status = 'processing'),
       (select extract(epoch from now() - min(next_attempt_at))::float8
          from deliveries where status = 'failed' and retryable and next_attempt_at <= now()),
       (select extract(epoch from now() - min(failed_at))::float8
          from deliveries where status = 'failed' and retryable and last_error_class = 'lost')";

const DEAD_BY_CLASS: &str = "
select coalesce(last_error_class, 'permanent'), count(*) from deliveries
where status = 'failed' and not retryable
group by 1 order by 2 desc, 1";

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
        let state: &str = row.get(1);
        let n: i64 = row.get(2);
        let counts = sources
            .entry(source.clone())
            .or_insert_with(|| SourceCounts {
                source,
                ..SourceCounts::default()
            });
        match state {
            "processing" => counts.processing += n,
            "completed" => counts.completed += n,
            "retrying" => counts.retrying += n,
            _ => counts.dead += n,
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

/// The overview's statements, for `EXPLAIN` in tests.
#[doc(hidden)]
pub const STATEMENTS: [&str; 4] = [BY_SOURCE, AGES, DEAD_BY_CLASS, LAST_HOUR];
