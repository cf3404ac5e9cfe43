//! After each attempt of a leg whose destination keeps a log or has a
//! breaker: the attempt's row in the log, and the breaker's transition it
//! calls for (see `hookinbox::deliveries::destinations`).
//!
//! Order matters: the breaker moves *before* the leg's failure is recorded,
//! so that by the time a failed leg is due (a held one is due at once), its
//! destination's row already gates it.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hookinbox::deliveries::{self, AttemptLog, AttemptResult, BreakerState};
use hookinbox::job::Job;
use hookinbox::postgres::DbError;

use super::Worker;
use super::lanes::Lane;
use crate::handlers::{Answer, HandlerError};

/// How an attempt ended, for the log and the breaker.
pub(super) struct Attempted<'a> {
    /// The leg.
    pub(super) job: &'a Job,
    /// Its attempt number.
    pub(super) attempt: i32,
    /// Whether it was its destination's probe.
    pub(super) probe: bool,
    /// When it started.
    pub(super) started: Instant,
    /// What the destination answered, as the handler noted it.
    pub(super) answer: Option<&'a Answer>,
}

/// How a handler's result counts for its destination.
pub(super) fn result_of(outcome: Result<(), &HandlerError>) -> AttemptResult {
    match outcome {
        Ok(()) => AttemptResult::Ok,
        Err(HandlerError::Destination { .. }) => AttemptResult::Destination,
        Err(HandlerError::Blocked { .. }) => AttemptResult::Blocked,
        Err(HandlerError::Defer { .. }) => AttemptResult::Deferred,
        Err(HandlerError::Permanent { .. }) => AttemptResult::Permanent,
        Err(e) if !e.is_transient() => AttemptResult::Permanent,
        Err(_) => AttemptResult::Transient,
    }
}

impl Worker {
    /// Logs the attempt (when the lane keeps a log) and moves the breaker
    /// (when the lane has one). Failures here are logged and left: the
    /// log and the breaker are advice; the leg's own transition decides.
    pub(super) async fn after_attempt(
        &self,
        lane: &Lane,
        attempted: Attempted<'_>,
        outcome: Result<(), &HandlerError>,
    ) {
        let result = result_of(outcome);
        let job = attempted.job;
        metrics::counter!(
            hookinbox::metrics::DESTINATION_ATTEMPTS,
            "source" => lane.source.as_str().to_owned(),
            "destination" => lane.destination.as_str().to_owned(),
            "result" => result.as_str()
        )
        .increment(1);
        let elapsed = attempted.started.elapsed();
        metrics::histogram!(
            hookinbox::metrics::DESTINATION_REQUEST_SECONDS,
            "source" => lane.source.as_str().to_owned(),
            "destination" => lane.destination.as_str().to_owned()
        )
        .record(elapsed);
        if lane.logs_attempts {
            let log = AttemptLog {
                key: job.key.clone(),
                attempt: attempted.attempt,
                probe: attempted.probe,
                result,
                status_code: attempted.answer.and_then(|a| a.status),
                error: outcome.err().map(ToString::to_string),
                duration: elapsed,
                excerpt: attempted.answer.and_then(|a| a.excerpt.clone()),
            };
            if let Err(e) = self.inner.attempt_log.submit(log).await {
                tracing::warn!(error = %e, "the attempt could not be logged");
            }
        }
        let Some(breaker) = lane.breaker else {
            return;
        };
        if let Err(e) = self
            .move_breaker(lane, breaker, attempted.probe, result, outcome.err())
            .await
        {
            tracing::warn!(error = %e, "the destination's breaker could not be updated");
        }
    }

    async fn move_breaker(
        &self,
        lane: &Lane,
        breaker: hookinbox::config::Breaker,
        probe: bool,
        result: AttemptResult,
        error: Option<&HandlerError>,
    ) -> Result<(), DbError> {
        let inner = &self.inner;
        let (source, name) = (&lane.source, &lane.destination);
        let known = inner.lanes.state(lane);
        let note = |state| inner.lanes.note(source.as_str(), name.as_str(), state);
        match (result, error) {
            // The destination answered: it works. Close the breaker if it
            // may be open (the probe, or a leg that was in flight).
            // "Not now": neither a success nor a failure of the
            // destination (a `503` with `Retry-After` is often a
            // maintenance page), so it moves no count. A deferred probe
            // says the destination takes no work yet: open again.
            (AttemptResult::Deferred, _) => {
                if probe {
                    let client = inner.pool.get().await?;
                    self.trip(&client, lane, "the probe was deferred").await?;
                }
            }
            (AttemptResult::Ok | AttemptResult::Permanent, _) => {
                lane.failures_in_row.store(0, Ordering::Relaxed);
                if probe || known != BreakerState::Closed {
                    let client = inner.pool.get().await?;
                    if deliveries::close(&client, source, name).await? {
                        tracing::info!(source = %source, destination = %name, "breaker closed");
                        note(BreakerState::Closed);
                    }
                }
            }
            (
                _,
                Some(HandlerError::Destination {
                    gone: true,
                    message,
                    ..
                }),
            ) => {
                let client = inner.pool.get().await?;
                if deliveries::disable(&client, source, name, message).await? {
                    tracing::warn!(source = %source, destination = %name, error = %message, "destination disabled: it answered 410 Gone");
                    note(BreakerState::Disabled);
                }
            }
            // The destination itself is wrong, or its address refused:
            // open at once.
            (AttemptResult::Destination | AttemptResult::Blocked, Some(error)) => {
                let client = inner.pool.get().await?;
                self.trip(&client, lane, &error.to_string()).await?;
            }
            (_, error) => {
                let message = error.map(ToString::to_string).unwrap_or_default();
                if probe {
                    let client = inner.pool.get().await?;
                    self.trip(&client, lane, &message).await?;
                    return Ok(());
                }
                if self.in_a_row(lane, breaker, &message).await? {
                    return Ok(());
                }
                self.over_the_ratio(lane, breaker, &message).await?;
            }
        }
        Ok(())
    }

    /// Trips the breaker once this worker has seen `min_requests` failed
    /// attempts of the destination in a row, with no answer between them
    /// (the ratio over that run is 1, over any `failure_ratio`). The
    /// window's ratio alone opens late when the window still holds the
    /// successes from before an outage: a destination that went down
    /// after a minute of traffic would have every leg attempted and failed
    /// until as many failures as successes had piled up. Returns whether
    /// it tripped.
    async fn in_a_row(
        &self,
        lane: &Lane,
        breaker: hookinbox::config::Breaker,
        message: &str,
    ) -> Result<bool, DbError> {
        // Counted only while this worker knows the destination closed:
        // failures still in flight when it opened say nothing new.
        if self.inner.lanes.state(lane) != BreakerState::Closed {
            return Ok(false);
        }
        let failures = lane.failures_in_row.fetch_add(1, Ordering::Relaxed) + 1;
        // One caller trips: the one that takes the count back to 0.
        if failures < breaker.min_requests
            || lane
                .failures_in_row
                .compare_exchange(failures, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return Ok(false);
        }
        let client = self.inner.pool.get().await?;
        self.trip(
            &client,
            lane,
            &format!("{failures} attempts failed in a row; last: {message}"),
        )
        .await?;
        Ok(true)
    }

    /// Counts the breaker's window after a failure this worker logged, and
    /// trips it past the ratio.
    ///
    /// One count at a time per lane, at most one per [`COUNT_GAP`]: a
    /// destination failing every leg at hundreds a second would otherwise
    /// count its whole window once per failure, and that load on Postgres
    /// is what the other destinations would feel. A failure waits for the
    /// next count that starts after its own log row was committed, or
    /// starts it; so every failure is counted by a count that sees it, and
    /// the breaker opens at most `COUNT_GAP` later than with a count each.
    /// The connection is taken only once the count is due: one held while
    /// waiting would be one the other destinations lack.
    async fn over_the_ratio(
        &self,
        lane: &Lane,
        breaker: hookinbox::config::Breaker,
        message: &str,
    ) -> Result<(), DbError> {
        // The attempt's log row is committed by now (`after_attempt`
        // awaited it).
        let logged = Instant::now();
        let mut counted = lane.window_counted.lock().await;
        if let Some(last) = *counted {
            if last >= logged {
                return Ok(());
            }
            tokio::time::sleep_until((last + COUNT_GAP).into()).await;
        }
        let client = self.inner.pool.get().await?;
        *counted = Some(Instant::now());
        let (source, name) = (&lane.source, &lane.destination);
        let (attempts, failed) = deliveries::window(&client, source, name, breaker.window).await?;
        let ratio = if attempts > 0 {
            failed as f64 / attempts as f64
        } else {
            0.0
        };
        if attempts >= i64::from(breaker.min_requests) && ratio >= breaker.failure_ratio {
            self.trip(
                &client,
                lane,
                &format!(
                    "{failed} of {attempts} attempts failed within {:?}; last: {message}",
                    breaker.window
                ),
            )
            .await?;
        }
        Ok(())
    }

    async fn trip(
        &self,
        client: &hookinbox::postgres::Client,
        lane: &Lane,
        error: &str,
    ) -> Result<(), DbError> {
        let (source, name) = (&lane.source, &lane.destination);
        if deliveries::trip(client, source, name, error).await? {
            tracing::warn!(source = %source, destination = %name, error = %error, "breaker opened: legs wait until a probe succeeds");
            self.inner
                .lanes
                .note(source.as_str(), name.as_str(), BreakerState::Open);
        }
        Ok(())
    }

    /// Reads every destination's state into the lanes (a hint for closing
    /// the breaker after a success) and the state gauge.
    pub(super) async fn read_breakers(&self) -> Result<(), DbError> {
        let client = self.inner.pool.get().await?;
        let rows = deliveries::rows(&client).await?;
        for row in &rows {
            for state in BreakerState::ALL {
                metrics::gauge!(
                    hookinbox::metrics::DESTINATION_STATE,
                    "source" => row.source.clone(),
                    "destination" => row.name.clone(),
                    "state" => state.as_str()
                )
                .set(if state == row.state { 1.0 } else { 0.0 });
            }
        }
        self.inner.lanes.refresh(
            rows.into_iter()
                .map(|row| ((row.source, row.name), row.state)),
        );
        Ok(())
    }
}

/// The least time between two counts of one destination's window by one
/// worker (see `Worker::over_the_ratio`).
const COUNT_GAP: Duration = Duration::from_millis(100);

/// How often a worker reads the destinations' states.
pub(super) const READ_EVERY: Duration = Duration::from_secs(1);
