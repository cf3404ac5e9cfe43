//! The reconciler's own tables (migration 0004): each source's watermark,
//! and the redeliveries asked per hook and GUID.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use hookinbox::deliveries::redact;
use hookinbox::postgres::DbError;
use hookinbox::postgres::sql::{self, Session};

use super::judge::Asked;

/// A source's progress.
#[derive(Clone, Debug, Default)]
pub(crate) struct Progress {
    /// The hook the watermark belongs to.
    pub(crate) hook: String,
    /// The `X-GitHub-Hook-ID` its deliveries carry, once known.
    pub(crate) hook_id: Option<String>,
    /// Every failed delivery logged before this was judged.
    pub(crate) watermark: Option<DateTime<Utc>>,
    /// Every delivery logged before this, successes too, was judged (by a
    /// pass that walked the whole log).
    pub(crate) full_watermark: Option<DateTime<Utc>>,
}

const PROGRESS: &str =
    "select hook, hook_id, watermark, full_watermark from reconcile_state where source = $1";

/// `source`'s progress, if it has any.
pub(crate) async fn progress(
    client: &impl Session,
    source: &str,
) -> Result<Option<Progress>, DbError> {
    Ok(sql::query_opt(client, PROGRESS, &[&source])
        .await?
        .map(|row| Progress {
            hook: row.get(0),
            hook_id: row.get(1),
            watermark: row.get(2),
            full_watermark: row.get(3),
        }))
}

const REMEMBER_HOOK_ID: &str = "
insert into reconcile_state (source, hook, hook_id) values ($1, $2, $3)
on conflict (source) do update
    set hook_id = excluded.hook_id,
        watermark = case when reconcile_state.hook = excluded.hook
                         then reconcile_state.watermark end,
        full_watermark = case when reconcile_state.hook = excluded.hook
                              then reconcile_state.full_watermark end,
        hook = excluded.hook";

/// Records the hook id a hook's deliveries carry (learned for an App).
pub(crate) async fn remember_hook_id(
    client: &impl Session,
    source: &str,
    hook: &str,
    hook_id: &str,
) -> Result<(), DbError> {
    sql::execute(client, REMEMBER_HOOK_ID, &[&source, &hook, &hook_id]).await?;
    Ok(())
}

const COMPLETED: &str = "
insert into reconcile_state (source, hook, hook_id, watermark, full_watermark, last_pass_at,
                             last_attempt_at, last_error, last_counts)
values ($1, $2, $3, $4, $6, now(), now(), null, $5)
on conflict (source) do update
    set hook_id = coalesce(excluded.hook_id, reconcile_state.hook_id),
        watermark = case
            when reconcile_state.hook <> excluded.hook then excluded.watermark
            else greatest(reconcile_state.watermark, excluded.watermark) end,
        full_watermark = case
            when reconcile_state.hook <> excluded.hook then excluded.full_watermark
            else greatest(reconcile_state.full_watermark, excluded.full_watermark) end,
        hook = excluded.hook,
        last_pass_at = now(), last_attempt_at = now(), last_error = null,
        last_counts = excluded.last_counts";

/// Records a complete pass: the watermarks move forward (never back;
/// `full_watermark` only after a pass that walked the whole log), and the
/// counts are kept for the operators.
pub(crate) async fn completed(
    client: &impl Session,
    source: &str,
    hook: &str,
    hook_id: Option<&str>,
    watermark: Option<DateTime<Utc>>,
    full_watermark: Option<DateTime<Utc>>,
    counts: &serde_json::Value,
) -> Result<(), DbError> {
    sql::execute(
        client,
        COMPLETED,
        &[
            &source,
            &hook,
            &hook_id,
            &watermark,
            counts,
            &full_watermark,
        ],
    )
    .await?;
    Ok(())
}

const FAILED: &str = "
insert into reconcile_state (source, hook, last_attempt_at, last_error)
values ($1, $2, now(), $3)
on conflict (source) do update
    set last_attempt_at = now(), last_error = excluded.last_error";

/// Records a pass that did not complete; the watermark stays.
pub(crate) async fn failed(
    client: &impl Session,
    source: &str,
    hook: &str,
    error: &str,
) -> Result<(), DbError> {
    sql::execute(client, FAILED, &[&source, &hook, &redact(error)]).await?;
    Ok(())
}

const ASKED: &str = "
select guid, asked, last_asked_at from reconcile_redeliveries
where hook = $1 and guid = any($2)";

/// The redeliveries already asked for each of `guids`.
pub(crate) async fn asked(
    client: &impl Session,
    hook: &str,
    guids: &[&str],
) -> Result<HashMap<String, Asked>, DbError> {
    Ok(sql::query(client, ASKED, &[&hook, &guids])
        .await?
        .iter()
        .map(|row| {
            (
                row.get(0),
                Asked {
                    asked: row.get(1),
                    last_asked_at: row.get(2),
                },
            )
        })
        .collect())
}

const ASK: &str = "
insert into reconcile_redeliveries (hook, guid, source, asked, last_result, traceparent)
values ($1, $2, $3, 1, 'asked', $4)
on conflict (hook, guid) do update
    set asked = reconcile_redeliveries.asked + 1, last_asked_at = now(), last_result = 'asked',
        traceparent = excluded.traceparent";

/// Counts a redelivery as asked, before the request to GitHub: a crash
/// between the two still counts against the cap, and a pass that follows
/// does not ask again within the minimum age. Keeps `traceparent`, the
/// span of this ask (traces on), for ingest's span of the redelivered
/// request to link to: written before the request, since GitHub may send
/// the delivery before it answers.
pub(crate) async fn ask(
    client: &impl Session,
    hook: &str,
    guid: &str,
    source: &str,
    traceparent: Option<&str>,
) -> Result<(), DbError> {
    sql::execute(client, ASK, &[&hook, &guid, &source, &traceparent]).await?;
    Ok(())
}

const ANSWERED: &str =
    "update reconcile_redeliveries set last_result = $3 where hook = $1 and guid = $2";

/// Records what GitHub answered to the redelivery request.
pub(crate) async fn answered(
    client: &impl Session,
    hook: &str,
    guid: &str,
    result: &str,
) -> Result<(), DbError> {
    sql::execute(client, ANSWERED, &[&hook, &guid, &result]).await?;
    Ok(())
}

const FORGET: &str = "
delete from reconcile_redeliveries where ctid in (
    select ctid from reconcile_redeliveries
    where last_asked_at < now() - make_interval(secs => $1)
    limit 1000
)";

/// Forgets redeliveries asked longer ago than `older_than` (past GitHub's
/// log, they can never be asked again).
pub(crate) async fn forget(
    client: &impl Session,
    older_than: std::time::Duration,
) -> Result<u64, DbError> {
    sql::execute(client, FORGET, &[&older_than.as_secs_f64()]).await
}
