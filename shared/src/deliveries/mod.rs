//! The delivery state machine: one module, one function per transition,
//! each next to the single SQL statement that decides it. This file is the
//! map; the transitions live in one file per caller:
//!
//! | file | caller | transitions |
//! |---|---|---|
//! | [`claim`](self::claim) | ingest | `claim`, `claim_batch` (a delivery's legs and its body; `_linked`: with the traces its request links to), `publish_failed`, `hold_fair` |
//! | [`take`](self::take) | worker | `take` (and the hold of a gated leg), `take_batch`, `renew`, `fence`, `release_lease` |
//! | [`complete`](self::complete) | worker | `complete`, `complete_batch`, `complete_stale`, `store_event`, `fail`, `mark_dead_lettered` |
//! | [`schedule`](self::schedule) | scheduler, reaper, worker | `wake_ordered`, `next_of_key`, `wake_fair`, `next_fair`, `schedule_due`, `probe_due`, `reschedule`, `exhaust_due`, `needing_copy`, `dead_letter_unreadable`, `reap` |
//! | [`retention`](self::retention) | sweeper, operators | `sweep`, `purge` |
//! | [`delivery`](self::delivery) | every caller | `Delivery`, `DeadLetter`, `get` (reads only) |
//! | [`state`](self::state) | operators, the sampler | `State`: the operator's words for a row, `of` a row and `predicate` for a statement |
//! | [`admin`](self::admin) | operators | `find`, `stored_payload`, `replay`, `unreplay` |
//! | [`reconcile`](self::reconcile) | the reconciler | `held` (reads only) |
//! | [`destinations`](self::destinations) | worker, operators | the breaker: `register`, `trip`, `close`, `disable`, `disable_stale`, `lock_destination` and `set_by_operator`; the attempt log: `log_attempts`, `window`, `leg_attempts` |
//! | [`filter`](self::filter) | operators | `list`, `list_page`, `count`, `purge_dead`: the one filter of the CLI and the console |
//! | [`ordering`](self::ordering) | operators, the sampler | `halted`, `skip` and `retry` (an ordered key's halting leg), `halted_counts` |
//! | [`overview`](self::overview) | operators, the sampler | `overview`: the console's counts and ages; `gauges`: the state gauges |
//!
//! [`bodies`] holds the record of each delivery's body (written by the
//! claim, read by the take, dropped by retention once every leg ended),
//! `row` reads rows back into nouns, and `group_commit` starts the
//! collectors that batch claims, body reads, takes and completions. Each batched statement sits beside the single one it
//! must agree with, and the guards they share are named once below.
//!
//! ```text
//!   —──claim──▶ processing(T0, attempts 0) ──take──▶ processing(T, attempts+1)
//!                    │  ▲                                │   │   │
//!         release    │  │ claim (lease expired,          │   │   └─fail──▶ failed(retryable?)
//!  (publish failed)  ▼  │ or failed+due)          complete   renew
//!                  failed ◀──────────────────────────────┘(same tx as the effect)
//! ```
//!
//! Rules every statement follows:
//! - Each transition is decided by one atomic statement (a compare-and-set);
//!   a read that follows only reports the state to the caller.
//! - Every write after the claim is guarded by the claim token, so a holder
//!   that lost its claim changes nothing (it is *fenced*).
//! - Every lease comparison uses the database clock, `now()`, never the
//!   caller's, so skewed hosts agree on who holds a lease.
//!
//! Every fence that addresses one delivery by its key compares
//! `status || ''` rather than `status` (`held_by!`, `reclaimable!`). The
//! planner may otherwise answer `status = 'processing'` from an index of
//! processing rows (the partial lease index, or the one led by `status`),
//! and such an index holds every row that was ever processing until a
//! vacuum (and behind a long transaction, past it): the statement would
//! then grow slower with history. The key is the only way in; the
//! reaper, which wants the lease index, keeps the plain comparison, and so
//! does the take (`takeable!`), whose row is locked by key first.
//! `tests/it/plans.rs` checks this for the hot path.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::types::ToSql;

use crate::key::LegKey;
use crate::postgres::DbError;
use crate::postgres::sql::{self, Session};

/// An error class's stored name as an SQL literal (`class!(fair)` is
/// `'fair'`): the one SQL spelling of each [`ErrorClass`], checked
/// against [`ErrorClass::as_str`] by a test.
macro_rules! class {
    (transient) => {
        "'transient'"
    };
    (permanent) => {
        "'permanent'"
    };
    (timeout) => {
        "'timeout'"
    };
    (db) => {
        "'db'"
    };
    (poison) => {
        "'poison'"
    };
    (lost) => {
        "'lost'"
    };
    (max_attempts) => {
        "'max_attempts'"
    };
    (publish) => {
        "'publish'"
    };
    (held) => {
        "'held'"
    };
    (deferred) => {
        "'deferred'"
    };
    (deferred_too_long) => {
        "'deferred_too_long'"
    };
    (ordered) => {
        "'ordered'"
    };
    (fair) => {
        "'fair'"
    };
    (stale) => {
        "'stale'"
    };
}

/// The key predicate of one leg: `$1`–`$5` of every keyed statement (the
/// delivery's four parts and the destination), optionally on a table
/// alias (`key!("d")`).
macro_rules! key {
    () => {
        "provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4 and destination = $5"
    };
    ($t:literal) => {
        concat!(
            $t,
            ".provider = $1 and ",
            $t,
            ".source = $2 and ",
            $t,
            ".hook_id = $3 and ",
            $t,
            ".delivery_id = $4 and ",
            $t,
            ".destination = $5"
        )
    };
}

/// The delivery predicate: `$1`–`$4`, every leg of one delivery.
macro_rules! delivery_key {
    ($t:literal) => {
        concat!(
            $t,
            ".provider = $1 and ",
            $t,
            ".source = $2 and ",
            $t,
            ".hook_id = $3 and ",
            $t,
            ".delivery_id = $4"
        )
    };
}

/// The token fence: the row is still processing under `$token`. Compares
/// `status || ''` (see the module notes on plans).
macro_rules! held_by {
    ($token:literal) => {
        concat!("claim_token = ", $token, " and status || '' = 'processing'")
    };
    ($t:literal, $token:literal) => {
        concat!(
            $t,
            ".claim_token = ",
            $token,
            " and ",
            $t,
            ".status || '' = 'processing'"
        )
    };
}

/// What a claim may take over of a leg that exists (`$max` the attempts
/// allowed when the leg records none): a processing claim whose lease
/// expired, or a retryable failure that is due with attempts left. Shared
/// by [`claim`] and [`claim_batch`]; the body is compared beside it.
/// Compares `status || ''` (see the module notes on plans): with the plain
/// comparison, a generic plan answered both arms from the partial indexes
/// of processing and of failed rows, walking every dead entry of a lease
/// run out since the last vacuum on each claim.
macro_rules! reclaimable {
    ($t:literal, $max:literal) => {
        concat!(
            "((",
            $t,
            ".status || '' = 'processing' and ",
            $t,
            ".lease_until < now()) or (",
            $t,
            ".status || '' = 'failed' and ",
            $t,
            ".retryable and ",
            $t,
            ".next_attempt_at <= now() and ",
            $t,
            ".attempts < coalesce(",
            $t,
            ".max_attempts, ",
            $max,
            ")))"
        )
    };
}

/// What a take (or the poison check) may take: the message's own claim
/// (`$presented`), a claim whose lease expired, or a claim the reaper
/// turned `lost`. Shared by [`take`], [`take_batch`] and the poison check.
macro_rules! takeable {
    ($presented:literal) => {
        concat!(
            "((status = 'processing' and (claim_token = ",
            $presented,
            " or lease_until < now())) or (status = 'failed' and last_error_class = ",
            class!(lost),
            "))"
        )
    };
    ($t:literal, $presented:literal) => {
        concat!(
            "((",
            $t,
            ".status = 'processing' and (",
            $t,
            ".claim_token = ",
            $presented,
            " or ",
            $t,
            ".lease_until < now())) or (",
            $t,
            ".status = 'failed' and ",
            $t,
            ".last_error_class = ",
            class!(lost),
            "))"
        )
    };
}

/// A leg back to `processing` under a new token, its lease from `$lease`
/// seconds: the claim's reclaim, the scheduler's pick, the probe, the
/// publish of a key's next leg, and a replay (with its own extra columns)
/// all set these columns so.
macro_rules! to_processing {
    ($lease:literal) => {
        concat!(
            "status = 'processing', retryable = false, claim_token = gen_random_uuid(),
    lease_until = now() + make_interval(secs => ",
            $lease,
            "), claimed_at = now(), next_attempt_at = null"
        )
    };
}

/// The advisory-lock key of the ordered key of a row `$t`: the claim
/// assigns a key's places holding it, and a replay that gives a leg a new
/// place takes the same lock, so both must compute it alike.
macro_rules! order_lock {
    ($t:literal) => {
        concat!(
            "hashtextextended(",
            $t,
            ".source || '/' || ",
            $t,
            ".destination || '/' || ",
            $t,
            ".order_key, 0)"
        )
    };
}

/// The order gate on a leg `$t` (docs/architecture.md, "Ordered legs"):
/// its destination is ordered and an earlier leg of its key, by claim
/// order, is still open: processing, failed and retryable, or failed for
/// good and not skipped (it halts the key). Such a leg may not be taken,
/// so per key only the first open leg runs. Shared by [`take`],
/// [`take_batch`] and the wait of a leg behind its key.
macro_rules! behind {
    ($t:literal) => {
        concat!(
            "(",
            $t,
            ".order_key is not null and exists (select 1 from deliveries o where o.source = ",
            $t,
            ".source and o.destination = ",
            $t,
            ".destination and o.order_key = ",
            $t,
            ".order_key and o.order_seq < ",
            $t,
            ".order_seq and o.order_key is not null and o.status in ('processing', 'failed') \
             and o.order_skipped_at is null))"
        )
    };
}

/// The legs `f` of the fair leg `$t`'s installation at its destination
/// that are still `processing` (queued or running): what the take's gate
/// and the claim's hold count.
macro_rules! installation_processing {
    ($t:literal) => {
        concat!(
            "f.source = ",
            $t,
            ".source and f.destination = ",
            $t,
            ".destination and f.fair_key = ",
            $t,
            ".fair_key and f.fair_key is not null and f.status = 'processing'"
        )
    };
}

/// The fairness gate on a leg `$t` (docs/architecture.md, "Fairness"): its
/// destination is fair, its installation already has `fair_cap` legs in
/// flight (taken, or published again for a retry) besides this one, and
/// another installation's leg is waiting for its take (or the cap is
/// hard: an explicit `per_key_concurrency`). Such a leg yields: it waits
/// in Postgres until one of its installation's legs ends, and the legs of
/// installations under their share go first. Without a hard cap a lone
/// installation is never held back. Shared by [`take`], [`take_batch`],
/// the one-statement completions, the wait and the scheduler's wake.
/// Each part reads one partial index of migration 17.
macro_rules! yields {
    ($t:literal) => {
        concat!(
            "(",
            $t,
            ".fair_key is not null and (select count(*) from (select 1 from deliveries f \
             where ",
            installation_processing!($t),
            " and f.attempts > 0 and f.ctid <> ",
            $t,
            ".ctid limit ",
            $t,
            ".fair_cap) r) >= ",
            $t,
            ".fair_cap and (",
            $t,
            ".fair_hard or exists (select 1 from deliveries q where q.source = ",
            $t,
            ".source and q.destination = ",
            $t,
            ".destination and q.fair_key is not null and q.status = 'processing' \
             and q.attempts = 0 and q.fair_key < ",
            $t,
            ".fair_key) or exists (select 1 from deliveries q where q.source = ",
            $t,
            ".source and q.destination = ",
            $t,
            ".destination and q.fair_key is not null and q.status = 'processing' \
             and q.attempts = 0 and q.fair_key > ",
            $t,
            ".fair_key)))"
        )
    };
}

/// The fair leg `$t`'s installation's limits at its destination, a row
/// of two columns, the destination's workers read once:
///
/// - `hold`: how many of its legs may be queued (in its destination's
///   queue, not yet taken) before a new one waits (`crowded!`). A hard cap
///   (`per_key_concurrency`): one round of it, so its slots never wait
///   for a release. Else one share (the destination's `fair_cap`, per
///   worker) for each worker consuming its queue, as the sampler last
///   counted them. Or, when it is more, what the destination completes in
///   50 ms (its `fair_rate` a second, as the sampler last measured it): a
///   fast destination that one installation keeps busy keeps that much
///   queued without a hold, a release and a publish per leg, and another
///   installation's leg finds at most about 50 ms of the flood's ahead of
///   it. While the destination served one installation alone over the
///   sampler's last ten seconds (`fair_keys`), a second of its pace: there
///   is nobody to be fair to, and a stream near the machine's limit is not
///   pushed onto the held path by its own bursts; another installation's
///   first legs find at most that ahead of them, until the sampler counts
///   it.
/// - `round`: how many it may have queued and running together: two
///   shares (a worker's `concurrency`, the share being half of it) for
///   each worker, and the pace's hold on top where the pace sets the hold
///   (a hard cap: two caps, a cap queued and a cap running). Why: each
///   worker runs a fair
///   destination on one slot more than its `concurrency` (the spare) and
///   prefetches as many; an installation that had legs queued beyond the
///   round filled the spare too, and another installation's leg then
///   waited for one of the flood's to end (175 ms p99 against a 200-ms
///   receiver, 8 × its time alone, where 12 ms was measured while the
///   hold counted running legs).
///
/// Counting the running legs in the hold itself made it a limit on all
/// that is in flight even for a fast destination's pace, and an
/// installation alone past it went only as fast as releases came: at a
/// high rate its held legs never caught up. The round is that limit only
/// where the pace is below a share a worker: a faster destination's queue
/// holds 50 ms of its pace ahead of another installation's leg anyway,
/// so its spare slot is no longer what that leg waits for.
macro_rules! fair_limits {
    ($t:literal) => {
        concat!(
            "(select case when ",
            $t,
            ".fair_hard then ",
            $t,
            ".fair_cap::int8 else greatest(",
            $t,
            ".fair_cap::int8 * d.workers, d.pace) end as hold, case when ",
            $t,
            ".fair_hard then 2 * ",
            $t,
            ".fair_cap::int8 else 2 * ",
            $t,
            ".fair_cap::int8 * d.workers + (case when d.pace > ",
            $t,
            ".fair_cap::int8 * d.workers then d.pace else 0 end) end as round \
             from (select greatest(1, coalesce(x.consumers, 1))::int8 as workers, \
                   coalesce(x.fair_rate, 0)::int8 \
                   / (case when coalesce(x.fair_keys, 0) > 1 then 20 else 1 end) as pace \
                   from (select 1) one left join destinations x on x.source = ",
            $t,
            ".source and x.name = ",
            $t,
            ".destination) d)"
        )
    };
}

/// Whether the fair leg `$t`'s installation is crowded at its
/// destination: it has its hold (`fair_limits!`) of legs queued besides
/// `$t`, and its share (`fair_cap`) of legs running there or a hard cap;
/// or, without a hard cap, its round of legs queued and running together
/// (which also bounds its queue while none of its legs run: the workers
/// are not taking, or stall). A new leg so found is held in Postgres by
/// the claim instead of added to the queue, and a waiting one is not
/// released (by a leg that ended, or the scheduler's wake), so the queue
/// never holds much more than a hold of one installation's legs ahead of
/// another's, the workers' spare slots stay free for another
/// installation's leg, and a hold gone over (claims and releases that
/// count at the same moment) comes back to it as legs are taken. An
/// installation under its share of the running legs, and under its round,
/// has the destination keeping up with it: its queue is then only the way
/// to the workers, what delays another installation's leg is the machine,
/// not that queue, and a hold (a second write, a release and a publish
/// per leg) would only add to it; near the machine's limit it tipped a
/// stream onto the held path for good. Each count stops at its bound (the
/// round is at least the hold); the partial indexes of migration 17
/// serve them.
macro_rules! crowded {
    ($t:literal) => {
        concat!(
            // The limits computed once (a lookup of the destination's
            // workers), not once for each count and comparison.
            "(select (q.n >= h.hold and (",
            $t,
            ".fair_hard or run.n >= ",
            $t,
            ".fair_cap)) or (not ",
            $t,
            ".fair_hard and q.n + run.n >= h.round) from ",
            fair_limits!($t),
            " h cross join lateral (select ",
            installation_load!($t, "h.round"),
            " as n) q cross join lateral (select ",
            installation_running!($t, "greatest(h.round, "),
            " as n) run)"
        )
    };
}

/// How many of the fair leg `$t`'s installation's legs are queued at its
/// destination (`processing`, not yet taken), the count stopping at
/// `$hold` (computed once by the caller), from the partial index of
/// migration 17.
macro_rules! installation_load {
    ($t:literal, $hold:literal) => {
        concat!(
            "(select count(*) from (select 1 from deliveries f where ",
            installation_processing!($t),
            " and f.attempts = 0 limit ",
            $hold,
            ") r)"
        )
    };
}

/// How many of the fair leg `$t`'s installation's legs are running at its
/// destination (taken, or published again for a retry: `processing` with
/// an attempt), the count stopping at `$limit` followed by `$t`'s
/// `fair_cap` and a closing parenthesis (so `"greatest(x, "` makes the
/// larger of the two the bound), from the partial index of migration 17.
macro_rules! installation_running {
    ($t:literal, $limit:literal) => {
        concat!(
            "(select count(*) from (select 1 from deliveries f where ",
            installation_processing!($t),
            " and f.attempts > 0 limit ",
            $limit,
            $t,
            ".fair_cap)) r)"
        )
    };
}

/// The columns `delivery::delivery` reads, in its order, from the table
/// `deliveries` (unaliased).
macro_rules! delivery_columns {
    () => {
        concat!(
            "provider, source, hook_id, delivery_id, event, action, status, retryable,
       claim_token, attempts, replays, lease_until, next_attempt_at, created_at,
       completed_at, failed_at, dead_lettered_at is not null, last_error_class, last_error,
       first_failed_at, repository, claimed_at, dead_lettered_at, destination, filter_reason,
       max_attempts, ",
            awaiting_redelivery!("deliveries"),
            ", github_tenant"
        )
    };
}

/// Whether the leg `$t`'s delivery has its body in `bodies` (by the
/// delivery's key and `received_at`, the leg's `created_at`: one
/// partition): what the scheduler publishes and a replay starts from.
macro_rules! body_exists {
    ($t:literal) => {
        concat!(
            "exists (select 1 from bodies b where b.provider = ",
            $t,
            ".provider and b.source = ",
            $t,
            ".source and b.hook_id = ",
            $t,
            ".hook_id and b.delivery_id = ",
            $t,
            ".delivery_id and b.received_at = ",
            $t,
            ".created_at)"
        )
    };
}

/// An untaken leg of a destination that takes no legs now (breaker open,
/// paused, disabled): its message waits in the destination's queue for as
/// long as that lasts, so its claim's lease running out says nothing of a
/// lost message. The reaper leaves it, and it is not
/// [`awaiting_redelivery!`]. A boolean expression over the alias `$t`.
macro_rules! waits_for_its_destination {
    ($t:literal) => {
        concat!(
            "(",
            $t,
            ".attempts = 0 and exists (select 1 from destinations x where x.source = ",
            $t,
            ".source and x.name = ",
            $t,
            ".destination and x.state <> 'closed'))"
        )
    };
}

/// A row hookinbox cannot finish on its own, so that only a redelivery from
/// GitHub can: its delivery has no body in Postgres (a leg claimed before
/// the claim wrote bodies, whose message is gone), and it is either reaped
/// `lost` or an untaken claim whose lease expired and whose destination
/// takes legs (see [`waits_for_its_destination!`]). A claim writes its
/// body in its own statement, so no leg claimed since is ever in this
/// state. A boolean expression over the alias `$t`.
macro_rules! awaiting_redelivery {
    ($t:literal) => {
        concat!(
            "(not ",
            body_exists!($t),
            " and ((",
            $t,
            ".status = 'failed' and ",
            $t,
            ".last_error_class = ",
            class!(lost),
            ") or (",
            $t,
            ".status = 'processing' and ",
            $t,
            ".attempts = 0 and ",
            $t,
            ".lease_until < now() and not ",
            waits_for_its_destination!($t),
            ")))"
        )
    };
}

/// A retry the scheduler can publish now: failed, retryable, due, with its
/// delivery's body kept (`schedule_due` takes exactly these). A claim
/// reaped `lost` is one (its message is gone: the scheduler publishes it
/// again); without a body it is [`awaiting_redelivery!`] instead, and
/// never a due retry. A boolean expression over the alias `$t`.
macro_rules! due_retry {
    ($t:literal) => {
        concat!(
            "(",
            $t,
            ".status = 'failed' and ",
            $t,
            ".retryable and ",
            $t,
            ".next_attempt_at <= now() and ",
            body_exists!($t),
            ")"
        )
    };
}

/// The rules of the operator's states (`state::State`), each a boolean
/// expression over the table `deliveries` (unaliased). They do not
/// overlap: a dead letter is `dead` whatever its body; a row that only
/// GitHub can finish and is not dead is `awaiting_redelivery`, never
/// `processing` or `retrying`.
macro_rules! dead_state {
    () => {
        "(deliveries.status = 'failed' and not deliveries.retryable)"
    };
}

/// `processing`: claimed or taken, and not awaiting a redelivery.
macro_rules! processing_state {
    () => {
        concat!(
            "(deliveries.status = 'processing' and not ",
            awaiting_redelivery!("deliveries"),
            ")"
        )
    };
}

/// The error classes that are waits, not failures ([`ErrorClass::is_wait`]),
/// as an SQL list: held by its destination, deferred to a time, behind its
/// key's earlier leg, or yielding its installation's turn.
macro_rules! wait_classes {
    () => {
        concat!(
            "(",
            class!(held),
            ", ",
            class!(deferred),
            ", ",
            class!(ordered),
            ", ",
            class!(fair),
            ")"
        )
    };
}

/// `retrying`: failed, retryable, not waiting ([`waiting_state!`]), and not
/// awaiting a redelivery.
macro_rules! retrying_state {
    () => {
        concat!(
            "(deliveries.status = 'failed' and deliveries.retryable \
             and coalesce(deliveries.last_error_class, '') not in ",
            wait_classes!(),
            " and not ",
            awaiting_redelivery!("deliveries"),
            ")"
        )
    };
}

/// `waiting`: retryable, its last outcome a wait ([`wait_classes!`]) that
/// spent no attempt, and not awaiting a redelivery.
macro_rules! waiting_state {
    () => {
        concat!(
            "(deliveries.status = 'failed' and deliveries.retryable \
             and deliveries.last_error_class in ",
            wait_classes!(),
            " and not ",
            awaiting_redelivery!("deliveries"),
            ")"
        )
    };
}

/// `awaiting_redelivery`: only GitHub can finish it, and it is not dead.
macro_rules! awaiting_redelivery_state {
    () => {
        concat!(
            "(",
            awaiting_redelivery!("deliveries"),
            " and not ",
            dead_state!(),
            ")"
        )
    };
}

/// `FromStr` for a stored name: one of `ALL` by its `as_str`, anything
/// else an [`UnknownName`] that lists the names.
macro_rules! from_stored_name {
    ($t:ty, $what:literal) => {
        impl std::str::FromStr for $t {
            type Err = UnknownName;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::ALL
                    .into_iter()
                    .find(|c| c.as_str() == s)
                    .ok_or_else(|| UnknownName {
                        what: $what,
                        value: s.to_owned(),
                        allowed: Self::ALL.map(Self::as_str).join(", "),
                    })
            }
        }
    };
}

mod admin;
pub mod bodies;
mod claim;
mod complete;
mod delivery;
mod destinations;
mod filter;
pub mod group_commit;
mod ordering;
mod overview;
pub mod partitions;
mod reconcile;
mod retention;
mod row;
mod schedule;
mod state;
mod take;

pub use admin::{
    NO_BODY_TO_REPLAY, PayloadOrigin, Replayed, Scope, StoredPayload, find, replay, stored_payload,
    unreplay,
};
pub use bodies::{Encoded, Stored, Undecodable};
pub use claim::{
    Claim, ClaimLinks, ClaimRequest, Claimed, LegClaim, LegRequest, Origin, claim, claim_batch,
    claim_batch_linked, claim_linked, hold_fair, publish_failed,
};
pub use complete::{
    Completing, Deferral, StoredEvent, complete, complete_batch, complete_stale, defer, fail,
    mark_dead_lettered, store_event,
};
pub use delivery::{DeadLetter, Delivery, get};
pub use destinations::{
    AttemptLog, AttemptResult, BreakerState, DestinationRow, EXCERPT_BYTES, LoggedAttempt,
    Registration, Waiting, close, disable, disable_stale, leg_attempts, lock_destination,
    log_attempts, register, rows, set_by_operator, set_consumers, trip, waiting, window,
};
#[doc(hidden)]
pub use filter::statements_for_explain;
pub use filter::{Cursor, CursorError, Filter, Order, Page, count, list, list_page, purge_dead};
pub use ordering::{HaltedKey, halted, halted_counts, retry, skip};
#[doc(hidden)]
pub use overview::GAUGES as GAUGES_STATEMENT;
#[doc(hidden)]
pub use overview::STATEMENTS as OVERVIEW_STATEMENTS;
pub use overview::{EXACT_COMPLETED_UP_TO, Gauges, Overview, SourceCounts, gauges, overview};
pub use reconcile::{Held, ReconcilerState, held, reconciler_states};
pub use retention::{Retention, Swept, purge, sweep};
pub use row::{Republish, Unreadable};
pub use schedule::{
    dead_letter_unreadable, exhaust_due, needing_copy, next_fair, next_of_key, probe_due, reap,
    reschedule, schedule_due, wake_fair, wake_ordered,
};
pub use state::{FAILED, State};
pub use take::{Take, Taking, fence, release_lease, renew, take, take_batch};

/// The knobs every transition shares.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// How long a claim or a take is held without renewal. The ingest claim
    /// sets it too, so it covers the time a job waits in the queue.
    pub lease: Duration,
    /// Takes allowed before a delivery is declared poison.
    pub max_attempts: i32,
    /// How long ingest waits for a publisher confirm. A duplicate that finds
    /// the claim untaken and older than this republishes it.
    pub publish_timeout: Duration,
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

type Param<'a> = &'a (dyn ToSql + Sync);

/// The leg's five key columns (`$1`–`$5` of every keyed statement, see
/// [`key!`]), then `rest`.
fn params<'a>(key: &'a LegKey, rest: &[Param<'a>]) -> Vec<Param<'a>> {
    let d = &key.delivery;
    let mut all: Vec<Param<'a>> = vec![
        &d.provider,
        &d.source,
        &d.hook_id,
        &d.delivery_id,
        &key.destination,
    ];
    all.extend_from_slice(rest);
    all
}

/// Runs a keyed statement ([`sql::execute`]): `$1`–`$5` the leg's key, then
/// `rest`. Returns the rows it changed.
async fn execute(
    client: &impl Session,
    statement: &str,
    key: &LegKey,
    rest: &[Param<'_>],
) -> Result<u64, DbError> {
    sql::execute(client, statement, &params(key, rest)).await
}

/// Like [`execute`], for a statement that returns at most one row.
async fn query_opt(
    client: &impl Session,
    statement: &str,
    key: &LegKey,
    rest: &[Param<'_>],
) -> Result<Option<tokio_postgres::Row>, DbError> {
    sql::query_opt(client, statement, &params(key, rest)).await
}

/// Like [`execute`], for a statement that returns any number of rows.
async fn query_all(
    client: &impl Session,
    statement: &str,
    key: &LegKey,
    rest: &[Param<'_>],
) -> Result<Vec<tokio_postgres::Row>, DbError> {
    sql::query(client, statement, &params(key, rest)).await
}

/// Like [`execute`], for a statement that returns exactly one row.
async fn query_one(
    client: &impl Session,
    statement: &str,
    key: &LegKey,
    rest: &[Param<'_>],
) -> Result<tokio_postgres::Row, DbError> {
    sql::query_one(client, statement, &params(key, rest)).await
}

/// Why a delivery failed. Stored in `last_error_class`; bounded, so it can
/// label metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// The handler reported an error worth retrying.
    Transient,
    /// The handler reported an error that no retry can fix.
    Permanent,
    /// The handler ran past `HOOKINBOX_HANDLER_TIMEOUT_MS`.
    Timeout,
    /// The database failed under the handler.
    Db,
    /// The job crashed or hung its worker on every attempt.
    Poison,
    /// The claim was abandoned (its lease expired long ago).
    Lost,
    /// Transient failures used up `HOOKINBOX_MAX_ATTEMPTS`.
    MaxAttempts,
    /// The job could not be published.
    Publish,
    /// Waiting for its destination (breaker open, paused or disabled, or
    /// an answer that says the destination itself is wrong): no attempt
    /// spent, due once the destination takes legs again.
    Held,
    /// The handler asked to be tried again at a given time (a `429` or
    /// `503` with `Retry-After`, a rate limit's reset): no attempt spent.
    Deferred,
    /// Deferred past its destination's retry horizon (counted from its
    /// first deferral): failed for good.
    DeferredTooLong,
    /// Waiting behind an earlier open leg of its key (an ordered
    /// destination): no attempt spent, due once it is its key's first.
    Ordered,
    /// Yielded its installation's turn on a fair destination (its
    /// installation had its share in flight while another's legs waited):
    /// no attempt spent, due once one of its installation's legs ends.
    Fair,
    /// `skip_stale`: completed without its effect, its payload older than
    /// a completed leg's of its key. Stays on the completed leg.
    Stale,
}

impl ErrorClass {
    /// Whether a leg left with this class waits rather than failed: held by
    /// its destination, deferred, ordered or fair (the operator's
    /// `waiting` state; the SQL spelling is `wait_classes!`).
    pub fn is_wait(self) -> bool {
        matches!(
            self,
            Self::Held | Self::Deferred | Self::Ordered | Self::Fair
        )
    }

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Permanent => "permanent",
            Self::Timeout => "timeout",
            Self::Db => "db",
            Self::Poison => "poison",
            Self::Lost => "lost",
            Self::MaxAttempts => "max_attempts",
            Self::Publish => "publish",
            Self::Held => "held",
            Self::Deferred => "deferred",
            Self::DeferredTooLong => "deferred_too_long",
            Self::Ordered => "ordered",
            Self::Fair => "fair",
            Self::Stale => "stale",
        }
    }

    /// Every class, in the order above.
    pub const ALL: [Self; 14] = [
        Self::Transient,
        Self::Permanent,
        Self::Timeout,
        Self::Db,
        Self::Poison,
        Self::Lost,
        Self::MaxAttempts,
        Self::Publish,
        Self::Held,
        Self::Deferred,
        Self::DeferredTooLong,
        Self::Ordered,
        Self::Fair,
        Self::Stale,
    ];
}

/// A stored name that is not a known class, status or state.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("'{value}' is not a known {what} (one of {allowed})")]
pub struct UnknownName {
    what: &'static str,
    value: String,
    allowed: String,
}

from_stored_name!(ErrorClass, "error class");
from_stored_name!(Status, "status");

/// Shortens an error message for `last_error` and drops control characters,
/// so a handler's error text cannot forge log lines or grow a row.
pub fn redact(message: &str) -> String {
    const MAX: usize = 240;
    let mut out: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if out.len() > MAX {
        let mut cut = MAX;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    out
}

/// The status column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Claimed or taken; `lease_until` says until when.
    Processing,
    /// The effect happened. Terminal.
    Completed,
    /// Failed; `retryable` says whether it will be tried again.
    Failed,
    /// Its destination's filters did not take the delivery
    /// (`filter_reason` says why). Terminal.
    Filtered,
}

impl Status {
    /// Every status.
    pub const ALL: [Self; 4] = [
        Self::Processing,
        Self::Completed,
        Self::Failed,
        Self::Filtered,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "processing",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Filtered => "filtered",
        }
    }

    /// Completed or filtered: nothing more will happen to the leg.
    pub fn is_done(self) -> bool {
        matches!(self, Self::Completed | Self::Filtered)
    }
}

/// How a failed attempt is recorded.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The class stored in `last_error_class`.
    pub class: ErrorClass,
    /// A short description; it is redacted before it is stored.
    pub message: String,
    /// `Some(delay)`: retryable, due after `delay`. `None`: failed for good
    /// (dead-lettered).
    pub retry_in: Option<Duration>,
}

/// What the database says about a failure once it is recorded.
#[derive(Clone, Copy, Debug)]
pub struct Failed {
    /// Takes so far.
    pub attempts: i32,
    /// The first failure of this delivery.
    pub first_failed_at: DateTime<Utc>,
    /// This failure.
    pub failed_at: DateTime<Utc>,
}
