//! The retry scheduler: due retries (and legs reaped `lost`, whose
//! messages are gone) are published again, their keys only (the take
//! reads each body from Postgres), exhausted ones dead-lettered,
//! unreadable rows dead-lettered with the reason, and dead letters whose
//! broker copy a crash left unwritten are given one.

use std::time::Duration;

use hookinbox::deliveries::{self, Unreadable};
use hookinbox::postgres::DbError;

use crate::context::{Context, RuntimeError};

/// Rows per scheduler statement.
const SCHEDULE_BATCH: i64 = 100;
/// How long a failed retry publish waits before it is due again.
const REPUBLISH_PAUSE: Duration = Duration::from_secs(1);
/// A dead letter without a confirmed copy this long is given one.
const COPY_GRACE: Duration = Duration::from_secs(60);

/// One pass of the retry scheduler: dead-letters due retries that used
/// every attempt, moves due retries back to `processing` under new tokens
/// and publishes each (a probe through the shared queue), all confirms in
/// flight at once.
/// A publish that fails puts its row back as due, token-guarded. Also
/// writes dead-letter copies that a crash left unwritten. Returns how many
/// retries it published.
pub(crate) async fn schedule_once(ctx: &Context) -> Result<usize, RuntimeError> {
    let client = ctx.pool.get().await.map_err(DbError::from)?;
    deliveries::exhaust_due(&client, &ctx.policy, SCHEDULE_BATCH).await?;
    // Before the pick: a key's next leg, woken here, goes out in this pass.
    deliveries::wake_ordered(&client).await?;
    // Not with `?`: a wake that fails delays fair legs by a pass, and must
    // not stop the retries, probes and copies below.
    match deliveries::wake_fair(&client).await {
        Ok(waiting) => {
            if let Ok(mut known) = ctx.fair_waiting.write() {
                *known = waiting.into_iter().collect();
            }
        }
        Err(error) => tracing::warn!(%error, "fair legs not woken this pass"),
    }
    let due = deliveries::schedule_due(&client, &ctx.policy, SCHEDULE_BATCH).await?;
    // Breakers: destinations open too long are disabled; each open one
    // whose pause is over gets its probe, published like a retry.
    let disabled = deliveries::disable_stale(&client).await?;
    if disabled > 0 {
        tracing::warn!(
            disabled,
            "destinations disabled: their breakers stayed open longer than disable_after"
        );
    }
    let probes = deliveries::probe_due(&client, &ctx.policy).await?;
    for probe in probes.iter().flatten() {
        tracing::info!(
            source = %probe.envelope.key.source,
            destination = %probe.envelope.key.destination,
            delivery_id = %probe.envelope.key.delivery_id,
            "probing an open destination"
        );
    }
    // A probe goes through the shared queue (see `Publisher::publish_probe`).
    let due = due
        .into_iter()
        .map(|parked| (parked, false))
        .chain(probes.into_iter().map(|parked| (parked, true)));
    let orphans = deliveries::needing_copy(&client, COPY_GRACE, SCHEDULE_BATCH).await?;
    drop(client);

    let publishes = due.map(|(parked, probe)| async move {
        let parked = match parked {
            Ok(parked) => parked,
            Err(unreadable) => {
                dead_letter_unreadable(ctx, &unreadable).await;
                return false;
            }
        };
        let job = &parked.envelope;
        let published = if probe {
            ctx.publisher.publish_probe(job).await
        } else {
            ctx.publisher.publish(job).await
        };
        let Err(error) = published else {
            return true;
        };
        let error = error.to_string();
        tracing::warn!(delivery_id = %job.key.delivery_id, %error, "retry publish failed; due again shortly");
        if let Ok(client) = ctx.pool.get().await {
            let _ =
                deliveries::reschedule(&client, &job.key, job.token, REPUBLISH_PAUSE, &error).await;
        }
        false
    });
    let published = futures::future::join_all(publishes)
        .await
        .into_iter()
        .filter(|ok| *ok)
        .count();
    metrics::counter!(hookinbox::metrics::RETRIES_PUBLISHED).increment(published as u64);

    for parked in orphans {
        let parked = match parked {
            Ok(parked) => parked,
            Err(unreadable) => {
                dead_letter_unreadable(ctx, &unreadable).await;
                continue;
            }
        };
        let job = &parked.envelope;
        let row = match ctx.pool.get().await {
            Ok(client) => deliveries::get(&client, &job.key).await,
            Err(e) => Err(DbError::from(e)),
        };
        let Ok(Some(row)) = row else { continue };
        if ctx
            .publisher
            .publish_dead_letter(job, &row.dead_letter())
            .await
            .is_ok()
            && let Ok(client) = ctx.pool.get().await
        {
            let _ = deliveries::mark_dead_lettered(&client, &job.key).await;
        }
    }
    Ok(published)
}

/// A row that cannot become a job is dead-lettered with the reason, rather
/// than skipped or rescheduled forever. Logged without its content.
async fn dead_letter_unreadable(ctx: &Context, row: &Unreadable) {
    tracing::error!(
        delivery_id = %row.parts[3],
        reason = %row.reason,
        "a delivery cannot be read as a job; dead-lettering it"
    );
    let result = match ctx.pool.get().await {
        Ok(client) => deliveries::dead_letter_unreadable(&client, row).await,
        Err(e) => Err(DbError::from(e)),
    };
    if let Err(e) = result {
        tracing::warn!(error = %e, "could not dead-letter an unreadable row");
    }
}

/// After an ordered leg completed: publishes its key's next leg if it
/// waited (`deliveries::next_of_key`), putting it back as due if the
/// publish fails. Errors are logged: the scheduler's pass brings back any
/// leg this misses.
pub(crate) async fn publish_next_of_key(ctx: &Context, key: &hookinbox::LegKey) {
    let next = match ctx.pool.get().await {
        Ok(client) => deliveries::next_of_key(&client, &ctx.policy, key).await,
        Err(e) => Err(DbError::from(e)),
    };
    publish_next(ctx, next).await;
}

/// After a leg of a destination with fair legs waiting ended: publishes
/// its installation's oldest waiting leg, if any (see
/// `deliveries::next_fair`).
pub(crate) async fn publish_next_fair(ctx: &Context, key: &hookinbox::LegKey) {
    // Runs after every leg of an unordered destination: no allocation and
    // no statement unless the destination is known to have legs waiting.
    let waiting = ctx.fair_waiting.read().is_ok_and(|known| {
        known.iter().any(|(source, destination)| {
            source == key.source.as_str() && destination == key.destination.as_str()
        })
    });
    if !waiting {
        return;
    }
    // The destination stays known until the scheduler's next pass finds
    // no legs waiting: this installation having none says nothing of the
    // others'.
    let next = match ctx.pool.get().await {
        Ok(client) => deliveries::next_fair(&client, &ctx.policy, key).await,
        Err(e) => Err(DbError::from(e)),
    };
    publish_next(ctx, next).await;
}

/// Publishes the leg [`publish_next_of_key`] or [`publish_next_fair`]
/// moved to `processing`, putting it back as due if the publish fails.
async fn publish_next(
    ctx: &Context,
    next: Result<Option<Result<deliveries::Republish, deliveries::Unreadable>>, DbError>,
) {
    let parked = match next {
        Ok(Some(parked)) => parked,
        Ok(None) => return,
        Err(error) => {
            tracing::debug!(%error, "next leg of the key not published; the scheduler will");
            return;
        }
    };
    let parked = match parked {
        Ok(parked) => parked,
        Err(unreadable) => {
            dead_letter_unreadable(ctx, &unreadable).await;
            return;
        }
    };
    let job = &parked.envelope;
    if let Err(error) = ctx.publisher.publish(job).await {
        let error = error.to_string();
        tracing::warn!(delivery_id = %job.key.delivery_id, %error, "next leg's publish failed; due again shortly");
        if let Ok(client) = ctx.pool.get().await {
            let _ =
                deliveries::reschedule(&client, &job.key, job.token, REPUBLISH_PAUSE, &error).await;
        }
    }
}
