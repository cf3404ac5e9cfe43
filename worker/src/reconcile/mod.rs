//! The reconciler: GitHub never retries a failed delivery, so this reads
//! each configured hook's delivery log (`GET …/deliveries`) and asks GitHub
//! to redeliver (`POST …/deliveries/{id}/attempts`) every delivery that
//! GitHub saw fail and hookinbox never durably took. It runs as
//! `hookinbox-worker reconcile` (one pass), and inside workers every
//! `HOOKINBOX_RECONCILE_INTERVAL_SECS`, one worker per source at a time
//! (a leader lock).
//!
//! The loop guard: a GUID is redelivered at most
//! `HOOKINBOX_RECONCILE_MAX_REDELIVERIES` times across passes (counted in
//! Postgres before each request), never while younger than
//! `HOOKINBOX_RECONCILE_MIN_AGE_SECS`, at most
//! `HOOKINBOX_RECONCILE_PER_SECOND`; GitHub's rate limits are waited out,
//! and a 422 is recorded, never retried in a loop.

use std::time::Duration;

use deadpool_postgres::Pool;
use hookinbox::config::{ReconcileTarget, WorkerConfig};
use hookinbox::postgres::{DbError, advisory};
use hookinbox::telemetry::{self, SpanTrace};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

mod github;
mod judge;
mod pass;
mod state;

pub use github::ApiError;
pub use pass::{PassOptions, Report};

/// Why a pass did not complete.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Postgres failed.
    #[error(transparent)]
    Db(#[from] DbError),
    /// GitHub failed, or refused.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// Another worker holds the source's leader lock.
    #[error("another worker is reconciling source '{0}'")]
    Busy(String),
}

/// How often a waiting pass tries the leader lock again.
const LOCK_POLL: Duration = Duration::from_millis(250);

/// One pass over `target` under its leader lock: a session advisory lock,
/// so that one worker at a time reconciles a source and a dead leader's
/// lock dies with its connection. `wait_for_lock`: how long to wait for
/// another leader to finish (`None`: do not wait).
pub async fn run(
    pool: &Pool,
    leaders: &Pool,
    target: &ReconcileTarget,
    config: &WorkerConfig,
    options: &PassOptions,
    wait_for_lock: Option<Duration>,
) -> Result<Report, ReconcileError> {
    let source = target.source.as_str();
    let leader = leaders.get().await.map_err(DbError::from)?;
    let deadline = tokio::time::Instant::now() + wait_for_lock.unwrap_or(Duration::ZERO);
    while !advisory::try_lock_named(&leader, advisory::RECONCILE, source).await? {
        if tokio::time::Instant::now() >= deadline {
            metrics::counter!(hookinbox::metrics::RECONCILE_RUNS, "source" => source.to_owned(), "outcome" => "busy")
                .increment(1);
            return Err(ReconcileError::Busy(source.to_owned()));
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
    let span = pass_span(source, options.dry_run);
    let result = pass::pass(pool, target, config, options)
        .instrument(span.clone())
        .await;
    if advisory::unlock_named(&leader, advisory::RECONCILE, source)
        .await
        .is_err()
    {
        // Never hand a session that may still hold the lock back to the
        // pool: closing it releases the lock.
        drop(deadpool_postgres::Object::take(leader));
    }
    let outcome = match &result {
        Ok(_) if options.dry_run => "dry_run",
        Ok(_) => {
            metrics::gauge!(hookinbox::metrics::RECONCILE_LAST_SUCCESS, "source" => source.to_owned())
                .set(chrono::Utc::now().timestamp() as f64);
            "complete"
        }
        Err(e) => {
            if let Ok(client) = pool.get().await {
                let hook = target.settings.hook.to_string();
                let _ = state::failed(&client, source, &hook, &e.to_string()).await;
            }
            "incomplete"
        }
    };
    metrics::counter!(hookinbox::metrics::RECONCILE_RUNS, "source" => source.to_owned(), "outcome" => outcome)
        .increment(1);
    span.record("outcome", outcome);
    result
}

/// The span of one pass, when traces are on: the root of the trace its
/// redelivery requests (`reconcile.redeliver`) belong to. A disabled span
/// otherwise.
fn pass_span(source: &str, dry_run: bool) -> tracing::Span {
    if !telemetry::enabled() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "pass",
        otel.name = "reconcile.pass",
        source,
        dry_run,
        outcome = tracing::field::Empty,
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
    );
    span.record_ids();
    span
}

/// Says, once per source at the worker's start, that a source ingest
/// rate-limits without a reconciler loses what it refuses: GitHub does not
/// retry a failed delivery, so a `429` is final from GitHub's side unless
/// the reconciler asks GitHub to redeliver it.
fn warn_of_final_429s(config: &WorkerConfig) {
    for source in config.rate_limited_unreconciled.iter() {
        tracing::warn!(
            source = %source,
            "source '{source}' has a rate limit and no reconciler: a delivery ingest answers 429 \
             is final from GitHub's side (GitHub does not retry it); name the source's hook \
             (HOOKINBOX_RECONCILE_HOOK, or a [sources.github] table) so that the reconciler \
             brings it back"
        );
    }
}

/// Reconciles every configured source every interval until `stop`, from
/// inside a worker; passes of a source another worker leads are skipped.
pub(crate) async fn periodically(
    pool: Pool,
    leaders: Pool,
    config: WorkerConfig,
    stop: CancellationToken,
) {
    use tokio::time::Instant;
    warn_of_final_429s(&config);
    let targets = config.reconcile.clone();
    if targets.is_empty() {
        return;
    }
    // Starts the "last complete pass" clock at the worker's start, so that
    // a reconciler that never completes is alerted on too (the alert takes
    // the newest value across workers: the leader's).
    for target in targets.iter() {
        metrics::gauge!(hookinbox::metrics::RECONCILE_LAST_SUCCESS, "source" => target.source.as_str().to_owned())
            .set(chrono::Utc::now().timestamp() as f64);
    }
    // The first pass waits a little: a fleet starting together need not
    // all try the lock at once, and a worker that restarts in a loop does
    // not hammer GitHub.
    let mut due: Vec<Instant> = targets
        .iter()
        .map(|_| Instant::now() + Duration::from_secs(5))
        .collect();
    loop {
        let next = due.iter().min().copied().unwrap_or_else(Instant::now);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(next) => {}
        }
        for (i, target) in targets.iter().enumerate() {
            if Instant::now() < due[i] {
                continue;
            }
            let interval = target.settings.interval;
            due[i] = Instant::now() + interval;
            let options = PassOptions {
                dry_run: false,
                since: None,
                max_wait: interval,
                full: false,
            };
            let pass = run(&pool, &leaders, target, &config, &options, None);
            let result = tokio::select! {
                _ = stop.cancelled() => return,
                result = pass => result,
            };
            match result {
                Ok(r) => tracing::info!(
                    source = %target.source,
                    scanned = r.scanned,
                    redelivered = r.redelivered,
                    late = r.late,
                    unexplained = r.unexplained,
                    capped = r.capped,
                    "reconciler pass complete"
                ),
                Err(ReconcileError::Busy(_)) => {
                    tracing::debug!(source = %target.source, "another worker leads this source's reconciler");
                }
                Err(e) => {
                    tracing::warn!(source = %target.source, error = %e, "reconciler pass did not complete")
                }
            }
        }
    }
}
