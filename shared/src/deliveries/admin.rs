//! What operators read and do: one delivery, a filtered list, replay of
//! dead letters (and its undo when the publish fails), and the facts a
//! dead-letter copy carries.

use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;

use super::parked::{Parked, Unreadable};
use super::row::{delivery, parked};
use super::{ErrorClass, Policy, Status, execute, query_opt, redact, secs};
use crate::key::{ClaimToken, DeliveryKey};
use crate::postgres::DbError;

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
    pub last_error_class: Option<ErrorClass>,
    /// Short, redacted text of the last failure.
    pub last_error: Option<String>,
}

/// Why and when a delivery was dead-lettered: the headers of its copy in
/// the dead-letter queue.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    /// The failure's class.
    pub class: ErrorClass,
    /// Takes so far.
    pub attempts: i32,
    /// First failure of the delivery.
    pub first_failed_at: DateTime<Utc>,
    /// The failure that dead-lettered it.
    pub last_failed_at: DateTime<Utc>,
}

impl Delivery {
    /// The facts of its dead-letter copy. The one fallback rule: a class
    /// missing from the row reads as `permanent`; a failure time missing
    /// (a row failed before the column existed) reads as the last failure,
    /// then as the claim.
    pub fn dead_letter(&self) -> DeadLetter {
        let last_failed_at = self.failed_at.unwrap_or(self.created_at);
        DeadLetter {
            class: self.last_error_class.unwrap_or(ErrorClass::Permanent),
            attempts: self.attempts,
            first_failed_at: self.first_failed_at.unwrap_or(last_failed_at),
            last_failed_at,
        }
    }

    /// Whether it is a dead letter: failed, and not to be retried.
    pub fn is_dead(&self) -> bool {
        self.status == Status::Failed && !self.retryable
    }
}

const GET: &str = concat!(
    "
select ",
    delivery_columns!(),
    "
from deliveries
where ",
    key!()
);

/// Reads one delivery.
pub async fn get(
    client: &impl GenericClient,
    key: &DeliveryKey,
) -> Result<Option<Delivery>, DbError> {
    let row = query_opt(client, GET, key, &[]).await?;
    row.as_ref().map(delivery).transpose()
}

const REPLAY: &str = concat!(
    "
update deliveries d
set status = 'processing', retryable = false, claim_token = gen_random_uuid(),
    attempts = 0, replays = d.replays + 1, next_attempt_at = null,
    lease_until = now() + make_interval(secs => $5), claimed_at = now(),
    dead_lettered_at = null
from parked_bodies p
where ",
    key!("d"),
    "
  and d.status = 'failed'
  and p.provider = d.provider and p.source = d.source
  and p.hook_id = d.hook_id and p.delivery_id = d.delivery_id
returning d.provider, d.source, d.hook_id, d.delivery_id, d.event, d.action,
          d.claim_token, d.attempts, p.content_type, p.headers, p.body"
);

/// Operator replay of a failed delivery: back to `processing` under a new
/// token with `attempts = 0` and `replays + 1`, in one compare-and-set on
/// `status = 'failed'`. Replaying the same delivery twice starts one job:
/// the second finds it processing and changes nothing (`None`). A row whose
/// parked body cannot become a job comes back as [`Unreadable`].
pub async fn replay(
    client: &impl GenericClient,
    policy: &Policy,
    key: &DeliveryKey,
) -> Result<Option<Result<Parked, Unreadable>>, DbError> {
    let row = query_opt(client, REPLAY, key, &[&secs(policy.lease)]).await?;
    Ok(row.as_ref().map(parked))
}

const UNREPLAY: &str = concat!(
    "
update deliveries
set status = 'failed', retryable = false, dead_lettered_at = now(),
    last_error = $6
where ",
    key!(),
    " and ",
    held_by!("$5"),
    " and attempts = 0"
);

/// Puts a replayed delivery back among the dead letters because its
/// publish failed. Token-guarded, and only while no worker took it.
pub async fn unreplay(
    client: &impl GenericClient,
    key: &DeliveryKey,
    token: ClaimToken,
    error: &str,
) -> Result<bool, DbError> {
    let n = execute(client, UNREPLAY, key, &[&token.0, &redact(error)]).await?;
    Ok(n == 1)
}

/// Which deliveries an operator asks for.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only this status.
    pub status: Option<Status>,
    /// Only dead letters (failed and not retryable).
    pub dead: bool,
    /// Only claims hookinbox cannot finish on its own: no body, no job
    /// (see [`super::Held::AwaitingRedelivery`]).
    pub awaiting_redelivery: bool,
    /// Only this source.
    pub source: Option<String>,
    /// Only this event.
    pub event: Option<String>,
    /// Only this error class.
    pub error_class: Option<ErrorClass>,
    /// Only rows active (created, failed or completed) within this long.
    pub since: Option<Duration>,
    /// Only these delivery ids.
    pub ids: Option<Vec<String>>,
    /// Only rows that failed more than this long ago.
    pub failed_before: Option<Duration>,
    /// At most this many rows (newest first).
    pub limit: i64,
}

const LIST: &str = concat!(
    "
select ",
    delivery_columns!(),
    "
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
  and (not $10 or ",
    awaiting_redelivery!("deliveries"),
    ")
order by greatest(created_at, failed_at, completed_at) desc
limit $8"
);

/// Lists deliveries matching `filter`, most recently active first.
pub async fn list(client: &impl GenericClient, filter: &Filter) -> Result<Vec<Delivery>, DbError> {
    let stmt = client.prepare_cached(LIST).await?;
    let status = filter.status.map(Status::as_str);
    let error_class = filter.error_class.map(ErrorClass::as_str);
    let since = filter.since.map(secs);
    let rows = client
        .query(
            &stmt,
            &[
                &status,
                &filter.dead,
                &filter.source,
                &filter.event,
                &error_class,
                &since,
                &filter.ids,
                &filter.limit,
                &filter.failed_before.map(secs),
                &filter.awaiting_redelivery,
            ],
        )
        .await?;
    rows.iter().map(delivery).collect()
}
