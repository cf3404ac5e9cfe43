//! The worker's resolutions: completion (one delivery in its own
//! transaction, or many by group commit, with the `store` effect written by
//! the completing statement), the `github_events` insert, and failure.
//!
//! A completion may also be the delivery's take (`take: Some(n)`): for a
//! job whose whole effect is in the completing transaction, the worker
//! skips the separate take, and the completion counts the attempt itself,
//! guarded by the message's token, the attempts the row had when the job
//! was published (`n`), and attempts left. It is the take's compare-and-set
//! for the common case (the message's own claim, untaken), narrowed: a row
//! it does not match is left as it was, and the worker takes it the full
//! way, which decides every other case (an expired lease, a `lost` row,
//! poison, a live holder, resolved).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::postgres::sql::{self, Session};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::row::{KeyColumns, KeyTuple, key_tuple};
use super::{Failed, Failure, execute, query_opt, redact, secs};
use crate::key::{ClaimToken, LegKey};
use crate::postgres::DbError;

/// The one `github_events` insert: the `store` effect, written in the
/// completing transaction (see [`store_event`]) or by the completing
/// statement itself (see [`complete_batch`]). Its `received_at` is the
/// delivery row's `created_at`, when ingest first claimed it: the table is
/// partitioned by it, and its primary key is the delivery's key and it.
/// `on conflict do nothing`: the fence already makes a second effect of one
/// claim impossible; this keeps a second completion of the same claim from
/// failing forever.
///
/// A delivery claimed anew after its claim was swept (a request arriving
/// past the completed retention, 7 days or more unless
/// `HOOKINBOX_ALLOW_SHORT_RETENTION`, beyond GitHub's
/// redelivery window) runs again, as with every handler, and its event is
/// stored again, under its new claim's day. Checking every day's partition
/// for the key instead cost each store an index probe and a lock per
/// partition (see docs/architecture.md, "Storage at volume").
macro_rules! insert_github_event {
    ($($select:tt)+) => {
        concat!(
            "insert into github_events
        (provider, source, hook_id, delivery_id, event, action, payload, received_at)
    ",
            $($select)+,
            "
    on conflict do nothing"
        )
    };
}

/// The fault-injection suite counts effects in a log without a unique key,
/// so that a second effect would show.
#[cfg(feature = "failpoints")]
macro_rules! log_effect {
    ($select:literal) => {
        concat!(
            "insert into hookinbox_effect_log (provider, source, hook_id, delivery_id, destination) ",
            $select
        )
    };
}

const COMPLETE: &str = concat!(
    "
with done as (
    update deliveries
    set status = 'completed', completed_at = now(), retryable = false, next_attempt_at = null,
        attempts = attempts + (($7::int4) is not null)::int4
    where ",
    key!(),
    " and ",
    held_by!("$6"),
    "
      and ($7::int4 is null or (attempts = $7 and attempts < $8 and not ",
    behind!("deliveries"),
    " and not ",
    yields!("deliveries"),
    "))
    returning provider, source, hook_id, delivery_id, destination, created_at
)
select created_at from done"
);

/// Marks the delivery completed. Run it in the transaction of a database
/// effect, so the effect and the completion
/// commit together or not at all.
/// Guarded by the token alone, not by `lease_until > now()`: a holder whose
/// lease lapsed but whom nobody replaced may still finish. With `take:
/// Some(n)` the completion is also the take (see the module notes): it
/// counts the attempt, and holds only while the row has `n` attempts, fewer
/// than `max_attempts`. Returns when ingest first claimed the delivery, or
/// `None` when fenced.
pub async fn complete(
    client: &impl Session,
    key: &LegKey,
    token: ClaimToken,
    take: Option<i32>,
    max_attempts: i32,
) -> Result<Option<DateTime<Utc>>, DbError> {
    let row = query_opt(client, COMPLETE, key, &[&token.0, &take, &max_attempts]).await?;
    Ok(row.map(|row| row.get(0)))
}

const COMPLETE_STALE: &str = concat!(
    "
with done as (
    update deliveries d
    set status = 'completed', completed_at = now(), retryable = false, next_attempt_at = null,
        last_error_class = ",
    class!(stale),
    ",
        last_error = 'skipped: older than a completed event of its key (skip_stale)'
    where ",
    key!("d"),
    " and ",
    held_by!("d", "$6"),
    "
      and d.order_key is not null and d.stale_clock is not null
      and exists (select 1 from deliveries c
                  where c.source = d.source and c.destination = d.destination
                    and c.order_key = d.order_key and c.order_key is not null
                    and c.stale_clock is not null and c.status = 'completed'
                    and c.stale_clock > d.stale_clock)
    returning d.provider, d.source, d.hook_id, d.delivery_id, d.destination
)
select count(*) from done"
);

/// `skip_stale`: completes the leg `key`, held under `token`, without its
/// effect when its payload's time is older than that of a completed leg
/// of its key (docs/architecture.md, "Ordered legs"). Run after the take
/// and before the effect: the take made it its key's first open leg, so
/// every leg of the key claimed before it has ended. Returns whether it
/// was stale (and is now completed, class `stale`).
pub async fn complete_stale(
    client: &impl Session,
    key: &LegKey,
    token: ClaimToken,
) -> Result<bool, DbError> {
    let row = super::query_one(client, COMPLETE_STALE, key, &[&token.0]).await?;
    Ok(row.get::<_, i64>(0) == 1)
}

/// A `github_events` row that the completing statement itself writes (see
/// [`complete_batch`]).
#[derive(Clone, Debug)]
pub struct StoredEvent {
    /// `X-GitHub-Event`.
    pub event: String,
    /// The payload's `action`.
    pub action: Option<String>,
    /// The payload as JSON text (UTF-8). A `Bytes` so that a JSON body is
    /// shared with the job, not copied.
    pub payload: bytes::Bytes,
}

const STORE_EVENT: &str = insert_github_event!(
    "select provider, source, hook_id, delivery_id, $6, $7, $8::text::jsonb, created_at
    from deliveries where ",
    key!()
);

/// Writes `event` into `github_events` as the delivery's effect, inside a
/// transaction that fenced the row first ([`super::fence`]) and will
/// complete it ([`complete`]).
pub async fn store_event(
    client: &impl Session,
    key: &LegKey,
    event: &StoredEvent,
) -> Result<(), DbError> {
    execute(
        client,
        STORE_EVENT,
        key,
        &[
            &event.event,
            &event.action,
            &String::from_utf8_lossy(&event.payload),
        ],
    )
    .await?;
    #[cfg(feature = "failpoints")]
    execute(client, log_effect!("values ($1, $2, $3, $4, $5)"), key, &[]).await?;
    Ok(())
}

/// One completion for [`complete_batch`].
#[derive(Clone, Debug)]
pub struct Completing {
    /// The leg.
    pub key: LegKey,
    /// The token its holder took it with (or, with `take`, the token the
    /// job was published with).
    pub token: ClaimToken,
    /// `Some(n)`: this completion is also the take (see the module notes),
    /// and holds only while the row has `n` attempts, fewer than
    /// `max_attempts`.
    pub take: Option<i32>,
    /// The leg's bound on attempts (only read with `take`).
    pub max_attempts: i32,
    /// The event to store with the completion, if the effect is one.
    pub store: Option<StoredEvent>,
}

/// The batched completion: `$gate`, what else a row must be to complete
/// (empty for completions after a take), then an optional extra step for
/// the fault-injection suite's effect log.
macro_rules! complete_batch_sql {
    ($gate:expr, $($log:tt)*) => {
        concat!(
            "
with input as (
    select * from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::uuid[], $7::bool[], $8::text[], $9::text[], $10::text[],
                         $11::int4[], $12::int4[])
        as i(provider, source, hook_id, delivery_id, destination, token, store, event, action,
             payload, take, max_attempts)
), done as (
    update deliveries d
    set status = 'completed', completed_at = now(), retryable = false, next_attempt_at = null,
        attempts = d.attempts + (i.take is not null)::int4
    from input i
    where d.provider = i.provider and d.source = i.source and d.hook_id = i.hook_id
      and d.delivery_id = i.delivery_id and d.destination = i.destination
      and ",
            held_by!("d", "i.token"),
            $gate,
            "
    returning d.provider, d.source, d.hook_id, d.delivery_id, d.destination, i.token,
              d.created_at
), effects as (
    select i.*, done.created_at
    from input i join done using (provider, source, hook_id, delivery_id, destination, token)
    where i.store
), stored as (
    ",
            insert_github_event!(
                "select provider, source, hook_id, delivery_id, event, action, payload::jsonb, created_at
    from effects"
            ),
            "
)",
            $($log)*,
            "
select provider, source, hook_id, delivery_id, destination, token, created_at from done"
        )
    };
}

/// What a completion that is also the take asks of its row besides the
/// token: the attempts it was published with, fewer than `max_attempts`,
/// and no gate closed (order, fairness).
///
/// Why its own statement: the gates' subqueries name `d` alone, so the
/// planner prices them on every row a plan reads from `deliveries`, and
/// only a lookup of each row by its key is cheap. Written as
/// `i.take is null or (…)`, beside completions after a take, they named
/// `i` too, were priced only on rows already joined, and the generic plan
/// could read the whole table into a hash (a twentieth of this
/// statement's batches on a closed loop, at 1.4 ms a delivery instead of
/// 0.2).
macro_rules! taking_gate {
    () => {
        concat!(
            "
      and d.attempts = i.take and d.attempts < i.max_attempts
      and not ",
            behind!("d"),
            "
      and not ",
            yields!("d")
        )
    };
}

/// The fault-injection suite's effect log, as a step of the batched
/// completion.
#[cfg(feature = "failpoints")]
macro_rules! batch_effect_log {
    () => {
        concat!(
            ", logged as (\n    ",
            log_effect!("select provider, source, hook_id, delivery_id, destination from effects"),
            "\n)"
        )
    };
}

#[cfg(not(feature = "failpoints"))]
macro_rules! batch_effect_log {
    () => {
        ""
    };
}

/// Completions after a take.
const COMPLETE_BATCH: &str = complete_batch_sql!("", batch_effect_log!());

/// Completions that are also the take.
const COMPLETE_BATCH_TAKING: &str = complete_batch_sql!(taking_gate!(), batch_effect_log!());

/// Group commit of completions: completes many deliveries, and writes the
/// events of those whose effect is a stored event, in one statement
/// (`UPDATE … FROM unnest(…)`) per kind (completions that are also the
/// take, and the others: see [`taking_gate`]), answering for each when
/// ingest first claimed it, or `None` when it was fenced. A caller that
/// must know each statement's fate apart (an error means nothing of that
/// statement committed) passes one kind at a time, as the worker's
/// collector does: with both kinds outside a transaction, an error in the
/// second statement hides the first's answers, though its rows completed
/// (their effects are written once all the same: a later try is fenced).
///
/// Each row stays individually fenced: a row is completed only if its own
/// token still holds it (`claim_token = token and status = 'processing'`,
/// and for a completion that is also the take, the attempts it was
/// published with, fewer than `max_attempts`), and its event is written
/// only if that row completed, in the same statement and so the same
/// transaction. A worker that lost its delivery to a takeover therefore
/// neither completes it nor writes its effect, no matter which batch it
/// rides in. The input is sorted by key so that concurrent batches lock
/// rows in the same order.
pub async fn complete_batch(
    client: &impl Session,
    items: &[Completing],
) -> Result<Vec<Option<DateTime<Utc>>>, DbError> {
    // One statement cannot update a row twice: one entry per (key, token),
    // in key order (see `row::firsts_by_key`).
    let mut unique: BTreeMap<(&LegKey, Uuid), usize> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        unique.entry((&item.key, item.token.0)).or_insert(i);
    }
    let mut done: HashMap<(KeyTuple, Uuid), DateTime<Utc>> = HashMap::new();
    for (sql, taking) in [(COMPLETE_BATCH_TAKING, true), (COMPLETE_BATCH, false)] {
        let picked: Vec<(&LegKey, Uuid, usize)> = unique
            .iter()
            .filter(|&(_, &i)| items[i].take.is_some() == taking)
            .map(|(&(key, token), &i)| (key, token, i))
            .collect();
        if !picked.is_empty() {
            done.extend(complete_some(client, sql, items, &picked).await?);
        }
    }
    // Only the entry that took part in the statement answers for its
    // (key, token); a repeat of it in the same batch is not a second
    // completion.
    Ok(items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            if unique.get(&(&item.key, item.token.0)) != Some(&i) {
                return None;
            }
            done.remove(&(key_tuple(&item.key), item.token.0))
        })
        .collect())
}

/// Runs one of the batched completions over `picked` (each a key, its
/// token and its item's place in `items`, in key order); the rows it
/// completed.
async fn complete_some(
    client: &impl Session,
    sql: &str,
    items: &[Completing],
    picked: &[(&LegKey, Uuid, usize)],
) -> Result<HashMap<(KeyTuple, Uuid), DateTime<Utc>>, DbError> {
    let keys = KeyColumns::of(picked.iter().map(|(key, _, _)| *key));
    let stored = |i: usize| items[i].store.as_ref();
    let events: Vec<Option<&str>> = picked
        .iter()
        .map(|&(_, _, i)| stored(i).map(|e| e.event.as_str()))
        .collect();
    let actions: Vec<Option<&str>> = picked
        .iter()
        .map(|&(_, _, i)| stored(i).and_then(|e| e.action.as_deref()))
        .collect();
    // Borrowed, not copied: the handler checked the payload is UTF-8.
    let payloads: Vec<Option<std::borrow::Cow<'_, str>>> = picked
        .iter()
        .map(|&(_, _, i)| stored(i).map(|e| String::from_utf8_lossy(&e.payload)))
        .collect();
    let tokens: Vec<Uuid> = picked.iter().map(|&(_, token, _)| token).collect();
    let store: Vec<bool> = picked
        .iter()
        .map(|&(_, _, i)| stored(i).is_some())
        .collect();
    let takes: Vec<Option<i32>> = picked.iter().map(|&(_, _, i)| items[i].take).collect();
    let max_attempts: Vec<i32> = picked
        .iter()
        .map(|&(_, _, i)| items[i].max_attempts)
        .collect();
    let rows = sql::query_planned(
        client,
        sql,
        &keys.params(&[
            &tokens,
            &store,
            &events,
            &actions,
            &payloads,
            &takes,
            &max_attempts,
        ]),
    )
    .await?;
    Ok(rows
        .iter()
        .map(|r| ((r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)), r.get(5)))
        .zip(rows.iter().map(|r| r.get(6)))
        .collect())
}

const FAIL: &str = concat!(
    "
update deliveries
set status = 'failed', retryable = $7,
    next_attempt_at = case when $7 then now() + make_interval(secs => $8) end,
    failed_at = now(), first_failed_at = coalesce(first_failed_at, now()),
    last_error_class = $9, last_error = $10,
    attempts = greatest(attempts - (case when $9 = ",
    class!(held),
    " then 1 else 0 end), 0)
where ",
    key!(),
    " and ",
    held_by!("$6"),
    "
returning attempts, first_failed_at, failed_at"
);

/// Records a failed attempt, in one statement, guarded by the holder's
/// token: a change of state only (the claim wrote the body). Returns `None` when fenced (someone else holds
/// the leg now). A failure of class `held` (the destination itself is
/// wrong or down) gives its attempt back: the leg waits for its
/// destination without being spent.
pub async fn fail(
    client: &impl Session,
    key: &LegKey,
    token: ClaimToken,
    failure: &Failure,
) -> Result<Option<Failed>, DbError> {
    let retryable = failure.retry_in.is_some();
    let delay = failure.retry_in.map(secs).unwrap_or(0.0);
    let row = query_opt(
        client,
        FAIL,
        key,
        &[
            &token.0,
            &retryable,
            &delay,
            &failure.class.as_str(),
            &redact(&failure.message),
        ],
    )
    .await?;
    Ok(row.map(|row| Failed {
        attempts: row.get(0),
        first_failed_at: row.get(1),
        failed_at: row.get(2),
    }))
}

const DEFER: &str = concat!(
    "
update deliveries
set status = 'failed', retryable = t.in_time,
    next_attempt_at = case when t.in_time then now() + make_interval(secs => t.delay) end,
    failed_at = now(), first_failed_at = coalesce(first_failed_at, now()),
    deferred_since = coalesce(deferred_since, now()),
    last_error_class = case when t.in_time then ",
    class!(deferred),
    " else ",
    class!(deferred_too_long),
    " end,
    last_error = case when t.in_time then $9 else $10 end,
    attempts = case when t.in_time then greatest(attempts - 1, 0) else attempts end
from (
    select delay,
           coalesce(deferred_since, now()) + make_interval(secs => $8)
           >= now() + make_interval(secs => delay) as in_time
    from (
        select x.deferred_since,
               greatest($7, $11,
                        extract(epoch from now() - coalesce(x.deferred_since, now()))::float8
                        * $12) as delay
        from deliveries x
        where ",
    key!("x"),
    "
    ) y
) t
where ",
    key!(),
    " and ",
    held_by!("$6"),
    "
returning t.in_time"
);

/// How a deferral was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deferral {
    /// Due at the time asked, its attempt given back.
    Due,
    /// The time asked falls past the destination's retry horizon, counted
    /// from the leg's first deferral: failed for good, class
    /// `deferred_too_long`, to be dead-lettered.
    TooLong,
}

/// The shortest deferral, whatever the handler asked.
pub const DEFER_AT_LEAST: Duration = Duration::from_secs(1);

/// Each deferral waits at least this share of the time the leg has been
/// deferred already: a destination that keeps asking for "now" is asked
/// again about a hundred times over a day's horizon, not once a second.
pub const DEFER_GROWTH: f64 = 0.1;

/// Records a handler's "not now, try in `until`": the leg is failed and
/// retryable, due after `until` (at least [`DEFER_AT_LEAST`], and at least
/// [`DEFER_GROWTH`] of the time since its first deferral), class
/// `deferred`, its attempt given back (a deferral is not an attempt); all
/// in one statement guarded by the holder's token. Deferrals are bounded by `horizon` from
/// the leg's first one (`deferred_since`): one that would fall later fails
/// the leg for good instead ([`Deferral::TooLong`]). Returns `None` when
/// fenced.
pub async fn defer(
    client: &impl Session,
    key: &LegKey,
    token: ClaimToken,
    until: Duration,
    horizon: Duration,
    message: &str,
) -> Result<Option<Deferral>, DbError> {
    let too_long = format!(
        "{message}: past its retry horizon ({} s from its first deferral)",
        horizon.as_secs()
    );
    let row = query_opt(
        client,
        DEFER,
        key,
        &[
            &token.0,
            &secs(until),
            &secs(horizon),
            &redact(message),
            &redact(&too_long),
            &secs(DEFER_AT_LEAST),
            &DEFER_GROWTH,
        ],
    )
    .await?;
    Ok(row.map(|row| {
        if row.get::<_, bool>(0) {
            Deferral::Due
        } else {
            Deferral::TooLong
        }
    }))
}

const MARK_DEAD_LETTERED: &str = concat!(
    "
update deliveries set dead_lettered_at = now()
where ",
    key!(),
    "
  and status = 'failed' and not retryable"
);

/// Records that the dead-letter copy of a failed delivery was confirmed by
/// the broker. Until then a redelivered message writes the copy again
/// (a second copy is harmless; a missing one is not).
pub async fn mark_dead_lettered(client: &impl Session, key: &LegKey) -> Result<(), DbError> {
    execute(client, MARK_DEAD_LETTERED, key, &[]).await?;
    Ok(())
}
