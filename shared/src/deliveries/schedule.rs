//! The scheduler's and the reaper's transitions: due retries back to
//! `processing`, exhausted ones dead-lettered, dead letters still missing
//! their broker copy, unreadable rows dead-lettered, and abandoned claims
//! marked `lost` (whose messages the scheduler then publishes again, from
//! the body the claim wrote).
//!
//! Every statement that moves a leg back to `processing` returns its key,
//! event, action, new token, attempts and first trace: the job to publish
//! ([`Republish`]), never a body. The worker's take reads the body.

use std::time::Duration;

use crate::postgres::sql::{self, Session};

use super::row::{Republish, Unreadable, republish};
use super::{Policy, execute, redact, secs};
use crate::key::{ClaimToken, LegKey};
use crate::postgres::DbError;

/// The legs of a destination that takes no legs now (its breaker is open
/// or half open, or it is paused or disabled) wait; the probe is picked by
/// [`probe_due`].
const SCHEDULE: &str = concat!(
    "
with due as (
    select d.provider, d.source, d.hook_id, d.delivery_id, d.destination
    from deliveries d
    where d.status = 'failed' and d.retryable and d.next_attempt_at <= now()
      and d.attempts < coalesce(d.max_attempts, $1)
      and ",
    body_exists!("d"),
    "
      and not exists (select 1 from destinations x
                      where x.source = d.source and x.name = d.destination
                        and x.state <> 'closed')
    order by d.next_attempt_at
    limit $2
    for update of d skip locked
)
update deliveries d
set ",
    to_processing!("$3"),
    "
from due
where d.provider = due.provider and d.source = due.source
  and d.hook_id = due.hook_id and d.delivery_id = due.delivery_id
  and d.destination = due.destination
returning d.provider, d.source, d.hook_id, d.delivery_id, d.destination, d.event, d.action,
          d.claim_token, d.attempts, d.traceparent"
);

/// The breaker's probe, fleet-wide at most one per destination per
/// `probe_secs`: for each destination whose breaker is open (or half open
/// with its probe overdue) and whose next probe is due, the compare-and-set
/// on its row (`skip locked`, `probe_at <= now()`) moves its oldest waiting
/// leg to `processing` under a new token and makes that token the probe's:
/// its take passes the gate. One statement, so a probe is never out
/// without the row saying so.
const PROBE: &str = concat!(
    "
with due as (
    select x.source, x.name from destinations x
    where x.state in ('open', 'half_open') and x.probe_at <= now()
    for update skip locked
), leg as (
    select w.provider, w.source, w.hook_id, w.delivery_id, w.destination
    from due cross join lateral (
        select d.provider, d.source, d.hook_id, d.delivery_id, d.destination
        from deliveries d
        where d.source = due.source and d.destination = due.name
          and d.status = 'failed' and d.retryable
          and ",
    body_exists!("d"),
    "
          -- A deferred leg goes no earlier than the time it asked for.
          and not (d.last_error_class = ",
    class!(deferred),
    " and d.next_attempt_at > now())
          -- A leg behind an open leg of its ordered key is not the one to
          -- probe with (its take would only wait); its key's first is.
          and not ",
    behind!("d"),
    "
        order by d.next_attempt_at
        limit 1
        for update of d skip locked
    ) w
), moved as (
    update deliveries d
    set ",
    to_processing!("$1"),
    "
    from leg
    where d.provider = leg.provider and d.source = leg.source
      and d.hook_id = leg.hook_id and d.delivery_id = leg.delivery_id
      and d.destination = leg.destination
    returning d.provider, d.source, d.hook_id, d.delivery_id, d.destination, d.event,
              d.action, d.claim_token, d.attempts, d.traceparent
), probing as (
    update destinations x
    set state = 'half_open', probe_at = now() + make_interval(secs => x.probe_secs),
        probe_token = m.claim_token
    from moved m
    where x.source = m.source and x.name = m.destination
)
select m.provider, m.source, m.hook_id, m.delivery_id, m.destination, m.event, m.action,
       m.claim_token, m.attempts, m.traceparent
from moved m"
);

/// The wake of ordered keys (docs/architecture.md, "Ordered legs"): each
/// key's first open leg, when it is a leg that waited behind the key
/// (class `ordered`, not due), becomes due now, and the same pass's
/// [`schedule_due`] publishes it. Reads each ordered key's open legs in
/// claim order through their partial index. Run by every pass, so a wait
/// that raced with the end of the leg before it is woken by the next.
///
/// `materialized`: the heads are computed once, then each woken leg is
/// found by its key (inlined, a planner without statistics can evaluate
/// them again for every waiting leg); the rows are locked in key order
/// and `skip locked`, so the passes of several workers never deadlock
/// (a leg one of them is waking is woken once).
const WAKE: &str = concat!(
    "
with heads as materialized (
    select distinct on (source, destination, order_key)
           provider, source, hook_id, delivery_id, destination, status, last_error_class,
           next_attempt_at
    from deliveries
    where order_key is not null and status in ('processing', 'failed')
      and order_skipped_at is null
    order by source, destination, order_key, order_seq
), woken as (
    select d.ctid as row_id
    from heads h
    join deliveries d using (provider, source, hook_id, delivery_id, destination)
    where h.status = 'failed' and h.last_error_class = ",
    class!(ordered),
    " and h.next_attempt_at is null
    order by d.provider, d.source, d.hook_id, d.delivery_id, d.destination
    for update of d skip locked
)
update deliveries d
set next_attempt_at = now()
-- The rows by their addresses, as the fair wake's (`WAKE_FAIR`).
where d.ctid = any(array(select row_id from woken))
  and d.status = 'failed' and d.retryable and d.last_error_class = ",
    class!(ordered),
    "
  and d.next_attempt_at is null"
);

/// Makes each ordered key's first open leg due when it waited behind the
/// key (see [`WAKE`]); returns how many it woke.
pub async fn wake_ordered(client: &impl Session) -> Result<u64, DbError> {
    sql::execute(client, WAKE, &[]).await
}

/// The end of [`NEXT_OF_KEY`] and [`NEXT_FAIR`]: the leg a CTE named
/// `head` found (at most one row, its `ctid` as `row_id`), still waiting
/// with class `$class`, moved to `processing` under a new token (lease
/// `$6` seconds) while its destination is closed, and returned to publish.
macro_rules! release_head {
    ($class:literal) => {
        concat!(
            "moved as (
    update deliveries d
    set ",
            to_processing!("$6"),
            "
    -- The row by its address: a join on the key was planned, when the
    -- table was small, as a scan of every waiting leg.
    where d.ctid = (select row_id from head)
      -- Judged on the row, not on `head`'s snapshot: a wait that is
      -- committing as this runs holds the row, and the update sees the
      -- row it committed, waiting.
      and d.status = 'failed' and d.retryable and d.last_error_class = '",
            $class,
            "'
      and not exists (select 1 from destinations x
                      where x.source = d.source and x.name = d.destination
                        and x.state <> 'closed')
    returning d.provider, d.source, d.hook_id, d.delivery_id, d.destination, d.event,
              d.action, d.claim_token, d.attempts, d.traceparent
)
select * from moved"
        )
    };
}

/// The next leg of the key of the ordered leg `$1`–`$5`, which just
/// completed: its key's first open leg, if it waited behind the key, moved
/// to `processing` under a new token (its destination closed), with its
/// key to publish. One statement on that key's legs alone.
const NEXT_OF_KEY: &str = concat!(
    "
with done as (
    select source, destination, order_key from deliveries
    where ",
    key!(),
    " and order_key is not null
), head as (
    select d.ctid as row_id
    from done k
    join deliveries d
      on d.source = k.source and d.destination = k.destination and d.order_key = k.order_key
    where d.order_key is not null and d.status in ('processing', 'failed')
      and d.order_skipped_at is null
    order by d.order_seq
    limit 1
), ",
    release_head!("ordered")
);

/// After an ordered leg `key` completed: moves its key's next leg, if it
/// waited, to `processing` and returns it for the caller to publish (and
/// to put back with [`reschedule`] if the publish fails), so a busy key
/// goes on at once instead of at the scheduler's next pass, which remains
/// the way back for any leg this misses.
pub async fn next_of_key(
    client: &impl Session,
    policy: &Policy,
    key: &LegKey,
) -> Result<Option<Result<Republish, Unreadable>>, DbError> {
    release(client, policy, key, NEXT_OF_KEY).await
}

/// The wake of fair destinations' waiting legs (docs/architecture.md,
/// "Fairness"): per installation with legs waiting (class `fair`), its
/// oldest become due now, as many as its hold has room for beside its
/// legs queued and its round beside its legs queued and running
/// (`fair_limits!`, `installation_load!`, `installation_running!`; a leg woken
/// before and not yet published takes its place), each unless it would
/// only yield again (the take's own gate, `yields!`); the same pass's [`schedule_due`]
/// publishes it. The way back for a leg whose installation's legs all
/// ended without releasing it ([`next_fair`] is the fast way). Returns
/// the destinations that have legs waiting, so the workers know to
/// release them as legs end. `materialized` and `skip locked` as
/// [`WAKE`].
const WAKE_FAIR: &str = concat!(
    "
with heads as materialized (
    select provider, source, hook_id, delivery_id, destination, fair_key, fair_cap, fair_hard,
           row_number() over (partition by source, destination, fair_key order by failed_at)
               as place
    from deliveries
    where fair_key is not null and status = 'failed' and last_error_class = ",
    class!(fair),
    "
), room as materialized (
    -- Each waiting installation's room under its hold, counted once: a
    -- release that never came (its worker died, or did not know legs
    -- waited) is made up for in one pass, not one leg a pass.
    select h.source, h.destination, h.fair_key,
           (select least(x.hold - ",
    installation_load!("h", "x.hold"),
    ", x.round - ",
    installation_load!("h", "x.round"),
    " - ",
    installation_running!("h", "greatest(x.round, "),
    ") from ",
    fair_limits!("h"),
    " x) as room
    from heads h
    where h.place = 1
), woken as (
    select d.ctid as row_id
    from heads h
    join room r using (source, destination, fair_key)
    join deliveries d using (provider, source, hook_id, delivery_id, destination)
    where h.place <= r.room and d.next_attempt_at is null and not ",
    yields!("d"),
    "
    order by d.provider, d.source, d.hook_id, d.delivery_id, d.destination
    for update of d skip locked
), moved as (
    update deliveries d
    set next_attempt_at = now()
    -- The rows by their addresses: a join on the key was planned as a
    -- scan of every due leg.
    where d.ctid = any(array(select row_id from woken))
      and d.status = 'failed' and d.retryable and d.last_error_class = ",
    class!(fair),
    "
      and d.next_attempt_at is null
)
select distinct source, destination from heads"
);

/// Makes each fair destination's waiting installations' oldest legs due
/// when their turn has come (see [`WAKE_FAIR`]); returns the destinations,
/// as `(source, destination)`, that had legs waiting.
pub async fn wake_fair(client: &impl Session) -> Result<Vec<(String, String)>, DbError> {
    // Planned afresh: the set of waiting legs grows from none to a flood.
    let rows = sql::query_replanned(client, WAKE_FAIR).await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The next leg of the installation of the fair leg `$1`–`$5`, which just
/// ended, unless the installation still has its hold queued
/// (`crowded!`): its oldest leg waiting for its turn, moved to `processing` under
/// a new token (its destination closed), to publish.
/// One statement on that installation's waiting legs alone.
const NEXT_FAIR: &str = concat!(
    "
with done as (
    select source, destination, fair_key, fair_cap, fair_hard from deliveries
    where ",
    key!(),
    " and fair_key is not null
), head as (
    -- Not while the installation still has its hold queued
    -- (claims and releases that counted at the same moment went over it):
    -- the next of its legs to end releases it instead.
    select w.row_id
    from done k
    -- The installation's oldest waiting leg, read in the order of its
    -- index (migration 17): a join was planned, when the table was small,
    -- as a sort of every waiting leg of the destination.
    cross join lateral (
        select d.ctid as row_id from deliveries d
        where d.source = k.source and d.destination = k.destination and d.fair_key = k.fair_key
          and d.fair_key is not null and d.status = 'failed' and d.last_error_class = ",
    class!(fair),
    "
        order by d.failed_at
        limit 1
        for update of d skip locked
    ) w
    where not ",
    crowded!("k"),
    "
), ",
    release_head!("fair")
);

/// After a fair leg `key` ended (completed, failed or due to retry): moves
/// its installation's oldest waiting leg, if any, to `processing` and
/// returns it for the caller to publish (and to put back with
/// [`reschedule`] if the publish fails): the slot it freed is its own
/// installation's. The scheduler's [`wake_fair`] is the way back for any
/// leg this misses.
pub async fn next_fair(
    client: &impl Session,
    policy: &Policy,
    key: &LegKey,
) -> Result<Option<Result<Republish, Unreadable>>, DbError> {
    release(client, policy, key, NEXT_FAIR).await
}

/// Runs [`NEXT_OF_KEY`] or [`NEXT_FAIR`] for the leg `key` that ended.
async fn release(
    client: &impl Session,
    policy: &Policy,
    key: &LegKey,
    statement: &str,
) -> Result<Option<Result<Republish, Unreadable>>, DbError> {
    let row = super::query_opt(client, statement, key, &[&secs(policy.lease)]).await?;
    Ok(row.as_ref().map(republish))
}

/// Picks the probes that are due (see [`PROBE`]); the caller publishes
/// each like a scheduled retry.
pub async fn probe_due(
    client: &impl Session,
    policy: &Policy,
) -> Result<Vec<Result<Republish, Unreadable>>, DbError> {
    let rows = sql::query(client, PROBE, &[&secs(policy.lease)]).await?;
    Ok(rows.iter().map(republish).collect())
}

/// The retry scheduler's pick: moves up to `limit` due retries back to
/// `processing` under new tokens, in one compare-and-set. `skip locked`
/// lets every worker run the scheduler without two picking one row, and
/// `next_attempt_at <= now()` (the database clock) means a retry is never
/// early. The caller publishes each (its key: the take reads the body), puts it back
/// with [`reschedule`] if the publish fails, and dead-letters a row that
/// cannot become a job with [`dead_letter_unreadable`].
pub async fn schedule_due(
    client: &impl Session,
    policy: &Policy,
    limit: i64,
) -> Result<Vec<Result<Republish, Unreadable>>, DbError> {
    let rows = sql::query(
        client,
        SCHEDULE,
        &[&policy.max_attempts, &limit, &secs(policy.lease)],
    )
    .await?;
    Ok(rows.iter().map(republish).collect())
}

const RESCHEDULE: &str = concat!(
    "
update deliveries
set status = 'failed', retryable = true,
    next_attempt_at = now() + make_interval(secs => $7),
    last_error_class = ",
    class!(publish),
    ", last_error = $8
where ",
    key!(),
    " and ",
    held_by!("$6")
);

/// Puts a scheduled retry back as due after `delay`, because its publish
/// failed. Token-guarded: if a worker already took it (the confirm was
/// lost, not the message), nothing changes.
pub async fn reschedule(
    client: &impl Session,
    key: &LegKey,
    token: ClaimToken,
    delay: Duration,
    error: &str,
) -> Result<bool, DbError> {
    let n = execute(
        client,
        RESCHEDULE,
        key,
        &[&token.0, &secs(delay), &redact(error)],
    )
    .await?;
    Ok(n == 1)
}

const EXHAUST: &str = concat!(
    "
update deliveries
set retryable = false, last_error_class = ",
    class!(max_attempts),
    ",
    last_error = 'attempts exhausted', failed_at = now()
where ctid in (
    select ctid from deliveries
    where status = 'failed' and retryable and next_attempt_at <= now()
      and attempts >= coalesce(max_attempts, $1)
    limit $2
    for update skip locked
)"
);

/// Dead-letters due retries that already used every attempt (a `lost`
/// claim can reach that state), so they do not wait forever. Their
/// dead-letter copies follow from [`needing_copy`].
pub async fn exhaust_due(
    client: &impl Session,
    policy: &Policy,
    limit: i64,
) -> Result<u64, DbError> {
    sql::execute(client, EXHAUST, &[&policy.max_attempts, &limit]).await
}

const NEEDING_COPY: &str = "
select d.provider, d.source, d.hook_id, d.delivery_id, d.destination, d.event, d.action,
       d.claim_token, d.attempts
from deliveries d
where d.status = 'failed' and not d.retryable and d.dead_lettered_at is null
  and d.failed_at < now() - make_interval(secs => $1)
order by d.failed_at
limit $2";

/// Dead letters whose broker copy was never confirmed (a worker died
/// between the failure and the copy, or the copy was purged from the
/// queue), older than `grace` so that a worker still busy with the copy is
/// left alone. A row that cannot become a job comes back as
/// [`Unreadable`].
pub async fn needing_copy(
    client: &impl Session,
    grace: Duration,
    limit: i64,
) -> Result<Vec<Result<Republish, Unreadable>>, DbError> {
    let rows = sql::query(client, NEEDING_COPY, &[&secs(grace), &limit]).await?;
    Ok(rows.iter().map(republish).collect())
}

/// Addressed by the key as stored (its parts may not parse), fenced by the
/// token the row was read with.
const DEAD_LETTER_UNREADABLE: &str = concat!(
    "
update deliveries
set status = 'failed', retryable = false, next_attempt_at = null,
    failed_at = now(), first_failed_at = coalesce(first_failed_at, now()),
    dead_lettered_at = now(), last_error_class = ",
    class!(permanent),
    ", last_error = $7
where ",
    key!(),
    " and claim_token = $6"
);

/// Dead-letters a row that cannot become a job (see [`Unreadable`]):
/// failed for good, class `permanent`, with the reason. No broker copy can
/// be built from it, so it is marked as copied; operators find it with
/// `dlq list` and Postgres keeps its body. Returns
/// whether the row was still the one read.
pub async fn dead_letter_unreadable(
    client: &impl Session,
    row: &Unreadable,
) -> Result<bool, DbError> {
    let [provider, source, hook_id, delivery_id, destination] = &*row.parts;
    let message = redact(&format!("the row cannot be read as a job: {}", row.reason));
    let n = sql::execute(
        client,
        DEAD_LETTER_UNREADABLE,
        &[
            provider,
            source,
            hook_id,
            delivery_id,
            destination,
            &row.token.0,
            &message,
        ],
    )
    .await?;
    Ok(n == 1)
}

const REAP: &str = concat!(
    "
update deliveries
set status = 'failed', retryable = true, next_attempt_at = now(),
    failed_at = now(), first_failed_at = coalesce(first_failed_at, now()),
    last_error_class = ",
    class!(lost),
    ",
    last_error = 'lease expired long ago: the holder is presumed dead'
where ctid in (
    select ctid from deliveries d
    where d.status = 'processing' and d.lease_until < now() - make_interval(secs => $1)
      and not ",
    waits_for_its_destination!("d"),
    "
    limit $2
    for update skip locked
)"
);

/// The reaper: claims whose lease expired more than `after` ago (ingest may
/// have died between the claim and the publish, the broker lost the
/// message, or every worker was down) become failed, retryable, class
/// `lost`, due now, keeping their token. Any message of the delivery still
/// in the queue takes it (the token may be a dead worker's, which no
/// message carries); otherwise the scheduler publishes it again from the
/// body the claim wrote, whatever GitHub's log says (a leg without a body,
/// claimed before bodies were written, waits for a redelivery instead). An untaken leg of a destination that takes no legs
/// now is left alone: its message waits in the destination's queue (see
/// `waits_for_its_destination!`).
pub async fn reap(client: &impl Session, after: Duration, limit: i64) -> Result<u64, DbError> {
    sql::execute(client, REAP, &[&secs(after), &limit]).await
}
