//! One job, start to end: decode the message (the leg's key and token),
//! take the delivery (which reads its body), run the handler under the
//! lease, complete or fail under the token, then ack.
//!
//! The order of a job's steps is the whole correctness argument:
//!
//! 1. **Take** (one compare-and-set) installs this worker's token and counts
//!    the attempt *before* the effect, so a job that crashes its worker every
//!    time is stopped by `max_attempts`.
//! 2. **Heartbeat** renews the lease about every third of it; a renewal that
//!    finds the token gone cancels the handler.
//! 3. **Fence before effect**: a database effect runs in a transaction that
//!    first locks the row under the token ([`Effect::transaction`]), or (the
//!    built-in `store`) is staged and written by the completing statement
//!    itself, only for a row its token still holds
//!    ([`deliveries::complete_batch`]).
//! 4. **Complete in the same transaction** as the effect, guarded by the
//!    token: a stale worker's write changes nothing and its effect rolls
//!    back (*fenced*). Completions without a transaction of their own are
//!    batched across jobs (group commit), each row fenced by its own token.
//! 5. **Ack after commit**: a crash before the ack redelivers the message,
//!    whose take then finds the delivery completed and acks it.
//!
//! A job whose handler writes only to Postgres, on its message's first
//! delivery, first tries the one-statement path (`fused`): it reads the
//! body, and its completion is its take. Whatever that path does not
//! finish comes here, to step 1.
//!
//! With Postgres down a job keeps its message unacked and waits; prefetch
//! bounds how many such messages a worker holds, so it stops consuming
//! instead of spinning on requeue.

use std::panic::AssertUnwindSafe;
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use hookinbox::deliveries::{self, Deferral, ErrorClass, Failure, Status, Stored, Take};
use hookinbox::job::{Envelope, Job};
use hookinbox::key::ClaimToken;
use hookinbox::postgres::DbError;
use hookinbox::telemetry::{SpanTrace, step};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, field};

use super::acks::Settle;
use super::breaker::Attempted;
use super::heartbeat::heartbeat;
use super::lanes::Lane;
use super::wait::Waited;
use super::{JobOutcome, Received, Stop, Worker};
use crate::handlers::{Completion, Effect, HandlerError};

/// How often a job that has not ended says so, with the step it is at.
const STILL_RUNNING_EVERY: Duration = Duration::from_secs(60);

/// Notes the step the current job is at (its span's `step`), for the
/// "job still running" warning.
pub(super) fn at(step: &'static str) {
    tracing::Span::current().record("step", step);
}

/// How a handler run ended.
pub(super) enum Ran {
    /// The handler returned this.
    Returned(Result<(), HandlerError>),
    /// It panicked; caught, nothing of it committed.
    Panicked,
    /// It ran past `handler_timeout` and was cancelled.
    TimedOut,
    /// The heartbeat lost the lease; it was cancelled (fenced).
    LeaseLost,
    /// The worker is stopping hard; it was cancelled.
    Shutdown,
}

/// What a take gave a job to attempt.
struct Taken {
    token: ClaimToken,
    attempts: i32,
    created_at: chrono::DateTime<chrono::Utc>,
    probe: bool,
}

/// What one attempt left to do.
enum Attempt {
    Done(JobOutcome),
    /// Postgres failed while recording the outcome: take again.
    RetryTake,
}

impl Worker {
    /// One message, start to end.
    pub(super) async fn process(
        &self,
        properties: lapin::BasicProperties,
        data: Vec<u8>,
        received: Received,
        settle: Settle,
        stop: &Stop,
    ) -> JobOutcome {
        let envelope = match hookinbox::broker::decode(&properties, data) {
            Ok(job) => job,
            Err(e) => {
                tracing::warn!(error = %e, "dead-lettering a malformed message");
                // requeue = false: the work queue's dead-letter exchange
                // takes it (at-least-once), so nothing is dropped.
                let _ = settle.nack(false).await;
                return JobOutcome::Malformed;
            }
        };
        let span = tracing::info_span!(
            "delivery",
            delivery_id = %envelope.key.delivery_id,
            source = %envelope.key.source,
            destination = %envelope.key.destination,
            hook_id = %envelope.key.hook_id,
            event = %envelope.event,
            action = envelope.action.as_deref().unwrap_or(""),
            attempt = field::Empty,
            outcome = field::Empty,
            step = field::Empty,
            otel.name = "worker.job",
            otel.kind = "consumer",
            trace_id = field::Empty,
            span_id = field::Empty,
        );
        // A job ingest published continues its request's trace; a job
        // published again (a retry, a probe, a replay) starts a trace of
        // its own, linked to the delivery's first. Nothing when traces are
        // off.
        if let Some(parent) = &envelope.trace.parent {
            span.continue_from(parent);
        } else if let Some(origin) = &envelope.trace.origin {
            span.link_to(origin);
        }
        span.record_ids();
        // Which messages reached this worker, and when (for a search after
        // a lost message; off unless debug logging is on).
        tracing::debug!(parent: &span, redelivered = received.redelivered, "message received");
        let started = std::time::Instant::now();
        // A job waits without end only by mistake (the waits it may make,
        // for its destination, for Postgres, for another holder's lease,
        // are each bounded or end with the stop): one that has not ended
        // says so every minute, with the step it is at, so that a message
        // held unacked by a stuck job is found.
        let run = self
            .run_job(&envelope, received, stop)
            .instrument(span.clone());
        tokio::pin!(run);
        let mut still = tokio::time::interval_at(
            tokio::time::Instant::now() + STILL_RUNNING_EVERY,
            STILL_RUNNING_EVERY,
        );
        let outcome = loop {
            tokio::select! {
                outcome = &mut run => break outcome,
                _ = still.tick() => tracing::warn!(
                    parent: &span,
                    running_s = started.elapsed().as_secs(),
                    "job still running"
                ),
            }
        };
        span.record("outcome", outcome.as_str());
        let acked = match outcome {
            JobOutcome::Left => Ok(()),
            JobOutcome::Requeued => settle.nack(true).await,
            // Ack after commit: every other outcome is already recorded in
            // Postgres (or needs nothing), so the message can go.
            _ => settle.ack().await,
        };
        if let Err(e) = acked {
            // The channel died; the broker redelivers the message and its
            // take finds the delivery resolved.
            tracing::debug!(parent: &span, error = %e, "ack failed");
        }
        span.in_scope(|| {
            tracing::info!(
                outcome = outcome.as_str(),
                duration_ms = started.elapsed().as_secs_f64() * 1000.0,
                "job done"
            )
        });
        metrics::counter!(hookinbox::metrics::JOBS, "outcome" => outcome.as_str()).increment(1);
        outcome
    }

    async fn run_job(&self, envelope: &Envelope, received: Received, stop: &Stop) -> JobOutcome {
        let inner = &self.inner;
        let lane = inner.lanes.of(&envelope.key);
        // Before anything is written: while its destination takes no legs,
        // the leg waits unacked and the broker keeps the ones behind it. A
        // probe (through the shared queue) goes on to its take, which lets
        // only the probe through.
        at("destination_wait");
        if !received.shared && self.wait_for_destination(lane, stop).await == Waited::Leave {
            return JobOutcome::Left;
        }
        // A message from before bodies lived in Postgres: its body goes
        // there first, so that whatever the leg comes to (held, waiting,
        // retried, dead) keeps it once this message is acked.
        if let Some(carried) = &envelope.carried {
            at("keep_carried");
            loop {
                let kept = match inner.pool.get().await {
                    Ok(client) => {
                        deliveries::bodies::keep_carried(&client, &envelope.key, carried).await
                    }
                    Err(e) => Err(DbError::from(e)),
                };
                match kept {
                    Ok(()) => break,
                    Err(error) => {
                        tracing::warn!(%error, "Postgres unavailable; holding the message");
                        if !self.wait_for_db(stop).await {
                            return JobOutcome::Left;
                        }
                    }
                }
            }
        }
        // A redelivered message may be the one that crashed a worker: it
        // goes the full way, whose take counts the attempt before the
        // handler runs, so a job that crashes every worker is stopped by
        // `max_attempts`.
        at("fused");
        if !received.redelivered
            && let Some(outcome) = self.fused(envelope, stop).await
        {
            at("release");
            if lane.fair {
                crate::maintenance::publish_next_fair(&inner.ctx, &envelope.key).await;
            }
            return outcome;
        }
        // The destination's pace, before the take: waiting for it is not
        // an attempt.
        at("pace");
        tokio::select! {
            _ = lane.pace() => {}
            _ = stop.hard.cancelled() => return JobOutcome::Left,
        }
        // The token this message presents. After a take of ours whose
        // outcome is unknown (Postgres failed), it becomes our own token so
        // that the retry takes the delivery back at once.
        let mut presented = envelope.token;
        let mut deferred = false;
        loop {
            if stop.hard.is_cancelled() {
                return JobOutcome::Left;
            }
            at("take");
            let taken = self
                .take(envelope, lane, presented)
                .instrument(step("worker.take"))
                .await;
            let take = match taken {
                Ok(take) => take,
                Err(error) => {
                    tracing::warn!(%error, "Postgres unavailable; holding the message");
                    at("db_wait");
                    if !self.wait_for_db(stop).await {
                        return JobOutcome::Left;
                    }
                    continue;
                }
            };
            match take {
                Take::Resolved(Some(Status::Failed)) => {
                    return self.ensure_dead_letter_copy(envelope, stop).await;
                }
                Take::Resolved(_) => return JobOutcome::Duplicate,
                Take::Deferred { lease_left } => {
                    if !deferred {
                        deferred = true;
                        metrics::counter!(hookinbox::metrics::JOBS, "outcome" => "deferred")
                            .increment(1);
                    }
                    // Another holder's lease is live. Wait (without a handler
                    // slot) until it resolves or expires; never run beside it.
                    at("deferred_wait");
                    let wait = lease_left
                        .min(inner.policy.lease / 3)
                        .max(Duration::from_millis(50));
                    tokio::select! {
                        _ = stop.hard.cancelled() => return JobOutcome::Left,
                        _ = tokio::time::sleep(wait) => continue,
                    }
                }
                Take::Poisoned { .. } => {
                    tracing::warn!("attempts exhausted; dead-lettering as poison");
                    return self.ensure_dead_letter_copy(envelope, stop).await;
                }
                Take::Held => {
                    tracing::info!("destination not taking legs now; held");
                    return JobOutcome::Held;
                }
                Take::Waiting => {
                    if lane.fair {
                        tracing::debug!("its installation has its share in flight; waiting");
                        if let Ok(mut known) = inner.ctx.fair_waiting.write() {
                            known.insert((
                                envelope.key.source.as_str().to_owned(),
                                envelope.key.destination.as_str().to_owned(),
                            ));
                        }
                    } else {
                        tracing::debug!("an earlier leg of its key is open; waiting");
                    }
                    return JobOutcome::Waiting;
                }
                Take::Taken {
                    token,
                    attempts,
                    takeover,
                    created_at,
                    probe,
                    waited,
                    replays,
                    body,
                } => {
                    // The job: its message's key with the body the take
                    // read (or, for a message from before bodies lived in
                    // Postgres, the body it carries).
                    let job = match job_of(envelope, body, replays) {
                        Ok(job) => job,
                        Err(failure) => {
                            return self.unrunnable(envelope, token, failure, stop).await;
                        }
                    };
                    let job = &job;
                    if let Some(waited) = waited.filter(|_| !takeover) {
                        metrics::histogram!(
                            hookinbox::metrics::ORDERING_WAIT_SECONDS,
                            "source" => job.key.source.as_str().to_owned(),
                            "destination" => job.key.destination.as_str().to_owned(),
                        )
                        .record(waited.as_secs_f64());
                    }
                    tracing::Span::current().record("attempt", attempts);
                    hookinbox::kill_point!("worker.after_take");
                    if takeover {
                        tracing::info!("took over an expired lease");
                        metrics::counter!(hookinbox::metrics::TAKEOVERS).increment(1);
                    }
                    if probe {
                        tracing::info!("probing the destination with this leg");
                    }
                    // Before the effect: the take made this leg its key's
                    // first open one, so every earlier leg of the key has
                    // ended and the comparison is final. A probe runs: the
                    // breaker waits for its answer.
                    if lane.skip_stale && !probe {
                        at("stale_check");
                        match self.complete_if_stale(job, token).await {
                            Ok(false) => {}
                            Ok(true) => {
                                metrics::counter!(
                                    hookinbox::metrics::LEGS_STALE,
                                    "source" => job.key.source.as_str().to_owned(),
                                    "destination" => job.key.destination.as_str().to_owned(),
                                )
                                .increment(1);
                                tracing::info!(
                                    "older than a completed event of its key; completed without its effect"
                                );
                                crate::maintenance::publish_next_of_key(&inner.ctx, &job.key).await;
                                return JobOutcome::Stale;
                            }
                            // No answer: whether it completed as stale is
                            // unknown, so the effect may not run. Take again
                            // with our token: the take finds it completed,
                            // or ours to check again.
                            Err(error) => {
                                tracing::warn!(%error, "staleness not checked; taking the leg again");
                                presented = token;
                                if !self.wait_for_db(stop).await {
                                    return JobOutcome::Left;
                                }
                                continue;
                            }
                        }
                    }
                    at("slot");
                    let Ok(slot) = lane.slots.acquire().await else {
                        return JobOutcome::Left;
                    };
                    at("attempt");
                    let taken = Taken {
                        token,
                        attempts,
                        created_at,
                        probe,
                    };
                    match self.attempt(job, lane, taken, stop).await {
                        // Fenced by the reaper rather than by another
                        // worker (Postgres was out of reach past the lease):
                        // nobody holds the delivery, so this message must
                        // take it again instead of being acked away.
                        Attempt::Done(JobOutcome::Fenced) if self.is_lost(job).await => {
                            presented = token;
                        }
                        Attempt::Done(outcome) => {
                            at("release");
                            // Its key's next leg, if it waited, goes now
                            // rather than at the scheduler's next pass; the
                            // handler slot is free again meanwhile.
                            drop(slot);
                            if lane.ordered && outcome == JobOutcome::Completed {
                                crate::maintenance::publish_next_of_key(&inner.ctx, &job.key).await;
                            }
                            // Its installation's next waiting leg takes the
                            // turn this one leaves, however it ended.
                            if lane.fair {
                                crate::maintenance::publish_next_fair(&inner.ctx, &job.key).await;
                            }
                            return outcome;
                        }
                        Attempt::RetryTake => {
                            presented = token;
                            if !self.wait_for_db(stop).await {
                                return JobOutcome::Left;
                            }
                        }
                    }
                }
            }
        }
    }

    /// Takes the leg of `job`: the common case rides in a batch with other
    /// messages' takes; what the batch did not take goes through the full
    /// take, which decides poison, held, deferred and resolved.
    async fn take(
        &self,
        job: &Envelope,
        lane: &Lane,
        presented: ClaimToken,
    ) -> Result<Take, DbError> {
        let inner = &self.inner;
        if inner.config.take_batch > 1
            && let Some(taken) = inner
                .takes
                .submit(deliveries::Taking {
                    key: job.key.clone(),
                    presented,
                    max_attempts: lane.max_attempts(),
                })
                .await?
        {
            return Ok(taken);
        }
        let client = inner.pool.get().await?;
        deliveries::take(
            &client,
            &inner.policy,
            &job.key,
            presented,
            lane.max_attempts(),
        )
        .await
    }

    /// `skip_stale`: completes the leg without its effect when it is older
    /// than a completed leg of its key; `Ok(true)` when it did.
    async fn complete_if_stale(&self, job: &Job, token: ClaimToken) -> Result<bool, DbError> {
        match self.inner.pool.get().await {
            Ok(client) => deliveries::complete_stale(&client, &job.key, token).await,
            Err(e) => Err(DbError::from(e)),
        }
    }

    /// Runs the handler once under the take's token, with the heartbeat and
    /// the time limit, tells the destination's log and breaker how it went,
    /// and records the result.
    async fn attempt(&self, job: &Job, lane: &Lane, taken: Taken, stop: &Stop) -> Attempt {
        let Taken {
            token,
            attempts,
            created_at,
            probe,
        } = taken;
        let inner = &self.inner;
        let lost = CancellationToken::new();
        // Aborted on drop too: if this attempt's future is dropped (the
        // worker is torn down), the lease must stop being renewed.
        let heartbeat = AbortOnDropHandle::new(tokio::spawn(heartbeat(
            inner.pool.clone(),
            inner.policy,
            job.key.clone(),
            token,
            lost.clone(),
        )));
        let mut effect = Effect::new(inner.pool.clone(), job.key.clone(), token, attempts)
            .with_completions(inner.completions.clone());
        let started = std::time::Instant::now();
        let ran = self
            .run_handler(job, &mut effect, &lost, stop)
            .instrument(step("worker.handler"))
            .await;
        heartbeat.abort();
        // The destination's log and breaker hear of every attempt that
        // reached an end of its own, before the leg's failure is recorded
        // (see `breaker`).
        let timed_out = HandlerError::transient(format!(
            "handler ran past {:?}",
            inner.config.handler_timeout
        ));
        let outcome = match &ran {
            Ran::Returned(Ok(())) => Some(Ok(())),
            Ran::Returned(Err(HandlerError::Fenced)) => None,
            Ran::Returned(Err(e)) => Some(Err(e)),
            Ran::TimedOut => Some(Err(&timed_out)),
            Ran::Panicked | Ran::LeaseLost | Ran::Shutdown => None,
        };
        if let Some(outcome) = outcome {
            let attempted = Attempted {
                job,
                attempt: attempts,
                probe,
                started,
                answer: effect.answer(),
            };
            self.after_attempt(lane, attempted, outcome).await;
        }

        let failure = match ran {
            Ran::Returned(Ok(())) => {
                // A completion may wait on a lock or a full batch past the
                // grace period. It is then left to Postgres: whichever way
                // the statement ends, the token fences every later write,
                // and the unacked message goes to another worker, whose take
                // finds the delivery completed or takes it over once this
                // statement has let go of the row.
                let completed = tokio::select! {
                    completed = effect.complete().instrument(step("worker.complete")) => completed,
                    _ = stop.hard.cancelled() => return Attempt::Done(JobOutcome::Left),
                };
                match completed {
                    Ok(Completion::Completed { .. }) => {
                        hookinbox::kill_point!("worker.after_commit");
                        completed_since(created_at);
                        return Attempt::Done(JobOutcome::Completed);
                    }
                    Ok(Completion::Fenced) => {
                        tracing::warn!("completion fenced: another worker holds the delivery");
                        return Attempt::Done(JobOutcome::Fenced);
                    }
                    // Postgres refused the completion, so nothing committed.
                    // A row it can never take (a data or constraint error:
                    // a payload jsonb cannot hold) is dead-lettered at once,
                    // naming the cause; any other refusal is retried with
                    // backoff like a failed effect.
                    Ok(Completion::Refused(refusal)) => {
                        tracing::warn!(error = %refusal, "Postgres refused the completion");
                        let class = if refusal.is_row_level() {
                            ErrorClass::Permanent
                        } else {
                            ErrorClass::Db
                        };
                        lane.retries
                            .decide(class, refusal.to_string(), None, attempts)
                    }
                    // No answer: whether the commit landed is unknown. Take
                    // again; the take finds it completed, or ours to run
                    // again.
                    Err(e) => {
                        tracing::warn!(error = %e, "completion got no answer");
                        return Attempt::RetryTake;
                    }
                }
            }
            Ran::Returned(Err(HandlerError::Fenced)) | Ran::LeaseLost => {
                drop(effect);
                tracing::warn!("fenced: the claim was taken over; effect rolled back");
                return Attempt::Done(JobOutcome::Fenced);
            }
            Ran::Shutdown => {
                drop(effect);
                // Before the effect committed: end the lease so that the
                // redelivered message is taken at once elsewhere.
                if let Ok(client) = inner.pool.get().await {
                    let _ = deliveries::release_lease(&client, &job.key, token).await;
                }
                return Attempt::Done(JobOutcome::Left);
            }
            Ran::Panicked => {
                drop(effect);
                tracing::error!("handler panicked; requeueing (attempts bound the retries)");
                if let Ok(client) = inner.pool.get().await {
                    let _ = deliveries::release_lease(&client, &job.key, token).await;
                }
                return Attempt::Done(JobOutcome::Requeued);
            }
            Ran::TimedOut => {
                drop(effect);
                lane.retries
                    .decide(ErrorClass::Timeout, timed_out.to_string(), None, attempts)
            }
            Ran::Returned(Err(HandlerError::Defer { message, until })) => {
                effect.rollback().await;
                drop(effect);
                return self.deferred(job, lane, token, &message, until, stop).await;
            }
            Ran::Returned(Err(error)) => {
                effect.rollback().await;
                drop(effect);
                error.failure(&lane.retries, attempts, lane.breaker.is_some())
            }
        };
        tracing::warn!(
            class = failure.class.as_str(),
            retry_in_ms = failure.retry_in.map(|d| d.as_millis() as u64),
            "handler failed"
        );
        let recorded = async {
            match inner.pool.get().await {
                Ok(client) => deliveries::fail(&client, &job.key, token, &failure).await,
                Err(e) => Err(DbError::from(e)),
            }
        }
        .instrument(step("worker.fail"))
        .await;
        match recorded {
            Ok(None) => Attempt::Done(JobOutcome::Fenced),
            // The destination itself failed: the leg waits for it, its
            // attempt given back.
            Ok(Some(_)) if failure.class == ErrorClass::Held => Attempt::Done(JobOutcome::Held),
            Ok(Some(_)) if failure.retry_in.is_some() => Attempt::Done(JobOutcome::Failed {
                class: failure.class,
                retryable: true,
            }),
            Ok(Some(_)) => self.dead_lettered(job, failure.class, stop).await,
            Err(e) => {
                tracing::warn!(error = %e, "recording the failure failed");
                Attempt::RetryTake
            }
        }
    }

    /// After a leg failed for good under `class`: its dead-letter copy.
    async fn dead_lettered(&self, job: &Job, class: ErrorClass, stop: &Stop) -> Attempt {
        match self.ensure_dead_letter_copy(&job.envelope(), stop).await {
            JobOutcome::Left => Attempt::Done(JobOutcome::Left),
            _ => Attempt::Done(JobOutcome::Failed {
                class,
                retryable: false,
            }),
        }
    }

    /// Records a handler's deferral: the leg due at `until` with its
    /// attempt given back, or, past the destination's retry horizon, failed
    /// for good and dead-lettered.
    async fn deferred(
        &self,
        job: &Job,
        lane: &Lane,
        token: ClaimToken,
        message: &str,
        until: SystemTime,
        stop: &Stop,
    ) -> Attempt {
        let horizon = lane.retries.horizon().max(DEFER_HORIZON_AT_LEAST);
        // A time past the horizon fails the leg either way: one just past
        // it keeps the interval within what Postgres can hold.
        let delay = until
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO)
            .min(horizon + Duration::from_secs(1));
        tracing::info!(
            retry_in_ms = delay.as_millis() as u64,
            "the handler deferred the leg: no attempt spent"
        );
        let recorded = async {
            match self.inner.pool.get().await {
                Ok(client) => {
                    deliveries::defer(&client, &job.key, token, delay, horizon, message).await
                }
                Err(e) => Err(DbError::from(e)),
            }
        }
        .instrument(step("worker.defer"))
        .await;
        match recorded {
            Ok(None) => Attempt::Done(JobOutcome::Fenced),
            Ok(Some(Deferral::Due)) => Attempt::Done(JobOutcome::Deferred),
            Ok(Some(Deferral::TooLong)) => {
                tracing::warn!(
                    horizon_secs = horizon.as_secs(),
                    "deferred past the retry horizon: failed as deferred_too_long"
                );
                self.dead_lettered(job, ErrorClass::DeferredTooLong, stop)
                    .await
            }
            Err(e) => {
                tracing::warn!(error = %e, "recording the deferral failed");
                Attempt::RetryTake
            }
        }
    }

    /// Runs the handler once, with the time limit, until it returns,
    /// panics, times out, `lost` is cancelled (the lease is gone) or the
    /// hard stop comes; records how long it ran.
    pub(super) async fn run_handler(
        &self,
        job: &Job,
        effect: &mut Effect,
        lost: &CancellationToken,
        stop: &Stop,
    ) -> Ran {
        let inner = &self.inner;
        let started = std::time::Instant::now();
        let handle = AssertUnwindSafe(inner.handler.handle(job, effect)).catch_unwind();
        let ran = tokio::select! {
            r = tokio::time::timeout(inner.config.handler_timeout, handle) => match r {
                Ok(Ok(result)) => Ran::Returned(result),
                Ok(Err(_panic)) => Ran::Panicked,
                Err(_) => Ran::TimedOut,
            },
            _ = lost.cancelled() => Ran::LeaseLost,
            _ = stop.hard.cancelled() => Ran::Shutdown,
        };
        metrics::histogram!(hookinbox::metrics::JOB_SECONDS).record(started.elapsed());
        ran
    }

    /// A leg taken with no body to run it with (see [`job_of`]): records
    /// `failure` under the take's token, and dead-letters it when it is
    /// not to be retried.
    async fn unrunnable(
        &self,
        envelope: &Envelope,
        token: ClaimToken,
        failure: Failure,
        stop: &Stop,
    ) -> JobOutcome {
        tracing::warn!(class = failure.class.as_str(), error = %failure.message, "no body to run the leg with");
        let recorded = match self.inner.pool.get().await {
            Ok(client) => deliveries::fail(&client, &envelope.key, token, &failure).await,
            Err(e) => Err(DbError::from(e)),
        };
        match recorded {
            Ok(None) => JobOutcome::Fenced,
            Ok(Some(_)) if failure.retry_in.is_some() => JobOutcome::Failed {
                class: failure.class,
                retryable: true,
            },
            Ok(Some(_)) => match self.ensure_dead_letter_copy(envelope, stop).await {
                JobOutcome::Left => JobOutcome::Left,
                _ => JobOutcome::Failed {
                    class: failure.class,
                    retryable: false,
                },
            },
            // The take's lease runs out and the message comes back.
            Err(e) => {
                tracing::warn!(error = %e, "recording the missing body failed");
                JobOutcome::Left
            }
        }
    }

    /// Whether the delivery sits in `failed`, class `lost` (reaped).
    async fn is_lost(&self, job: &Job) -> bool {
        let Ok(client) = self.inner.pool.get().await else {
            return false;
        };
        matches!(
            deliveries::get(&client, &job.key).await,
            Ok(Some(row)) if row.status == Status::Failed && row.last_error_class == Some(ErrorClass::Lost)
        )
    }
}

/// The job of `envelope` with the body its take read, replayed `replays`
/// times. Postgres's body wins; a message published before bodies lived
/// in Postgres carries its own, used when Postgres holds none. A leg with
/// neither cannot run: it waits for a redelivery from GitHub, as a claim
/// reaped `lost` without a body does; a body that does not decode is a
/// dead letter.
pub(super) fn job_of(
    envelope: &Envelope,
    stored: Option<Stored>,
    replays: i32,
) -> Result<Job, Failure> {
    let body = match (stored, &envelope.carried) {
        (Some(stored), _) => stored.decode().map_err(|e| Failure {
            class: ErrorClass::Permanent,
            message: e.to_string(),
            retry_in: None,
        })?,
        (None, Some(carried)) => carried.clone(),
        (None, None) => {
            return Err(Failure {
                class: ErrorClass::Lost,
                message: "no body in Postgres nor in its message: only a redelivery from GitHub \
                          can bring it back"
                    .to_owned(),
                retry_in: Some(Duration::ZERO),
            });
        }
    };
    Ok(Job::new(envelope.clone(), body, replays))
}

/// Records a completion's end-to-end time, from ingest's first claim.
pub(super) fn completed_since(received_at: chrono::DateTime<chrono::Utc>) {
    let e2e = chrono::Utc::now() - received_at;
    tracing::debug!(e2e_ms = e2e.num_milliseconds(), "completed");
    metrics::histogram!(hookinbox::metrics::END_TO_END_SECONDS)
        .record(e2e.to_std().unwrap_or_default());
}

/// The shortest horizon a deferral is bounded by, whatever the
/// destination's retries span: GitHub's rate limits reset within the hour,
/// and a handler waiting for one must not be failed for it.
const DEFER_HORIZON_AT_LEAST: Duration = Duration::from_secs(3600 + 60);
