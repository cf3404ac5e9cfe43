//! Ingest's transitions: the claim (one request, or a batch of them by
//! group commit), and what ingest records when it cannot publish.

use std::collections::HashMap;

use crate::postgres::sql::{self, Session};
use uuid::Uuid;

use super::parked::ParkedBody;
use super::row::{KeyColumns, KeyTuple, firsts_by_key, key_of, key_tuple, status_of};
use super::{Policy, Status, execute, params, query_one, redact, secs};
use crate::key::{ClaimToken, DeliveryKey};
use crate::postgres::DbError;

/// A claim request from ingest.
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
    /// delivery id is refused ([`Claim::ReplayedBody`]), and one seen under
    /// the same delivery id and another hook id is a copy ([`Claim::Copy`]).
    pub guarded: bool,
    /// The source pins its hook ids: the same delivery id under another
    /// (pinned) hook id is one event sent to two hooks, each claimed and
    /// run for its hook.
    pub pinned: bool,
}

/// What a claim decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// This request owns the claim: publish a job carrying `token`.
    Claimed {
        /// The token the job must carry.
        token: ClaimToken,
        /// False for a new row; true when an expired lease or a due retry
        /// was claimed again.
        reclaimed: bool,
        /// Takes so far (0 for a new row; a reclaim keeps the count).
        attempts: i32,
    },
    /// Claimed by an earlier request that never saw its job taken, longer
    /// ago than the publish timeout: its publish may have died with its
    /// ingest. Republish with the same token; a second copy is harmless.
    Republish {
        /// The token of the existing claim.
        token: ClaimToken,
    },
    /// A duplicate of a delivery in this state; nothing to publish.
    Duplicate(Status),
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
        /// That claim's status; `None` once retention swept its row.
        status: Option<Status>,
    },
}

/// The SQLSTATE `hookinbox_replayed_body()` raises (migration 6).
const REPLAYED_BODY: &str = "HB409";
/// The SQLSTATE `hookinbox_copied_event()` raises (migration 7).
const COPIED_EVENT: &str = "HB200";

/// The replay guard, after a claim CTE named `claimed` (`inserted` true for
/// a new row): each new row's body is recorded for its source in
/// `seen_bodies`; when the body was recorded before under another delivery
/// id, the statement raises `HB409` (a replay); under the same delivery id
/// and another hook id where hook ids are not pinned, `HB200` (a copy of
/// the event). Either way it leaves nothing behind: the copy's row is not
/// inserted, so the event keeps one claim and one effect. `DO UPDATE` (a
/// no-op) rather than `DO NOTHING`: it returns the row that is there, even
/// one a concurrent claim committed after this statement began, so two
/// hooks' copies racing each other still get one claim between them.
macro_rules! guard_new_bodies {
    ($rows:literal) => {
        concat!(
            ", guard as (
    insert into seen_bodies (provider, source, body_sha256, hook_id, delivery_id)
    ",
            $rows,
            "
    on conflict (provider, source, body_sha256) do update set hook_id = seen_bodies.hook_id
    returning provider, source, body_sha256, hook_id, delivery_id
)"
        )
    };
}

const CLAIM: &str = concat!(
    "
with claimed as (
    insert into deliveries as d
        (provider, source, hook_id, delivery_id, event, action, body_sha256,
         status, claim_token, lease_until, claimed_at, repository)
    values ($1, $2, $3, $4, $5, $6, $7,
            'processing', $8, now() + make_interval(secs => $9), now(), $13)
    ",
    reclaim_on_conflict!(),
    "
    returning (xmax = 0) as inserted, attempts
)",
    guard_new_bodies!("select $1, $2, $7, $3, $4 from claimed where claimed.inserted and $11"),
    "
select inserted, attempts,
       case when exists (select 1 from guard g where g.delivery_id <> $4)
            then hookinbox_replayed_body()
            when exists (select 1 from guard g where g.hook_id <> $3 and not $12)
            then hookinbox_copied_event() end
from claimed"
);

/// The state a claim reports when `ON CONFLICT … WHERE` refused the key.
const CLAIM_STATE: &str = concat!(
    "
select status, attempts, claim_token, body_sha256, lease_until > now(),
       claimed_at < now() - make_interval(secs => $5)
from deliveries
where ",
    key!()
);

/// What a row the claim could not take over says; [`Existing::decide`]
/// turns it into the answer, for [`claim`] and [`claim_batch`] alike.
struct Existing {
    status: Status,
    attempts: i32,
    token: ClaimToken,
    body_sha256: Vec<u8>,
    lease_live: Option<bool>,
    publish_overdue: bool,
}

impl Existing {
    fn from_row(row: &tokio_postgres::Row, at: usize) -> Result<Self, DbError> {
        Ok(Self {
            status: status_of(row.get(at))?,
            attempts: row.get(at + 1),
            token: ClaimToken(row.get(at + 2)),
            body_sha256: row.get(at + 3),
            lease_live: row.get(at + 4),
            publish_overdue: row.get(at + 5),
        })
    }

    /// Another body under the same key is a conflict. A claim nobody took
    /// (attempts 0), still leased, but claimed longer ago than the publish
    /// timeout may have lost its publish with its ingest: republish it with
    /// the same token. Anything else is a duplicate of what is there.
    fn decide(&self, body_sha256: &[u8; 32]) -> Claim {
        if self.body_sha256.as_slice() != body_sha256.as_slice() {
            Claim::Conflict
        } else if self.status == Status::Processing
            && self.attempts == 0
            && self.lease_live == Some(true)
            && self.publish_overdue
        {
            Claim::Republish { token: self.token }
        } else {
            Claim::Duplicate(self.status)
        }
    }
}

/// Claims a delivery for ingest in one statement: a new key is inserted;
/// an existing one is taken over only when its lease expired or its retry is
/// due, and only with the same body. Never `exists()` then `insert()`: two
/// racing copies of one delivery must get one claim between them.
pub async fn claim(
    client: &impl Session,
    policy: &Policy,
    req: &ClaimRequest,
) -> Result<Claim, DbError> {
    let body_sha: &[u8] = &req.body_sha256;
    // The row may vanish between the two statements (retention); then the
    // claim is simply tried again.
    for _ in 0..3 {
        let token = ClaimToken::new();
        let row = sql::query_opt(
            client,
            CLAIM,
            &params(
                &req.key,
                &[
                    &req.event,
                    &req.action,
                    &body_sha,
                    &token.0,
                    &secs(policy.lease),
                    &policy.max_attempts,
                    &req.guarded,
                    &req.pinned,
                    &req.repository,
                ],
            ),
        )
        .await;
        let row = match row {
            Err(e) if refused_by(&e, REPLAYED_BODY) => return Ok(Claim::ReplayedBody),
            Err(e) if refused_by(&e, COPIED_EVENT) => match copy_of(client, req).await? {
                Some(copy) => return Ok(copy),
                // The first copy's body was swept meanwhile: claim again.
                None => continue,
            },
            other => other?,
        };
        if let Some(row) = row {
            let inserted: bool = row.get(0);
            return Ok(Claim::Claimed {
                token,
                reclaimed: !inserted,
                attempts: row.get(1),
            });
        }
        // ON CONFLICT ... WHERE refused: report what is there.
        if let Some(row) = sql::query_opt(
            client,
            CLAIM_STATE,
            &params(&req.key, &[&secs(policy.publish_timeout)]),
        )
        .await?
        {
            return Ok(Existing::from_row(&row, 0)?.decide(&req.body_sha256));
        }
    }
    Ok(Claim::Duplicate(Status::Processing))
}

const CLAIM_BATCH: &str = concat!(
    "
with input as (
    select * from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                         $7::bytea[], $8::uuid[], $11::bool[], $12::bool[], $13::text[])
        as i(provider, source, hook_id, delivery_id, event, action, body_sha256, claim_token,
             guarded, pinned, repository)
), claimed as (
    insert into deliveries as d
        (provider, source, hook_id, delivery_id, event, action, body_sha256,
         status, claim_token, lease_until, claimed_at, repository)
    select provider, source, hook_id, delivery_id, event, action, body_sha256,
           'processing', claim_token, now() + make_interval(secs => $9), now(), repository
    from input
    order by provider, source, hook_id, delivery_id
    ",
    reclaim_on_conflict!(),
    "
    returning d.provider, d.source, d.hook_id, d.delivery_id, (xmax = 0) as inserted, d.attempts
)",
    guard_new_bodies!(
        "select distinct on (i.provider, i.source, i.body_sha256)
           i.provider, i.source, i.body_sha256, i.hook_id, i.delivery_id
    from claimed c join input i using (provider, source, hook_id, delivery_id)
    where c.inserted and i.guarded
    order by i.provider, i.source, i.body_sha256"
    ),
    "
select c.provider, c.source, c.hook_id, c.delivery_id, c.inserted, c.attempts,
       case when exists (
           select 1 from guard g join input i using (provider, source, body_sha256)
           where i.guarded and g.delivery_id <> i.delivery_id)
            then hookinbox_replayed_body()
            when exists (
           select 1 from guard g join input i using (provider, source, body_sha256)
           where i.guarded and g.hook_id <> i.hook_id and not i.pinned)
            then hookinbox_copied_event() end
from claimed c"
);

/// Whether `e` is the replay guard's refusal `code`.
fn refused_by(e: &DbError, code: &str) -> bool {
    e.refusal().is_some_and(|r| r.code == code)
}

/// The claim a copy's body was first seen under (`$3` the body), as the
/// guard recorded it, and that claim's status while its row is kept.
const FIRST_SEEN: &str = "
select s.provider, s.source, s.hook_id, s.delivery_id, d.status
from seen_bodies s
left join deliveries d using (provider, source, hook_id, delivery_id)
where s.provider = $1 and s.source = $2 and s.body_sha256 = $3";

/// Reports a copy ([`Claim::Copy`]): the claim the guard found its body
/// under; `None` if retention swept that body since.
async fn copy_of(client: &impl Session, req: &ClaimRequest) -> Result<Option<Claim>, DbError> {
    let body_sha: &[u8] = &req.body_sha256;
    let row = sql::query_opt(
        client,
        FIRST_SEEN,
        &[&req.key.provider, &req.key.source, &body_sha],
    )
    .await?;
    row.map(|row| {
        Ok(Claim::Copy {
            of: key_of(&row)?,
            status: row.get::<_, Option<&str>>(4).map(status_of).transpose()?,
        })
    })
    .transpose()
}

/// [`CLAIM_STATE`] for many keys.
const CLAIM_BATCH_STATE: &str = "
select d.provider, d.source, d.hook_id, d.delivery_id, d.status, d.attempts, d.claim_token,
       d.body_sha256, d.lease_until > now(),
       d.claimed_at < now() - make_interval(secs => $5)
from deliveries d
join unnest($1::text[], $2::text[], $3::text[], $4::text[])
     as k(provider, source, hook_id, delivery_id)
  using (provider, source, hook_id, delivery_id)";

/// Group commit: claims many requests in one statement
/// (`INSERT … SELECT FROM unnest(…) ON CONFLICT … RETURNING`), answering
/// each exactly as [`claim`] would.
///
/// One statement cannot affect the same row twice, so the keys are
/// deduplicated first: the first request of a key takes part in the
/// statement, and later copies in the same batch are duplicates of it (or
/// conflicts, with another body). The keys are sorted, so concurrent batches
/// lock rows in the same order and cannot deadlock.
pub async fn claim_batch(
    client: &impl Session,
    policy: &Policy,
    requests: &[ClaimRequest],
) -> Result<Vec<Claim>, DbError> {
    let firsts = firsts_by_key(requests.iter().map(|r| &r.key));
    let tokens: HashMap<usize, ClaimToken> =
        firsts.values().map(|&i| (i, ClaimToken::new())).collect();
    let keys = KeyColumns::of(firsts.keys().copied());
    let events: Vec<&str> = firsts
        .values()
        .map(|&i| requests[i].event.as_str())
        .collect();
    let actions: Vec<Option<&str>> = firsts
        .values()
        .map(|&i| requests[i].action.as_deref())
        .collect();
    let shas: Vec<&[u8]> = firsts
        .values()
        .map(|&i| &requests[i].body_sha256[..])
        .collect();
    let uuids: Vec<Uuid> = firsts.values().map(|i| tokens[i].0).collect();
    let guarded: Vec<bool> = firsts.values().map(|&i| requests[i].guarded).collect();
    let pinned: Vec<bool> = firsts.values().map(|&i| requests[i].pinned).collect();
    let repositories: Vec<Option<&str>> = firsts
        .values()
        .map(|&i| requests[i].repository.as_deref())
        .collect();
    let rows = match sql::query(
        client,
        CLAIM_BATCH,
        &keys.params(&[
            &events,
            &actions,
            &shas,
            &uuids,
            &secs(policy.lease),
            &policy.max_attempts,
            &guarded,
            &pinned,
            &repositories,
        ]),
    )
    .await
    {
        // A replay or a copy refuses the whole statement, and Postgres
        // says which only for one of them: claim each on its own, in
        // order, so that each gets the answer `claim` gives it (the first
        // copy of an event claims it, the later ones are its copies).
        Err(e) if refused_by(&e, REPLAYED_BODY) || refused_by(&e, COPIED_EVENT) => {
            let mut out = Vec::with_capacity(requests.len());
            for request in requests {
                out.push(claim(client, policy, request).await?);
            }
            return Ok(out);
        }
        other => other?,
    };
    let claimed: HashMap<KeyTuple, (bool, i32)> = rows
        .iter()
        .map(|r| {
            (
                (r.get(0), r.get(1), r.get(2), r.get(3)),
                (r.get(4), r.get(5)),
            )
        })
        .collect();

    // Report what is there for the keys the statement did not claim.
    let missing: Vec<&DeliveryKey> = firsts
        .keys()
        .copied()
        .filter(|k| !claimed.contains_key(&key_tuple(k)))
        .collect();
    let mut states: HashMap<KeyTuple, Existing> = HashMap::new();
    if !missing.is_empty() {
        let keys = KeyColumns::of(missing.iter().copied());
        for r in sql::query(
            client,
            CLAIM_BATCH_STATE,
            &keys.params(&[&secs(policy.publish_timeout)]),
        )
        .await?
        {
            states.insert(
                (r.get(0), r.get(1), r.get(2), r.get(3)),
                Existing::from_row(&r, 4)?,
            );
        }
    }

    let mut out = Vec::with_capacity(requests.len());
    for (i, r) in requests.iter().enumerate() {
        let k = key_tuple(&r.key);
        let first = firsts[&r.key];
        let answer = if let Some(&(inserted, attempts)) = claimed.get(&k) {
            if first == i {
                Claim::Claimed {
                    token: tokens[&i],
                    reclaimed: !inserted,
                    attempts,
                }
            } else if requests[first].body_sha256 == r.body_sha256 {
                // A copy that raced the first in this very batch.
                Claim::Duplicate(Status::Processing)
            } else {
                Claim::Conflict
            }
        } else if first != i && requests[first].body_sha256 != r.body_sha256 {
            // The statement tried only the first body of this key; this one
            // differs, so decide it exactly as a claim of its own would.
            claim(client, policy, r).await?
        } else if let Some(row) = states.get(&k) {
            row.decide(&r.body_sha256)
        } else {
            // Swept between the statements: claim it on its own.
            claim(client, policy, r).await?
        };
        out.push(answer);
    }
    Ok(out)
}

const PARK_DUE: &str = concat!(
    "
with moved as (
    update deliveries
    set status = 'failed', retryable = true, next_attempt_at = now(),
        failed_at = now(), first_failed_at = coalesce(first_failed_at, now()),
        last_error_class = 'publish', last_error = $6
    where ",
    key!(),
    " and ",
    held_by!("$5"),
    " and attempts = $7
    returning provider, source, hook_id, delivery_id
), ",
    park_moved!(8, 9, 10),
    "
select count(*) from moved"
);

/// After ingest's publish failed: parks the body and records the delivery
/// as failed, retryable, due now, so that the scheduler publishes it once
/// the broker is back. One statement, so the row never says "due" without
/// a body to publish. Guarded by the claim's own token *and*
/// `attempts` as the claim saw it (0 for a new claim; a reclaimed retry
/// keeps its count): if a worker took the job after all (the confirm was
/// lost, not the message), this changes nothing and never undoes the take.
/// Returns whether it parked.
pub async fn park_due(
    client: &impl Session,
    key: &DeliveryKey,
    token: ClaimToken,
    error: &str,
    attempts_at_claim: i32,
    parked: ParkedBody<'_>,
) -> Result<bool, DbError> {
    let headers = parked.headers_json();
    let row = query_one(
        client,
        PARK_DUE,
        key,
        &[
            &token.0,
            &redact(error),
            &attempts_at_claim,
            &parked.content_type,
            &headers,
            &parked.body,
        ],
    )
    .await?;
    Ok(row.get::<_, i64>(0) == 1)
}

const PARK_COPY: &str = concat!(
    "
insert into parked_bodies (provider, source, hook_id, delivery_id, content_type, headers, body)
select provider, source, hook_id, delivery_id, $5, $6, $7
from deliveries
where ",
    key!(),
    "
  and status = 'processing'
on conflict (provider, source, hook_id, delivery_id) do nothing"
);

/// Parks the body of a copy that raced a claim still processing. The claim
/// may belong to an ingest that died before publishing: then the reaper
/// turns it `lost`, and the scheduler republishes this body. If the claim's
/// job runs normally, completion deletes the body. One statement; a no-op
/// when a body is parked already or the row moved on.
pub async fn park_copy(
    client: &impl Session,
    key: &DeliveryKey,
    parked: ParkedBody<'_>,
) -> Result<(), DbError> {
    let headers = parked.headers_json();
    execute(
        client,
        PARK_COPY,
        key,
        &[&parked.content_type, &headers, &parked.body],
    )
    .await?;
    Ok(())
}
