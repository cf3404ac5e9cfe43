//! Day partitions of the append-only tables (migration 0022): the sweep
//! creates each table's partitions a week ahead and drops the days wholly
//! past their retention, so that retention costs a `drop table` per day
//! instead of a delete per row, and leaves no dead rows behind.
//!
//! A partition is `<table>_pYYYYMMDD`, covering that UTC day. Rows of a day
//! without one go to the table's DEFAULT partition (`<table>_default`),
//! which the sweep deletes from in batches, as before.
//!
//! Every statement here takes a lock on the parent table; each runs in a
//! transaction of its own with a short `lock_timeout`, so that a sweep
//! behind a long transaction gives up until its next pass instead of
//! queueing, and holding up every insert queued behind it. After one such
//! timeout the table's other changes wait for the next pass too: each
//! would hold the inserts up as long again.

use std::time::Duration;

use chrono::{DateTime, Days, NaiveDate, Utc};
use tokio_postgres::error::SqlState;

use crate::postgres::DbError;
use crate::postgres::sql::{self, Session};

/// A table partitioned by day, and the column its days are taken from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DayPartitioned {
    /// The parent table.
    pub table: &'static str,
    /// Its `timestamptz` partition key.
    pub column: &'static str,
}

/// The `store` handler's events, by `received_at` (the delivery's first
/// claim).
pub const GITHUB_EVENTS: DayPartitioned = DayPartitioned {
    table: "github_events",
    column: "received_at",
};

/// The attempt log, by `at`.
pub const DESTINATION_ATTEMPTS: DayPartitioned = DayPartitioned {
    table: "destination_attempts",
    column: "at",
};

/// What [`DayPartitioned::ensure`] or [`DayPartitioned::drop_expired`]
/// did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Changed {
    /// Partitions created or dropped.
    pub count: u64,
    /// A long transaction held the table: the rest is left to the next
    /// sweep.
    pub held: bool,
}

/// Days of partitions kept ready past today.
pub const AHEAD_DAYS: u64 = 7;

/// How long a partition statement waits for its lock on the parent.
const LOCK_TIMEOUT: &str = "1s";

impl DayPartitioned {
    /// The name of `day`'s partition.
    pub fn partition(&self, day: NaiveDate) -> String {
        format!("{}_p{}", self.table, day.format("%Y%m%d"))
    }

    /// The name of the DEFAULT partition.
    pub fn default_partition(&self) -> String {
        format!("{}_default", self.table)
    }

    /// The day a partition of this table covers, from its name; `None` for
    /// any other name (the DEFAULT partition, say).
    fn day_of(&self, name: &str) -> Option<NaiveDate> {
        let suffix = name.strip_prefix(self.table)?.strip_prefix("_p")?;
        NaiveDate::parse_from_str(suffix, "%Y%m%d").ok()
    }

    /// Creates the partitions of `today` and the [`AHEAD_DAYS`] after it
    /// that do not exist yet.
    ///
    /// A day whose rows the DEFAULT partition already holds (today's, the
    /// first day after the migration) cannot get a partition: its rows stay
    /// in the default, and are swept from there.
    pub async fn ensure(
        &self,
        client: &impl Session,
        today: NaiveDate,
    ) -> Result<Changed, DbError> {
        let existing = self.days(client).await?;
        let mut created = Changed::default();
        for ahead in 0..=AHEAD_DAYS {
            let Some(day) = today.checked_add_days(Days::new(ahead)) else {
                break;
            };
            if existing.contains(&day) {
                continue;
            }
            let Some(next) = day.succ_opt() else { break };
            let ddl = format!(
                "create table if not exists {} partition of {} \
                 for values from ('{} 00:00:00+00') to ('{} 00:00:00+00')",
                self.partition(day),
                self.table,
                day.format("%Y-%m-%d"),
                next.format("%Y-%m-%d"),
            );
            match run_ddl(client, &ddl).await {
                Ok(()) => created.count += 1,
                // The default holds rows of that day.
                Err(e) if e.code() == Some(&SqlState::CHECK_VIOLATION) => {
                    tracing::debug!(table = self.table, %day, "day kept in the default partition");
                }
                // The rest would wait as long: left to the next sweep.
                Err(e) if waited_too_long(&e) => {
                    created.held = true;
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(created)
    }

    /// Drops the partitions whose whole day is older than `keep` before
    /// `now`.
    pub async fn drop_expired(
        &self,
        client: &impl Session,
        now: DateTime<Utc>,
        keep: Duration,
    ) -> Result<Changed, DbError> {
        let mut dropped = Changed::default();
        let Ok(keep) = chrono::Duration::from_std(keep) else {
            return Ok(dropped);
        };
        let Some(cutoff) = now.checked_sub_signed(keep) else {
            return Ok(dropped);
        };
        for day in self.days(client).await? {
            let Some(end) = day.succ_opt().and_then(|d| d.and_hms_opt(0, 0, 0)) else {
                continue;
            };
            if end.and_utc() > cutoff {
                continue;
            }
            match run_ddl(
                client,
                &format!("drop table if exists {}", self.partition(day)),
            )
            .await
            {
                Ok(()) => dropped.count += 1,
                Err(e) if waited_too_long(&e) => {
                    dropped.held = true;
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(dropped)
    }

    /// The days that have a partition, oldest first.
    pub async fn days(&self, client: &impl Session) -> Result<Vec<NaiveDate>, DbError> {
        let rows = sql::query(client, PARTITIONS, &[&self.table]).await?;
        let mut days: Vec<NaiveDate> = rows
            .iter()
            .filter_map(|r| self.day_of(r.get::<_, &str>(0)))
            .collect();
        days.sort();
        Ok(days)
    }
}

/// The partitions of a table, by name.
const PARTITIONS: &str = "
select c.relname::text
from pg_inherits i
join pg_class c on c.oid = i.inhrelid
where i.inhparent = $1::text::regclass";

/// Whether `e` is [`LOCK_TIMEOUT`] running out: a long transaction holds
/// the table. Logged, and left to the next sweep.
fn waited_too_long(e: &tokio_postgres::Error) -> bool {
    let timed_out = e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE);
    if timed_out {
        tracing::warn!(
            "a partition change waited {LOCK_TIMEOUT} for its lock (a long transaction holds \
             the table): left to the next sweep"
        );
    }
    timed_out
}

/// Runs one DDL statement in a transaction of its own, waiting at most
/// [`LOCK_TIMEOUT`] for its locks.
async fn run_ddl(client: &impl Session, ddl: &str) -> Result<(), tokio_postgres::Error> {
    let done = client
        .batch_execute(&format!(
            "begin; set local lock_timeout = '{LOCK_TIMEOUT}'; {ddl}; commit"
        ))
        .await;
    if done.is_err() {
        // A failed statement leaves its transaction open on the
        // connection; end it, so that the connection goes back clean.
        let _ = client.batch_execute("rollback").await;
    }
    done
}
