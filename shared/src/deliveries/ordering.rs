//! Ordered keys as operators see and steer them (docs/architecture.md,
//! "Ordered legs"): the keys a leg halted, the skip of the leg that halts
//! one, its retry in place (due again with fresh attempts: the scheduler
//! publishes it once its destination takes legs), and the count of halted
//! keys per destination for the gauge.
//!
//! A key is *halted* when its first open leg (by claim order) failed for
//! good: dead-lettered, its key's later legs waiting behind it.

use chrono::{DateTime, Utc};

use crate::key::{DestinationName, LegKey, SourceName};
use crate::postgres::DbError;
use crate::postgres::sql::{self, Session};

use super::row::{key_from_parts, key_parts};

/// Each key's first open leg, of the destination `$1`/`$2` (and, when `$3`
/// is not null, of that key alone), through the ordered legs' index;
/// `materialized` where it is used, so it is computed once and each leg
/// found by its key.
macro_rules! heads {
    () => {
        "
select distinct on (order_key) provider, source, hook_id, delivery_id, destination,
       order_key, order_seq, status, retryable, event, action, failed_at, last_error_class,
       last_error
from deliveries
where source = $1 and destination = $2 and ($3::text is null or order_key = $3)
  and order_key is not null and status in ('processing', 'failed')
  and order_skipped_at is null
order by order_key, order_seq"
    };
}

const HALTED: &str = concat!(
    "
with heads as materialized (",
    heads!(),
    ")
select h.provider, h.source, h.hook_id, h.delivery_id, h.destination, h.order_key, h.event,
       h.action, h.failed_at, h.last_error_class, h.last_error,
       (select count(*) from deliveries o
        where o.source = h.source and o.destination = h.destination
          and o.order_key = h.order_key and o.order_seq > h.order_seq
          and o.order_key is not null and o.status in ('processing', 'failed')
          and o.order_skipped_at is null) as waiting
from heads h
where h.status = 'failed' and not h.retryable
order by h.failed_at, h.order_key
limit $4"
);

/// A key halted by a leg that failed for good.
#[derive(Clone, Debug)]
pub struct HaltedKey {
    /// The key: the repository's id, or `id#number` ordered by pull
    /// request.
    pub key: String,
    /// The leg that halts it.
    pub halted_by: LegKey,
    /// Its event.
    pub event: String,
    /// Its action.
    pub action: Option<String>,
    /// When it failed.
    pub failed_at: Option<DateTime<Utc>>,
    /// Its class of failure.
    pub error_class: Option<String>,
    /// Its last error.
    pub error: Option<String>,
    /// The key's legs waiting behind it.
    pub waiting: i64,
}

/// The keys of a destination that a leg halted, oldest halt first, at
/// most `limit`; with `key`, that key alone (empty when it is not halted).
pub async fn halted(
    client: &impl Session,
    source: &SourceName,
    destination: &DestinationName,
    key: Option<&str>,
    limit: i64,
) -> Result<Vec<HaltedKey>, DbError> {
    let rows = sql::query(
        client,
        HALTED,
        &[&source.as_str(), &destination.as_str(), &key, &limit],
    )
    .await?;
    rows.iter()
        .map(|r| {
            Ok(HaltedKey {
                halted_by: key_from_parts(&key_parts(r))?,
                key: r.get("order_key"),
                event: r.get("event"),
                action: r.get("action"),
                failed_at: r.get("failed_at"),
                error_class: r.get("last_error_class"),
                error: r.get("last_error"),
                waiting: r.get("waiting"),
            })
        })
        .collect()
}

const SKIP: &str = concat!(
    "
with heads as materialized (",
    heads!(),
    ")
update deliveries d
set order_skipped_at = now(), order_skipped_by = $4
from heads h
where d.provider = h.provider and d.source = h.source and d.hook_id = h.hook_id
  and d.delivery_id = h.delivery_id and d.destination = h.destination
  and h.status = 'failed' and not h.retryable
  and d.status = 'failed' and not d.retryable and d.order_skipped_at is null
returning d.provider, d.source, d.hook_id, d.delivery_id, d.destination"
);

/// An operator's skip of the leg that halts `key`: it stays failed (a dead
/// letter, still replayable), and no longer holds the key, whose next leg
/// the scheduler's next pass makes due. One compare-and-set: two skips at
/// once skip one leg. Returns the leg skipped, or `None` when the key is
/// not halted.
pub async fn skip(
    client: &impl Session,
    source: &SourceName,
    destination: &DestinationName,
    key: &str,
    actor: &str,
) -> Result<Option<LegKey>, DbError> {
    let row = sql::query_opt(
        client,
        SKIP,
        &[&source.as_str(), &destination.as_str(), &Some(key), &actor],
    )
    .await?;
    row.map(|r| key_from_parts(&key_parts(&r))).transpose()
}

const HALTED_COUNTS: &str = "
select source, destination, count(*) from (
    select distinct on (source, destination, order_key) source, destination, status, retryable
    from deliveries
    where order_key is not null and status in ('processing', 'failed')
      and order_skipped_at is null
    order by source, destination, order_key, order_seq
) h
where status = 'failed' and not retryable
group by source, destination";

/// Halted keys per destination (`source`, `destination`, count), for the
/// gauge; destinations without one are absent.
pub async fn halted_counts(client: &impl Session) -> Result<Vec<(String, String, i64)>, DbError> {
    Ok(sql::query(client, HALTED_COUNTS, &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

const RETRY: &str = concat!(
    "
with heads as materialized (",
    heads!(),
    ")
update deliveries d
set retryable = true, next_attempt_at = now(), attempts = 0, replays = d.replays + 1,
    dead_lettered_at = null, deferred_since = null
from heads h
where d.provider = h.provider and d.source = h.source and d.hook_id = h.hook_id
  and d.delivery_id = h.delivery_id and d.destination = h.destination
  and h.status = 'failed' and not h.retryable
  and d.status = 'failed' and not d.retryable and d.order_skipped_at is null
  and ",
    body_exists!("d"),
    "
returning d.provider, d.source, d.hook_id, d.delivery_id, d.destination"
);

/// An operator's retry of the leg that halts `key`, in its place: due now
/// with a fresh count of attempts (a replay, counted in `replays`), so the
/// scheduler publishes it again and the key's later legs wait for it as
/// before. One compare-and-set. Returns the leg, or `None` when the key is
/// not halted or its leg's delivery has no body kept.
pub async fn retry(
    client: &impl Session,
    source: &SourceName,
    destination: &DestinationName,
    key: &str,
) -> Result<Option<LegKey>, DbError> {
    let row = sql::query_opt(
        client,
        RETRY,
        &[&source.as_str(), &destination.as_str(), &Some(key)],
    )
    .await?;
    row.map(|r| key_from_parts(&key_parts(&r))).transpose()
}
