//! One delivery (one leg) as every caller reads it: ingest and the worker
//! in tests, the reconciler, the scheduler, operators. [`Delivery`], the
//! facts its dead-letter copy carries, and [`get`], by key.

use chrono::{DateTime, Utc};

use super::row::{class_of, key_from_parts, key_parts, status_of};
use super::{ErrorClass, Status, query_opt};
use crate::key::{ClaimToken, LegKey};
use crate::postgres::DbError;
use crate::postgres::sql::Session;

/// One row of `deliveries` (one leg of a delivery), as operators and
/// tests see it.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// The leg's key: the delivery's and the destination.
    pub key: LegKey,
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
    /// The payload's `repository.full_name`, when ingest found one.
    pub repository: Option<String>,
    /// When the current token was installed (by a claim, a take, the
    /// scheduler or a replay).
    pub claimed_at: DateTime<Utc>,
    /// When the dead-letter copy was confirmed.
    pub dead_lettered_at: Option<DateTime<Utc>>,
    /// Why its destination's filters did not take it (`filtered` legs).
    pub filter_reason: Option<String>,
    /// The takes its destination allows, as its last take recorded.
    pub max_attempts: Option<i32>,
    /// Whether, when it was read, only a redelivery from GitHub could
    /// finish it (`awaiting_redelivery!`: no body kept, and reaped
    /// `lost` or an untaken claim whose lease ran out). `State::of` reads
    /// it.
    pub awaiting_redelivery: bool,
    /// `X-GitHub-Tenant`: the GHE.com enterprise that sent it (`None` for
    /// github.com and GitHub Enterprise Server).
    pub github_tenant: Option<String>,
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

/// Reads one leg.
pub async fn get(client: &impl Session, key: &LegKey) -> Result<Option<Delivery>, DbError> {
    let row = query_opt(client, GET, key, &[]).await?;
    row.as_ref().map(delivery).transpose()
}

/// A row of `delivery_columns!()`.
pub(super) fn delivery(row: &tokio_postgres::Row) -> Result<Delivery, DbError> {
    Ok(Delivery {
        key: key_from_parts(&key_parts(row))?,
        event: row.get(4),
        action: row.get(5),
        status: status_of(row.get(6))?,
        retryable: row.get(7),
        claim_token: ClaimToken(row.get(8)),
        attempts: row.get(9),
        replays: row.get(10),
        lease_until: row.get(11),
        next_attempt_at: row.get(12),
        created_at: row.get(13),
        completed_at: row.get(14),
        failed_at: row.get(15),
        dead_lettered: row.get(16),
        last_error_class: class_of(row.get(17))?,
        last_error: row.get(18),
        first_failed_at: row.get(19),
        repository: row.get(20),
        claimed_at: row.get(21),
        dead_lettered_at: row.get(22),
        filter_reason: row.get(24),
        max_attempts: row.get(25),
        awaiting_redelivery: row.get(26),
        github_tenant: row.get(27),
    })
}
