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
pub(crate) use scheduler::schedule_once;

/// How often the leader samples the state gauges.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// How often the reaper runs.
const REAP_EVERY: Duration = Duration::from_secs(30);
/// How often the retention sweeper runs.
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// The scheduler, sampler, reaper and sweeper, until `stop` is cancelled.
pub(crate) async fn maintain(ctx: &Context, stop: CancellationToken) {
    let mut sampler = sampler::Sampler::default();
    let mut last_sample = Instant::now() - SAMPLE_EVERY;
    let mut last_reap = Instant::now() - REAP_EVERY;
    let mut last_sweep = Instant::now() - SWEEP_EVERY;
    loop {
        if let Err(e) = schedule_once(ctx).await {
            tracing::warn!(error = %e, "retry scheduler pass failed");
        }
        if last_sample.elapsed() >= SAMPLE_EVERY {
            last_sample = Instant::now();
            if let Err(e) = sampler.sample(ctx).await {
                tracing::debug!(error = %e, "state sampling failed");
            }
        }
        if last_reap.elapsed() >= REAP_EVERY {
            last_reap = Instant::now();
            match reap_once(ctx).await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(reaped = n, "abandoned claims marked lost"),
                Err(e) => tracing::warn!(error = %e, "reaper pass failed"),
            }
        }
        if last_sweep.elapsed() >= SWEEP_EVERY {
            last_sweep = Instant::now();
            match sweep(&ctx.pool, &ctx.config).await {
                Ok(Some(swept)) => tracing::info!(
                    completed = swept.completed,
                    failed = swept.failed,
                    "retention sweep"
                ),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "retention sweep failed"),
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(ctx.config.scheduler_interval) => {}
        }
    }
}
