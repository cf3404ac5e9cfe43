//! Ingest's transitions: the claim of a delivery's legs and its body (one
//! request, or a batch of them by group commit), and what ingest records
//! when it cannot publish a leg, or holds one for its installation's turn.
//!
//! The claim writes the delivery's body (`bodies`) in the same statement
//! as its legs: once a claim has committed, Postgres can publish each of
//! its legs again, whatever happens to their messages. Ingest publishes
//! only the legs' keys.
//!
//! A delivery's legs are decided once, at its first claim: one per
//! destination of its source, `processing` where the destination's
//! filters take the delivery and `filtered` (with the reason) where they
//! do not. A later claim of the same delivery (a redelivery from GitHub or
//! the reconciler) never adds a leg; it takes over the legs that may be
//! taken over (an expired lease, or a due retry with attempts left) and
//! reports the others.

use std::collections::{BTreeMap, HashMap};

use crate::postgres::sql::{self, Session};
use chrono::{DateTime, Utc};

use super::bodies::Encoded;
use super::row::status_of;
use super::{Policy, Status, redact, secs};
use crate::key::{ClaimToken, DeliveryKey, DestinationName, LegKey};
use crate::postgres::DbError;

/// A claim request from ingest: one delivery and its legs.
#[derive(Clone, Debug)]
pub struct ClaimRequest {
    /// The delivery's key.
    pub key: DeliveryKey,
    /// `X-GitHub-Event`.
    pub event: String,
    /// The payload's `action`, when it has one.
    pub action: Option<String>,
    /// The payload's `repository.full_name`, when it has one.
    pub repository: Option<String>,
    /// SHA-256 of the raw body: the same key with another body is a conflict.
    pub body_sha256: [u8; 32],
    /// The source's replay guard is on: a body seen before under another
    /// key is refused ([`Claim::ReplayedBody`]).
    pub guarded: bool,
    /// The source pins its hook ids: the same delivery id under another
    /// (pinned) hook id is one event sent to two hooks, not a replay.
    pub pinned: bool,
    /// One leg per destination of the source, in the configured order.
    pub legs: Vec<LegRequest>,
    /// What the new legs keep of the request beyond its key.
    pub origin: Origin,
    /// The body as received, compressed, with its `Content-Type` and
    /// carried headers: written once, with a new delivery's legs (or with
    /// a reclaimed delivery that has none kept).
    pub body: Encoded,
}

/// What a new delivery's legs keep of the request that brought it, beyond
/// its key; a later claim of the same delivery changes none of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    /// The `traceparent` of ingest's request span, when traces are on:
    /// the trace that retries and replays link back to.
    pub traceparent: Option<String>,
    /// `X-GitHub-Tenant`: the GHE.com enterprise that sent the delivery.
    pub github_tenant: Option<String>,
}

/// A leg a new delivery gets.
#[derive(Clone, Debug)]
pub struct LegRequest {
    /// Its destination.
    pub destination: DestinationName,
    /// `Some(reason)`: the destination's filters do not take the delivery,
    /// and the leg is recorded `filtered` with the reason.
    pub filtered: Option<&'static str>,
    /// The leg's key, when its destination is ordered and the payload has
    /// one: the leg takes the next place in the key's claim order.
    pub order_key: Option<String>,
    /// The leg's installation, that installation's share of legs in
    /// flight, and whether the share is a hard cap, when its destination
    /// is fair.
    pub fair: Option<(String, i32, bool)>,
    /// The payload's pull request's or issue's `updated_at`, when its
    /// destination skips stale legs (`skip_stale`).
    pub stale_clock: Option<DateTime<Utc>>,
}

/// What a claim decided for one leg.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegClaim {
    /// This request owns the leg's claim: publish a job carrying `token`.
    Claimed {
        /// The token the job must carry.
        token: ClaimToken,
        /// False for a new leg; true when an expired lease or a due retry
        /// was claimed again.
        reclaimed: bool,
        /// Takes so far (0 for a new leg; a reclaim keeps the count).
        attempts: i32,
        /// A new leg of a fair destination whose installation already has
        /// its hold queued there: hold it in Postgres
        /// ([`hold_fair`]) instead of publishing it, and the release after
        /// one of that installation's legs ends publishes it.
        held: bool,
    },
    /// Claimed by an earlier request that never saw its job taken, longer
    /// ago than the publish timeout: its publish may have died with its
    /// ingest. Republish with the same token; a second copy is harmless.
    Republish {
        /// The token of the existing claim.
        token: ClaimToken,
    },
    /// A new leg its destination's filters did not take: recorded, nothing
    /// to publish.
    Filtered,
    /// A leg of a delivery claimed before, in this state; nothing to publish.
    Duplicate(Status),
}

/// What a claim decided for a delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Each leg of the delivery, by destination, and what was decided for
    /// it. A delivery claimed before the destinations existed has one leg,
    /// to the empty (legacy) destination.
    Legs(Vec<(DestinationName, LegClaim)>),
    /// The same key arrived before with another body.
    Conflict,
    /// The body arrived before under another delivery id: a replay of a
    /// captured request. Nothing was claimed.
    ReplayedBody,
    /// The same delivery id and body arrived before under another hook id
    /// of this source, which does not pin its hook ids: one event GitHub
    /// sent to two of the source's hooks (a repository's and an
    /// organization's, say), not a replay. Nothing was claimed: the first
    /// hook's claim holds the event, and the copy adds no effect.
    Copy {
        /// The key the event was first claimed under.
        of: DeliveryKey,
        /// That claim's legs and their states; empty once retention swept
        /// its rows.
        legs: Vec<(DestinationName, Status)>,
    },
}

/// The SQLSTATE `hookinbox_replayed_body()` raises (migration 6).
const REPLAYED_BODY: &str = "HB409";
/// The SQLSTATE `hookinbox_copied_event()` raises (migration 9).
const COPIED_EVENT: &str = "HB200";

/// The claim of many deliveries' legs, in one statement: `$1`–`$10` the
/// deliveries (their key, event, action, body hash, guard settings and
/// repository, numbered by position, and `$16`–`$17` their traceparent and
/// GitHub tenant),
/// `$11`–`$13` their legs (the delivery's position, the destination, the
/// filter's reason, and `$18`, `$20`–`$23` its order key, installation,
/// share, whether it is a hard cap, and the payload's time `skip_stale`
/// compares), `$14` the lease in seconds, `$15` the attempts
/// allowed a leg that records none, `$19` each delivery's arrival, and
/// `$24`–`$28` each delivery's body (content type, headers, size,
/// encoding, bytes).
///
/// - `reclaimed` takes over, under new tokens, the existing legs of each
///   delivery that may be taken over, with the same body: of a configured
///   destination, or the legacy (empty) one. It locks them in key order
///   first (`candidates`), so concurrent claims cannot deadlock.
/// - `inserted` inserts the legs of each delivery that has none yet: a
///   redelivery never adds a leg. Two racing copies of a new delivery both
///   try; the primary key lets one in, the other's `on conflict do nothing`
///   leaves it nothing, and it reports what the first wrote.
/// - `asked`, with traces on (the delivery's `traceparent` given), finds
///   the newest redelivery the reconciler asked GitHub for of each
///   delivery's source and GUID that kept its span's `traceparent`
///   (migration 14), by a partial index that holds only those: ingest's
///   span links to it. Returned with each leg taken, beside the
///   `traceparent` a reclaimed leg kept from its first claim.
/// - `stored` writes the body of each delivery it inserted legs of, once
///   per delivery, with `received_at` its legs' `created_at` (the same
///   `now()`): the record every later publish, take and replay reads. A
///   reclaimed delivery that has no body kept (claimed before bodies were
///   written, and lost) gets this one; one that has, conflicts and keeps
///   its own (the same bytes: the claim compares the body's hash).
/// - `guard` records each new delivery's body for the replay guard, once
///   per delivery, and the final select raises (rolling everything back)
///   `HB409` when the body was recorded before under another delivery id
///   (a replay), and `HB200` when it was recorded under the same delivery
///   id and another hook id where hook ids are not pinned (a copy of the
///   event): either way nothing is left behind, so the event keeps one
///   claim and one effect. `do update` (a no-op) rather than `do nothing`:
///   it returns the row that is there, even one a concurrent claim
///   committed after this statement began, so two hooks' copies racing
///   each other still get one claim between them.
const CLAIM: &str = concat!(
    "
with input as (
    select * from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                         $7::bytea[], $8::bool[], $9::bool[], $10::text[], $16::text[],
                         $17::text[], $19::int8[], $24::text[], $25::jsonb[], $26::int4[],
                         $27::text[], $28::bytea[]) with ordinality
        as i(provider, source, hook_id, delivery_id, event, action, body_sha256, guarded,
             pinned, repository, traceparent, github_tenant, arrival, content_type,
             headers, size, encoding, body, ix)
), legs as (
    select i.provider, i.source, i.hook_id, i.delivery_id, l.destination, l.filter_reason,
           i.event, i.action, i.body_sha256, i.repository, i.traceparent,
           i.github_tenant, case when l.filter_reason is null then l.order_key end as order_key,
           i.arrival, case when l.filter_reason is null then l.fair_key end as fair_key,
           case when l.filter_reason is null then l.fair_cap end as fair_cap,
           case when l.filter_reason is null then l.fair_hard end as fair_hard,
           case when l.filter_reason is null and l.order_key is not null
                then l.stale_clock end as stale_clock
    from unnest($11::int8[], $12::text[], $13::text[], $18::text[], $20::text[], $21::int4[],
                $22::bool[], $23::timestamptz[])
        as l(ix, destination, filter_reason, order_key, fair_key, fair_cap, fair_hard,
             stale_clock)
    join input i using (ix)
), ordered as (
    -- Why before the insert: a key's places (`order_seq`) must follow the
    -- order its claims commit in, or a take could see a leg while an
    -- earlier place of its key is still uncommitted and start ahead of it.
    -- Each ordered key's advisory lock is held to the end of the
    -- transaction, taken in one order (so batches cannot deadlock), and
    -- the count makes every lock precede the first `nextval` (`places`).
    select count(*) from (
        select pg_advisory_xact_lock(k.h)
        from (select distinct ",
    order_lock!("l"),
    " as h
              from legs l
              where l.order_key is not null and l.filter_reason is null
              order by 1 offset 0) k
    ) locked
), places as (
    -- The ordered legs' places, in the order their requests arrived (the
    -- batch is sorted by key for its row locks, which says nothing of
    -- arrival), each after every advisory lock. Not inlined (`nextval`
    -- is volatile), so each leg gets one place.
    select p.provider, p.source, p.hook_id, p.delivery_id, p.destination,
           nextval('deliveries_order_seq') as seq
    from (select l.provider, l.source, l.hook_id, l.delivery_id, l.destination
          from legs l cross join ordered
          where l.order_key is not null
          order by l.arrival, l.destination offset 0) p
), candidates as (
    -- `cross join ordered`: every advisory lock before any row lock, in
    -- every claim (and a replay's place takes its lock before its row's),
    -- so the two kinds of lock are always taken in one order.
    select d.provider, d.source, d.hook_id, d.delivery_id, d.destination
    from deliveries d join input i using (provider, source, hook_id, delivery_id)
    cross join ordered
    where d.body_sha256 = i.body_sha256
      and (d.destination = ''
           or exists (select 1 from legs l
                      where l.provider = d.provider and l.source = d.source
                        and l.hook_id = d.hook_id and l.delivery_id = d.delivery_id
                        and l.destination = d.destination))
      and ",
    reclaimable!("d", "$15"),
    "
    order by d.provider, d.source, d.hook_id, d.delivery_id, d.destination
    for update of d
), reclaimed as (
    update deliveries d
    set ",
    to_processing!("$14"),
    "
    from candidates c
    where d.provider = c.provider and d.source = c.source and d.hook_id = c.hook_id
      and d.delivery_id = c.delivery_id and d.destination = c.destination
      and ",
    reclaimable!("d", "$15"),
    "
    returning d.provider, d.source, d.hook_id, d.delivery_id, d.destination, d.claim_token,
              d.attempts, d.status, false as inserted, d.traceparent as stored_traceparent,
              d.created_at
), inserted as (
    insert into deliveries as d
        (provider, source, hook_id, delivery_id, destination, event, action, body_sha256,
         status, claim_token, lease_until, claimed_at, repository, filter_reason, completed_at,
         traceparent, github_tenant, order_key, order_seq, fair_key, fair_cap,
         fair_hard, stale_clock)
    select l.provider, l.source, l.hook_id, l.delivery_id, l.destination, l.event, l.action,
           l.body_sha256,
           case when l.filter_reason is null then 'processing' else 'filtered' end,
           gen_random_uuid(),
           case when l.filter_reason is null then now() + make_interval(secs => $14) end,
           now(), l.repository, l.filter_reason,
           case when l.filter_reason is not null then now() end,
           l.traceparent, l.github_tenant, l.order_key, pl.seq, l.fair_key, l.fair_cap,
           l.fair_hard, l.stale_clock
    from legs l cross join ordered
    left join places pl using (provider, source, hook_id, delivery_id, destination)
    where not exists (
        select 1 from deliveries x
        where x.provider = l.provider and x.source = l.source
          and x.hook_id = l.hook_id and x.delivery_id = l.delivery_id)
    order by l.provider, l.source, l.hook_id, l.delivery_id, l.destination
    on conflict do nothing
    returning d.provider, d.source, d.hook_id, d.delivery_id, d.destination, d.claim_token,
              d.attempts, d.status, true as inserted, null::text as stored_traceparent,
              d.created_at
), stored as (
    -- Why here: a claim that commits has its body committed with it, so
    -- that nothing answered 202 depends on a message the broker holds.
    insert into bodies
        (provider, source, hook_id, delivery_id, received_at, content_type, headers, size,
         encoding, body)
    select i.provider, i.source, i.hook_id, i.delivery_id, c.created_at, i.content_type,
           i.headers, i.size, i.encoding, i.body
    from (select distinct provider, source, hook_id, delivery_id, created_at
          from (select provider, source, hook_id, delivery_id, created_at from inserted
                union all
                select provider, source, hook_id, delivery_id, created_at from reclaimed) x) c
    join input i using (provider, source, hook_id, delivery_id)
    order by i.provider, i.source, i.hook_id, i.delivery_id
    on conflict do nothing
), crowding as materialized (
    -- Once per installation and destination of the batch, not per leg:
    -- the counts walk index entries that legs gone by left behind.
    select k.source, k.destination, k.fair_key, ",
    crowded!("k"),
    "
           -- Behind its installation's waiting legs while the destination
           -- is busy with it (its share running): then only releases, one
           -- for each of its legs that ends, publish its legs, and a claim
           -- and a release that counted the same freed place do not both
           -- take it (the second took the worker's spare slot, and another
           -- installation's leg waited for one of the flood's to end).
           -- Under its share it is not held for what waits: then the
           -- destination keeps up with it, and at a high rate a stream
           -- held behind its waiting legs never caught up.
           or (not k.fair_hard
               and exists (select 1 from deliveries w
                           where w.source = k.source and w.destination = k.destination
                             and w.fair_key = k.fair_key and w.fair_key is not null
                             and w.status = 'failed' and w.last_error_class = ",
    class!(fair),
    ")
               and ",
    installation_running!("k", "("),
    " >= k.fair_cap) as crowded
    from (select distinct source, destination, fair_key, fair_cap, fair_hard
          from legs where fair_key is not null) k
), asked as (
    select i.provider, i.source, i.hook_id, i.delivery_id,
           (select r.traceparent from reconcile_redeliveries r
            where r.source = i.source and r.guid = i.delivery_id and r.traceparent is not null
            order by r.last_asked_at desc
            limit 1) as traceparent
    from input i
    where i.traceparent is not null
), guard as (
    insert into seen_bodies (provider, source, body_sha256, hook_id, delivery_id)
    select distinct on (i.provider, i.source, i.body_sha256)
           i.provider, i.source, i.body_sha256, i.hook_id, i.delivery_id
    from inserted c join input i using (provider, source, hook_id, delivery_id)
    where i.guarded
    order by i.provider, i.source, i.body_sha256
    on conflict (provider, source, body_sha256) do update set hook_id = seen_bodies.hook_id
    returning provider, source, body_sha256, hook_id, delivery_id
)
select c.provider, c.source, c.hook_id, c.delivery_id, c.destination, c.claim_token,
       c.attempts, c.status, c.inserted, c.stored_traceparent, a.traceparent,
       case when exists (
           select 1 from guard g join input i using (provider, source, body_sha256)
           where i.guarded and g.delivery_id <> i.delivery_id)
            then hookinbox_replayed_body()
            when exists (
           select 1 from guard g join input i using (provider, source, body_sha256)
           where i.guarded and g.hook_id <> i.hook_id and not i.pinned)
            then hookinbox_copied_event() end,
       -- Read in the statement's snapshot: the installation's legs that
       -- other claims committed, not this batch's.
       coalesce(c.inserted and c.status = 'processing' and l.fair_key is not null and w.crowded,
                false)
from (select * from reclaimed union all select * from inserted) c
left join asked a using (provider, source, hook_id, delivery_id)
left join legs l using (provider, source, hook_id, delivery_id, destination)
left join crowding w
  on w.source = l.source and w.destination = l.destination and w.fair_key = l.fair_key"
);

/// What is there of the deliveries whose legs the claim did not all write
/// (`$1`–`$4` their keys, `$5` the publish timeout in seconds): every leg,
/// with what [`Existing::decide`] needs.
const CLAIM_STATE: &str = "
select d.provider, d.source, d.hook_id, d.delivery_id, d.destination, d.status, d.attempts,
       d.claim_token, d.body_sha256, d.lease_until > now(),
       d.claimed_at < now() - make_interval(secs => $5), d.traceparent
from deliveries d
join unnest($1::text[], $2::text[], $3::text[], $4::text[])
     as k(provider, source, hook_id, delivery_id)
  using (provider, source, hook_id, delivery_id)
order by d.destination";

/// A delivery's key as four owned strings.
type DeliveryTuple = (String, String, String, String);

fn delivery_tuple(key: &DeliveryKey) -> DeliveryTuple {
    (
        key.provider.clone(),
        key.source.as_str().to_owned(),
        key.hook_id.as_str().to_owned(),
        key.delivery_id.as_str().to_owned(),
    )
}

/// What a leg the claim did not take over says; [`Existing::decide`] turns
/// it into the leg's answer.
struct Existing {
    destination: String,
    status: Status,
    attempts: i32,
    token: ClaimToken,
    body_sha256: Vec<u8>,
    lease_live: Option<bool>,
    publish_overdue: bool,
    traceparent: Option<String>,
}

impl Existing {
    fn from_row(row: &tokio_postgres::Row) -> Result<Self, DbError> {
        Ok(Self {
            destination: row.get(4),
            status: status_of(row.get(5))?,
            attempts: row.get(6),
            token: ClaimToken(row.get(7)),
            body_sha256: row.get(8),
            lease_live: row.get(9),
            publish_overdue: row.get(10),
            traceparent: row.get(11),
        })
    }

    /// A claim nobody took (attempts 0), still leased, but claimed longer
    /// ago than the publish timeout may have lost its publish with its
    /// ingest: republish it with the same token. Anything else is a
    /// duplicate of what is there.
    fn decide(&self) -> LegClaim {
        if self.status == Status::Processing
            && self.attempts == 0
            && self.lease_live == Some(true)
            && self.publish_overdue
        {
            LegClaim::Republish { token: self.token }
        } else {
            LegClaim::Duplicate(self.status)
        }
    }
}

/// The traces a claim's request links to, read by the claim itself (no
/// statement of its own): both `None` with traces off.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimLinks {
    /// The `traceparent` the delivery kept from its first claim, when it
    /// was stored before this request.
    pub stored: Option<String>,
    /// The `traceparent` of the reconciler's span that asked GitHub to
    /// redeliver it (`reconcile_redeliveries.traceparent`), when one did
    /// and the claim took a leg. Read only when the request carries a
    /// `traceparent` of its own (traces on).
    pub redelivery: Option<String>,
}

/// A claim's answer, with the traces its request links to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimed {
    /// What the claim decided.
    pub claim: Claim,
    /// The traces to link to.
    pub links: ClaimLinks,
}

impl Claimed {
    fn unlinked(claim: Claim) -> Self {
        Self {
            claim,
            links: ClaimLinks::default(),
        }
    }
}

/// Claims one delivery's legs: [`claim_batch`] with one request, the same
/// statement (so the single and the batched claim cannot disagree). A
/// delivery that vanished between the statements (retention) is claimed
/// again.
pub async fn claim(
    client: &impl Session,
    policy: &Policy,
    req: &ClaimRequest,
) -> Result<Claim, DbError> {
    Ok(claim_linked(client, policy, req).await?.claim)
}

/// [`claim`], with the traces the request links to.
pub async fn claim_linked(
    client: &impl Session,
    policy: &Policy,
    req: &ClaimRequest,
) -> Result<Claimed, DbError> {
    let mut answer = Claimed::unlinked(Claim::Legs(Vec::new()));
    for _ in 0..SWEPT_RETRIES {
        answer = claim_batch_linked(client, policy, std::slice::from_ref(req))
            .await?
            .pop()
            .unwrap_or_else(|| Claimed::unlinked(Claim::Legs(Vec::new())));
        if answer.claim != Claim::Legs(Vec::new()) {
            break;
        }
    }
    Ok(answer)
}

/// Whether `e` is the replay guard's refusal `code`.
fn refused_by(e: &DbError, code: &str) -> bool {
    e.refusal().is_some_and(|r| r.code == code)
}

/// The claim a copy's body was first seen under (`$3` the body), as the
/// guard recorded it, and that claim's legs while its rows are kept.
const FIRST_SEEN: &str = "
select s.provider, s.source, s.hook_id, s.delivery_id, d.destination, d.status
from seen_bodies s
left join deliveries d using (provider, source, hook_id, delivery_id)
where s.provider = $1 and s.source = $2 and s.body_sha256 = $3
order by d.destination";

/// Reports a copy ([`Claim::Copy`]): the claim the guard found its body
/// under; `None` if retention swept that body since.
async fn copy_of(client: &impl Session, req: &ClaimRequest) -> Result<Option<Claim>, DbError> {
    let body_sha: &[u8] = &req.body_sha256;
    let rows = sql::query(
        client,
        FIRST_SEEN,
        &[&req.key.provider, &req.key.source, &body_sha],
    )
    .await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let of = DeliveryKey::from_parts(first.get(0), first.get(1), first.get(2), first.get(3))
        .map_err(|e| DbError::BadRow(e.part()))?;
    let mut legs = Vec::new();
    for row in &rows {
        let (Some(destination), Some(status)) =
            (row.get::<_, Option<&str>>(4), row.get::<_, Option<&str>>(5))
        else {
            continue;
        };
        legs.push((
            DestinationName::stored(destination).map_err(|e| DbError::BadRow(e.part()))?,
            status_of(status)?,
        ));
    }
    Ok(Some(Claim::Copy { of, legs }))
}

/// How often a claim whose delivery vanished between its two statements
/// (retention swept it) is tried again before it is reported as in flight.
const SWEPT_RETRIES: usize = 3;

/// Claims many deliveries' legs in one statement ([`CLAIM`]), answering
/// each request as a claim of its own would. Never `exists()` then
/// `insert()`: two racing copies of one delivery get one claim of each leg
/// between them.
///
/// One statement cannot affect the same row twice, so the deliveries are
/// deduplicated first: the first request of a key takes part, and later
/// copies in the same batch are duplicates of it (or, with another body,
/// claimed on their own). The keys are sorted, so concurrent batches lock
/// rows in one order and cannot deadlock. A replayed body refuses the
/// whole statement; the group commit then claims each request on its own.
pub async fn claim_batch(
    client: &impl Session,
    policy: &Policy,
    requests: &[ClaimRequest],
) -> Result<Vec<Claim>, DbError> {
    Ok(claim_batch_linked(client, policy, requests)
        .await?
        .into_iter()
        .map(|c| c.claim)
        .collect())
}

/// [`claim_batch`], each answer with the traces its request links to.
pub async fn claim_batch_linked(
    client: &impl Session,
    policy: &Policy,
    requests: &[ClaimRequest],
) -> Result<Vec<Claimed>, DbError> {
    let mut firsts: BTreeMap<&DeliveryKey, usize> = BTreeMap::new();
    for (i, r) in requests.iter().enumerate() {
        firsts.entry(&r.key).or_insert(i);
    }
    let mut decided = match claim_firsts(client, policy, requests, &firsts).await {
        Ok(decided) => decided,
        // A replay or a copy refuses the whole statement, and Postgres
        // says which only for one of them: alone, it is this request's
        // answer; in a batch, each request is claimed on its own, in
        // order, so that each gets the answer a claim of its own gives it
        // (the first copy of an event claims it, the later ones are its
        // copies).
        Err(e) if refused_by(&e, REPLAYED_BODY) || refused_by(&e, COPIED_EVENT) => {
            if let [alone] = requests {
                let answer = if refused_by(&e, REPLAYED_BODY) {
                    Claim::ReplayedBody
                } else {
                    // Swept since: an empty answer, claimed again.
                    copy_of(client, alone)
                        .await?
                        .unwrap_or(Claim::Legs(Vec::new()))
                };
                return Ok(vec![Claimed::unlinked(answer)]);
            }
            let mut out = Vec::with_capacity(requests.len());
            for request in requests {
                out.push(Box::pin(claim_linked(client, policy, request)).await?);
            }
            return Ok(out);
        }
        Err(e) => return Err(e),
    };
    let mut out: Vec<Claimed> = Vec::with_capacity(requests.len());
    for (i, r) in requests.iter().enumerate() {
        let first = firsts[&r.key];
        let answer = if first == i {
            match decided.remove(&i) {
                Some(answer) => answer,
                // Swept between the statements: claim it again on its own.
                None => {
                    let mut again = Claimed::unlinked(Claim::Legs(Vec::new()));
                    for _ in 0..SWEPT_RETRIES {
                        let mut answers =
                            Box::pin(claim_firsts(client, policy, std::slice::from_ref(r), &{
                                let mut one = BTreeMap::new();
                                one.insert(&r.key, 0);
                                one
                            }))
                            .await?;
                        if let Some(answer) = answers.remove(&0) {
                            again = answer;
                            break;
                        }
                    }
                    again
                }
            }
        } else if requests[first].body_sha256 != r.body_sha256 {
            // The statement tried only the first body of this key; this one
            // differs, so decide it exactly as a claim of its own would.
            Box::pin(claim_linked(client, policy, r)).await?
        } else {
            // A copy that raced the first in this very batch: a duplicate
            // of whatever the first made of it, linked as the first is.
            match out.get(first) {
                Some(Claimed {
                    claim: Claim::Legs(legs),
                    links,
                }) => Claimed {
                    claim: Claim::Legs(
                        legs.iter()
                            .map(|(d, leg): &(DestinationName, LegClaim)| {
                                let status = match leg {
                                    LegClaim::Filtered => Status::Filtered,
                                    LegClaim::Duplicate(status) => *status,
                                    _ => Status::Processing,
                                };
                                (d.clone(), LegClaim::Duplicate(status))
                            })
                            .collect(),
                    ),
                    links: links.clone(),
                },
                Some(other) => other.clone(),
                None => Claimed::unlinked(Claim::Legs(Vec::new())),
            }
        };
        out.push(answer);
    }
    Ok(out)
}

/// Runs [`CLAIM`] for the first request of each key, then reads what is
/// there for those it did not write every leg of. Answers by request
/// position; a delivery that vanished between the two statements has no
/// answer.
async fn claim_firsts(
    client: &impl Session,
    policy: &Policy,
    requests: &[ClaimRequest],
    firsts: &BTreeMap<&DeliveryKey, usize>,
) -> Result<HashMap<usize, Claimed>, DbError> {
    let order: Vec<usize> = firsts.values().copied().collect();
    let pick = |f: &dyn Fn(&ClaimRequest) -> Option<&str>| -> Vec<Option<&str>> {
        order.iter().map(|&i| f(&requests[i])).collect()
    };
    let providers = pick(&|r| Some(r.key.provider.as_str()));
    let sources = pick(&|r| Some(r.key.source.as_str()));
    let hook_ids = pick(&|r| Some(r.key.hook_id.as_str()));
    let delivery_ids = pick(&|r| Some(r.key.delivery_id.as_str()));
    let events = pick(&|r| Some(r.event.as_str()));
    let actions = pick(&|r| r.action.as_deref());
    let repositories = pick(&|r| r.repository.as_deref());
    let traceparents = pick(&|r| r.origin.traceparent.as_deref());
    let tenants = pick(&|r| r.origin.github_tenant.as_deref());
    let shas: Vec<&[u8]> = order
        .iter()
        .map(|&i| &requests[i].body_sha256[..])
        .collect();
    let guarded: Vec<bool> = order.iter().map(|&i| requests[i].guarded).collect();
    let content_types = pick(&|r| Some(r.body.content_type.as_str()));
    let headers: Vec<&serde_json::Value> =
        order.iter().map(|&i| &requests[i].body.headers).collect();
    let sizes: Vec<i32> = order.iter().map(|&i| requests[i].body.size).collect();
    let encodings = pick(&|r| Some(r.body.encoding));
    let bodies: Vec<&[u8]> = order.iter().map(|&i| &requests[i].body.bytes[..]).collect();
    // Where each request arrived in the batch: the order of its ordered
    // legs' places.
    let arrival: Vec<i64> = order.iter().map(|&i| i as i64).collect();
    let pinned: Vec<bool> = order.iter().map(|&i| requests[i].pinned).collect();
    let mut leg_ix: Vec<i64> = Vec::new();
    let mut leg_destination: Vec<&str> = Vec::new();
    let mut leg_filtered: Vec<Option<&str>> = Vec::new();
    let mut leg_order_key: Vec<Option<&str>> = Vec::new();
    let mut leg_fair_key: Vec<Option<&str>> = Vec::new();
    let mut leg_fair_cap: Vec<Option<i32>> = Vec::new();
    let mut leg_fair_hard: Vec<Option<bool>> = Vec::new();
    let mut leg_stale_clock: Vec<Option<DateTime<Utc>>> = Vec::new();
    for (position, &i) in order.iter().enumerate() {
        for leg in &requests[i].legs {
            // `with ordinality` numbers the deliveries from 1.
            leg_ix.push(position as i64 + 1);
            leg_destination.push(leg.destination.as_str());
            leg_filtered.push(leg.filtered);
            leg_order_key.push(leg.order_key.as_deref());
            leg_fair_key.push(leg.fair.as_ref().map(|(k, _, _)| k.as_str()));
            leg_fair_cap.push(leg.fair.as_ref().map(|(_, c, _)| *c));
            leg_fair_hard.push(leg.fair.as_ref().map(|(_, _, h)| *h));
            leg_stale_clock.push(leg.stale_clock);
        }
    }
    let rows = sql::query(
        client,
        CLAIM,
        &[
            &providers,
            &sources,
            &hook_ids,
            &delivery_ids,
            &events,
            &actions,
            &shas,
            &guarded,
            &pinned,
            &repositories,
            &leg_ix,
            &leg_destination,
            &leg_filtered,
            &secs(policy.lease),
            &policy.max_attempts,
            &traceparents,
            &tenants,
            &leg_order_key,
            &arrival,
            &leg_fair_key,
            &leg_fair_cap,
            &leg_fair_hard,
            &leg_stale_clock,
            &content_types,
            &headers,
            &sizes,
            &encodings,
            &bodies,
        ],
    )
    .await?;

    // What the statement wrote, by delivery, and the traces it found.
    let mut written: HashMap<DeliveryTuple, (bool, Vec<(String, LegClaim)>)> = HashMap::new();
    let mut linked: HashMap<DeliveryTuple, ClaimLinks> = HashMap::new();
    for r in &rows {
        let key: DeliveryTuple = (r.get(0), r.get(1), r.get(2), r.get(3));
        let destination: String = r.get(4);
        let token = ClaimToken(r.get(5));
        let attempts: i32 = r.get(6);
        let status = status_of(r.get(7))?;
        let inserted: bool = r.get(8);
        let held: bool = r.get(12);
        let links = linked.entry(key.clone()).or_default();
        links.stored = links.stored.take().or(r.get(9));
        links.redelivery = links.redelivery.take().or(r.get(10));
        let leg = match status {
            Status::Filtered => LegClaim::Filtered,
            _ => LegClaim::Claimed {
                token,
                reclaimed: !inserted,
                attempts,
                held,
            },
        };
        let entry = written.entry(key).or_insert((false, Vec::new()));
        entry.0 |= inserted;
        entry.1.push((destination, leg));
    }

    // A delivery the statement inserted is new: it has exactly the legs it
    // wrote. For any other, read what is there.
    let unresolved: Vec<&DeliveryKey> = firsts
        .keys()
        .copied()
        .filter(|k| {
            written
                .get(&delivery_tuple(k))
                .is_none_or(|(inserted, _)| !inserted)
        })
        .collect();
    let mut existing: HashMap<DeliveryTuple, Vec<Existing>> = HashMap::new();
    if !unresolved.is_empty() {
        let column = |f: &dyn Fn(&DeliveryKey) -> &str| -> Vec<&str> {
            unresolved.iter().map(|k| f(k)).collect()
        };
        let (p, s, h, d) = (
            column(&|k| k.provider.as_str()),
            column(&|k| k.source.as_str()),
            column(&|k| k.hook_id.as_str()),
            column(&|k| k.delivery_id.as_str()),
        );
        for r in sql::query(
            client,
            CLAIM_STATE,
            &[&p, &s, &h, &d, &secs(policy.publish_timeout)],
        )
        .await?
        {
            existing
                .entry((r.get(0), r.get(1), r.get(2), r.get(3)))
                .or_default()
                .push(Existing::from_row(&r)?);
        }
    }

    let mut answers = HashMap::with_capacity(firsts.len());
    for (key, &i) in firsts {
        let k = delivery_tuple(key);
        let (_, mut legs) = written.remove(&k).unwrap_or_default();
        let there = existing.remove(&k).unwrap_or_default();
        let mut links = linked.remove(&k).unwrap_or_default();
        if links.stored.is_none() {
            links.stored = there.iter().find_map(|e| e.traceparent.clone());
        }
        let answer = if there
            .iter()
            .any(|e| e.body_sha256.as_slice() != requests[i].body_sha256.as_slice())
        {
            Claim::Conflict
        } else {
            for e in &there {
                if !legs.iter().any(|(d, _)| d == &e.destination) {
                    legs.push((e.destination.clone(), e.decide()));
                }
            }
            if legs.is_empty() {
                // Swept between the statements: the caller claims it again.
                continue;
            }
            legs.sort_by(|a, b| a.0.cmp(&b.0));
            Claim::Legs(
                legs.into_iter()
                    .map(|(d, leg)| {
                        DestinationName::stored(&d)
                            .map(|name| (name, leg))
                            .map_err(|e| DbError::BadRow(e.part()))
                    })
                    .collect::<Result<_, _>>()?,
            )
        };
        answers.insert(
            i,
            Claimed {
                claim: answer,
                links,
            },
        );
    }
    Ok(answers)
}

const PUBLISH_FAILED: &str = concat!(
    "
update deliveries
set status = 'failed', retryable = true, next_attempt_at = now(),
    failed_at = now(), first_failed_at = coalesce(first_failed_at, now()),
    last_error_class = ",
    class!(publish),
    ", last_error = $7
where ",
    key!(),
    " and claim_token = $6 and attempts = $8
  and (status || '' = 'processing'
       or (status || '' = 'failed' and last_error_class = ",
    class!(lost),
    "))"
);

/// After ingest's publish of a leg failed: records the leg as failed,
/// retryable, due now, so that the scheduler publishes it once the broker
/// is back. A state change only: the claim wrote the body. Guarded by the
/// claim's own token *and* `attempts` as the claim saw it (0 for a new
/// claim; a reclaimed retry keeps its count): if a worker took the job
/// after all (the confirm was lost, not the message), this changes nothing
/// and never undoes the take.
///
/// The claim may also have been reaped `lost` meanwhile (a publish that
/// failed only after the lease and the reaper's grace ran out): the row
/// still holds this claim's token and attempts, so no one took it, and it
/// is recorded the same way; a take since would have installed a new token
/// and bumped `attempts`, and the guard refuses. Returns whether it
/// recorded it.
pub async fn publish_failed(
    client: &impl Session,
    key: &LegKey,
    token: ClaimToken,
    error: &str,
    attempts_at_claim: i32,
) -> Result<bool, DbError> {
    let error = redact(error);
    let n = super::execute(
        client,
        PUBLISH_FAILED,
        key,
        &[&token.0, &error, &attempts_at_claim],
    )
    .await?;
    Ok(n == 1)
}

const HOLD_FAIR: &str = concat!(
    "
update deliveries
set status = 'failed', retryable = true, next_attempt_at = null, failed_at = now(),
    last_error_class = ",
    class!(fair),
    ",
    last_error = 'waiting: its installation has its share of legs queued'
where ",
    key!(),
    " and claim_token = $6 and attempts = $7
  and (status || '' = 'processing'
       or (status || '' = 'failed' and last_error_class = ",
    class!(lost),
    "))
  and fair_key is not null"
);

/// Holds a leg its claim found crowded ([`LegClaim::Claimed`] `held`): it
/// waits its installation's turn, failed and retryable with class `fair`,
/// not due, no attempt spent, instead of being published. A state change
/// only: the claim wrote the body. The leg is released (moved to
/// `processing` and published) by the worker after one of its
/// installation's legs ends (`next_fair`) or by the scheduler's pass
/// (`wake_fair`). Guarded like [`publish_failed`] by the claim's token and
/// attempts, and like it holds a claim the reaper turned `lost` meanwhile.
/// Returns whether it held the leg; `false` when the leg moved on (a
/// worker or a concurrent claim has it).
pub async fn hold_fair(
    client: &impl Session,
    key: &LegKey,
    token: ClaimToken,
    attempts_at_claim: i32,
) -> Result<bool, DbError> {
    let n = super::execute(client, HOLD_FAIR, key, &[&token.0, &attempts_at_claim]).await?;
    Ok(n == 1)
}
