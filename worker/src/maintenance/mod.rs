//! The work every worker does beside its jobs, on its own cadence: the
//! retry scheduler (every `HOOKINBOX_SCHEDULER_INTERVAL_MS`), the state
//! sampler, the reaper and the retention sweep. The scheduler's `skip
//! locked` lets every worker run it at once; the sampler and the sweep run
//! on one worker at a time, under leader locks.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::context::Context;

mod retention;
mod sampler;
mod scheduler;

pub(crate) use retention::{reap_once, sweep};
pub(crate) use scheduler::{publish_next_fair, publish_next_of_key, schedule_once};

/// How often the leader samples the state gauges.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// How often the reaper runs.
const REAP_EVERY: Duration = Duration::from_secs(30);
/// How often the retention sweeper runs.
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// When each periodic task last ran.
struct Clocks {
    sampler: sampler::Sampler,
    last_sample: Instant,
    last_reap: Instant,
    last_sweep: Instant,
}

/// The scheduler, sampler, reaper and sweeper, until `stop` is cancelled.
pub(crate) async fn maintain(ctx: &Context, stop: CancellationToken) {
    let mut clocks = Clocks {
        sampler: sampler::Sampler::default(),
        last_sample: Instant::now() - SAMPLE_EVERY,
        last_reap: Instant::now() - REAP_EVERY,
        last_sweep: Instant::now() - SWEEP_EVERY,
    };
    loop {
        // A pass can wait in Postgres for as long as a lock is held (a
        // sweep behind an operator's lock on github_events, say): shutdown
        // does not wait for it. Each statement is atomic and every pass is
        // redone by the next one, so dropping it midway loses nothing; a
        // leader lock held by its connection ends with the process.
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = pass(ctx, &mut clocks) => {}
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(ctx.config.scheduler_interval) => {}
        }
    }
}

/// One round: the scheduler, and whatever else is due.
async fn pass(ctx: &Context, clocks: &mut Clocks) {
    if let Err(e) = schedule_once(ctx).await {
        tracing::warn!(error = %e, "retry scheduler pass failed");
    }
    if clocks.last_sample.elapsed() >= SAMPLE_EVERY {
        clocks.last_sample = Instant::now();
        if let Err(e) = clocks.sampler.sample(ctx).await {
            tracing::debug!(error = %e, "state sampling failed");
        }
    }
    if clocks.last_reap.elapsed() >= REAP_EVERY {
        clocks.last_reap = Instant::now();
        match reap_once(ctx).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(reaped = n, "abandoned claims marked lost"),
            Err(e) => tracing::warn!(error = %e, "reaper pass failed"),
        }
    }
    if clocks.last_sweep.elapsed() >= SWEEP_EVERY {
        clocks.last_sweep = Instant::now();
        match sweep(&ctx.leaders, &ctx.config).await {
            Ok(Some(swept)) => tracing::info!(
                completed = swept.completed,
                failed = swept.failed,
                seen_bodies = swept.seen_bodies,
                events = swept.events,
                attempts = swept.attempts,
                partitions_dropped = swept.partitions,
                partitions_created = swept.created,
                "retention sweep"
            ),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "retention sweep failed"),
        }
    }
}
