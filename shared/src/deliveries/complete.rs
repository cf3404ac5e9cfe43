//! The worker's resolutions: completion (one delivery in its own
//! transaction, or many by group commit, with the `store` effect written by
//! the completing statement), the `github_events` insert, and failure.

use std::collections::{BTreeMap, HashSet};

use crate::postgres::sql::{self, Session};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::parked::ParkedBody;
use super::row::{KeyColumns, KeyTuple, key_tuple};
use super::{Failed, Failure, execute, query_one, query_opt, redact, secs};
use crate::key::{ClaimToken, DeliveryKey};
use crate::postgres::DbError;

/// The one `github_events` insert: the `store` effect, written in the
/// completing transaction (see [`store_event`]) or by the completing
/// statement itself (see [`complete_batch`]). `on conflict do nothing`:
/// the fence already makes a second effect impossible; this keeps a
/// replayed request, claimed anew after its delivery row was swept, from
/// failing forever.
macro_rules! insert_github_event {
    ($select:literal) => {
        concat!(
            "insert into github_events
        (provider, source, hook_id, delivery_id, event, action, payload, received_at)
    ",
            $select,
            "
    on conflict do nothing"
        )
    };
}

/// The fault-injection suite counts effects in a log without a unique key,
/// so that a second effect would show.
#[cfg(feature = "failpoints")]
macro_rules! log_effect {
    ($select:literal) => {
        concat!(
            "insert into hookinbox_effect_log (provider, source, hook_id, delivery_id) ",
            $select
        )
    };
}

const COMPLETE: &str = concat!(
    "
with done as (
    update deliveries
    set status = 'completed', completed_at = now(), retryable = false, next_attempt_at = null
    where ",
    key!(),
    " and ",
    held_by!("$5"),
    "
    returning provider, source, hook_id, delivery_id
), unparked as (
    delete from parked_bodies p using done d
    where p.provider = d.provider and p.source = d.source
      and p.hook_id = d.hook_id and p.delivery_id = d.delivery_id
)
select count(*) from done"
);

/// Marks the delivery completed and deletes its parked body. Run it in the
/// transaction of a database effect, so the effect and the completion
/// commit together or not at all.
/// Guarded by the token alone, not by `lease_until > now()`: a holder whose
/// lease lapsed but whom nobody replaced may still finish. Returns false
/// when fenced.
pub async fn complete(
    client: &impl Session,
    key: &DeliveryKey,
    token: ClaimToken,
) -> Result<bool, DbError> {
    let row = query_one(client, COMPLETE, key, &[&token.0]).await?;
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

const STORE_EVENT: &str =
    insert_github_event!("values ($1, $2, $3, $4, $5, $6, $7::text::jsonb, $8)");

/// Writes `event` into `github_events` as the delivery's effect, inside a
/// transaction that fenced the row first ([`super::fence`]) and will
/// complete it ([`complete`]).
pub async fn store_event(
    client: &impl Session,
    key: &DeliveryKey,
    event: &StoredEvent,
) -> Result<(), DbError> {
    execute(
        client,
        STORE_EVENT,
        key,
        &[
            &event.event,
            &event.action,
            &String::from_utf8_lossy(&event.payload),
            &event.received_at,
        ],
    )
    .await?;
    #[cfg(feature = "failpoints")]
    execute(client, log_effect!("values ($1, $2, $3, $4)"), key, &[]).await?;
    Ok(())
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
    ($($log:tt)*) => {
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
      and ",
            held_by!("d", "i.token"),
            "
    returning d.provider, d.source, d.hook_id, d.delivery_id, i.token
), effects as (
    select i.* from input i join done using (provider, source, hook_id, delivery_id, token)
    where i.store
), stored as (
    ",
            insert_github_event!(
                "select provider, source, hook_id, delivery_id, event, action, payload::jsonb, received_at
    from effects"
            ),
            "
), unparked as (
    delete from parked_bodies p using done d
    where p.provider = d.provider and p.source = d.source
      and p.hook_id = d.hook_id and p.delivery_id = d.delivery_id
)",
            $($log)*,
            "
select provider, source, hook_id, delivery_id, token from done"
        )
    };
}

#[cfg(not(feature = "failpoints"))]
const COMPLETE_BATCH: &str = complete_batch_sql!("");

#[cfg(feature = "failpoints")]
const COMPLETE_BATCH: &str = complete_batch_sql!(concat!(
    ", logged as (\n    ",
    log_effect!("select provider, source, hook_id, delivery_id from effects"),
    "\n)"
));

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
    client: &impl Session,
    items: &[Completing],
) -> Result<Vec<bool>, DbError> {
    // One statement cannot update a row twice: one entry per (key, token),
    // in key order (see `row::firsts_by_key`).
    let mut unique: BTreeMap<(&DeliveryKey, Uuid), usize> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        unique.entry((&item.key, item.token.0)).or_insert(i);
    }
    let keys = KeyColumns::of(unique.keys().map(|(key, _)| *key));
    let stored = |i: usize| items[i].store.as_ref();
    let events: Vec<Option<&str>> = unique
        .values()
        .map(|&i| stored(i).map(|e| e.event.as_str()))
        .collect();
    let actions: Vec<Option<&str>> = unique
        .values()
        .map(|&i| stored(i).and_then(|e| e.action.as_deref()))
        .collect();
    // Borrowed, not copied: the handler checked the payload is UTF-8.
    let payloads: Vec<Option<std::borrow::Cow<'_, str>>> = unique
        .values()
        .map(|&i| stored(i).map(|e| String::from_utf8_lossy(&e.payload)))
        .collect();
    let tokens: Vec<Uuid> = unique.keys().map(|(_, token)| *token).collect();
    let store: Vec<bool> = unique.values().map(|&i| stored(i).is_some()).collect();
    let received: Vec<Option<DateTime<Utc>>> = unique
        .values()
        .map(|&i| stored(i).map(|e| e.received_at))
        .collect();
    let rows = sql::query(
        client,
        COMPLETE_BATCH,
        &keys.params(&[&tokens, &store, &events, &actions, &payloads, &received]),
    )
    .await?;
    let done: HashSet<(KeyTuple, Uuid)> = rows
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
            done.contains(&(key_tuple(&item.key), item.token.0))
                && unique.get(&(&item.key, item.token.0)) == Some(&i)
        })
        .collect())
}

const FAIL: &str = concat!(
    "
with moved as (
    update deliveries
    set status = 'failed', retryable = $6,
        next_attempt_at = case when $6 then now() + make_interval(secs => $7) end,
        failed_at = now(), first_failed_at = coalesce(first_failed_at, now()),
        last_error_class = $8, last_error = $9
    where ",
    key!(),
    " and ",
    held_by!("$5"),
    "
    returning provider, source, hook_id, delivery_id, attempts, first_failed_at, failed_at
), ",
    park_moved!(10, 11, 12),
    "
select attempts, first_failed_at, failed_at from moved"
);

/// Records a failed attempt and parks the body, in one statement, guarded
/// by the holder's token. Returns `None` when fenced (someone else holds
/// the delivery now).
pub async fn fail(
    client: &impl Session,
    key: &DeliveryKey,
    token: ClaimToken,
    failure: &Failure,
    parked: ParkedBody<'_>,
) -> Result<Option<Failed>, DbError> {
    let retryable = failure.retry_in.is_some();
    let delay = failure.retry_in.map(secs).unwrap_or(0.0);
    let headers = parked.headers_json();
    let row = query_opt(
        client,
        FAIL,
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
    )
    .await?;
    Ok(row.map(|row| Failed {
        attempts: row.get(0),
        first_failed_at: row.get(1),
        failed_at: row.get(2),
    }))
}

const MARK_DEAD_LETTERED: &str = concat!(
    "
update deliveries set dead_lettered_at = now()
where ",
    key!(),
    "
  and status = 'failed' and not retryable"
);

/// Records that the dead-letter copy of a failed delivery was confirmed by
/// the broker. Until then a redelivered message writes the copy again
/// (a second copy is harmless; a missing one is not).
pub async fn mark_dead_lettered(client: &impl Session, key: &DeliveryKey) -> Result<(), DbError> {
    execute(client, MARK_DEAD_LETTERED, key, &[]).await?;
    Ok(())
}
