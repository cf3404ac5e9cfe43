//! Destinations' shared state, one row each in `destinations`: the circuit
//! breaker (docs/architecture.md, "The circuit breaker"), each transition
//! decided by one statement; and the attempt log its failure ratio is
//! counted over.
//!
//! ```text
//!   closed ──trip──▶ open ──probe (schedule.rs)──▶ half_open
//!     ▲                ▲                              │
//!     │ close           └──────────trip───────────────┤
//!     └───────────────────────────────────────close───┘
//!   410, or open past disable_after ──disable──▶ disabled
//!   operator: pause ──▶ paused; resume (from any state) ──▶ closed
//! ```
//!
//! The gate that keeps legs of a destination that is not closed from being
//! attempted is in the take (`take.rs`), and the pick of the probe in the
//! scheduler (`schedule.rs`): the state is read where the leg is decided.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::postgres::DbError;
use crate::postgres::sql::{self, Session};

use super::{UnknownName, secs};
use crate::key::{DestinationName, LegKey, SourceName};

/// A destination's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Legs are attempted.
    Closed,
    /// Failing: legs wait, a probe goes every `probe_secs`.
    Open,
    /// One probe is out.
    HalfOpen,
    /// Paused by an operator.
    Paused,
    /// Disabled (410, or open past `disable_after`): only an operator
    /// resumes it.
    Disabled,
}

impl BreakerState {
    /// Every state.
    pub const ALL: [Self; 5] = [
        Self::Closed,
        Self::Open,
        Self::HalfOpen,
        Self::Paused,
        Self::Disabled,
    ];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
            Self::Paused => "paused",
            Self::Disabled => "disabled",
        }
    }
}

from_stored_name!(BreakerState, "destination state");

/// What a worker registers of a configured destination.
#[derive(Clone, Debug)]
pub struct Registration {
    /// Its source.
    pub source: SourceName,
    /// Its name.
    pub name: DestinationName,
    /// Its kind (`forward`, `store`, a handler's name).
    pub kind: String,
    /// The pause between probes while its breaker is open.
    pub probe: Duration,
    /// How long its breaker may stay open before it is disabled.
    pub disable_after: Duration,
}

const REGISTER: &str = "
insert into destinations as x (source, name, kind, probe_secs, disable_after_secs)
select * from unnest($1::text[], $2::text[], $3::text[], $4::int4[], $5::int8[])
on conflict (source, name) do update
set kind = excluded.kind, probe_secs = excluded.probe_secs,
    disable_after_secs = excluded.disable_after_secs, registered_at = now()";

/// Registers the configured destinations (a new one starts `closed`; an
/// existing one keeps its state and takes the configured probe pause and
/// disable age). Every worker does it at start.
pub async fn register(client: &impl Session, all: &[Registration]) -> Result<(), DbError> {
    let sources: Vec<&str> = all.iter().map(|r| r.source.as_str()).collect();
    let names: Vec<&str> = all.iter().map(|r| r.name.as_str()).collect();
    let kinds: Vec<&str> = all.iter().map(|r| r.kind.as_str()).collect();
    let probes: Vec<i32> = all
        .iter()
        .map(|r| i32::try_from(r.probe.as_secs()).unwrap_or(i32::MAX))
        .collect();
    let disable: Vec<i64> = all
        .iter()
        .map(|r| i64::try_from(r.disable_after.as_secs()).unwrap_or(i64::MAX))
        .collect();
    sql::execute(
        client,
        REGISTER,
        &[&sources, &names, &kinds, &probes, &disable],
    )
    .await?;
    Ok(())
}

const TRIP: &str = "
update destinations
set state = 'open', changed_by = 'breaker',
    state_since = case when state = 'closed' then now() else state_since end,
    opened_at = coalesce(opened_at, now()),
    probe_at = now() + make_interval(secs => probe_secs), probe_token = null,
    last_error = $3, last_error_at = now()
where source = $1 and name = $2 and state in ('closed', 'half_open')";

/// Opens the breaker (from `closed`), or opens it again after a failed
/// probe (from `half_open`): legs wait, and the next probe goes after
/// `probe_secs`. Returns whether it changed the state. A paused or
/// disabled destination is left as it is.
pub async fn trip(
    client: &impl Session,
    source: &SourceName,
    name: &DestinationName,
    error: &str,
) -> Result<bool, DbError> {
    let n = sql::execute(client, TRIP, &[source, name, &super::redact(error)]).await?;
    Ok(n == 1)
}

const CLOSE: &str = "
update destinations
set state = 'closed', changed_by = 'breaker', state_since = now(), opened_at = null,
    probe_at = null, probe_token = null
where source = $1 and name = $2 and state in ('open', 'half_open')";

/// Closes the breaker after a success (the probe's, or any leg's that was
/// in flight): the scheduler publishes the waiting legs again. Returns
/// whether it changed the state.
pub async fn close(
    client: &impl Session,
    source: &SourceName,
    name: &DestinationName,
) -> Result<bool, DbError> {
    Ok(sql::execute(client, CLOSE, &[source, name]).await? == 1)
}

const SET_CONSUMERS: &str = "
with pace as (
    -- The index of completed legs by time (migration 2): the last ten
    -- seconds' completions of every destination, this one's counted.
    select (count(*) / 10)::int4 as rate, count(distinct fair_key)::int4 as keys
    from deliveries
    where status = 'completed' and completed_at > now() - interval '10 seconds'
      and source = $1 and destination = $2
)
update destinations
set consumers = $3, fair_rate = pace.rate, fair_keys = pace.keys
from pace
where source = $1 and name = $2
  and (consumers is distinct from $3 or fair_rate is distinct from pace.rate
       or fair_keys is distinct from pace.keys)";

/// Records how many workers consume a fair destination's queue, as the
/// gauge sampler saw it, and the legs it completed a second and the
/// installations it served over the last ten seconds: the claim holds an
/// installation's new legs once it has about that many workers' share
/// queued (migration 18), or, when it is more, what the destination
/// completes in 50 ms (migration 20), or in a second while it served one
/// installation alone (migration 21). Writes only a change.
pub async fn set_consumers(
    client: &impl Session,
    source: &SourceName,
    name: &DestinationName,
    consumers: i32,
) -> Result<(), DbError> {
    sql::execute(client, SET_CONSUMERS, &[source, name, &consumers]).await?;
    Ok(())
}

const DISABLE: &str = "
update destinations
set state = 'disabled', changed_by = 'breaker', state_since = now(),
    probe_at = null, probe_token = null, last_error = $3, last_error_at = now()
where source = $1 and name = $2 and state not in ('paused', 'disabled')";

/// Disables a destination that said it is gone (`410`): its legs wait
/// until an operator resumes it.
pub async fn disable(
    client: &impl Session,
    source: &SourceName,
    name: &DestinationName,
    error: &str,
) -> Result<bool, DbError> {
    let n = sql::execute(client, DISABLE, &[source, name, &super::redact(error)]).await?;
    Ok(n == 1)
}

const DISABLE_STALE: &str = "
update destinations
set state = 'disabled', changed_by = 'breaker', state_since = now(),
    probe_at = null, probe_token = null,
    last_error = 'open longer than disable_after: ' || coalesce(last_error, ''),
    last_error_at = now()
where state in ('open', 'half_open')
  and opened_at < now() - make_interval(secs => disable_after_secs::float8)";

/// The maintenance pass: disables every destination whose breaker has
/// been open longer than its `disable_after`. Returns how many.
pub async fn disable_stale(client: &impl Session) -> Result<u64, DbError> {
    sql::execute(client, DISABLE_STALE, &[]).await
}

const SET_BY_OPERATOR: &str = "
update destinations
set state = $3, changed_by = $4, state_since = now(), opened_at = null, probe_at = null,
    probe_token = null
where source = $1 and name = $2 and state <> $3";

/// An operator's pause (`Paused`) or resume (`Closed`, from any state).
/// Returns whether the state changed; `None` when there is no such
/// destination.
pub async fn set_by_operator(
    client: &impl Session,
    source: &SourceName,
    name: &DestinationName,
    state: BreakerState,
    actor: &str,
) -> Result<Option<bool>, DbError> {
    let changed = sql::execute(
        client,
        SET_BY_OPERATOR,
        &[source, name, &state.as_str(), &actor],
    )
    .await?;
    if changed == 1 {
        return Ok(Some(true));
    }
    let exists = sql::query_opt(
        client,
        "select 1 from destinations where source = $1 and name = $2",
        &[source, name],
    )
    .await?;
    Ok(exists.map(|_| false))
}

const LOCK: &str = "
select state from destinations where source = $1 and name = $2 for update";

/// Locks a destination's row for an operator's change in the caller's
/// transaction, and reads its state; `None` when there is no such row.
/// The change ([`set_by_operator`]) and its audit row then name the state
/// it changed from, which no breaker transition can move meanwhile.
pub async fn lock_destination(
    client: &impl Session,
    source: &SourceName,
    name: &DestinationName,
) -> Result<Option<BreakerState>, DbError> {
    let Some(row) = sql::query_opt(client, LOCK, &[source, name]).await? else {
        return Ok(None);
    };
    let state: &str = row.get(0);
    state
        .parse()
        .map(Some)
        .map_err(|_: UnknownName| DbError::BadRow("state"))
}

/// One destination's row.
#[derive(Clone, Debug)]
pub struct DestinationRow {
    /// Its source.
    pub source: String,
    /// Its name.
    pub name: String,
    /// Its kind.
    pub kind: String,
    /// Its state.
    pub state: BreakerState,
    /// Since when.
    pub state_since: DateTime<Utc>,
    /// Who changed it last: `breaker` or an operator.
    pub changed_by: Option<String>,
    /// When its breaker opened.
    pub opened_at: Option<DateTime<Utc>>,
    /// When the next probe may go.
    pub probe_at: Option<DateTime<Utc>>,
    /// The last error that moved it.
    pub last_error: Option<String>,
    /// When.
    pub last_error_at: Option<DateTime<Utc>>,
}

const ROWS: &str = "
select source, name, kind, state, state_since, changed_by, opened_at, probe_at, last_error,
       last_error_at
from destinations
order by source, name";

/// Every destination's row, by source and name.
pub async fn rows(client: &impl Session) -> Result<Vec<DestinationRow>, DbError> {
    let rows = sql::query(client, ROWS, &[]).await?;
    rows.iter()
        .map(|r| {
            let state: &str = r.get(3);
            Ok(DestinationRow {
                source: r.get(0),
                name: r.get(1),
                kind: r.get(2),
                state: state
                    .parse()
                    .map_err(|_: UnknownName| DbError::BadRow("state"))?,
                state_since: r.get(4),
                changed_by: r.get(5),
                opened_at: r.get(6),
                probe_at: r.get(7),
                last_error: r.get(8),
                last_error_at: r.get(9),
            })
        })
        .collect()
}

/// A destination's legs waiting to be run: untaken, retrying or held.
#[derive(Clone, Debug, PartialEq)]
pub struct Waiting {
    /// Its source.
    pub source: String,
    /// Its name (empty for legs claimed before destinations existed).
    pub destination: String,
    /// Legs processing but never taken, retrying or held.
    pub legs: i64,
    /// Seconds since the oldest of them was first claimed.
    pub oldest_secs: f64,
}

/// Every leg not settled and not in a handler: processing with no take
/// yet (in its queue), or failed and retryable (a retry, or held for its
/// destination). Read through the partial indexes of processing and
/// retryable rows, never the settled ones.
const WAITING: &str = "
select source, destination, count(*),
       coalesce(extract(epoch from now() - min(created_at)), 0)::float8
from deliveries
where (status = 'processing' and attempts = 0) or (status = 'failed' and retryable)
group by source, destination
order by source, destination";

/// The legs waiting for each destination (see [`Waiting`]).
pub async fn waiting(client: &impl Session) -> Result<Vec<Waiting>, DbError> {
    Ok(sql::query(client, WAITING, &[])
        .await?
        .iter()
        .map(|r| Waiting {
            source: r.get(0),
            destination: r.get(1),
            legs: r.get(2),
            oldest_secs: r.get(3),
        })
        .collect())
}

/// How an attempt ended, as the log records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptResult {
    /// The destination took it.
    Ok,
    /// Failed; worth retrying.
    Transient,
    /// Failed for this leg only (a 400 or 422, say).
    Permanent,
    /// The destination itself is wrong or down (a 404, a DNS failure).
    Destination,
    /// Refused before anything was sent (the egress guard).
    Blocked,
    /// The destination answered "not now" with a time (a `429` or `503`
    /// with `Retry-After`): it is alive, and the leg waits without
    /// spending an attempt.
    Deferred,
}

impl AttemptResult {
    /// The stored name, also a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Transient => "transient",
            Self::Permanent => "permanent",
            Self::Destination => "destination",
            Self::Blocked => "blocked",
            Self::Deferred => "deferred",
        }
    }

    /// Whether it counts against the destination in the breaker's window.
    pub fn is_destination_failure(self) -> bool {
        matches!(self, Self::Transient | Self::Destination | Self::Blocked)
    }
}

/// One attempt of a leg, for the log.
#[derive(Clone, Debug)]
pub struct AttemptLog {
    /// The leg.
    pub key: LegKey,
    /// Its attempt number.
    pub attempt: i32,
    /// Whether it was its destination's probe.
    pub probe: bool,
    /// How it ended.
    pub result: AttemptResult,
    /// The answer's status code, when there was an answer.
    pub status_code: Option<u16>,
    /// What went wrong, short and redacted (never a secret, a signature or
    /// the payload).
    pub error: Option<String>,
    /// How long the attempt took.
    pub duration: Duration,
    /// The first 4 KiB of the answer's body.
    pub excerpt: Option<bytes::Bytes>,
}

/// The most of an answer's body the log keeps.
pub const EXCERPT_BYTES: usize = 4096;

const LOG_ATTEMPTS: &str = "
insert into destination_attempts
    (provider, source, hook_id, delivery_id, destination, attempt, probe, result, status_code,
     error, duration_ms, response_excerpt)
select * from unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int4[],
                     $7::bool[], $8::text[], $9::int4[], $10::text[], $11::float8[],
                     $12::bytea[])";

/// Writes attempts to the log, in one statement (the group commit of
/// [`super::group_commit::attempt_log`]).
pub async fn log_attempts(client: &impl Session, all: &[AttemptLog]) -> Result<(), DbError> {
    let column = |f: &dyn Fn(&AttemptLog) -> &str| -> Vec<&str> { all.iter().map(f).collect() };
    let providers = column(&|a| a.key.provider.as_str());
    let sources = column(&|a| a.key.source.as_str());
    let hooks = column(&|a| a.key.hook_id.as_str());
    let ids = column(&|a| a.key.delivery_id.as_str());
    let destinations = column(&|a| a.key.destination.as_str());
    let results = column(&|a| a.result.as_str());
    let attempts: Vec<i32> = all.iter().map(|a| a.attempt).collect();
    let probes: Vec<bool> = all.iter().map(|a| a.probe).collect();
    let codes: Vec<Option<i32>> = all.iter().map(|a| a.status_code.map(i32::from)).collect();
    let errors: Vec<Option<String>> = all
        .iter()
        .map(|a| a.error.as_deref().map(super::redact))
        .collect();
    let durations: Vec<f64> = all
        .iter()
        .map(|a| a.duration.as_secs_f64() * 1000.0)
        .collect();
    let excerpts: Vec<Option<&[u8]>> = all
        .iter()
        .map(|a| {
            a.excerpt
                .as_deref()
                .map(|b| &b[..b.len().min(EXCERPT_BYTES)])
        })
        .collect();
    sql::execute(
        client,
        LOG_ATTEMPTS,
        &[
            &providers,
            &sources,
            &hooks,
            &ids,
            &destinations,
            &attempts,
            &probes,
            &results,
            &codes,
            &errors,
            &durations,
            &excerpts,
        ],
    )
    .await?;
    Ok(())
}

const WINDOW: &str = "
select count(*),
       count(*) filter (where result in ('transient', 'destination', 'blocked'))
from destination_attempts
where source = $1 and destination = $2 and at > now() - make_interval(secs => $3)";

/// Attempts of a destination in the last `window`, and how many of them
/// failed because of the destination: what the breaker's ratio is taken
/// over.
pub async fn window(
    client: &impl Session,
    source: &SourceName,
    name: &DestinationName,
    window: Duration,
) -> Result<(i64, i64), DbError> {
    let row = sql::query_one(client, WINDOW, &[source, name, &secs(window)]).await?;
    Ok((row.get(0), row.get(1)))
}

/// A leg's attempts, newest first, at most `limit`.
#[derive(Clone, Debug)]
pub struct LoggedAttempt {
    /// When it started.
    pub at: DateTime<Utc>,
    /// Its number.
    pub attempt: i32,
    /// Whether it was a probe.
    pub probe: bool,
    /// How it ended (`ok`, `transient`, …).
    pub result: String,
    /// The answer's status code.
    pub status_code: Option<i32>,
    /// What went wrong.
    pub error: Option<String>,
    /// How long it took.
    pub duration_ms: f64,
    /// The first 4 KiB of the answer's body.
    pub excerpt: Option<Vec<u8>>,
}

const LEG_ATTEMPTS: &str = concat!(
    "
select at, attempt, probe, result, status_code, error, duration_ms, response_excerpt
from destination_attempts
where ",
    key!(),
    "
order by at desc
limit $6"
);

/// The attempt log of one leg, newest first.
pub async fn leg_attempts(
    client: &impl Session,
    key: &LegKey,
    limit: i64,
) -> Result<Vec<LoggedAttempt>, DbError> {
    let rows = super::query_all(client, LEG_ATTEMPTS, key, &[&limit]).await?;
    Ok(rows
        .iter()
        .map(|r| LoggedAttempt {
            at: r.get(0),
            attempt: r.get(1),
            probe: r.get(2),
            result: r.get(3),
            status_code: r.get(4),
            error: r.get(5),
            duration_ms: r.get(6),
            excerpt: r.get(7),
        })
        .collect())
}
