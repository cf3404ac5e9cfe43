//! The delivery state machine, one function per transition, each next to
//! the single SQL statement that decides it.
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
//! `status || ''` rather than `status`. The planner may otherwise answer
//! `status = 'processing'` from an index of processing rows (the partial
//! lease index, or the one led by `status`), and such an index holds every
//! row that was ever processing until a vacuum: the statement would then
//! grow slower with history. The key is the only way in; the reaper, which
//! wants the lease index, keeps the plain comparison. `tests/it/plans.rs`
//! checks this for the hot path.

use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::db::DbError;
use crate::key::{ClaimToken, DeliveryKey};

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

/// The key's four columns (`$1`–`$4` of every keyed statement), then `rest`.
fn params<'a>(key: &'a DeliveryKey, rest: &[Param<'a>]) -> Vec<Param<'a>> {
    let mut all: Vec<Param<'a>> = vec![&key.provider, &key.source, &key.hook_id, &key.delivery_id];
    all.extend_from_slice(rest);
    all
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
}

impl ErrorClass {
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
        }
    }
}

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
}

impl Status {
    fn parse(s: &str) -> Self {
        match s {
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            _ => Self::Processing,
        }
    }

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "processing",
            Self::Completed => "completed",
            Self::Failed => "failed",
        }
    }
}

/// A claim request from ingest.
#[derive(Clone, Copy, Debug)]
pub struct NewClaim<'a> {
    /// The delivery's key.
    pub key: &'a DeliveryKey,
    /// `X-GitHub-Event`.
    pub event: &'a str,
    /// The payload's `action`, when it has one.
    pub action: Option<&'a str>,
    /// SHA-256 of the raw body: the same key with another body is a conflict.
    pub body_sha256: &'a [u8; 32],
}

/// What a claim decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
}

const CLAIM: &str = "
insert into deliveries as d
    (provider, source, hook_id, delivery_id, event, action, body_sha256,
     status, claim_token, lease_until, claimed_at)
values ($1, $2, $3, $4, $5, $6, $7,
        'processing', $8, now() + make_interval(secs => $9), now())
on conflict (provider, source, hook_id, delivery_id) do update
    set status = 'processing', retryable = false,
        claim_token = excluded.claim_token, lease_until = excluded.lease_until,
        claimed_at = excluded.claimed_at, next_attempt_at = null
    where d.body_sha256 = excluded.body_sha256
      and ((d.status = 'processing' and d.lease_until < now())
        or (d.status = 'failed' and d.retryable and d.next_attempt_at <= now()
            and d.attempts < $10))
returning (xmax = 0) as inserted, attempts";

const CLAIM_STATE: &str = "
select status, attempts, claim_token, body_sha256 = $5 as same_body,
       lease_until > now() as lease_live,
       claimed_at < now() - make_interval(secs => $6) as publish_overdue
from deliveries
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4";

/// Claims a delivery for ingest in one statement: a new key is inserted;
/// an existing one is taken over only when its lease expired or its retry is
/// due, and only with the same body. Never `exists()` then `insert()`: two
/// racing copies of one delivery must get one claim between them.
pub async fn claim(
    client: &impl GenericClient,
    policy: &Policy,
    req: NewClaim<'_>,
) -> Result<Claim, DbError> {
    let k = req.key;
    let insert = client.prepare_cached(CLAIM).await?;
    let state = client.prepare_cached(CLAIM_STATE).await?;
    let body_sha: &[u8] = req.body_sha256;
    // The row may vanish between the two statements (retention); then the
    // claim is simply tried again.
    for _ in 0..3 {
        let token = ClaimToken::new();
        let row = client
            .query_opt(
                &insert,
                &params(
                    k,
                    &[
                        &req.event,
                        &req.action,
                        &body_sha,
                        &token.0,
                        &secs(policy.lease),
                        &policy.max_attempts,
                    ],
                ),
            )
            .await?;
        if let Some(row) = row {
            let inserted: bool = row.get(0);
            return Ok(Claim::Claimed {
                token,
                reclaimed: !inserted,
                attempts: row.get(1),
            });
        }
        // ON CONFLICT ... WHERE refused: report what is there.
        let Some(row) = client
            .query_opt(
                &state,
                &params(k, &[&body_sha, &secs(policy.publish_timeout)]),
            )
            .await?
        else {
            continue;
        };
        let status = Status::parse(row.get(0));
        let attempts: i32 = row.get(1);
        let token = ClaimToken(row.get(2));
        let same_body: bool = row.get(3);
        let lease_live: Option<bool> = row.get(4);
        let publish_overdue: bool = row.get(5);
        if !same_body {
            return Ok(Claim::Conflict);
        }
        if status == Status::Processing
            && attempts == 0
            && lease_live == Some(true)
            && publish_overdue
        {
            return Ok(Claim::Republish { token });
        }
        return Ok(Claim::Duplicate(status));
    }
    Ok(Claim::Duplicate(Status::Processing))
}

/// A raw body to park with a failure: what the scheduler and replays
/// publish again.
#[derive(Clone, Copy, Debug)]
pub struct ParkedBody<'a> {
    /// The original `Content-Type`.
    pub content_type: &'a str,
    /// The original `X-GitHub-*` headers.
    pub headers: &'a [(String, String)],
    /// The raw body, as signed.
    pub body: &'a [u8],
}

impl<'a> ParkedBody<'a> {
    /// The parked form of a job.
    pub fn of(job: &'a crate::broker::Job) -> Self {
        Self {
            content_type: &job.content_type,
            headers: &job.github_headers,
            body: &job.body,
        }
    }

    fn headers_json(&self) -> serde_json::Value {
        serde_json::Value::Array(
            self.headers
                .iter()
                .map(|(k, v)| serde_json::json!([k, v]))
                .collect(),
        )
    }
}

/// Reads parked headers back.
pub fn headers_from_json(value: &serde_json::Value) -> Vec<(String, String)> {
    value
        .as_array()
        .map(|pairs| {
            pairs
                .iter()
                .filter_map(|p| {
                    Some((
                        p.get(0)?.as_str()?.to_owned(),
                        p.get(1)?.as_str()?.to_owned(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Inserts the parked body of the rows a CTE named `moved` returned; used
/// inside the statements that park.
macro_rules! park_moved {
    () => {
        "parked as (
    insert into parked_bodies (provider, source, hook_id, delivery_id, content_type, headers, body)
    select provider, source, hook_id, delivery_id, $20, $21, $22 from moved
    on conflict (provider, source, hook_id, delivery_id) do nothing
)"
    };
}

const PARK_DUE: &str = concat!(
    "
with moved as (
    update deliveries
    set status = 'failed', retryable = true, next_attempt_at = now(),
        failed_at = now(), first_failed_at = coalesce(first_failed_at, now()),
        last_error_class = 'publish', last_error = $6
    where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
      and claim_token = $5 and status || '' = 'processing' and attempts = $7
    returning provider, source, hook_id, delivery_id
), ",
    park_moved!(),
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
    client: &impl GenericClient,
    key: &DeliveryKey,
    token: ClaimToken,
    error: &str,
    attempts_at_claim: i32,
    parked: ParkedBody<'_>,
) -> Result<bool, DbError> {
    let stmt = client.prepare_cached(&renumber(PARK_DUE, 7)).await?;
    let headers = parked.headers_json();
    let row = client
        .query_one(
            &stmt,
            &params(
                key,
                &[
                    &token.0,
                    &redact(error),
                    &attempts_at_claim,
                    &parked.content_type,
                    &headers,
                    &parked.body,
                ],
            ),
        )
        .await?;
    Ok(row.get::<_, i64>(0) == 1)
}

const PARK_COPY: &str = "
insert into parked_bodies (provider, source, hook_id, delivery_id, content_type, headers, body)
select provider, source, hook_id, delivery_id, $5, $6, $7
from deliveries
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
  and status = 'processing'
on conflict (provider, source, hook_id, delivery_id) do nothing";

/// Parks the body of a copy that raced a claim still processing. The claim
/// may belong to an ingest that died before publishing: then the reaper
/// turns it `lost`, and the scheduler republishes this body. If the claim's
/// job runs normally, completion deletes the body. One statement; a no-op
/// when a body is parked already or the row moved on.
pub async fn park_copy(
    client: &impl GenericClient,
    key: &DeliveryKey,
    parked: ParkedBody<'_>,
) -> Result<(), DbError> {
    let stmt = client.prepare_cached(PARK_COPY).await?;
    let headers = parked.headers_json();
    client
        .execute(
            &stmt,
            &params(key, &[&parked.content_type, &headers, &parked.body]),
        )
        .await?;
    Ok(())
}

/// Gives the parked-body placeholders ($20–$22 in [`park_moved`]) the
/// numbers that follow a statement's own `n` parameters.
fn renumber(sql: &str, n: usize) -> String {
    sql.replace("$20", &format!("${}", n + 1))
        .replace("$21", &format!("${}", n + 2))
        .replace("$22", &format!("${}", n + 3))
}

/// What a worker's take decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    },
    /// Attempts were exhausted: the delivery is now failed, class `poison`,
    /// its body parked, and it must be dead-lettered without running the
    /// effect.
    Poisoned {
        /// How many takes it had.
        attempts: i32,
    },
    /// Another holder's lease is live: this message is a deferred copy.
    Deferred {
        /// Time left on that lease, by the database clock.
        lease_left: Duration,
    },
    /// Nothing to do for this message: the delivery is completed, failed,
    /// or no longer exists. Ack it.
    Resolved(Option<Status>),
}

const TAKE: &str = "
with prev as (
    select claim_token from deliveries
    where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
    for update
)
update deliveries d
set status = 'processing', retryable = false, next_attempt_at = null,
    claim_token = $6, lease_until = now() + make_interval(secs => $7),
    attempts = d.attempts + 1
from prev
where d.provider = $1 and d.source = $2 and d.hook_id = $3 and d.delivery_id = $4
  and d.attempts < $8
  and ((d.status = 'processing' and (d.claim_token = $5 or d.lease_until < now()))
    or (d.status = 'failed' and d.last_error_class = 'lost'))
returning d.attempts, prev.claim_token <> $5 and d.last_error_class is distinct from 'lost',
          d.created_at";

const POISON: &str = concat!(
    "
with moved as (
    update deliveries
    set status = 'failed', retryable = false, failed_at = now(),
        first_failed_at = coalesce(first_failed_at, now()),
        last_error_class = 'poison',
        last_error = 'attempts exhausted: the job crashed or hung its worker on every attempt'
    where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
      and attempts >= $6
      and ((status = 'processing' and (claim_token = $5 or lease_until < now()))
        or (status = 'failed' and last_error_class = 'lost'))
    returning provider, source, hook_id, delivery_id, attempts
), ",
    park_moved!(),
    "
select attempts from moved"
);

const TAKE_STATE: &str = "
select status, greatest(extract(epoch from lease_until - now()), 0)::float8
from deliveries
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4";

/// Takes a delivery for a worker, presenting the token its message carries.
///
/// The take installs a new token and counts the attempt *before* the effect
/// runs: a job that crashes its worker every time still reaches
/// `max_attempts`, and is then failed as `poison` instead of run again.
pub async fn take(
    client: &impl GenericClient,
    policy: &Policy,
    key: &DeliveryKey,
    presented: ClaimToken,
    parked: ParkedBody<'_>,
) -> Result<Take, DbError> {
    let take = client.prepare_cached(TAKE).await?;
    let poison = client.prepare_cached(&renumber(POISON, 6)).await?;
    let headers = parked.headers_json();
    let state = client.prepare_cached(TAKE_STATE).await?;
    loop {
        let token = ClaimToken::new();
        let lease = secs(policy.lease);
        if let Some(row) = client
            .query_opt(
                &take,
                &params(key, &[&presented.0, &token.0, &lease, &policy.max_attempts]),
            )
            .await?
        {
            return Ok(Take::Taken {
                token,
                attempts: row.get(0),
                takeover: row.get(1),
                created_at: row.get(2),
            });
        }
        if let Some(row) = client
            .query_opt(
                &poison,
                &params(
                    key,
                    &[
                        &presented.0,
                        &policy.max_attempts,
                        &parked.content_type,
                        &headers,
                        &parked.body,
                    ],
                ),
            )
            .await?
        {
            return Ok(Take::Poisoned {
                attempts: row.get(0),
            });
        }
        let Some(row) = client.query_opt(&state, &params(key, &[])).await? else {
            return Ok(Take::Resolved(None));
        };
        let status = Status::parse(row.get(0));
        let left: f64 = row.get::<_, Option<f64>>(1).unwrap_or(0.0);
        match status {
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

const TAKE_BATCH: &str = "
with input as (
    select * from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::uuid[], $6::uuid[])
        as i(provider, source, hook_id, delivery_id, presented, token)
), prev as (
    select d.provider, d.source, d.hook_id, d.delivery_id, d.claim_token as prev_token
    from deliveries d join input i using (provider, source, hook_id, delivery_id)
    order by d.provider, d.source, d.hook_id, d.delivery_id
    for update of d
)
update deliveries d
set status = 'processing', retryable = false, next_attempt_at = null,
    claim_token = i.token, lease_until = now() + make_interval(secs => $7),
    attempts = d.attempts + 1
from input i join prev p using (provider, source, hook_id, delivery_id)
where d.provider = i.provider and d.source = i.source and d.hook_id = i.hook_id
  and d.delivery_id = i.delivery_id
  and d.attempts < $8
  and ((d.status = 'processing' and (d.claim_token = i.presented or d.lease_until < now()))
    or (d.status = 'failed' and d.last_error_class = 'lost'))
returning d.provider, d.source, d.hook_id, d.delivery_id, d.attempts,
          p.prev_token <> i.presented and d.last_error_class is distinct from 'lost',
          d.created_at";

/// Group commit of takes: the common case of [`take`] (the delivery can be
/// taken) for many messages in one statement. Each answer is
/// `Some(Take::Taken)` exactly when [`take`] would have taken it, under the
/// same compare-and-set (the message's token, or an expired lease, or a
/// `lost` row, and attempts left); `None` means "not taken here", and the
/// caller runs [`take`] for that message, which decides the rarer outcomes
/// (poison, deferred, resolved).
///
/// Rows are locked in key order, so concurrent batches cannot deadlock; a
/// key that appears twice takes part once (one statement cannot update a
/// row twice), and its repeats answer `None`.
pub async fn take_batch(
    client: &impl GenericClient,
    policy: &Policy,
    items: &[(DeliveryKey, ClaimToken)],
) -> Result<Vec<Option<Take>>, DbError> {
    use std::collections::{BTreeMap, HashMap};
    let mut firsts: BTreeMap<KeyTuple, usize> = BTreeMap::new();
    for (i, (key, _)) in items.iter().enumerate() {
        firsts.entry(key_tuple(key)).or_insert(i);
    }
    let tokens: HashMap<usize, ClaimToken> =
        firsts.values().map(|&i| (i, ClaimToken::new())).collect();
    let column = |f: fn(&KeyTuple) -> &String| -> Vec<&String> { firsts.keys().map(f).collect() };
    let presented: Vec<Uuid> = firsts.values().map(|&i| items[i].1.0).collect();
    let new_tokens: Vec<Uuid> = firsts.values().map(|i| tokens[i].0).collect();
    let stmt = client.prepare_cached(TAKE_BATCH).await?;
    let rows = client
        .query(
            &stmt,
            &[
                &column(|k| &k.0),
                &column(|k| &k.1),
                &column(|k| &k.2),
                &column(|k| &k.3),
                &presented,
                &new_tokens,
                &secs(policy.lease),
                &policy.max_attempts,
            ],
        )
        .await?;
    let mut taken: HashMap<KeyTuple, Take> = HashMap::new();
    for r in rows {
        let key: KeyTuple = (r.get(0), r.get(1), r.get(2), r.get(3));
        let Some(&i) = firsts.get(&key) else {
            continue;
        };
        taken.insert(
            key,
            Take::Taken {
                token: tokens[&i],
                attempts: r.get(4),
                takeover: r.get(5),
                created_at: r.get(6),
            },
        );
    }
    Ok(items
        .iter()
        .enumerate()
        .map(|(i, (key, _))| {
            let key = key_tuple(key);
            if firsts.get(&key) == Some(&i) {
                taken.remove(&key)
            } else {
                None
            }
        })
        .collect())
}

const RENEW: &str = "
update deliveries set lease_until = now() + make_interval(secs => $6)
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
  and claim_token = $5 and status || '' = 'processing'";

/// Extends the holder's lease. Guarded by the token: a worker that lost its
/// claim cannot renew it back. Returns false when the token is gone.
pub async fn renew(
    client: &impl GenericClient,
    policy: &Policy,
    key: &DeliveryKey,
    token: ClaimToken,
) -> Result<bool, DbError> {
    let stmt = client.prepare_cached(RENEW).await?;
    let n = client
        .execute(&stmt, &params(key, &[&token.0, &secs(policy.lease)]))
        .await?;
    Ok(n == 1)
}

const FENCE: &str = "
select 1 from deliveries
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
  and claim_token = $5 and status || '' = 'processing'
for update";

/// Inside the completing transaction, before any effect: locks the row if
/// and only if `token` still holds it. While the lock is held nobody can
/// take the delivery over, so the completion that follows cannot be fenced
/// after the effect already ran. Returns false when fenced.
pub async fn fence(
    client: &impl GenericClient,
    key: &DeliveryKey,
    token: ClaimToken,
) -> Result<bool, DbError> {
    let stmt = client.prepare_cached(FENCE).await?;
    let row = client.query_opt(&stmt, &params(key, &[&token.0])).await?;
    Ok(row.is_some())
}

const COMPLETE: &str = "
with done as (
    update deliveries
    set status = 'completed', completed_at = now(), retryable = false, next_attempt_at = null
    where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
      and claim_token = $5 and status || '' = 'processing'
    returning provider, source, hook_id, delivery_id
), unparked as (
    delete from parked_bodies p using done d
    where p.provider = d.provider and p.source = d.source
      and p.hook_id = d.hook_id and p.delivery_id = d.delivery_id
)
select count(*) from done";

/// Marks the delivery completed and deletes its parked body. Run it in the
/// transaction of a database effect, so the effect and the completion
/// commit together or not at all.
/// Guarded by the token alone, not by `lease_until > now()`: a holder whose
/// lease lapsed but whom nobody replaced may still finish. Returns false
/// when fenced.
pub async fn complete(
    client: &impl GenericClient,
    key: &DeliveryKey,
    token: ClaimToken,
) -> Result<bool, DbError> {
    let stmt = client.prepare_cached(COMPLETE).await?;
    let row = client.query_one(&stmt, &params(key, &[&token.0])).await?;
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
    /// When ingest first claimed the delivery.
    pub received_at: DateTime<Utc>,
}

/// One completion for [`complete_batch`].
#[derive(Clone, Debug)]
pub struct Completing {
    /// The delivery.
    pub key: DeliveryKey,
    /// The token its holder took it with.
    pub token: ClaimToken,
    /// The event to store with the completion, if the effect is one.
    pub store: Option<StoredEvent>,
}

/// The batched completion, with an optional extra step for the
/// fault-injection suite's effect log.
macro_rules! complete_batch_sql {
    ($log:literal) => {
        concat!(
            "
with input as (
    select * from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::uuid[],
                         $6::bool[], $7::text[], $8::text[], $9::text[], $10::timestamptz[])
        as i(provider, source, hook_id, delivery_id, token, store, event, action, payload,
             received_at)
), done as (
    update deliveries d
    set status = 'completed', completed_at = now(), retryable = false, next_attempt_at = null
    from input i
    where d.provider = i.provider and d.source = i.source and d.hook_id = i.hook_id
      and d.delivery_id = i.delivery_id
      -- The fence (`status || ''`: see the module notes on plans).
      and d.claim_token = i.token and d.status || '' = 'processing'
    returning d.provider, d.source, d.hook_id, d.delivery_id, i.token
), effects as (
    select i.* from input i join done using (provider, source, hook_id, delivery_id, token)
    where i.store
), stored as (
    insert into github_events
        (provider, source, hook_id, delivery_id, event, action, payload, received_at)
    select provider, source, hook_id, delivery_id, event, action, payload::jsonb, received_at
    from effects
    on conflict do nothing
), unparked as (
    delete from parked_bodies p using done d
    where p.provider = d.provider and p.source = d.source
      and p.hook_id = d.hook_id and p.delivery_id = d.delivery_id
)",
            $log,
            "
select provider, source, hook_id, delivery_id, token from done"
        )
    };
}

#[cfg(not(feature = "failpoints"))]
const COMPLETE_BATCH: &str = complete_batch_sql!("");

// The fault-injection suite counts effects in a log without a unique key,
// so that a second effect would show.
#[cfg(feature = "failpoints")]
const COMPLETE_BATCH: &str = complete_batch_sql!(
    ", logged as (
    insert into hookinbox_effect_log (provider, source, hook_id, delivery_id)
    select provider, source, hook_id, delivery_id from effects
)"
);

/// Group commit of completions: completes many deliveries, and writes the
/// events of those whose effect is a stored event, in one statement
/// (`UPDATE … FROM unnest(…)`), answering for each whether it completed
/// (false: fenced).
///
/// Each row stays individually fenced: a row is completed only if its own
/// token still holds it (`claim_token = token and status = 'processing'`),
/// and its event is written only if that row completed, in the same
/// statement and so the same transaction. A worker that lost its delivery
/// to a takeover therefore neither completes it nor writes its effect, no
/// matter which batch it rides in. The input is sorted by key so that
/// concurrent batches lock rows in the same order.
pub async fn complete_batch(
    client: &impl GenericClient,
    items: &[Completing],
) -> Result<Vec<bool>, DbError> {
    use std::collections::BTreeMap;
    // One statement cannot update a row twice: one entry per (key, token).
    let mut unique: BTreeMap<(KeyTuple, Uuid), usize> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        unique
            .entry((key_tuple(&item.key), item.token.0))
            .or_insert(i);
    }
    let pick = |f: &dyn Fn(&Completing) -> Option<String>| -> Vec<Option<String>> {
        unique.values().map(|&i| f(&items[i])).collect()
    };
    let providers = pick(&|c| Some(c.key.provider.clone()));
    let sources = pick(&|c| Some(c.key.source.as_str().to_owned()));
    let hook_ids = pick(&|c| Some(c.key.hook_id.as_str().to_owned()));
    let ids = pick(&|c| Some(c.key.delivery_id.as_str().to_owned()));
    let events = pick(&|c| c.store.as_ref().map(|e| e.event.clone()));
    let actions = pick(&|c| c.store.as_ref().and_then(|e| e.action.clone()));
    // Borrowed, not copied: the handler checked the payload is UTF-8.
    let payloads: Vec<Option<std::borrow::Cow<'_, str>>> = unique
        .values()
        .map(|&i| {
            items[i]
                .store
                .as_ref()
                .map(|e| String::from_utf8_lossy(&e.payload))
        })
        .collect();
    let tokens: Vec<Uuid> = unique.values().map(|&i| items[i].token.0).collect();
    let store: Vec<bool> = unique.values().map(|&i| items[i].store.is_some()).collect();
    let received: Vec<Option<DateTime<Utc>>> = unique
        .values()
        .map(|&i| items[i].store.as_ref().map(|e| e.received_at))
        .collect();
    let stmt = client.prepare_cached(COMPLETE_BATCH).await?;
    let rows = client
        .query(
            &stmt,
            &[
                &providers, &sources, &hook_ids, &ids, &tokens, &store, &events, &actions,
                &payloads, &received,
            ],
        )
        .await?;
    let done: std::collections::HashSet<(KeyTuple, Uuid)> = rows
        .iter()
        .map(|r| ((r.get(0), r.get(1), r.get(2), r.get(3)), r.get(4)))
        .collect();
    // Only the entry that took part in the statement answers for its
    // (key, token); a repeat of it in the same batch is not a second
    // completion.
    Ok(items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let entry = (key_tuple(&item.key), item.token.0);
            done.contains(&entry) && unique.get(&entry) == Some(&i)
        })
        .collect())
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

const FAIL: &str = concat!(
    "
with moved as (
    update deliveries
    set status = 'failed', retryable = $6,
        next_attempt_at = case when $6 then now() + make_interval(secs => $7) end,
        failed_at = now(), first_failed_at = coalesce(first_failed_at, now()),
        last_error_class = $8, last_error = $9
    where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
      and claim_token = $5 and status || '' = 'processing'
    returning provider, source, hook_id, delivery_id, attempts, first_failed_at, failed_at
), ",
    park_moved!(),
    "
select attempts, first_failed_at, failed_at from moved"
);

/// Records a failed attempt and parks the body, in one statement, guarded
/// by the holder's token. Returns `None` when fenced (someone else holds
/// the delivery now).
pub async fn fail(
    client: &impl GenericClient,
    key: &DeliveryKey,
    token: ClaimToken,
    failure: &Failure,
    parked: ParkedBody<'_>,
) -> Result<Option<Failed>, DbError> {
    let stmt = client.prepare_cached(&renumber(FAIL, 9)).await?;
    let retryable = failure.retry_in.is_some();
    let delay = failure.retry_in.map(secs).unwrap_or(0.0);
    let headers = parked.headers_json();
    let row = client
        .query_opt(
            &stmt,
            &params(
                key,
                &[
                    &token.0,
                    &retryable,
                    &delay,
                    &failure.class.as_str(),
                    &redact(&failure.message),
                    &parked.content_type,
                    &headers,
                    &parked.body,
                ],
            ),
        )
        .await?;
    Ok(row.map(|row| Failed {
        attempts: row.get(0),
        first_failed_at: row.get(1),
        failed_at: row.get(2),
    }))
}

/// An owned claim request, for batching across requests.
#[derive(Clone, Debug)]
pub struct OwnedClaim {
    /// The delivery's key.
    pub key: DeliveryKey,
    /// `X-GitHub-Event`.
    pub event: String,
    /// The payload's `action`.
    pub action: Option<String>,
    /// SHA-256 of the raw body.
    pub body_sha256: [u8; 32],
}

const CLAIM_BATCH: &str = "
insert into deliveries as d
    (provider, source, hook_id, delivery_id, event, action, body_sha256,
     status, claim_token, lease_until, claimed_at)
select provider, source, hook_id, delivery_id, event, action, body_sha256,
       'processing', claim_token, now() + make_interval(secs => $9), now()
from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
            $7::bytea[], $8::uuid[])
     as input(provider, source, hook_id, delivery_id, event, action, body_sha256, claim_token)
order by provider, source, hook_id, delivery_id
on conflict (provider, source, hook_id, delivery_id) do update
    set status = 'processing', retryable = false,
        claim_token = excluded.claim_token, lease_until = excluded.lease_until,
        claimed_at = excluded.claimed_at, next_attempt_at = null
    where d.body_sha256 = excluded.body_sha256
      and ((d.status = 'processing' and d.lease_until < now())
        or (d.status = 'failed' and d.retryable and d.next_attempt_at <= now()
            and d.attempts < $10))
returning d.provider, d.source, d.hook_id, d.delivery_id, (xmax = 0) as inserted, d.attempts";

const CLAIM_BATCH_STATE: &str = "
select d.provider, d.source, d.hook_id, d.delivery_id, d.status, d.attempts, d.claim_token,
       d.body_sha256, d.lease_until > now(),
       d.claimed_at < now() - make_interval(secs => $5)
from deliveries d
join unnest($1::text[], $2::text[], $3::text[], $4::text[])
     as k(provider, source, hook_id, delivery_id)
  using (provider, source, hook_id, delivery_id)";

type KeyTuple = (String, String, String, String);

/// What [`claim_batch`] reads back for a key it did not claim.
struct RowState {
    status: Status,
    attempts: i32,
    token: ClaimToken,
    sha: Vec<u8>,
    lease_live: Option<bool>,
    overdue: bool,
}

fn key_tuple(key: &DeliveryKey) -> KeyTuple {
    (
        key.provider.clone(),
        key.source.as_str().to_owned(),
        key.hook_id.as_str().to_owned(),
        key.delivery_id.as_str().to_owned(),
    )
}

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
    client: &impl GenericClient,
    policy: &Policy,
    requests: &[OwnedClaim],
) -> Result<Vec<Claim>, DbError> {
    use std::collections::{BTreeMap, HashMap};
    // First request of each key, in key order.
    let mut firsts: BTreeMap<KeyTuple, usize> = BTreeMap::new();
    for (i, r) in requests.iter().enumerate() {
        firsts.entry(key_tuple(&r.key)).or_insert(i);
    }
    let tokens: HashMap<usize, ClaimToken> =
        firsts.values().map(|&i| (i, ClaimToken::new())).collect();
    let column = |f: &dyn Fn(&OwnedClaim) -> String| -> Vec<String> {
        firsts.values().map(|&i| f(&requests[i])).collect()
    };
    let providers = column(&|r| r.key.provider.clone());
    let sources = column(&|r| r.key.source.as_str().to_owned());
    let hook_ids = column(&|r| r.key.hook_id.as_str().to_owned());
    let ids = column(&|r| r.key.delivery_id.as_str().to_owned());
    let events = column(&|r| r.event.clone());
    let actions: Vec<Option<String>> = firsts
        .values()
        .map(|&i| requests[i].action.clone())
        .collect();
    let shas: Vec<&[u8]> = firsts
        .values()
        .map(|&i| &requests[i].body_sha256[..])
        .collect();
    let uuids: Vec<Uuid> = firsts.values().map(|i| tokens[i].0).collect();

    let stmt = client.prepare_cached(CLAIM_BATCH).await?;
    let rows = client
        .query(
            &stmt,
            &[
                &providers,
                &sources,
                &hook_ids,
                &ids,
                &events,
                &actions,
                &shas,
                &uuids,
                &secs(policy.lease),
                &policy.max_attempts,
            ],
        )
        .await?;
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
    let missing: Vec<&KeyTuple> = firsts
        .keys()
        .filter(|k| !claimed.contains_key(*k))
        .collect();
    let mut states: HashMap<KeyTuple, RowState> = HashMap::new();
    if !missing.is_empty() {
        let pick = |f: fn(&KeyTuple) -> &String| -> Vec<String> {
            missing.iter().map(|k| f(k).clone()).collect()
        };
        let stmt = client.prepare_cached(CLAIM_BATCH_STATE).await?;
        for r in client
            .query(
                &stmt,
                &[
                    &pick(|k| &k.0),
                    &pick(|k| &k.1),
                    &pick(|k| &k.2),
                    &pick(|k| &k.3),
                    &secs(policy.publish_timeout),
                ],
            )
            .await?
        {
            states.insert(
                (r.get(0), r.get(1), r.get(2), r.get(3)),
                RowState {
                    status: Status::parse(r.get(4)),
                    attempts: r.get(5),
                    token: ClaimToken(r.get(6)),
                    sha: r.get(7),
                    lease_live: r.get(8),
                    overdue: r.get(9),
                },
            );
        }
    }

    let mut out = Vec::with_capacity(requests.len());
    for (i, r) in requests.iter().enumerate() {
        let k = key_tuple(&r.key);
        let first = firsts[&k];
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
            claim(
                client,
                policy,
                NewClaim {
                    key: &r.key,
                    event: &r.event,
                    action: r.action.as_deref(),
                    body_sha256: &r.body_sha256,
                },
            )
            .await?
        } else if let Some(row) = states.get(&k) {
            if row.sha.as_slice() != r.body_sha256.as_slice() {
                Claim::Conflict
            } else if row.status == Status::Processing
                && row.attempts == 0
                && row.lease_live == Some(true)
                && row.overdue
            {
                Claim::Republish { token: row.token }
            } else {
                Claim::Duplicate(row.status)
            }
        } else {
            // Swept between the statements: claim it on its own.
            claim(
                client,
                policy,
                NewClaim {
                    key: &r.key,
                    event: &r.event,
                    action: r.action.as_deref(),
                    body_sha256: &r.body_sha256,
                },
            )
            .await?
        };
        out.push(answer);
    }
    Ok(out)
}

const RELEASE_LEASE: &str = "
update deliveries set lease_until = now()
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
  and claim_token = $5 and status || '' = 'processing'";

/// On shutdown, before the effect: ends the holder's lease now so that the
/// requeued message is taken at once by another worker instead of waiting
/// for the lease to run out. Token-guarded like every write.
pub async fn release_lease(
    client: &impl GenericClient,
    key: &DeliveryKey,
    token: ClaimToken,
) -> Result<bool, DbError> {
    let stmt = client.prepare_cached(RELEASE_LEASE).await?;
    let n = client.execute(&stmt, &params(key, &[&token.0])).await?;
    Ok(n == 1)
}

const MARK_DEAD_LETTERED: &str = "
update deliveries set dead_lettered_at = now()
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
  and status = 'failed' and not retryable";

/// Records that the dead-letter copy of a failed delivery was confirmed by
/// the broker. Until then a redelivered message writes the copy again
/// (a second copy is harmless; a missing one is not).
pub async fn mark_dead_lettered(
    client: &impl GenericClient,
    key: &DeliveryKey,
) -> Result<(), DbError> {
    let stmt = client.prepare_cached(MARK_DEAD_LETTERED).await?;
    client.execute(&stmt, &params(key, &[])).await?;
    Ok(())
}

/// One row of `deliveries`, as operators and tests see it.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// The key.
    pub key: DeliveryKey,
    /// `X-GitHub-Event`.
    pub event: String,
    /// The payload's `action`.
    pub action: Option<String>,
    /// Current state.
    pub status: Status,
    /// Whether a failed delivery will be tried again.
    pub retryable: bool,
    /// The current fencing token.
    pub claim_token: ClaimToken,
    /// Takes so far.
    pub attempts: i32,
    /// Operator replays so far.
    pub replays: i32,
    /// When the current lease ends.
    pub lease_until: Option<DateTime<Utc>>,
    /// When a retryable failure is due.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// First claim.
    pub created_at: DateTime<Utc>,
    /// Completion time.
    pub completed_at: Option<DateTime<Utc>>,
    /// Last failure time.
    pub failed_at: Option<DateTime<Utc>>,
    /// First failure time.
    pub first_failed_at: Option<DateTime<Utc>>,
    /// Whether the dead-letter copy was confirmed.
    pub dead_lettered: bool,
    /// Class of the last failure.
    pub last_error_class: Option<String>,
    /// Short, redacted text of the last failure.
    pub last_error: Option<String>,
}

const GET: &str = "
select provider, source, hook_id, delivery_id, event, action, status, retryable,
       claim_token, attempts, replays, lease_until, next_attempt_at, created_at,
       completed_at, failed_at, dead_lettered_at is not null, last_error_class, last_error,
       first_failed_at
from deliveries
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4";

/// Reads one delivery.
pub async fn get(
    client: &impl GenericClient,
    key: &DeliveryKey,
) -> Result<Option<Delivery>, DbError> {
    let stmt = client.prepare_cached(GET).await?;
    let row = client.query_opt(&stmt, &params(key, &[])).await?;
    row.as_ref().map(delivery_from_row).transpose()
}

/// A delivery with its parked body: what the scheduler, replays and
/// dead-letter copies publish.
#[derive(Clone, Debug)]
pub struct ParkedJob {
    /// The key.
    pub key: DeliveryKey,
    /// `X-GitHub-Event`.
    pub event: String,
    /// The payload's `action`.
    pub action: Option<String>,
    /// The token the published job must carry.
    pub token: ClaimToken,
    /// Takes so far.
    pub attempts: i32,
    /// The original `Content-Type`.
    pub content_type: String,
    /// The original `X-GitHub-*` headers.
    pub headers: Vec<(String, String)>,
    /// The raw body.
    pub body: Vec<u8>,
}

fn key_from_row(row: &tokio_postgres::Row) -> Result<DeliveryKey, DbError> {
    use crate::key::{DeliveryId, HookId, SourceName};
    let provider: String = row.get("provider");
    let source: &str = row.get("source");
    let hook_id: &str = row.get("hook_id");
    let delivery_id: &str = row.get("delivery_id");
    // Rows are written from validated keys; a row that no longer parses is
    // reported rather than trusted.
    let bad = |what: &'static str| DbError::BadRow(what);
    let mut key = DeliveryKey::github(
        SourceName::parse(source).map_err(|_| bad("source"))?,
        HookId::parse((!hook_id.is_empty()).then_some(hook_id.as_bytes()))
            .map_err(|_| bad("hook_id"))?,
        DeliveryId::parse(delivery_id.as_bytes()).map_err(|_| bad("delivery_id"))?,
    );
    key.provider = provider;
    Ok(key)
}

fn parked_job(row: &tokio_postgres::Row) -> Result<ParkedJob, DbError> {
    let headers: serde_json::Value = row.get("headers");
    Ok(ParkedJob {
        key: key_from_row(row)?,
        event: row.get("event"),
        action: row.get("action"),
        token: ClaimToken(row.get("claim_token")),
        attempts: row.get("attempts"),
        content_type: row.get("content_type"),
        headers: headers_from_json(&headers),
        body: row.get("body"),
    })
}

const SCHEDULE: &str = "
with due as (
    select d.provider, d.source, d.hook_id, d.delivery_id
    from deliveries d
    join parked_bodies p using (provider, source, hook_id, delivery_id)
    where d.status = 'failed' and d.retryable and d.next_attempt_at <= now()
      and d.attempts < $1
    order by d.next_attempt_at
    limit $2
    for update of d skip locked
)
update deliveries d
set status = 'processing', retryable = false, claim_token = gen_random_uuid(),
    lease_until = now() + make_interval(secs => $3), claimed_at = now(),
    next_attempt_at = null
from due, parked_bodies p
where d.provider = due.provider and d.source = due.source
  and d.hook_id = due.hook_id and d.delivery_id = due.delivery_id
  and p.provider = d.provider and p.source = d.source
  and p.hook_id = d.hook_id and p.delivery_id = d.delivery_id
returning d.provider, d.source, d.hook_id, d.delivery_id, d.event, d.action,
          d.claim_token, d.attempts, p.content_type, p.headers, p.body";

/// The retry scheduler's pick: moves up to `limit` due retries back to
/// `processing` under new tokens, in one compare-and-set. `skip locked`
/// lets every worker run the scheduler without two picking one row, and
/// `next_attempt_at <= now()` (the database clock) means a retry is never
/// early. The caller publishes each from its parked body, and puts it back
/// with [`reschedule`] if the publish fails.
pub async fn schedule_due(
    client: &impl GenericClient,
    policy: &Policy,
    limit: i64,
) -> Result<Vec<ParkedJob>, DbError> {
    let stmt = client.prepare_cached(SCHEDULE).await?;
    let rows = client
        .query(&stmt, &[&policy.max_attempts, &limit, &secs(policy.lease)])
        .await?;
    rows.iter().map(parked_job).collect()
}

const RESCHEDULE: &str = "
update deliveries
set status = 'failed', retryable = true,
    next_attempt_at = now() + make_interval(secs => $6),
    last_error_class = 'publish', last_error = $7
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
  and claim_token = $5 and status || '' = 'processing'";

/// Puts a scheduled retry back as due after `delay`, because its publish
/// failed. Token-guarded: if a worker already took it (the confirm was
/// lost, not the message), nothing changes.
pub async fn reschedule(
    client: &impl GenericClient,
    key: &DeliveryKey,
    token: ClaimToken,
    delay: Duration,
    error: &str,
) -> Result<bool, DbError> {
    let stmt = client.prepare_cached(RESCHEDULE).await?;
    let n = client
        .execute(
            &stmt,
            &params(key, &[&token.0, &secs(delay), &redact(error)]),
        )
        .await?;
    Ok(n == 1)
}

const EXHAUST: &str = "
update deliveries
set retryable = false, last_error_class = 'max_attempts',
    last_error = 'attempts exhausted', failed_at = now()
where ctid in (
    select ctid from deliveries
    where status = 'failed' and retryable and next_attempt_at <= now() and attempts >= $1
    limit $2
    for update skip locked
)";

/// Dead-letters due retries that already used every attempt (a `lost`
/// claim can reach that state), so they do not wait forever. Their
/// dead-letter copies follow from [`needing_copy`].
pub async fn exhaust_due(
    client: &impl GenericClient,
    policy: &Policy,
    limit: i64,
) -> Result<u64, DbError> {
    let stmt = client.prepare_cached(EXHAUST).await?;
    Ok(client
        .execute(&stmt, &[&policy.max_attempts, &limit])
        .await?)
}

const NEEDING_COPY: &str = "
select d.provider, d.source, d.hook_id, d.delivery_id, d.event, d.action,
       d.claim_token, d.attempts, p.content_type, p.headers, p.body
from deliveries d
join parked_bodies p using (provider, source, hook_id, delivery_id)
where d.status = 'failed' and not d.retryable and d.dead_lettered_at is null
  and d.failed_at < now() - make_interval(secs => $1)
order by d.failed_at
limit $2";

/// Dead letters whose broker copy was never confirmed (a worker died
/// between the failure and the copy, or the copy was purged from the
/// queue), older than `grace` so that a worker still busy with the copy is
/// left alone.
pub async fn needing_copy(
    client: &impl GenericClient,
    grace: Duration,
    limit: i64,
) -> Result<Vec<ParkedJob>, DbError> {
    let stmt = client.prepare_cached(NEEDING_COPY).await?;
    let rows = client.query(&stmt, &[&secs(grace), &limit]).await?;
    rows.iter().map(parked_job).collect()
}

const REPLAY: &str = "
update deliveries d
set status = 'processing', retryable = false, claim_token = gen_random_uuid(),
    attempts = 0, replays = d.replays + 1, next_attempt_at = null,
    lease_until = now() + make_interval(secs => $5), claimed_at = now(),
    dead_lettered_at = null
from parked_bodies p
where d.provider = $1 and d.source = $2 and d.hook_id = $3 and d.delivery_id = $4
  and d.status = 'failed'
  and p.provider = d.provider and p.source = d.source
  and p.hook_id = d.hook_id and p.delivery_id = d.delivery_id
returning d.provider, d.source, d.hook_id, d.delivery_id, d.event, d.action,
          d.claim_token, d.attempts, p.content_type, p.headers, p.body";

/// Operator replay of a failed delivery: back to `processing` under a new
/// token with `attempts = 0` and `replays + 1`, in one compare-and-set on
/// `status = 'failed'`. Replaying the same delivery twice starts one job:
/// the second finds it processing and changes nothing (`None`).
pub async fn replay(
    client: &impl GenericClient,
    policy: &Policy,
    key: &DeliveryKey,
) -> Result<Option<ParkedJob>, DbError> {
    let stmt = client.prepare_cached(REPLAY).await?;
    let row = client
        .query_opt(&stmt, &params(key, &[&secs(policy.lease)]))
        .await?;
    row.as_ref().map(parked_job).transpose()
}

const UNREPLAY: &str = "
update deliveries
set status = 'failed', retryable = false, dead_lettered_at = now(),
    last_error = $6
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
  and claim_token = $5 and status || '' = 'processing' and attempts = 0";

/// Puts a replayed delivery back among the dead letters because its
/// publish failed. Token-guarded, and only while no worker took it.
pub async fn unreplay(
    client: &impl GenericClient,
    key: &DeliveryKey,
    token: ClaimToken,
    error: &str,
) -> Result<bool, DbError> {
    let stmt = client.prepare_cached(UNREPLAY).await?;
    let n = client
        .execute(&stmt, &params(key, &[&token.0, &redact(error)]))
        .await?;
    Ok(n == 1)
}

const REAP: &str = "
update deliveries
set status = 'failed', retryable = true, next_attempt_at = now(),
    failed_at = now(), first_failed_at = coalesce(first_failed_at, now()),
    last_error_class = 'lost',
    last_error = 'lease expired long ago: the holder is presumed dead'
where ctid in (
    select ctid from deliveries
    where status = 'processing' and lease_until < now() - make_interval(secs => $1)
    limit $2
    for update skip locked
)";

/// The reaper: claims whose lease expired more than `after` ago (ingest may
/// have died between the claim and the publish, the message was lost, or
/// every worker was down) become failed, retryable, class `lost`, due now,
/// keeping their token. Any message of the delivery still in the queue
/// takes it (the token may be a dead worker's, which no message carries);
/// otherwise the next redelivery (or, with a parked body, the scheduler)
/// takes it at once.
pub async fn reap(
    client: &impl GenericClient,
    after: Duration,
    limit: i64,
) -> Result<u64, DbError> {
    let stmt = client.prepare_cached(REAP).await?;
    Ok(client.execute(&stmt, &[&secs(after), &limit]).await?)
}

const SWEEP_COMPLETED: &str = "
delete from deliveries
where ctid in (
    select ctid from deliveries
    where status = 'completed' and completed_at < now() - make_interval(secs => $1)
    limit $2
)";

const SWEEP_FAILED: &str = "
delete from deliveries
where ctid in (
    select ctid from deliveries
    where status = 'failed' and failed_at < now() - make_interval(secs => $1)
    limit $2
)";

/// What one sweep deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Completed rows older than their retention.
    pub completed: u64,
    /// Failed rows older than theirs.
    pub failed: u64,
}

/// Retention: deletes completed and failed rows older than their
/// retention, with their parked bodies (cascade), in batches of `batch` so
/// that no statement holds many locks or a long transaction. Processing
/// rows are never swept: the reaper deals with them.
pub async fn sweep(
    client: &impl GenericClient,
    completed: Duration,
    failed: Duration,
    batch: i64,
) -> Result<Swept, DbError> {
    let mut swept = Swept::default();
    for (sql, retention, count) in [
        (SWEEP_COMPLETED, completed, &mut swept.completed),
        (SWEEP_FAILED, failed, &mut swept.failed),
    ] {
        let stmt = client.prepare_cached(sql).await?;
        loop {
            let n = client.execute(&stmt, &[&secs(retention), &batch]).await?;
            *count += n;
            if n < batch as u64 {
                break;
            }
        }
    }
    Ok(swept)
}

const PURGE: &str = "
delete from deliveries
where status = 'failed' and not retryable
  and failed_at < now() - make_interval(secs => $1)
  and ($2::text[] is null or delivery_id = any($2))";

/// Deletes dead letters that failed more than `older_than` ago (and their
/// parked bodies), optionally only these delivery ids.
pub async fn purge_dead(
    client: &impl GenericClient,
    older_than: Duration,
    ids: Option<&[String]>,
) -> Result<u64, DbError> {
    let stmt = client.prepare_cached(PURGE).await?;
    Ok(client.execute(&stmt, &[&secs(older_than), &ids]).await?)
}

/// Which deliveries an operator asks for.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only this status.
    pub status: Option<Status>,
    /// Only dead letters (failed and not retryable).
    pub dead: bool,
    /// Only this source.
    pub source: Option<String>,
    /// Only this event.
    pub event: Option<String>,
    /// Only this error class.
    pub error_class: Option<String>,
    /// Only rows active (created, failed or completed) within this long.
    pub since: Option<Duration>,
    /// Only these delivery ids.
    pub ids: Option<Vec<String>>,
    /// Only rows that failed more than this long ago.
    pub failed_before: Option<Duration>,
    /// At most this many rows (newest first).
    pub limit: i64,
}

const LIST: &str = "
select provider, source, hook_id, delivery_id, event, action, status, retryable,
       claim_token, attempts, replays, lease_until, next_attempt_at, created_at,
       completed_at, failed_at, dead_lettered_at is not null, last_error_class, last_error,
       first_failed_at
from deliveries
where ($1::text is null or status = $1)
  and (not $2 or (status = 'failed' and not retryable))
  and ($3::text is null or source = $3)
  and ($4::text is null or event = $4)
  and ($5::text is null or last_error_class = $5)
  and ($6::float8 is null
       or greatest(created_at, failed_at, completed_at) >= now() - make_interval(secs => $6))
  and ($7::text[] is null or delivery_id = any($7))
  and ($9::float8 is null or failed_at < now() - make_interval(secs => $9))
order by greatest(created_at, failed_at, completed_at) desc
limit $8";

/// Lists deliveries matching `filter`, most recently active first.
pub async fn list(client: &impl GenericClient, filter: &Filter) -> Result<Vec<Delivery>, DbError> {
    let stmt = client.prepare_cached(LIST).await?;
    let status = filter.status.map(Status::as_str);
    let since = filter.since.map(secs);
    let rows = client
        .query(
            &stmt,
            &[
                &status,
                &filter.dead,
                &filter.source,
                &filter.event,
                &filter.error_class,
                &since,
                &filter.ids,
                &filter.limit,
                &filter.failed_before.map(secs),
            ],
        )
        .await?;
    rows.iter().map(delivery_from_row).collect()
}

fn delivery_from_row(row: &tokio_postgres::Row) -> Result<Delivery, DbError> {
    let token: Uuid = row.get(8);
    Ok(Delivery {
        key: key_from_row(row)?,
        event: row.get(4),
        action: row.get(5),
        status: Status::parse(row.get(6)),
        retryable: row.get(7),
        claim_token: ClaimToken(token),
        attempts: row.get(9),
        replays: row.get(10),
        lease_until: row.get(11),
        next_attempt_at: row.get(12),
        created_at: row.get(13),
        completed_at: row.get(14),
        failed_at: row.get(15),
        dead_lettered: row.get(16),
        last_error_class: row.get(17),
        last_error: row.get(18),
        first_failed_at: row.get(19),
    })
}
