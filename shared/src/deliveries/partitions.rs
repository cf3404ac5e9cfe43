//! Day partitions of the append-only tables (migrations 0022 and 0023: the
//! stored events, the attempt log and the bodies): the sweep
//! creates each table's partitions a week ahead and drops the days wholly
//! past their retention, so that retention costs a `drop table` per day
//! instead of a delete per row, and leaves no dead rows behind.
//!
//! A table's partitions, by name:
//! - `<table>_pYYYYMMDD`: that UTC day;
//! - `<table>_default`: the DEFAULT partition, for a row of a day without a
//!   partition of its own; swept by rows;
//! - `<table>_to_YYYYMMDD`: the rows from before the migration, everything
//!   before that day; swept by rows, dropped whole once that day is past
//!   retention.
//!
//! Every statement here that changes partitions takes a lock on the parent
//! table; each runs in a transaction of its own with a short
//! `lock_timeout`, so that a sweep behind a long transaction gives up until
//! its next pass instead of queueing, and holding up every insert queued
//! behind it. After one such timeout the table's other changes wait for
//! the next pass too: each would hold the inserts up as long again.

use std::time::Duration;

use chrono::{DateTime, Days, NaiveDate, Utc};
use tokio_postgres::error::SqlState;

use deadpool_postgres::Client;

use crate::postgres::DbError;
use crate::postgres::sql::{self, Session};

/// A table partitioned by day, and the column its days are taken from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DayPartitioned {
    /// The parent table.
    pub table: &'static str,
    /// Its `timestamptz` partition key.
    pub column: &'static str,
    /// The storage parameters each day's partition is made with (the
    /// `with (…)` of its `create`), if any.
    pub options: Option<&'static str>,
}

/// The `store` handler's events, by `received_at` (the delivery's first
/// claim).
pub const GITHUB_EVENTS: DayPartitioned = DayPartitioned {
    table: "github_events",
    column: "received_at",
    options: None,
};

/// The attempt log, by `at`.
pub const DESTINATION_ATTEMPTS: DayPartitioned = DayPartitioned {
    table: "destination_attempts",
    column: "at",
    options: None,
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

/// One partition of a table, as its name says.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Partition {
    /// One UTC day.
    Day(NaiveDate),
    /// Everything before that day (the rows from before the migration).
    Before(NaiveDate),
    /// The DEFAULT partition.
    Default,
}

impl Partition {
    /// The day this partition's rows all come before; `None` for the
    /// DEFAULT partition.
    fn end(&self) -> Option<NaiveDate> {
        match self {
            Self::Day(day) => day.succ_opt(),
            Self::Before(end) => Some(*end),
            Self::Default => None,
        }
    }
}

impl DayPartitioned {
    /// The name of `day`'s partition.
    pub fn partition(&self, day: NaiveDate) -> String {
        format!("{}_p{}", self.table, day.format("%Y%m%d"))
    }

    /// The name of the DEFAULT partition.
    pub fn default_partition(&self) -> String {
        format!("{}_default", self.table)
    }

    /// What a partition of this table is, from its name; `None` for a name
    /// this module did not give.
    fn kind_of(&self, name: &str) -> Option<Partition> {
        let rest = name.strip_prefix(self.table)?;
        let date = |s: &str| NaiveDate::parse_from_str(s, "%Y%m%d").ok();
        if rest == "_default" {
            Some(Partition::Default)
        } else if let Some(end) = rest.strip_prefix("_to_") {
            date(end).map(Partition::Before)
        } else {
            date(rest.strip_prefix("_p")?).map(Partition::Day)
        }
    }

    /// This table's partitions, by name.
    async fn partitions(&self, client: &impl Session) -> Result<Vec<(String, Partition)>, DbError> {
        let rows = sql::query(client, PARTITIONS, &[&self.table]).await?;
        let mut all: Vec<(String, Partition)> = rows
            .iter()
            .filter_map(|r| {
                let name: String = r.get(0);
                self.kind_of(&name).map(|kind| (name, kind))
            })
            .collect();
        all.sort_by_key(|(_, kind)| kind.end());
        Ok(all)
    }

    /// The days that have a partition of their own, oldest first.
    pub async fn days(&self, client: &impl Session) -> Result<Vec<NaiveDate>, DbError> {
        Ok(self
            .partitions(client)
            .await?
            .into_iter()
            .filter_map(|(_, kind)| match kind {
                Partition::Day(day) => Some(day),
                _ => None,
            })
            .collect())
    }

    /// Creates the partitions of `today` and the [`AHEAD_DAYS`] after it
    /// that do not exist yet.
    ///
    /// A day that the rows from before the migration cover, or whose rows
    /// the DEFAULT partition already holds, cannot get a partition: its rows
    /// stay where they are, and are swept from there by rows.
    pub async fn ensure(&self, client: &Client, today: NaiveDate) -> Result<Changed, DbError> {
        let existing = self.partitions(client).await?;
        let covered = |day: NaiveDate| {
            existing.iter().any(|(_, kind)| match kind {
                Partition::Day(d) => *d == day,
                Partition::Before(end) => day < *end,
                Partition::Default => false,
            })
        };
        let mut created = Changed::default();
        for ahead in 0..=AHEAD_DAYS {
            let Some(day) = today.checked_add_days(Days::new(ahead)) else {
                break;
            };
            let Some(next) = day.succ_opt() else { break };
            if covered(day) || self.default_holds(client, day, next).await? {
                continue;
            }
            let ddl = format!(
                "create table if not exists {} partition of {} \
                 for values from ('{} 00:00:00+00') to ('{} 00:00:00+00'){}",
                self.partition(day),
                self.table,
                day.format("%Y-%m-%d"),
                next.format("%Y-%m-%d"),
                self.options
                    .map(|o| format!(" with ({o})"))
                    .unwrap_or_default(),
            );
            match run_ddl(client, &ddl).await {
                Ok(()) => created.count += 1,
                // The DEFAULT partition holds rows of that day.
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

    /// Whether the DEFAULT partition holds rows of `[day, next)`: then the
    /// day cannot get a partition. Asked through its index first, since the
    /// `create` would read the whole DEFAULT partition, holding the table,
    /// to find out.
    async fn default_holds(
        &self,
        client: &Client,
        day: NaiveDate,
        next: NaiveDate,
    ) -> Result<bool, DbError> {
        let statement = format!(
            "select exists (select 1 from \"{}\" where {col} >= $1::text::timestamptz \
             and {col} < $2::text::timestamptz)",
            self.default_partition(),
            col = self.column,
        );
        let bound = |d: NaiveDate| format!("{} 00:00:00+00", d.format("%Y-%m-%d"));
        let row = sql::query_one(client, &statement, &[&bound(day), &bound(next)]).await?;
        Ok(row.get(0))
    }

    /// Drops the partitions whose rows are all older than `keep` before
    /// `now`: the days wholly past it, and the rows from before the
    /// migration once their last day is.
    pub async fn drop_expired(
        &self,
        client: &Client,
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
        for (name, kind) in self.partitions(client).await? {
            let Some(end) = kind.end().and_then(|d| d.and_hms_opt(0, 0, 0)) else {
                continue;
            };
            if end.and_utc() > cutoff {
                continue;
            }
            match run_ddl(client, &format!("drop table if exists \"{name}\"")).await {
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

    /// The day partitions whose rows are all older than `keep` before
    /// `now`, oldest first, by day and name.
    pub async fn expired_days(
        &self,
        client: &impl Session,
        now: DateTime<Utc>,
        keep: Duration,
    ) -> Result<Vec<(NaiveDate, String)>, DbError> {
        let Some(cutoff) = chrono::Duration::from_std(keep)
            .ok()
            .and_then(|keep| now.checked_sub_signed(keep))
        else {
            return Ok(Vec::new());
        };
        Ok(self
            .partitions(client)
            .await?
            .into_iter()
            .filter_map(|(name, kind)| match kind {
                Partition::Day(day) => day
                    .succ_opt()
                    .and_then(|end| end.and_hms_opt(0, 0, 0))
                    .filter(|end| end.and_utc() <= cutoff)
                    .map(|_| (day, name)),
                _ => None,
            })
            .collect())
    }

    /// Deletes, `batch` rows at a time, the rows older than `keep` from the
    /// partitions that are not days (the DEFAULT partition, the rows from
    /// before the migration). Returns how many.
    pub async fn sweep_rows(
        &self,
        client: &impl Session,
        keep: Duration,
        batch: i64,
    ) -> Result<u64, DbError> {
        let mut deleted = 0;
        for (name, kind) in self.partitions(client).await? {
            if matches!(kind, Partition::Day(_)) {
                continue;
            }
            // A ctid names a row within one table: the partition's own.
            let statement = format!(
                "delete from \"{name}\" where ctid in (
                     select ctid from \"{name}\"
                     where {column} < now() - make_interval(secs => $1)
                     limit $2)",
                column = self.column,
            );
            loop {
                let n = sql::execute(client, &statement, &[&keep.as_secs_f64(), &batch]).await?;
                deleted += n;
                if n < batch as u64 {
                    break;
                }
            }
        }
        Ok(deleted)
    }
}

/// The partitions of a table, by name (a name holds only the table's
/// name, `_`, letters and digits: see [`DayPartitioned::kind_of`]).
const PARTITIONS: &str = "
select c.relname::text
from pg_inherits i
join pg_class c on c.oid = i.inhrelid
where i.inhparent = $1::text::regclass";

/// Whether `e` is [`LOCK_TIMEOUT`] running out: a long transaction holds
/// the table. Logged, and left to the next sweep.
pub(super) fn waited_too_long(e: &tokio_postgres::Error) -> bool {
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
///
/// A connection, not a transaction: the statement's own transaction would
/// end the caller's.
pub(super) async fn run_ddl(client: &Client, ddl: &str) -> Result<(), tokio_postgres::Error> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_say_what_a_partition_holds() {
        let day = NaiveDate::from_ymd_opt(2026, 12, 6).expect("a date");
        let t = GITHUB_EVENTS;
        assert_eq!(t.partition(day), "github_events_p20261206");
        assert_eq!(
            t.kind_of("github_events_p20261206"),
            Some(Partition::Day(day))
        );
        assert_eq!(
            t.kind_of("github_events_to_20261206"),
            Some(Partition::Before(day))
        );
        assert_eq!(t.kind_of("github_events_default"), Some(Partition::Default));
        for other in [
            "github_events_p2026120",
            "github_events_p20261306",
            "github_events_old",
            "destination_attempts_p20261206",
            "github_events_p20261206; drop table deliveries",
        ] {
            assert_eq!(t.kind_of(other), None, "{other}");
        }
        assert_eq!(Partition::Day(day).end(), day.succ_opt());
        assert_eq!(Partition::Before(day).end(), Some(day));
    }
}
