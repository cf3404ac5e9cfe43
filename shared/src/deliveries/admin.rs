//! What operators read and do: a delivery by its `X-GitHub-Delivery` id,
//! its stored payload, and replay (of failed legs, or of any leg that has
//! ended, from its delivery's body), and its undo when the publish fails.
//! One delivery by key is `delivery`; lists and counts are in `filter`.

use crate::postgres::sql::Session;

use super::bodies::{self, Kept};
use super::delivery::Delivery;
use super::filter::{Filter, list};
use super::row::{Republish, Unreadable, republish};
use super::{Policy, execute, query_opt, redact, secs};
use crate::key::{ClaimToken, LegKey};
use crate::postgres::DbError;
use crate::postgres::sql;

/// `$7`: whether a completed leg may be replayed too (`Scope::Ended`), or
/// failed ones only (`Scope::Failed`). Either way its delivery's body must
/// be kept.
///
/// A failed leg of an ordered key keeps its place, so the retry of a
/// halted key runs its halting leg first; a leg an operator skipped, and a
/// completed leg, take a new place at the back of its key (the key went on
/// without it), under the key's advisory lock as a claim's place is (see
/// `claim`): a skipped leg holds the key again, a completed one runs after
/// what its key has now.
const REPLAY: &str = concat!(
    "
with skipped as (
    select x.source, x.destination, x.order_key from deliveries x
    where ",
    key!("x"),
    "
      and x.order_key is not null
      and ((x.status = 'failed' and x.order_skipped_at is not null)
           or (x.status = 'completed' and $7))
), place as (
    select nextval('deliveries_order_seq') as seq
    from (select count(*) from (
              select pg_advisory_xact_lock(",
    order_lock!("s"),
    ")
              from skipped s) l) locked
    where exists (select 1 from skipped)
), kept as (
    -- The delivery's body, locked (`for key share`) until this commits: a
    -- retention sweep that deletes bodies whose legs have all ended locks
    -- each first and looks at the legs again after, so it either deletes
    -- this body before this replay finds it (nothing is replayed), or
    -- finds the leg open once this commits (the body stays).
    select 1 from deliveries x
    join bodies b
      on b.provider = x.provider and b.source = x.source and b.hook_id = x.hook_id
     and b.delivery_id = x.delivery_id and b.received_at = x.created_at
    where ",
    key!("x"),
    "
    for key share of b
)
update deliveries d
set ",
    to_processing!("$6"),
    ",
    attempts = 0, replays = d.replays + 1, dead_lettered_at = null, deferred_since = null,
    completed_at = null,
    -- A completed leg's last error is history: its replay starts clean
    -- (a wait's class would read as the replay's own wait).
    last_error_class = case when d.status = 'completed' then null else d.last_error_class end,
    last_error = case when d.status = 'completed' then null else d.last_error end,
    -- A replay is an operator's request to run the leg: `skip_stale` does
    -- not skip it.
    stale_clock = null,
    order_seq = coalesce((select seq from place), d.order_seq),
    -- Who skipped it stays only on a leg that was skipped: an unreplay
    -- (its publish failed) skips it again.
    order_skipped_by = case when d.order_skipped_at is not null then d.order_skipped_by end,
    order_skipped_at = null
where ",
    key!("d"),
    "
  and (d.status = 'failed' or (d.status = 'completed' and $7))
  and exists (select 1 from kept)
returning d.provider, d.source, d.hook_id, d.delivery_id, d.destination, d.event, d.action,
          d.claim_token, d.attempts, d.traceparent"
);

/// Which legs a replay may start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Failed legs only (retrying, waiting or dead): `dlq replay`, and the
    /// console's replay of dead letters.
    Failed,
    /// Any leg that is not in flight and not filtered: completed ones too
    /// (`deliveries replay`, the console's delivery page).
    Ended,
}

/// What an operator replay of one delivery came to.
#[derive(Clone, Debug)]
pub enum Replayed {
    /// Back to `processing` under a new token: publish this job.
    Started(Box<Republish>),
    /// Its row cannot become a job; dead-letter it with the reason
    /// ([`super::dead_letter_unreadable`]).
    Unreadable(Unreadable),
    /// Nothing changed: hookinbox holds no body of this delivery (a leg
    /// claimed before the claim wrote bodies, see
    /// [`super::Held::AwaitingRedelivery`], or one whose body retention
    /// dropped), so only a redelivery from GitHub can bring it back.
    /// [`NO_BODY_TO_REPLAY`] says so to operators.
    NoBody,
    /// Nothing changed: the leg is not one the scope replays (any more):
    /// in flight (replayed or taken meanwhile), completed where only
    /// failed legs are replayed, filtered, or gone.
    NotFailed,
}

/// Why a delivery with no body kept is not replayed, and what brings it
/// back; the CLI and the console say the same.
pub const NO_BODY_TO_REPLAY: &str = "No body to replay: hookinbox keeps no body of this \
     delivery (it is past HOOKINBOX_RETENTION_BODIES, or the delivery was claimed before bodies \
     were kept and its message was lost), so only GitHub has its body. Ask GitHub to redeliver \
     it: run `hookinbox-worker reconcile` (the reconciler asks GitHub to redeliver every claim \
     awaiting redelivery), or press Redeliver on it in the webhook's Recent Deliveries on GitHub";

const REPLAY_REFUSED: &str = concat!(
    "
select not ",
    body_exists!("d"),
    "
       and (d.status = 'failed' or (d.status = 'completed' and $6) or ",
    awaiting_redelivery!("d"),
    ")
from deliveries d
where ",
    key!("d")
);

/// Operator replay of a leg: back to `processing` under a new token with
/// `attempts = 0` and `replays + 1`, in one compare-and-set on its status
/// (failed, or with [`Scope::Ended`] completed too) and on its delivery's
/// body being kept. Replaying the same leg twice starts one job: the
/// second finds it processing and changes nothing
/// ([`Replayed::NotFailed`]). When the compare-and-set changes nothing, a
/// read that follows says why: no body to replay ([`Replayed::NoBody`]),
/// or not replayable.
pub async fn replay(
    client: &impl Session,
    policy: &Policy,
    key: &LegKey,
    scope: Scope,
) -> Result<Replayed, DbError> {
    let ended = scope == Scope::Ended;
    if let Some(row) = query_opt(client, REPLAY, key, &[&secs(policy.lease), &ended]).await? {
        return Ok(match republish(&row) {
            Ok(job) => Replayed::Started(Box::new(job)),
            Err(unreadable) => Replayed::Unreadable(unreadable),
        });
    }
    let no_body = query_opt(client, REPLAY_REFUSED, key, &[&ended])
        .await?
        .is_some_and(|row| row.get::<_, bool>(0));
    Ok(if no_body {
        Replayed::NoBody
    } else {
        Replayed::NotFailed
    })
}

const UNREPLAY: &str = concat!(
    "
update deliveries
set status = 'failed', retryable = false, dead_lettered_at = now(),
    last_error = $7,
    -- A skipped leg whose replay did not go out is skipped again, not a
    -- halt of its key.
    order_skipped_at = case when order_skipped_by is not null then now() end
where ",
    key!(),
    " and ",
    held_by!("$6"),
    " and attempts = 0"
);

/// Puts a replayed delivery back among the dead letters because its
/// publish failed, skipped again if it was a skipped leg of an ordered
/// key. Token-guarded, and only while no worker took it.
pub async fn unreplay(
    client: &impl Session,
    key: &LegKey,
    token: ClaimToken,
    error: &str,
) -> Result<bool, DbError> {
    let n = execute(client, UNREPLAY, key, &[&token.0, &redact(error)]).await?;
    Ok(n == 1)
}

/// Every delivery with this `X-GitHub-Delivery` id in `source`; with
/// `hook_id`, at most the one of that hook (GitHub gives one id to an event
/// delivered to several hooks).
pub async fn find(
    client: &impl Session,
    source: &str,
    delivery_id: &str,
    hook_id: Option<&str>,
) -> Result<Vec<Delivery>, DbError> {
    let filter = Filter {
        source: Some(source.to_owned()),
        ids: Some(vec![delivery_id.to_owned()]),
        hook_id: hook_id.map(str::to_owned),
        limit: 100,
        ..Filter::default()
    };
    list(client, &filter).await
}

/// Where a stored payload was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayloadOrigin {
    /// `bodies`: the raw body as received, with its headers: what a replay
    /// publishes.
    Received,
    /// `github_events`: the `store` handler's effect, once the body is past
    /// its retention.
    Event,
}

/// A delivery's payload, as operators see it.
#[derive(Clone, Debug)]
pub struct StoredPayload {
    /// Where it was found.
    pub origin: PayloadOrigin,
    /// The original `Content-Type` (`Received` only).
    pub content_type: Option<String>,
    /// The carried request headers (`Received` only).
    pub headers: Vec<(String, String)>,
    /// The stored event as JSON (`Event`).
    pub json: Option<serde_json::Value>,
    /// The raw body as signed (`Received`); `None` for one that cannot be
    /// decoded (the reason is in `unreadable`).
    pub raw: Option<Vec<u8>>,
    /// Why a kept body cannot be read, if it cannot.
    pub unreadable: Option<String>,
}

/// `github_events` holds one row per claim of a delivery (one `store`
/// destination a source at most): addressed by the delivery's four parts,
/// the first claim's if it was claimed anew after its claim was swept.
const EVENT_PAYLOAD: &str = concat!(
    "
select payload from github_events g
where ",
    delivery_key!("g"),
    "
order by received_at
limit 1"
);

/// The payload kept of a delivery: its body as received, with its headers,
/// while `HOOKINBOX_RETENTION_BODIES` keeps it (what a replay would
/// publish); else its `github_events` row; `None` when neither is kept.
pub async fn stored_payload(
    client: &impl Session,
    key: &LegKey,
) -> Result<Option<StoredPayload>, DbError> {
    if let Some(Kept { body, .. }) = bodies::read(client, &key.delivery).await? {
        return Ok(Some(match body {
            Ok(body) => StoredPayload {
                origin: PayloadOrigin::Received,
                content_type: Some(body.content_type),
                headers: body.github_headers,
                json: None,
                raw: Some(body.bytes.to_vec()),
                unreadable: None,
            },
            Err(e) => StoredPayload {
                origin: PayloadOrigin::Received,
                content_type: None,
                headers: Vec::new(),
                json: None,
                raw: None,
                unreadable: Some(e.to_string()),
            },
        }));
    }
    let d = &key.delivery;
    Ok(sql::query_opt(
        client,
        EVENT_PAYLOAD,
        &[&d.provider, &d.source, &d.hook_id, &d.delivery_id],
    )
    .await?
    .map(|row| StoredPayload {
        origin: PayloadOrigin::Event,
        content_type: None,
        headers: Vec::new(),
        json: Some(row.get(0)),
        raw: None,
        unreadable: None,
    }))
}
