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

use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
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
returning (xmax = 0) as inserted";

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
                &[
                    &k.provider,
                    &k.source.as_str(),
                    &k.hook_id.as_str(),
                    &k.delivery_id.as_str(),
                    &req.event,
                    &req.action,
                    &body_sha,
                    &token.0,
                    &secs(policy.lease),
                    &policy.max_attempts,
                ],
            )
            .await?;
        if let Some(row) = row {
            let inserted: bool = row.get(0);
            return Ok(Claim::Claimed {
                token,
                reclaimed: !inserted,
            });
        }
        // ON CONFLICT ... WHERE refused: report what is there.
        let Some(row) = client
            .query_opt(
                &state,
                &[
                    &k.provider,
                    &k.source.as_str(),
                    &k.hook_id.as_str(),
                    &k.delivery_id.as_str(),
                    &body_sha,
                    &secs(policy.publish_timeout),
                ],
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

const RELEASE: &str = "
update deliveries
set status = 'failed', retryable = true, next_attempt_at = now(),
    failed_at = now(), first_failed_at = coalesce(first_failed_at, now()),
    last_error_class = 'publish', last_error = $6
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
  and claim_token = $5 and status = 'processing' and attempts = 0";

/// Gives a claim back after its publish failed, so a redelivery can claim it
/// at once. Guarded by the claim's own token *and* `attempts = 0`: if a
/// worker took the job after all (the confirm was lost, not the message),
/// this changes nothing and never undoes the take. Returns whether it did.
pub async fn release(
    client: &impl GenericClient,
    key: &DeliveryKey,
    token: ClaimToken,
    error: &str,
) -> Result<bool, DbError> {
    let stmt = client.prepare_cached(RELEASE).await?;
    let n = client
        .execute(
            &stmt,
            &[
                &key.provider,
                &key.source.as_str(),
                &key.hook_id.as_str(),
                &key.delivery_id.as_str(),
                &token.0,
                &redact(error),
            ],
        )
        .await?;
    Ok(n == 1)
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
    /// and must be dead-lettered without running the effect.
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
    or (d.status = 'failed' and d.last_error_class = 'lost' and d.claim_token = $5))
returning d.attempts, prev.claim_token <> $5 and d.last_error_class is distinct from 'lost',
          d.created_at";

const POISON: &str = "
update deliveries
set status = 'failed', retryable = false, failed_at = now(),
    first_failed_at = coalesce(first_failed_at, now()),
    last_error_class = 'poison',
    last_error = 'attempts exhausted: the job crashed or hung its worker on every attempt'
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
  and attempts >= $6
  and ((status = 'processing' and (claim_token = $5 or lease_until < now()))
    or (status = 'failed' and last_error_class = 'lost' and claim_token = $5))
returning attempts";

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
) -> Result<Take, DbError> {
    let k = [
        &key.provider as &(dyn tokio_postgres::types::ToSql + Sync),
        &key.source.as_str(),
        &key.hook_id.as_str(),
        &key.delivery_id.as_str(),
    ];
    let take = client.prepare_cached(TAKE).await?;
    let poison = client.prepare_cached(POISON).await?;
    let state = client.prepare_cached(TAKE_STATE).await?;
    loop {
        let token = ClaimToken::new();
        let lease = secs(policy.lease);
        if let Some(row) = client
            .query_opt(
                &take,
                &[
                    k[0],
                    k[1],
                    k[2],
                    k[3],
                    &presented.0,
                    &token.0,
                    &lease,
                    &policy.max_attempts,
                ],
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
                &[k[0], k[1], k[2], k[3], &presented.0, &policy.max_attempts],
            )
            .await?
        {
            return Ok(Take::Poisoned {
                attempts: row.get(0),
            });
        }
        let Some(row) = client.query_opt(&state, &k).await? else {
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

const RENEW: &str = "
update deliveries set lease_until = now() + make_interval(secs => $6)
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
  and claim_token = $5 and status = 'processing'";

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
        .execute(
            &stmt,
            &[
                &key.provider,
                &key.source.as_str(),
                &key.hook_id.as_str(),
                &key.delivery_id.as_str(),
                &token.0,
                &secs(policy.lease),
            ],
        )
        .await?;
    Ok(n == 1)
}

const FENCE: &str = "
select 1 from deliveries
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
  and claim_token = $5 and status = 'processing'
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
    let row = client
        .query_opt(
            &stmt,
            &[
                &key.provider,
                &key.source.as_str(),
                &key.hook_id.as_str(),
                &key.delivery_id.as_str(),
                &token.0,
            ],
        )
        .await?;
    Ok(row.is_some())
}

const COMPLETE: &str = "
update deliveries
set status = 'completed', completed_at = now(), retryable = false, next_attempt_at = null
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
  and claim_token = $5 and status = 'processing'";

/// Marks the delivery completed. Run it in the transaction of a database
/// effect, so the effect and the completion commit together or not at all.
/// Guarded by the token alone, not by `lease_until > now()`: a holder whose
/// lease lapsed but whom nobody replaced may still finish. Returns false
/// when fenced.
pub async fn complete(
    client: &impl GenericClient,
    key: &DeliveryKey,
    token: ClaimToken,
) -> Result<bool, DbError> {
    let stmt = client.prepare_cached(COMPLETE).await?;
    let n = client
        .execute(
            &stmt,
            &[
                &key.provider,
                &key.source.as_str(),
                &key.hook_id.as_str(),
                &key.delivery_id.as_str(),
                &token.0,
            ],
        )
        .await?;
    Ok(n == 1)
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

const FAIL: &str = "
update deliveries
set status = 'failed', retryable = $6,
    next_attempt_at = case when $6 then now() + make_interval(secs => $7) end,
    failed_at = now(), first_failed_at = coalesce(first_failed_at, now()),
    last_error_class = $8, last_error = $9
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
  and claim_token = $5 and status = 'processing'
returning attempts, first_failed_at, failed_at";

/// Records a failed attempt, guarded by the holder's token. Returns `None`
/// when fenced (someone else holds the delivery now).
pub async fn fail(
    client: &impl GenericClient,
    key: &DeliveryKey,
    token: ClaimToken,
    failure: &Failure,
) -> Result<Option<Failed>, DbError> {
    let stmt = client.prepare_cached(FAIL).await?;
    let retryable = failure.retry_in.is_some();
    let delay = failure.retry_in.map(secs).unwrap_or(0.0);
    let row = client
        .query_opt(
            &stmt,
            &[
                &key.provider,
                &key.source.as_str(),
                &key.hook_id.as_str(),
                &key.delivery_id.as_str(),
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

const RELEASE_LEASE: &str = "
update deliveries set lease_until = now()
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4
  and claim_token = $5 and status = 'processing'";

/// On shutdown, before the effect: ends the holder's lease now so that the
/// requeued message is taken at once by another worker instead of waiting
/// for the lease to run out. Token-guarded like every write.
pub async fn release_lease(
    client: &impl GenericClient,
    key: &DeliveryKey,
    token: ClaimToken,
) -> Result<bool, DbError> {
    let stmt = client.prepare_cached(RELEASE_LEASE).await?;
    let n = client
        .execute(
            &stmt,
            &[
                &key.provider,
                &key.source.as_str(),
                &key.hook_id.as_str(),
                &key.delivery_id.as_str(),
                &token.0,
            ],
        )
        .await?;
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
    client
        .execute(
            &stmt,
            &[
                &key.provider,
                &key.source.as_str(),
                &key.hook_id.as_str(),
                &key.delivery_id.as_str(),
            ],
        )
        .await?;
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
       completed_at, failed_at, dead_lettered_at is not null, last_error_class, last_error
from deliveries
where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4";

/// Reads one delivery.
pub async fn get(
    client: &impl GenericClient,
    key: &DeliveryKey,
) -> Result<Option<Delivery>, DbError> {
    let stmt = client.prepare_cached(GET).await?;
    let row = client
        .query_opt(
            &stmt,
            &[
                &key.provider,
                &key.source.as_str(),
                &key.hook_id.as_str(),
                &key.delivery_id.as_str(),
            ],
        )
        .await?;
    Ok(row.map(|row| {
        let token: Uuid = row.get(8);
        Delivery {
            key: key.clone(),
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
        }
    }))
}
