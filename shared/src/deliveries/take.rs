//! The worker's hold on a leg: the take (one message, or a batch of them by
//! group commit) behind the breaker's gate, the hold of a gated leg, the
//! lease renewal, the fence before a database effect, and the early
//! release on shutdown.

use std::collections::HashMap;
use std::time::Duration;

use crate::postgres::sql::{self, Session};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::bodies::Stored;
use super::row::{KeyColumns, KeyTuple, firsts_by_key, key_tuple, status_of};
use super::{Policy, Status, execute, params, query_opt, secs};
use crate::key::{ClaimToken, LegKey};
use crate::postgres::DbError;

/// What a worker's take decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Take {
    /// The worker holds the delivery under `token` and may run the effect.
    Taken {
        /// The worker's fencing token.
        token: ClaimToken,
        /// This take's number, starting at 1.
        attempts: i32,
        /// True when the take replaced a holder whose lease had expired.
        takeover: bool,
        /// When the delivery was first claimed (for end-to-end timing).
        created_at: DateTime<Utc>,
        /// Whether this leg is its destination's probe: its result closes
        /// the breaker or opens it again.
        probe: bool,
        /// How long it waited behind an earlier leg of its key, when it
        /// did (by the database clock).
        waited: Option<Duration>,
        /// Operator replays of the leg so far.
        replays: i32,
        /// Its delivery's body, read with the row; `None` when Postgres
        /// holds none (a leg claimed before the claim wrote bodies: its
        /// message may carry it).
        body: Option<Stored>,
    },
    /// Attempts were exhausted: the delivery is now failed, class `poison`,
    /// and it must be dead-lettered without running the effect.
    Poisoned {
        /// How many takes it had.
        attempts: i32,
    },
    /// Another holder's lease is live: this message is a deferred copy.
    Deferred {
        /// Time left on that lease, by the database clock.
        lease_left: Duration,
    },
    /// Its destination is not taking legs (breaker open, paused or
    /// disabled): the leg is now held, failed and retryable with class
    /// `held`, its attempts kept. Ack it; the scheduler publishes it once
    /// the destination is closed again.
    Held,
    /// An earlier leg of its ordered key is still open: the leg now waits,
    /// failed and retryable with class `ordered`, not due, its attempts
    /// kept. Ack it; the scheduler makes it due once it is its key's first
    /// open leg.
    Waiting,
    /// Nothing to do for this message: the delivery is completed, failed,
    /// or no longer exists. Ack it.
    Resolved(Option<Status>),
}

/// Whether the leg `$t`, presenting `$presented`, is its destination's
/// probe.
macro_rules! is_probe {
    ($t:literal, $presented:literal) => {
        concat!(
            "exists (select 1 from destinations x where x.source = ",
            $t,
            ".source and x.name = ",
            $t,
            ".destination and x.probe_token = ",
            $presented,
            ")"
        )
    };
}

/// The breaker's gate on a leg `$t` presenting `$presented`: its
/// destination's row says it takes no legs (not `closed`), and this leg is
/// not its probe. A destination without a row (legs from before
/// destinations, `store` without a breaker) is never gated.
macro_rules! gated {
    ($t:literal, $presented:literal) => {
        concat!(
            "exists (select 1 from destinations x where x.source = ",
            $t,
            ".source and x.name = ",
            $t,
            ".destination and x.state <> 'closed' and x.probe_token is distinct from ",
            $presented,
            ")"
        )
    };
}

/// The seconds a leg `$t` waited behind its key (`failed_at` is when its
/// wait began), or null for a leg that did not wait.
macro_rules! waited {
    ($t:literal) => {
        concat!(
            "case when ",
            $t,
            ".last_error_class = ",
            class!(ordered),
            " then greatest(extract(epoch from now() - ",
            $t,
            ".failed_at), 0)::float8 end"
        )
    };
}

/// The body of the leg a CTE named `taken` returned (its delivery's key
/// and `created_at`), beside the take's own columns: one partition of
/// `bodies`, found at run time.
macro_rules! with_body {
    ($columns:literal) => {
        concat!(
            "
select ",
            $columns,
            ", b.content_type, b.headers, b.size, b.encoding, b.body
from taken t
left join bodies b
  on b.provider = t.provider and b.source = t.source and b.hook_id = t.hook_id
 and b.delivery_id = t.delivery_id and b.received_at = t.created_at"
        )
    };
}

const TAKE: &str = concat!(
    "
with prev as (
    select claim_token from deliveries
    where ",
    key!(),
    "
    for update
), taken as (
update deliveries d
set status = 'processing', retryable = false, next_attempt_at = null,
    claim_token = $7, lease_until = now() + make_interval(secs => $8),
    attempts = d.attempts + 1, max_attempts = $9
from prev
where ",
    key!("d"),
    "
  and d.attempts < $9
  and ",
    takeable!("d", "$6"),
    "
  and not ",
    gated!("d", "$6"),
    "
  and not ",
    behind!("d"),
    "
  and not ",
    yields!("d"),
    "
returning d.provider, d.source, d.hook_id, d.delivery_id, d.attempts,
          prev.claim_token <> $6 and d.last_error_class is distinct from ",
    class!(lost),
    " as takeover,
          d.created_at, ",
    is_probe!("d", "$6"),
    " as probe, ",
    waited!("d"),
    " as waited, d.replays
)",
    with_body!("t.attempts, t.takeover, t.created_at, t.probe, t.waited, t.replays")
);

const POISON: &str = concat!(
    "
update deliveries
set status = 'failed', retryable = false, failed_at = now(),
    first_failed_at = coalesce(first_failed_at, now()),
    last_error_class = ",
    class!(poison),
    ",
    last_error = 'attempts exhausted: the job crashed or hung its worker on every attempt'
where ",
    key!(),
    "
  and attempts >= $7
  and ",
    takeable!("$6"),
    "
returning attempts"
);

/// A leg the gate turned away, while it is ours to take: held, no attempt
/// spent, due now (the scheduler publishes it once its destination is
/// closed again), in one statement: a change of state, the body stays
/// where the claim wrote it.
const HOLD: &str = concat!(
    "
update deliveries d
set status = 'failed', retryable = true, next_attempt_at = now(),
    failed_at = now(), first_failed_at = coalesce(first_failed_at, now()),
    last_error_class = ",
    class!(held),
    ",
    last_error = 'held: its destination is ' || (
        select x.state from destinations x
        where x.source = d.source and x.name = d.destination)
where ",
    key!("d"),
    "
  and ",
    takeable!("d", "$6"),
    "
  and ",
    gated!("d", "$6"),
    "
returning 1"
);

/// A leg behind an open leg of its key, or one that yields its
/// installation's turn on a fair destination, while it is ours to take:
/// waits, failed and retryable with class `ordered` (or `fair`), not due
/// (`next_attempt_at` null: the scheduler's wake makes it due when it is
/// its key's first open leg, or its installation's turn), no attempt
/// spent, in one statement: a change of state, the body stays where the
/// claim wrote it.
const WAIT: &str = concat!(
    "
update deliveries d
set status = 'failed', retryable = true, next_attempt_at = null,
    -- A fair leg that yields again keeps the start of its first wait:
    -- its installation's releases go oldest first, so it is not sent
    -- to the back each time a fresh leg took the turn it was given.
    failed_at = case when d.order_key is null and d.last_error_class = ",
    class!(fair),
    "
                     then coalesce(d.failed_at, now()) else now() end,
    last_error_class = case when d.order_key is not null then ",
    class!(ordered),
    " else ",
    class!(fair),
    " end,
    last_error = case when d.order_key is not null
                      then 'waiting for an earlier leg of its key'
                      else 'waiting: its installation has its share of legs in flight' end
where ",
    key!("d"),
    "
  and ",
    takeable!("d", "$6"),
    "
  and (",
    behind!("d"),
    " or ",
    yields!("d"),
    ")
returning 1"
);

const TAKE_STATE: &str = concat!(
    "
select status, greatest(extract(epoch from lease_until - now()), 0)::float8,
       claim_token = $6, status = 'failed' and last_error_class = ",
    class!(lost),
    "
from deliveries
where ",
    key!()
);

/// Takes a leg for a worker, presenting the token its message carries;
/// `max_attempts` is the leg's own bound (its destination's schedule), and
/// the take records it on the row.
///
/// The take installs a new token and counts the attempt *before* the effect
/// runs: a job that crashes its worker every time still reaches
/// `max_attempts`, and is then failed as `poison` instead of run again. It
/// also passes the breaker's gate: a leg whose destination takes no legs
/// now is held instead ([`Take::Held`]), without spending an attempt, and
/// the order gate: a leg behind an open leg of its ordered key waits
/// ([`Take::Waiting`]), without spending one either.
pub async fn take(
    client: &impl Session,
    policy: &Policy,
    key: &LegKey,
    presented: ClaimToken,
    max_attempts: i32,
) -> Result<Take, DbError> {
    loop {
        let token = ClaimToken::new();
        let lease = secs(policy.lease);
        if let Some(row) = sql::query_opt(
            client,
            TAKE,
            &params(key, &[&presented.0, &token.0, &lease, &max_attempts]),
        )
        .await?
        {
            return Ok(Take::Taken {
                token,
                attempts: row.get(0),
                takeover: row.get(1),
                created_at: row.get(2),
                probe: row.get(3),
                waited: seconds(row.get(4)),
                replays: row.get(5),
                body: Stored::from_row(&row),
            });
        }
        if let Some(row) =
            sql::query_opt(client, POISON, &params(key, &[&presented.0, &max_attempts])).await?
        {
            return Ok(Take::Poisoned {
                attempts: row.get(0),
            });
        }
        // Order before the breaker: a leg behind its key waits for its
        // key whatever its destination's state; only a key's first leg is
        // held, and it is the one the scheduler brings back.
        if sql::query_opt(client, WAIT, &params(key, &[&presented.0]))
            .await?
            .is_some()
        {
            return Ok(Take::Waiting);
        }
        if sql::query_opt(client, HOLD, &params(key, &[&presented.0]))
            .await?
            .is_some()
        {
            return Ok(Take::Held);
        }
        let Some(row) = sql::query_opt(client, TAKE_STATE, &params(key, &[&presented.0])).await?
        else {
            return Ok(Take::Resolved(None));
        };
        let status = status_of(row.get(0))?;
        let left: f64 = row.get::<_, Option<f64>>(1).unwrap_or(0.0);
        let ours = row.get::<_, Option<bool>>(2).unwrap_or(false);
        let lost = row.get::<_, Option<bool>>(3).unwrap_or(false);
        match status {
            // Still takeable (a claim the reaper marked lost): the gates
            // of the take and of the wait read the installation's or the
            // key's other legs, which changed between the two statements
            // (the take saw the leg yield, the wait no longer did). Try
            // again; answering it resolved would ack its only message and
            // leave the leg with no way out.
            Status::Failed if lost => continue,
            // Still our own claim: the statements above raced with a
            // change they depend on (the leg before it in its key ended
            // between the take and the wait, say). Try again at once.
            Status::Processing if ours => continue,
            Status::Processing if left > 0.0 => {
                return Ok(Take::Deferred {
                    lease_left: Duration::from_secs_f64(left),
                });
            }
            // The lease expired between the statements: try the take again.
            Status::Processing => continue,
            other => return Ok(Take::Resolved(Some(other))),
        }
    }
}

const TAKE_BATCH: &str = concat!(
    "
with input as (
    select * from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::uuid[], $7::uuid[], $8::int4[])
        as i(provider, source, hook_id, delivery_id, destination, presented, token,
             max_attempts)
), prev as (
    select d.provider, d.source, d.hook_id, d.delivery_id, d.destination,
           d.claim_token as prev_token
    from deliveries d join input i using (provider, source, hook_id, delivery_id, destination)
    order by d.provider, d.source, d.hook_id, d.delivery_id, d.destination
    for update of d
), taken as (
update deliveries d
set status = 'processing', retryable = false, next_attempt_at = null,
    claim_token = i.token, lease_until = now() + make_interval(secs => $9),
    attempts = d.attempts + 1, max_attempts = i.max_attempts
from input i join prev p using (provider, source, hook_id, delivery_id, destination)
where d.provider = i.provider and d.source = i.source and d.hook_id = i.hook_id
  and d.delivery_id = i.delivery_id and d.destination = i.destination
  and d.attempts < i.max_attempts
  and ",
    takeable!("d", "i.presented"),
    "
  and not ",
    gated!("d", "i.presented"),
    "
  and not ",
    behind!("d"),
    "
  and not ",
    yields!("d"),
    "
returning d.provider, d.source, d.hook_id, d.delivery_id, d.destination, d.attempts,
          p.prev_token <> i.presented and d.last_error_class is distinct from ",
    class!(lost),
    "
              as takeover,
          d.created_at, ",
    is_probe!("d", "i.presented"),
    " as probe, ",
    waited!("d"),
    " as waited, d.replays
)",
    with_body!(
        "t.provider, t.source, t.hook_id, t.delivery_id, t.destination, t.attempts, t.takeover, \
         t.created_at, t.probe, t.waited, t.replays"
    )
);

/// One take of a [`take_batch`]: the leg, the token its message presents,
/// and the leg's own bound on attempts.
#[derive(Clone, Debug)]
pub struct Taking {
    /// The leg.
    pub key: LegKey,
    /// The token its message carries.
    pub presented: ClaimToken,
    /// Takes the leg may have in all.
    pub max_attempts: i32,
}

/// Group commit of takes: the common case of [`take`] (the leg can be
/// taken) for many messages in one statement. Each answer is
/// `Some(Take::Taken)` exactly when [`take`] would have taken it, under the
/// same compare-and-set (the message's token, or an expired lease, or a
/// `lost` row, attempts left, and the breaker's gate open); `None` means
/// "not taken here", and the caller runs [`take`] for that message, which
/// decides the rarer outcomes (poison, held, deferred, resolved).
///
/// Rows are locked in key order, so concurrent batches cannot deadlock; a
/// key that appears twice takes part once (one statement cannot update a
/// row twice), and its repeats answer `None`.
pub async fn take_batch(
    client: &impl Session,
    policy: &Policy,
    items: &[Taking],
) -> Result<Vec<Option<Take>>, DbError> {
    let firsts = firsts_by_key(items.iter().map(|t| &t.key));
    let tokens: HashMap<usize, ClaimToken> =
        firsts.values().map(|&i| (i, ClaimToken::new())).collect();
    let keys = KeyColumns::of(firsts.keys().copied());
    let presented: Vec<Uuid> = firsts.values().map(|&i| items[i].presented.0).collect();
    let new_tokens: Vec<Uuid> = firsts.values().map(|i| tokens[i].0).collect();
    let max_attempts: Vec<i32> = firsts.values().map(|&i| items[i].max_attempts).collect();
    let rows = sql::query_planned(
        client,
        TAKE_BATCH,
        &keys.params(&[&presented, &new_tokens, &max_attempts, &secs(policy.lease)]),
    )
    .await?;
    let mut taken: HashMap<KeyTuple, TakenRow> = rows
        .iter()
        .map(|r| {
            (
                (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)),
                (
                    r.get(5),
                    r.get(6),
                    r.get(7),
                    r.get(8),
                    r.get(9),
                    r.get(10),
                    Stored::from_row(r),
                ),
            )
        })
        .collect();
    // Only the position that took part in the statement answers for its
    // key; a repeat of it in the same batch was not taken.
    Ok(items
        .iter()
        .enumerate()
        .map(|(i, Taking { key, .. })| {
            if firsts.get(key) != Some(&i) {
                return None;
            }
            let (attempts, takeover, created_at, probe, waited, replays, body) =
                taken.remove(&key_tuple(key))?;
            Some(Take::Taken {
                token: tokens[&i],
                attempts,
                takeover,
                created_at,
                probe,
                waited: seconds(waited),
                replays,
                body,
            })
        })
        .collect())
}

/// What [`TAKE_BATCH`] returns of a leg it took: attempts, takeover,
/// created at, probe, the seconds it waited behind its key, replays, and
/// its delivery's body.
type TakenRow = (
    i32,
    bool,
    DateTime<Utc>,
    bool,
    Option<f64>,
    i32,
    Option<Stored>,
);

/// A wait in seconds, as read back (never negative, never NaN).
fn seconds(value: Option<f64>) -> Option<Duration> {
    value.and_then(|s| Duration::try_from_secs_f64(s).ok())
}

const RENEW: &str = concat!(
    "
update deliveries set lease_until = now() + make_interval(secs => $7)
where ",
    key!(),
    " and ",
    held_by!("$6")
);

/// Extends the holder's lease. Guarded by the token: a worker that lost its
/// claim cannot renew it back. Returns false when the token is gone.
pub async fn renew(
    client: &impl Session,
    policy: &Policy,
    key: &LegKey,
    token: ClaimToken,
) -> Result<bool, DbError> {
    let n = execute(client, RENEW, key, &[&token.0, &secs(policy.lease)]).await?;
    Ok(n == 1)
}

const FENCE: &str = concat!(
    "
select 1 from deliveries
where ",
    key!(),
    " and ",
    held_by!("$6"),
    "
for update"
);

/// Inside the completing transaction, before any effect: locks the row if
/// and only if `token` still holds it. While the lock is held nobody can
/// take the delivery over, so the completion that follows cannot be fenced
/// after the effect already ran. Returns false when fenced.
pub async fn fence(
    client: &impl Session,
    key: &LegKey,
    token: ClaimToken,
) -> Result<bool, DbError> {
    let row = query_opt(client, FENCE, key, &[&token.0]).await?;
    Ok(row.is_some())
}

const RELEASE_LEASE: &str = concat!(
    "
update deliveries set lease_until = now()
where ",
    key!(),
    " and ",
    held_by!("$6")
);

/// On shutdown, before the effect: ends the holder's lease now so that the
/// requeued message is taken at once by another worker instead of waiting
/// for the lease to run out. Token-guarded like every write.
pub async fn release_lease(
    client: &impl Session,
    key: &LegKey,
    token: ClaimToken,
) -> Result<bool, DbError> {
    let n = execute(client, RELEASE_LEASE, key, &[&token.0]).await?;
    Ok(n == 1)
}
