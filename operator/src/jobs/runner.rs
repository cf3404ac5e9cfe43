//! Runs bulk jobs, one item at a time at the job's rate: in the background
//! for the console ([`spawn`]), in the foreground for the CLI
//! ([`run_held`]). Each item is one transaction: hold the job (renew the
//! runner's lease and lock the job's row, so a cancel waits for this item
//! and no item starts after it), apply the item's compare-and-set, record
//! its result. A replay is published after that commit
//! ([`crate::replay`]); if the publish fails the delivery goes back among
//! the dead letters (token-guarded) and the item says `failed`. A runner
//! that dies leaves its job to another once its lease expires.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use hookinbox::LegKey;
use hookinbox::broker::Publisher;
use hookinbox::config::WorkerConfig;
use hookinbox::deliveries::{self, Republish};
use hookinbox::postgres::DbError;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::JobError;
use super::store::{self, Kind};
use crate::audit;
use crate::reconcile_dead_letter_queue;
use crate::replay::{self, Begun};

/// How often an idle runner looks for jobs whose runner died.
const IDLE_POLL: Duration = Duration::from_secs(2);

/// What a runner needs: the pool it records items in, and the settings it
/// publishes replays with (the broker, the queue prefix, the policy).
#[derive(Clone)]
pub struct Runner {
    /// Postgres.
    pub pool: Pool,
    /// The worker's settings.
    pub config: WorkerConfig,
    /// This runner: it holds the jobs it runs.
    pub id: Uuid,
}

impl Runner {
    /// A runner of its own id.
    pub fn new(pool: Pool, config: WorkerConfig) -> Self {
        Self {
            pool,
            config,
            id: Uuid::new_v4(),
        }
    }
}

/// Starts the background runner: it takes every running job nobody holds
/// and runs each in a task of its own (a long, slow job never holds back a
/// replay of one), woken by `wake` or every two seconds; it stops when
/// `stop` is cancelled. The task it returns ends once every job's task has
/// stopped and closed its broker connection.
pub fn spawn(
    runner: Runner,
    wake: Arc<tokio::sync::Notify>,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut jobs = JoinSet::new();
        loop {
            let woken = wake.notified();
            loop {
                match take(&runner).await {
                    Ok(Some((id, kind, per_second))) => {
                        let (runner, stop) = (runner.clone(), stop.clone());
                        jobs.spawn(async move {
                            run(&runner, id, kind, per_second, &stop).await;
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

async fn take(runner: &Runner) -> Result<Option<(i64, Kind, f64)>, DbError> {
    let client = runner.pool.get().await?;
    store::take(&client, runner.id).await
}

/// What one item came to.
enum Step {
    /// Done; a replay's job to publish, if any.
    Did(Option<Box<Republish>>, i32),
    /// No item left: the job is finished.
    Finished,
    /// The job was cancelled or taken over.
    Stopped,
}

async fn step(runner: &Runner, id: i64, kind: Kind) -> Result<Step, JobError> {
    let mut client = runner.pool.get().await?;
    let tx = client.transaction().await?;
    if !store::hold(&tx, id, runner.id).await? {
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
        Kind::Replay | Kind::ReplayAny => {
            match replay::begin(&tx, &runner.config.common.policy(), &key, kind.scope()).await? {
                Begun::Done(outcome) => {
                    store::done(&tx, id, position, outcome.result(), outcome.error()).await?;
                    None
                }
                Begun::Publish(parked) => {
                    store::done(&tx, id, position, "replayed", None).await?;
                    Some(parked)
                }
            }
        }
    };
    tx.commit().await?;
    Ok(Step::Did(published, position))
}

async fn run(runner: &Runner, id: i64, kind: Kind, per_second: f64, stop: &CancellationToken) {
    if let Err(e) = run_held(runner, id, kind, per_second, stop).await {
        // Its hold lapses; this runner (or another) takes it up again.
        tracing::warn!(job_id = id, error = %e, "admin job interrupted; it resumes once its hold lapses");
    }
}

/// Runs the job `id`, which this runner holds, item by item at
/// `per_second`, until it finishes, is cancelled, or `stop` is cancelled
/// (the job then stays running, and resumes once its hold lapses). Once
/// it has ended: the dead-letter queue is brought in step, and the job's
/// audit row says what came of it.
pub async fn run_held(
    runner: &Runner,
    id: i64,
    kind: Kind,
    per_second: f64,
    stop: &CancellationToken,
) -> Result<(), JobError> {
    tracing::info!(
        job_id = id,
        kind = kind.as_str(),
        per_second,
        "admin job running"
    );
    let publisher = runner.config.common.publisher("hookinbox-admin");
    let ran = run_items(runner, id, kind, per_second, stop, &publisher).await;
    // Closed however the job stopped (see `broker::close`).
    publisher.close().await;
    let changed = ran?;
    let job = store::get(&runner.pool.get().await?, id).await?;
    let Some(job) = job else {
        return Ok(());
    };
    // Still running: another runner took it over (this one's lease ran
    // out), or this process is stopping.
    if job.status == "running" {
        return Ok(());
    }
    if changed && let Err(e) = reconcile_dead_letter_queue(&runner.pool, &runner.config).await {
        tracing::warn!(job_id = id, error = %e, "could not bring the dead-letter queue in step");
    }
    audit::job_ended(&runner.pool.get().await?, id, &super::summary(&job)).await?;
    Ok(())
}

/// The items of the job, one a tick, until it ends or `stop`; whether any
/// changed a delivery (so that the dead-letter queue is brought in step).
async fn run_items(
    runner: &Runner,
    id: i64,
    kind: Kind,
    per_second: f64,
    stop: &CancellationToken,
    publisher: &Publisher,
) -> Result<bool, JobError> {
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut changed = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let stepped = match step(runner, id, kind).await {
            Ok(stepped) => stepped,
            Err(e) => {
                // A blip (Postgres restarting): the item's transaction rolled
                // back; try again at the next tick.
                tracing::warn!(job_id = id, error = %e, "admin job step failed; retrying");
                continue;
            }
        };
        match stepped {
            Step::Stopped | Step::Finished => break,
            Step::Did(None, _) => changed |= kind == Kind::Purge,
            Step::Did(Some(parked), position) => {
                changed = true;
                let outcome =
                    replay::publish(&runner.pool, publisher, &parked, kind.scope()).await?;
                if outcome != replay::Outcome::Started {
                    let client = runner.pool.get().await?;
                    store::done(&client, id, position, outcome.result(), outcome.error()).await?;
                }
            }
        }
    }
    Ok(changed)
}
