//! What operators read and do: a delivery by its `X-GitHub-Delivery` id,
//! its stored payload, and replay of failed deliveries (and its undo when
//! the publish fails). One delivery by key is `delivery`; lists and counts
//! are in `filter`.

use crate::postgres::sql::Session;

use super::delivery::Delivery;
use super::filter::{Filter, list};
use super::parked::{Parked, Unreadable, headers_from_json};
use super::row::parked;
use super::{Policy, execute, query_opt, redact, secs};
use crate::key::{ClaimToken, LegKey};
use crate::postgres::DbError;
use crate::postgres::sql;

/// A leg of an ordered key keeps its place, so the retry of a halted key
/// runs its halting leg first; a leg an operator skipped takes a new place
/// at the back of its key (the key went on without it), under the key's
/// advisory lock as a claim's place is (see `claim`), and holds the key
/// again.
const REPLAY: &str = concat!(
    "
with skipped as (
    select x.source, x.destination, x.order_key from deliveries x
    where ",
    key!("x"),
    "
      and x.status = 'failed' and x.order_key is not null and x.order_skipped_at is not null
), place as (
    select nextval('deliveries_order_seq') as seq
    from (select count(*) from (
              select pg_advisory_xact_lock(",
    order_lock!("s"),
    ")
              from skipped s) l) locked
    where exists (select 1 from skipped)
)
update deliveries d
set ",
    to_processing!("$6"),
    ",
    attempts = 0, replays = d.replays + 1, dead_lettered_at = null, deferred_since = null,
    -- A replay is an operator's request to run the leg: `skip_stale` does
    -- not skip it.
    stale_clock = null,
    order_seq = coalesce((select seq from place), d.order_seq),
    -- Who skipped it stays only on a leg that was skipped: an unreplay
    -- (its publish failed) skips it again.
    order_skipped_by = case when d.order_skipped_at is not null then d.order_skipped_by end,
    order_skipped_at = null
from parked_bodies p
where ",
    key!("d"),
    "
  and d.status = 'failed'
  and p.provider = d.provider and p.source = d.source
  and p.hook_id = d.hook_id and p.delivery_id = d.delivery_id
  and p.destination = d.destination
returning d.provider, d.source, d.hook_id, d.delivery_id, d.destination, d.event, d.action,
          d.claim_token, d.attempts, p.content_type, p.headers, p.body, d.traceparent"
);

/// What an operator replay of one delivery came to.
#[derive(Clone, Debug)]
pub enum Replayed {
    /// Back to `processing` under a new token: publish this job.
    Started(Box<Parked>),
    /// Its parked body cannot become a job; dead-letter it with the reason
    /// ([`super::dead_letter_unreadable`]).
    Unreadable(Unreadable),
    /// Nothing changed: hookinbox holds no body of this delivery (see
    /// [`super::Held::AwaitingRedelivery`]), so only a redelivery from
    /// GitHub can bring it back. [`NO_BODY_TO_REPLAY`] says so to operators.
    NoBody,
    /// Nothing changed: the delivery is not failed (any more): replayed or
    /// taken meanwhile, completed, or gone.
    NotFailed,
}

/// Why a delivery with no parked body is not replayed, and what brings it
/// back; the CLI and the console say the same.
pub const NO_BODY_TO_REPLAY: &str = "No body to replay: ingest claimed this delivery but \
     never published it, so only GitHub has its body. Ask GitHub to redeliver it: run \
     `hookinbox-worker reconcile` (the reconciler asks GitHub to redeliver every claim \
     awaiting redelivery), or press Redeliver on it in the webhook's Recent Deliveries on GitHub";

const REPLAY_REFUSED: &str = concat!(
    "
select not exists (
           select 1 from parked_bodies p
           where p.provider = d.provider and p.source = d.source
             and p.hook_id = d.hook_id and p.delivery_id = d.delivery_id
             and p.destination = d.destination)
       and (d.status = 'failed' or ",
    awaiting_redelivery!("d"),
    ")
from deliveries d
where ",
    key!("d")
);

/// Operator replay of a failed delivery: back to `processing` under a new
/// token with `attempts = 0` and `replays + 1`, in one compare-and-set on
/// `status = 'failed'` with a parked body. Replaying the same delivery
/// twice starts one job: the second finds it processing and changes
/// nothing ([`Replayed::NotFailed`]). When the compare-and-set changes
/// nothing, a read that follows says why: no body to replay
/// ([`Replayed::NoBody`]), or not failed.
pub async fn replay(
    client: &impl Session,
    policy: &Policy,
    key: &LegKey,
) -> Result<Replayed, DbError> {
    if let Some(row) = query_opt(client, REPLAY, key, &[&secs(policy.lease)]).await? {
        return Ok(match parked(&row) {
            Ok(job) => Replayed::Started(Box::new(job)),
            Err(unreadable) => Replayed::Unreadable(unreadable),
        });
    }
    let no_body = query_opt(client, REPLAY_REFUSED, key, &[])
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
    /// `github_events`: the `store` handler's effect of a completed delivery.
    Event,
    /// `parked_bodies`: the raw body of a delivery that failed (or waits).
    Parked,
}

/// A delivery's payload, as operators see it.
#[derive(Clone, Debug)]
pub struct StoredPayload {
    /// Where it was found.
    pub origin: PayloadOrigin,
    /// The original `Content-Type` (parked bodies only).
    pub content_type: Option<String>,
    /// The original `X-GitHub-*` headers (parked bodies only).
    pub headers: Vec<(String, String)>,
    /// The stored event as JSON (`Event`).
    pub json: Option<serde_json::Value>,
    /// The raw body as signed (`Parked`).
    pub raw: Option<Vec<u8>>,
}

const PARKED_PAYLOAD: &str = concat!(
    "
select content_type, headers, body from parked_bodies
where ",
    key!()
);

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

/// The payload stored for a delivery: its parked body if it has one (what a
/// replay would publish), else its `github_events` row; `None` when neither
/// is kept (a forwarded delivery once completed, or one in flight).
pub async fn stored_payload(
    client: &impl Session,
    key: &LegKey,
) -> Result<Option<StoredPayload>, DbError> {
    if let Some(row) = query_opt(client, PARKED_PAYLOAD, key, &[]).await? {
        let headers: serde_json::Value = row.get(1);
        return Ok(Some(StoredPayload {
            origin: PayloadOrigin::Parked,
            content_type: Some(row.get(0)),
            headers: headers_from_json(&headers),
            json: None,
            raw: Some(row.get(2)),
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
    }))
}
