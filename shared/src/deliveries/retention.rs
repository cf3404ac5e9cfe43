//! Retention: completed and failed rows past their retention are deleted
//! in small batches, with the replay guard's bodies and the stored events,
//! and operators purge dead letters one at a time (the console's jobs; the
//! CLI's filtered purge is `filter::purge_dead`). Processing rows are never
//! swept: the reaper deals with them.

use std::time::Duration;

use crate::postgres::sql::{self, Session};

use super::{execute, partitions, secs};
use crate::key::LegKey;
use crate::postgres::DbError;

/// Deletes up to `$2` rows of `table` whose `at` column is older than `$1`
/// seconds (and that match `and`).
macro_rules! sweep {
    ($table:literal, $at:literal, $and:expr) => {
        concat!(
            "
delete from ",
            $table,
            "
where ctid in (
    select ctid from ",
            $table,
            "
    where ",
            $at,
            " < now() - make_interval(secs => $1)",
            $and,
            "
    limit $2
)"
        )
    };
}

const SWEEP_COMPLETED: &str = sweep!("deliveries", "completed_at", " and status = 'completed'");
const SWEEP_FILTERED: &str = sweep!("deliveries", "completed_at", " and status = 'filtered'");
/// A leg waiting behind its ordered key is not swept: its wait began when
/// it met the key's first leg, and may be older than that leg's own
/// failure; it goes when its key reaches it. Nor is a leg waiting for its
/// installation's turn on a fair destination: it goes when its turn comes.
const SWEEP_FAILED: &str = sweep!(
    "deliveries",
    "failed_at",
    concat!(
        " and status = 'failed' and last_error_class is distinct from ",
        class!(ordered),
        " and last_error_class is distinct from ",
        class!(fair)
    )
);
const SWEEP_SEEN_BODIES: &str = sweep!("seen_bodies", "seen_at", "");
/// How long each kind of row is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Completed deliveries, and the replay guard's bodies: the window in
    /// which a redelivery is answered as a duplicate and a replayed body
    /// is refused.
    pub completed: Duration,
    /// Failed deliveries (dead letters and retries).
    pub failed: Duration,
    /// The `store` handler's `github_events`; `None` keeps them.
    pub events: Option<Duration>,
    /// The deliveries' bodies, from their first claim; a delivery with a
    /// leg not yet ended keeps its body whatever its age (see
    /// [`super::bodies::retire`]).
    pub bodies: Duration,
}

/// What one sweep deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Completed rows older than their retention.
    pub completed: u64,
    /// Filtered legs older than the completed retention.
    pub filtered: u64,
    /// Failed rows older than theirs.
    pub failed: u64,
    /// Bodies the replay guard no longer needs to remember.
    pub seen_bodies: u64,
    /// Stored events older than their retention, deleted by rows from the
    /// partitions that are not days (see [`partitions`]); the days past
    /// retention go whole, in [`Swept::partitions`].
    pub events: u64,
    /// Logged attempts older than the longer of the completed and failed
    /// retentions, deleted by rows likewise.
    pub attempts: u64,
    /// Partitions dropped whole (days, or the rows from before the
    /// upgrade), of either table.
    pub partitions: u64,
    /// Day partitions created ahead.
    pub created: u64,
    /// Bodies past their retention: the days dropped whole (after the
    /// bodies of deliveries with a leg not yet ended moved out of them),
    /// and the bodies deleted by rows from the DEFAULT partition.
    pub bodies: super::bodies::Retired,
}

impl Swept {
    /// What went: rows deleted, and partitions dropped whole (the
    /// partitions created are not counted).
    pub fn total(&self) -> u64 {
        self.completed
            + self.filtered
            + self.failed
            + self.seen_bodies
            + self.events
            + self.attempts
            + self.partitions
            + self.bodies.days
            + self.bodies.deleted
    }
}

/// Retention: deletes completed and failed rows older than their
/// retention, the replay guard's
/// bodies older than the completed retention, stored events older than
/// theirs and logged attempts older than the longer of the two, in batches
/// of `batch` so that no statement holds many locks or a long transaction.
/// Processing rows are never swept: the reaper deals with them.
///
/// The day-partitioned tables first get their partitions for the week
/// ahead, and lose the days wholly past their retention (see
/// [`super::partitions`]); only their other partitions (the DEFAULT one,
/// the rows from before the migration) are swept by rows.
pub async fn sweep(
    client: &deadpool_postgres::Client,
    retention: &Retention,
    batch: i64,
) -> Result<Swept, DbError> {
    let mut swept = Swept::default();
    let now = chrono::Utc::now();
    let attempts_kept = retention.completed.max(retention.failed);
    for (table, kept) in [
        (partitions::GITHUB_EVENTS, retention.events),
        (partitions::DESTINATION_ATTEMPTS, Some(attempts_kept)),
    ] {
        // A partition change that fails (a partition made by hand that
        // overlaps, say) leaves the rest of retention to run.
        let created = match table.ensure(client, now.date_naive()).await {
            Ok(created) => created,
            Err(e) => {
                tracing::warn!(table = table.table, error = %e, "creating day partitions failed");
                // Counted as held: its drops are left to the next sweep too.
                partitions::Changed {
                    count: 0,
                    held: true,
                }
            }
        };
        swept.created += created.count;
        // Held by a long transaction: its drops would wait as long.
        if let (Some(kept), false) = (kept, created.held) {
            match table.drop_expired(client, now, kept).await {
                Ok(dropped) => swept.partitions += dropped.count,
                Err(e) => {
                    tracing::warn!(table = table.table, error = %e, "dropping day partitions failed")
                }
            }
        }
    }
    let tables = vec![
        (SWEEP_COMPLETED, retention.completed, &mut swept.completed),
        (SWEEP_FILTERED, retention.completed, &mut swept.filtered),
        (SWEEP_FAILED, retention.failed, &mut swept.failed),
        (
            SWEEP_SEEN_BODIES,
            retention.completed,
            &mut swept.seen_bodies,
        ),
    ];
    for (statement, kept, count) in tables {
        loop {
            let n = sql::execute(client, statement, &[&secs(kept), &batch]).await?;
            *count += n;
            if n < batch as u64 {
                break;
            }
        }
    }
    if let Some(events) = retention.events {
        swept.events = partitions::GITHUB_EVENTS
            .sweep_rows(client, events, batch)
            .await?;
    }
    swept.attempts = partitions::DESTINATION_ATTEMPTS
        .sweep_rows(client, attempts_kept, batch)
        .await?;
    // Last: the rows swept above no longer hold a body back.
    swept.bodies = super::bodies::retire(client, now, retention.bodies, batch).await?;
    swept.created += swept.bodies.created;
    Ok(swept)
}

const PURGE_ONE: &str = concat!(
    "
delete from deliveries
where ",
    key!(),
    // `status || ''`: the key is the only way in (see the module notes).
    " and status || '' = 'failed' and not retryable"
);

/// Deletes one dead letter, by key; the console's
/// bulk purge runs it item by item. Returns false when the delivery is no
/// longer a dead letter (replayed meanwhile) or is gone.
pub async fn purge(client: &impl Session, key: &LegKey) -> Result<bool, DbError> {
    Ok(execute(client, PURGE_ONE, key, &[]).await? == 1)
}
