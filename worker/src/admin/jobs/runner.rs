//! Runs bulk jobs in the background, one item at a time at the job's
//! rate. Each item is one transaction: hold the job (renew the runner's
//! lease and lock the job's row, so a cancel waits for this item and no
//! item starts after it), apply the item's compare-and-set, record its
//! result. A replay is published after that commit; if the publish fails
//! the delivery goes back among the dead letters (token-guarded) and the
//! item says `failed`. A runner that dies leaves its job to another once
//! its lease expires.

use std::time::Duration;

use actix_web::web;
use hookinbox::LegKey;
use hookinbox::broker::Publisher;
use hookinbox::deliveries::{self, Replayed};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::store::{self, Kind};
use crate::admin::audit;
use crate::admin::state::State;
use crate::ops::reconcile_dead_letter_queue;

/// How often an idle runner looks for jobs whose runner died.
const IDLE_POLL: Duration = Duration::from_secs(2);

/// Starts the runner: it takes every running job nobody holds and runs
/// each in a task of its own (a long, slow job never holds back a replay of
/// one); it stops when `stop` is cancelled. The task it returns ends once
/// every job's task has stopped and closed its broker connection.
pub(crate) fn spawn(state: web::Data<State>, stop: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let runner = Uuid::new_v4();
        let mut jobs = JoinSet::new();
        loop {
            let woken = state.wake_runner.notified();
            loop {
                match take(&state, runner).await {
                    Ok(Some((id, kind, per_second))) => {
                        let (state, stop) = (state.clone(), stop.clone());
                        jobs.spawn(async move {
                            run(&state, runner, id, kind, per_second, &stop).await;
                        });
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "admin job runner cannot reach Postgres");
                        break;
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = woken => {}
                _ = tokio::time::sleep(IDLE_POLL) => {}
            }
            // Reap the jobs that ended.
            while jobs.try_join_next().is_some() {}
        }
        while jobs.join_next().await.is_some() {}
    })
}

async fn take(
    state: &State,
    runner: Uuid,
) -> Result<Option<(i64, Kind, f64)>, hookinbox::postgres::DbError> {
    let client = state.pool.get().await?;
    store::take(&client, runner).await
}

/// Why a job stopped before its end.
#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error(transparent)]
    Db(#[from] hookinbox::postgres::DbError),
}

impl From<tokio_postgres::Error> for RunError {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Db(e.into())
    }
}

impl From<deadpool_postgres::PoolError> for RunError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        Self::Db(e.into())
    }
}

/// What one item came to.
enum Step {
    /// Done; a replay's job to publish, if any.
    Did(Option<Box<deliveries::Parked>>, i32),
    /// No item left: the job is finished.
    Finished,
    /// The job was cancelled or taken over.
    Stopped,
}

async fn step(state: &State, runner: Uuid, id: i64, kind: Kind) -> Result<Step, RunError> {
    let mut client = state.pool.get().await?;
    let tx = client.transaction().await?;
    if !store::hold(&tx, id, runner).await? {
        return Ok(Step::Stopped);
    }
    let Some((position, parts)) = store::next_item(&tx, id).await? else {
        store::finish(&tx, id).await?;
        tx.commit().await?;
        return Ok(Step::Finished);
    };
    let [p, s, h, d, n] = &parts;
    let Ok(key) = LegKey::from_parts(p, s, h, d, n) else {
        store::done(
            &tx,
            id,
            position,
            "failed",
            Some("the key no longer parses"),
        )
        .await?;
        tx.commit().await?;
        return Ok(Step::Did(None, position));
    };
    let published = match kind {
        Kind::Purge => {
            let purged = deliveries::purge(&tx, &key).await?;
            store::done(
                &tx,
                id,
                position,
                if purged { "purged" } else { "skipped" },
                None,
            )
            .await?;
            None
        }
        // The compare-and-set decides: a delivery replayed meanwhile (or
        // no longer failed) is skipped, never started twice.
        Kind::Replay => match deliveries::replay(&tx, &state.worker.common.policy(), &key).await? {
            Replayed::NotFailed => {
                store::done(&tx, id, position, "skipped", None).await?;
                None
            }
            // Only GitHub has its body: the item says so, and what to do.
            Replayed::NoBody => {
                store::done(
                    &tx,
                    id,
                    position,
                    "failed",
                    Some(deliveries::NO_BODY_TO_REPLAY),
                )
                .await?;
                None
            }
            Replayed::Unreadable(unreadable) => {
                deliveries::dead_letter_unreadable(&tx, &unreadable).await?;
                store::done(&tx, id, position, "failed", Some(&unreadable.reason)).await?;
                None
            }
            Replayed::Started(parked) => {
                store::done(&tx, id, position, "replayed", None).await?;
                Some(parked)
            }
        },
    };
    tx.commit().await?;
    Ok(Step::Did(published, position))
}

async fn run(
    state: &State,
    runner: Uuid,
    id: i64,
    kind: Kind,
    per_second: f64,
    stop: &CancellationToken,
) {
    tracing::info!(
        job_id = id,
        kind = kind.as_str(),
        per_second,
        "admin job running"
    );
    let publisher = state.worker.common.publisher("hookinbox-admin");
    let ran = run_items(state, runner, id, kind, per_second, stop, &publisher).await;
    // Closed however the job stopped (see `broker::close`).
    publisher.close().await;
    if let Err(e) = ran {
        // Its hold lapses; this runner (or another) takes it up again.
        tracing::warn!(job_id = id, error = %e, "admin job interrupted; it resumes once its hold lapses");
    }
}

async fn run_items(
    state: &State,
    runner: Uuid,
    id: i64,
    kind: Kind,
    per_second: f64,
    stop: &CancellationToken,
    publisher: &Publisher,
) -> Result<(), RunError> {
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut changed = false;
    let ended = loop {
        tokio::select! {
            _ = stop.cancelled() => break None,
            _ = ticker.tick() => {}
        }
        let stepped = match step(state, runner, id, kind).await {
            Ok(stepped) => stepped,
            Err(e) => {
                // A blip (Postgres restarting): the item's transaction rolled
                // back; try again at the next tick.
                tracing::warn!(job_id = id, error = %e, "admin job step failed; retrying");
                continue;
            }
        };
        match stepped {
            Step::Stopped | Step::Finished => break Some(()),
            Step::Did(None, _) => changed |= kind == Kind::Purge,
            Step::Did(Some(parked), position) => {
                changed = true;
                let token = parked.job.token;
                if let Err(e) = publisher.publish(&parked.job).await {
                    let error = e.to_string();
                    let client = state.pool.get().await?;
                    deliveries::unreplay(&client, &parked.job.key, token, &error).await?;
                    store::done(&client, id, position, "failed", Some(&error)).await?;
                }
            }
        }
    };
    let client = state.pool.get().await?;
    let Some(job) = store::get(&client, id).await? else {
        return Ok(());
    };
    // Still running: another runner took it over (this one's lease ran
    // out), or this process is stopping.
    if ended.is_none() || job.status == "running" {
        return Ok(());
    }
    if changed && let Err(e) = reconcile_dead_letter_queue(&state.pool, &state.worker).await {
        tracing::warn!(job_id = id, error = %e, "could not bring the dead-letter queue in step");
    }
    audit::job_ended(&client, id, &super::summary(&job)).await?;
    Ok(())
}
