//! The worker runtime: consume a job, take its claim, keep the lease, run
//! the handler, complete or fail under the token, then ack.
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
//! With Postgres down a job keeps its message unacked and waits; prefetch
//! bounds how many such messages a worker holds, so it stops consuming
//! instead of spinning on requeue.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use backon::BackoffBuilder;
use deadpool_postgres::Pool;
use futures::{FutureExt, StreamExt};
use lapin::acker::Acker;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions,
    BasicQosOptions,
};
use lapin::types::FieldTable;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, field};

use crate::broker::{self, BrokerError, DeadLetter, Job, Publisher, Topology};
use crate::config::WorkerConfig;
use crate::db::{self, DbError};
use crate::deliveries::{self, ErrorClass, ParkedBody, Policy, Status, Take};
use crate::handler::{Completion, Effect, Handler, HandlerError};
use crate::key::ClaimToken;

/// Why the runtime could not start or go on.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Postgres failed at start.
    #[error(transparent)]
    Db(#[from] DbError),
    /// RabbitMQ failed.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// A channel operation failed.
    #[error("RabbitMQ: {0}")]
    Channel(#[from] lapin::Error),
}

/// How one message ended. Every variant but `Left` and `Requeued` acked it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobOutcome {
    /// The effect ran and the delivery is completed.
    Completed,
    /// The worker's token no longer held the delivery; nothing was changed.
    Fenced,
    /// The handler failed and the delivery is failed (dead-lettered when
    /// not retryable).
    Failed {
        /// The failure's class.
        class: ErrorClass,
        /// Whether it will be retried.
        retryable: bool,
    },
    /// Attempts were exhausted before this take; dead-lettered unrun.
    Poisoned,
    /// The delivery was already resolved (completed or failed) or is gone.
    Duplicate,
    /// The message could not be read as a job; the broker dead-letters it.
    Malformed,
    /// The handler panicked; the message went back to the queue and the
    /// attempts counter will stop it eventually.
    Requeued,
    /// Left unacked (shutdown or lost channel): the broker redelivers it.
    Left,
}

impl JobOutcome {
    /// A bounded label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Fenced => "fenced",
            Self::Failed {
                retryable: true, ..
            } => "retried",
            Self::Failed {
                retryable: false, ..
            } => "dead_lettered",
            Self::Poisoned => "poisoned",
            Self::Duplicate => "duplicate",
            Self::Malformed => "malformed",
            Self::Requeued => "requeued",
            Self::Left => "left",
        }
    }
}

/// What [`Worker::drain`] did.
#[derive(Clone, Debug, Default)]
pub struct DrainReport {
    /// Outcomes in the order the messages were processed.
    pub outcomes: Vec<JobOutcome>,
}

impl DrainReport {
    /// How many messages ended with `outcome`.
    pub fn count(&self, outcome: JobOutcome) -> usize {
        self.outcomes.iter().filter(|o| **o == outcome).count()
    }
}

/// Two-stage stop: `soft` stops consuming; `hard` (after the grace period)
/// cancels jobs still running, which release their leases.
#[derive(Clone, Default)]
struct Stop {
    hard: CancellationToken,
}

/// A worker: one handler, one pool, one consumer.
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

struct Inner {
    config: WorkerConfig,
    policy: Policy,
    pool: Pool,
    handler: Arc<dyn Handler>,
    /// Publishes dead-letter copies (and, later, scheduled retries).
    publisher: Publisher,
    topology: Topology,
    /// Handler slots. A deferred copy waits without one.
    slots: Semaphore,
    /// Group commit of completions.
    completions: crate::batcher::CompletionBatcher,
    /// Group commit of takes.
    takes: crate::batcher::TakeBatcher,
    /// Whether the consumer is attached (for `/readyz`).
    consuming: std::sync::atomic::AtomicBool,
}

impl Worker {
    /// Builds the runtime: the pool (migrated when `HOOKINBOX_AUTO_MIGRATE`
    /// is on) and the publisher. Consuming starts with [`Worker::run`].
    pub async fn build(
        config: WorkerConfig,
        handler: Arc<dyn Handler>,
    ) -> Result<Self, RuntimeError> {
        let common = &config.common;
        let pool = common.db_pool()?;
        if common.auto_migrate {
            db::migrate(&pool).await?;
        }
        let topology = Topology::new(&common.queue_prefix);
        let publisher = Publisher::new(
            &common.amqp_url,
            "hookinbox-worker",
            topology.clone(),
            Duration::from_millis(common.publish_timeout_ms),
        )
        .with_window(common.publish_window);
        let completions = crate::batcher::completions(pool.clone(), config.complete_batch);
        let takes = crate::batcher::takes(pool.clone(), common.policy(), config.take_batch);
        Ok(Self {
            inner: Arc::new(Inner {
                policy: common.policy(),
                slots: Semaphore::new(usize::from(config.concurrency)),
                completions,
                takes,
                config,
                pool,
                handler,
                publisher,
                topology,
                consuming: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// The Postgres pool.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Consumes until `shutdown` is cancelled, reconnecting to RabbitMQ as
    /// needed. On shutdown it stops consuming, gives in-flight jobs the
    /// grace period, then cancels the rest: they release their leases and
    /// stay unacked, so the broker hands them to another worker at once.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), RuntimeError> {
        let ready = self.clone();
        let readiness: crate::metrics::Readiness = Arc::new(move || {
            let worker = ready.clone();
            Box::pin(async move {
                worker
                    .inner
                    .consuming
                    .load(std::sync::atomic::Ordering::Relaxed)
                    && db::ping(&worker.inner.pool).await
            })
        });
        let (port, metrics_server) =
            crate::metrics::serve(self.inner.config.metrics_listen, readiness).map_err(|e| {
                BrokerError::Unavailable(format!("cannot bind the metrics listener: {e}"))
            })?;
        let metrics_handle = metrics_server.handle();
        tokio::spawn(metrics_server);
        tracing::info!(port, "metrics listening");
        let stop = Stop::default();
        let mut jobs = JoinSet::new();
        let mut delays = reconnect_backoff();
        let maintenance_stop = CancellationToken::new();
        let maintenance = tokio::spawn({
            let worker = self.clone();
            let stop = maintenance_stop.clone();
            async move { worker.maintain(stop).await }
        });
        let mut connections = Vec::new();
        while !shutdown.is_cancelled() {
            let (connection, channel, mut consumer) = match self.consume().await {
                Ok(c) => {
                    delays = reconnect_backoff();
                    c
                }
                Err(e) => {
                    let delay = delays.next().unwrap_or(Duration::from_secs(5));
                    tracing::warn!(error = %e, retry_in = ?delay, "cannot consume; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(delay) => continue,
                    }
                }
            };
            tracing::info!(queue = %self.inner.topology.work_queue(), "consuming");
            self.inner
                .consuming
                .store(true, std::sync::atomic::Ordering::Relaxed);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => {
                        // Stop taking new messages; in-flight ones go on.
                        let tag = consumer.tag();
                        let _ = channel.basic_cancel(tag.as_str(), BasicCancelOptions::default()).await;
                        break;
                    }
                    next = consumer.next() => match next {
                        Some(Ok(delivery)) => {
                            let worker = self.clone();
                            let stop = stop.clone();
                            jobs.spawn(async move {
                                worker.process(delivery.properties, delivery.data, delivery.acker, &stop).await
                            });
                        }
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "consumer failed; reconnecting");
                            break;
                        }
                        None => {
                            tracing::warn!("consumer closed; reconnecting");
                            break;
                        }
                    },
                    Some(_) = jobs.join_next(), if !jobs.is_empty() => {}
                }
            }
            self.inner
                .consuming
                .store(false, std::sync::atomic::Ordering::Relaxed);
            // Jobs of a lost channel go on: their acks fail harmlessly and
            // the broker redelivers those messages, whose takes then find
            // the deliveries resolved.
            connections.push(connection);
            connections.retain(|c: &lapin::Connection| c.status().connected());
        }

        let grace = self.inner.config.shutdown_grace;
        let drained =
            tokio::time::timeout(grace, async { while jobs.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!(
                left = jobs.len(),
                "grace period over; releasing unfinished jobs"
            );
            stop.hard.cancel();
            while jobs.join_next().await.is_some() {}
        }
        maintenance_stop.cancel();
        let _ = maintenance.await;
        // Closing the connection returns every unacked message to the queue.
        for connection in connections {
            let _ = connection.close(200, "shutdown").await;
        }
        self.inner.publisher.close().await;
        metrics_handle.stop(false).await;
        Ok(())
    }

    async fn consume(
        &self,
    ) -> Result<(lapin::Connection, lapin::Channel, lapin::Consumer), RuntimeError> {
        let common = &self.inner.config.common;
        let connection = broker::connect(
            &common.amqp_url,
            "hookinbox-worker",
            Duration::from_millis(common.publish_timeout_ms),
        )
        .await?;
        let channel = connection.create_channel().await?;
        self.inner.topology.declare(&channel).await?;
        // Prefetch = concurrency: the broker never hands this worker more
        // unacked messages than it can run, and a worker stuck waiting for
        // Postgres holds at most that many.
        channel
            .basic_qos(self.inner.config.concurrency, BasicQosOptions::default())
            .await?;
        let consumer = channel
            .basic_consume(
                &self.inner.topology.work_queue(),
                "",
                // Manual acks: a message is acked only after its outcome is
                // committed in Postgres.
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok((connection, channel, consumer))
    }

    /// Processes messages one at a time with `basic.get` until the work
    /// queue is empty, and reports what happened to each. Tests and tools
    /// use it to drive the runtime without sleeping.
    pub async fn drain(&self) -> Result<DrainReport, RuntimeError> {
        self.drain_at_most(usize::MAX).await
    }

    /// Processes at most one message; `None` when the queue was empty.
    pub async fn drain_one(&self) -> Result<Option<JobOutcome>, RuntimeError> {
        Ok(self.drain_at_most(1).await?.outcomes.pop())
    }

    async fn drain_at_most(&self, limit: usize) -> Result<DrainReport, RuntimeError> {
        let common = &self.inner.config.common;
        let connection = broker::connect(
            &common.amqp_url,
            "hookinbox-worker-drain",
            Duration::from_millis(common.publish_timeout_ms),
        )
        .await?;
        let channel = connection.create_channel().await?;
        self.inner.topology.declare(&channel).await?;
        let stop = Stop::default();
        let mut report = DrainReport::default();
        while report.outcomes.len() < limit {
            let Some(message) = channel
                .basic_get(
                    &self.inner.topology.work_queue(),
                    BasicGetOptions::default(),
                )
                .await?
            else {
                break;
            };
            let delivery = message.delivery;
            let outcome = self
                .process(delivery.properties, delivery.data, delivery.acker, &stop)
                .await;
            report.outcomes.push(outcome);
        }
        let _ = connection.close(200, "drained").await;
        Ok(report)
    }

    /// One message, start to end.
    async fn process(
        &self,
        properties: lapin::BasicProperties,
        data: Vec<u8>,
        acker: Acker,
        stop: &Stop,
    ) -> JobOutcome {
        let job = match Job::from_message(&properties, data) {
            Ok(job) => job,
            Err(e) => {
                tracing::warn!(error = %e, "dead-lettering a malformed message");
                // requeue = false: the work queue's dead-letter exchange
                // takes it (at-least-once), so nothing is dropped.
                let _ = acker
                    .nack(BasicNackOptions {
                        requeue: false,
                        ..Default::default()
                    })
                    .await;
                return JobOutcome::Malformed;
            }
        };
        let span = tracing::info_span!(
            "delivery",
            delivery_id = %job.key.delivery_id,
            source = %job.key.source,
            hook_id = %job.key.hook_id,
            event = %job.event,
            action = job.action.as_deref().unwrap_or(""),
            attempt = field::Empty,
            outcome = field::Empty,
        );
        let outcome = self.run_job(&job, stop).instrument(span.clone()).await;
        span.record("outcome", outcome.as_str());
        let acked = match outcome {
            JobOutcome::Left => Ok(()),
            JobOutcome::Requeued => {
                acker
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..Default::default()
                    })
                    .await
            }
            // Ack after commit: every other outcome is already recorded in
            // Postgres (or needs nothing), so the message can go.
            _ => acker.ack(BasicAckOptions::default()).await,
        };
        if let Err(e) = acked {
            // The channel died; the broker redelivers the message and its
            // take finds the delivery resolved.
            tracing::debug!(parent: &span, error = %e, "ack failed");
        }
        span.in_scope(|| tracing::info!(outcome = outcome.as_str(), "job done"));
        metrics::counter!(crate::metrics::JOBS, "outcome" => outcome.as_str()).increment(1);
        outcome
    }

    async fn run_job(&self, job: &Job, stop: &Stop) -> JobOutcome {
        let inner = &self.inner;
        // The token this message presents. After a take of ours whose
        // outcome is unknown (Postgres failed), it becomes our own token so
        // that the retry takes the delivery back at once.
        let mut presented = job.token;
        let mut deferred = false;
        loop {
            if stop.hard.is_cancelled() {
                return JobOutcome::Left;
            }
            let taken = self.take(job, presented).await;
            let take = match taken {
                Ok(take) => take,
                Err(error) => {
                    tracing::warn!(%error, "Postgres unavailable; holding the message");
                    if !self.wait_for_db(stop).await {
                        return JobOutcome::Left;
                    }
                    continue;
                }
            };
            match take {
                Take::Resolved(Some(Status::Failed)) => {
                    return self.ensure_dead_letter_copy(job, stop).await;
                }
                Take::Resolved(_) => return JobOutcome::Duplicate,
                Take::Deferred { lease_left } => {
                    if !deferred {
                        deferred = true;
                        metrics::counter!(crate::metrics::JOBS, "outcome" => "deferred")
                            .increment(1);
                    }
                    // Another holder's lease is live. Wait (without a handler
                    // slot) until it resolves or expires; never run beside it.
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
                    return self.ensure_dead_letter_copy(job, stop).await;
                }
                Take::Taken {
                    token,
                    attempts,
                    takeover,
                    created_at,
                } => {
                    tracing::Span::current().record("attempt", attempts);
                    crate::kill_point!("worker.after_take");
                    if takeover {
                        tracing::info!("took over an expired lease");
                        metrics::counter!(crate::metrics::TAKEOVERS).increment(1);
                    }
                    let Ok(_slot) = inner.slots.acquire().await else {
                        return JobOutcome::Left;
                    };
                    match self.attempt(job, token, attempts, created_at, stop).await {
                        // Fenced by the reaper rather than by another
                        // worker (Postgres was out of reach past the lease):
                        // nobody holds the delivery, so this message must
                        // take it again instead of being acked away.
                        Attempt::Done(JobOutcome::Fenced) if self.is_lost(job).await => {
                            presented = token;
                        }
                        Attempt::Done(outcome) => return outcome,
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

    /// Takes the delivery of `job`: the common case rides in a batch with
    /// other messages' takes; what the batch did not take goes through the
    /// full take, which decides poison, deferred and resolved.
    async fn take(&self, job: &Job, presented: ClaimToken) -> Result<Take, String> {
        let inner = &self.inner;
        if inner.config.take_batch > 1
            && let Some(taken) = inner.takes.submit((job.key.clone(), presented)).await?
        {
            return Ok(taken);
        }
        let client = inner.pool.get().await.map_err(|e| e.to_string())?;
        deliveries::take(
            &client,
            &inner.policy,
            &job.key,
            presented,
            ParkedBody::of(job),
        )
        .await
        .map_err(|e| e.to_string())
    }

    /// Runs the handler once under `token`, with the heartbeat and the time
    /// limit, and records the result.
    async fn attempt(
        &self,
        job: &Job,
        token: ClaimToken,
        attempts: i32,
        created_at: chrono::DateTime<chrono::Utc>,
        stop: &Stop,
    ) -> Attempt {
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
        let mut effect = Effect::new(
            inner.pool.clone(),
            job.key.clone(),
            token,
            attempts,
            created_at,
        )
        .with_completions(inner.completions.clone());
        let started = std::time::Instant::now();
        let ran = {
            let handle = AssertUnwindSafe(inner.handler.handle(job, &mut effect)).catch_unwind();
            tokio::select! {
                r = tokio::time::timeout(inner.config.handler_timeout, handle) => match r {
                    Ok(Ok(result)) => Ran::Returned(result),
                    Ok(Err(_panic)) => Ran::Panicked,
                    Err(_) => Ran::TimedOut,
                },
                _ = lost.cancelled() => Ran::LeaseLost,
                _ = stop.hard.cancelled() => Ran::Shutdown,
            }
        };
        heartbeat.abort();
        metrics::histogram!(crate::metrics::JOB_SECONDS).record(started.elapsed());

        let failure = match ran {
            Ran::Returned(Ok(())) => {
                // A completion may wait on a lock or a full batch past the
                // grace period. It is then left to Postgres: whichever way
                // the statement ends, the token fences every later write,
                // and the unacked message goes to another worker, whose take
                // finds the delivery completed or takes it over once this
                // statement has let go of the row.
                let completed = tokio::select! {
                    completed = effect.complete() => completed,
                    _ = stop.hard.cancelled() => return Attempt::Done(JobOutcome::Left),
                };
                return match completed {
                    Ok(Completion::Completed) => {
                        crate::kill_point!("worker.after_commit");
                        let e2e = chrono::Utc::now() - created_at;
                        tracing::debug!(e2e_ms = e2e.num_milliseconds(), "completed");
                        metrics::histogram!(crate::metrics::END_TO_END_SECONDS)
                            .record(e2e.to_std().unwrap_or_default());
                        Attempt::Done(JobOutcome::Completed)
                    }
                    Ok(Completion::Fenced) => {
                        tracing::warn!("completion fenced: another worker holds the delivery");
                        Attempt::Done(JobOutcome::Fenced)
                    }
                    // Unknown whether the commit landed: take again; the take
                    // finds it completed, or ours to run again.
                    Err(e) => {
                        tracing::warn!(error = %e, "completion failed");
                        Attempt::RetryTake
                    }
                };
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
                inner.config.retry.decide_class(
                    ErrorClass::Timeout,
                    format!("handler ran past {:?}", inner.config.handler_timeout),
                    None,
                    attempts,
                )
            }
            Ran::Returned(Err(error)) => {
                effect.rollback().await;
                drop(effect);
                inner.config.retry.decide(&error, attempts)
            }
        };
        tracing::warn!(
            class = failure.class.as_str(),
            retry_in_ms = failure.retry_in.map(|d| d.as_millis() as u64),
            "handler failed"
        );
        let recorded = match inner.pool.get().await {
            Ok(client) => {
                deliveries::fail(&client, &job.key, token, &failure, ParkedBody::of(job)).await
            }
            Err(e) => Err(DbError::from(e)),
        };
        match recorded {
            Ok(None) => Attempt::Done(JobOutcome::Fenced),
            Ok(Some(_)) if failure.retry_in.is_some() => Attempt::Done(JobOutcome::Failed {
                class: failure.class,
                retryable: true,
            }),
            Ok(Some(_)) => match self.ensure_dead_letter_copy(job, stop).await {
                JobOutcome::Left => Attempt::Done(JobOutcome::Left),
                _ => Attempt::Done(JobOutcome::Failed {
                    class: failure.class,
                    retryable: false,
                }),
            },
            Err(e) => {
                tracing::warn!(error = %e, "recording the failure failed");
                Attempt::RetryTake
            }
        }
    }

    /// For a delivery failed for good: makes sure its dead-letter copy is in
    /// the broker, then reports it. The steps are ordered so that a crash
    /// between any two loses nothing: the failure is committed first (the
    /// record), the copy is published with a confirm, then the row notes the
    /// copy; a crash before that note republishes the copy (harmless).
    async fn ensure_dead_letter_copy(&self, job: &Job, stop: &Stop) -> JobOutcome {
        let inner = &self.inner;
        let mut delays = reconnect_backoff();
        loop {
            let row = match inner.pool.get().await {
                Ok(client) => deliveries::get(&client, &job.key).await,
                Err(e) => Err(DbError::from(e)),
            };
            let row = match row {
                Ok(Some(row)) => row,
                Ok(None) => return JobOutcome::Duplicate,
                Err(_) => {
                    if !self.wait_for_db(stop).await {
                        return JobOutcome::Left;
                    }
                    continue;
                }
            };
            let class = row
                .last_error_class
                .as_deref()
                .map(class_from_str)
                .unwrap_or(ErrorClass::Permanent);
            if row.status != Status::Failed || row.retryable || row.dead_lettered {
                return if class == ErrorClass::Poison {
                    JobOutcome::Poisoned
                } else {
                    JobOutcome::Duplicate
                };
            }
            let dead = DeadLetter {
                class,
                attempts: row.attempts,
                first_failed_at: row
                    .first_failed_at
                    .or(row.failed_at)
                    .unwrap_or(row.created_at),
                last_failed_at: row.failed_at.unwrap_or(row.created_at),
            };
            match inner.publisher.publish_dead_letter(job, &dead).await {
                Ok(()) => {
                    if let Ok(client) = inner.pool.get().await {
                        let _ = deliveries::mark_dead_lettered(&client, &job.key).await;
                    }
                    return if class == ErrorClass::Poison {
                        JobOutcome::Poisoned
                    } else {
                        JobOutcome::Failed {
                            class,
                            retryable: false,
                        }
                    };
                }
                Err(e) => {
                    let delay = delays.next().unwrap_or(Duration::from_secs(5));
                    tracing::warn!(error = %e, retry_in = ?delay, "dead-letter copy not confirmed; retrying");
                    tokio::select! {
                        _ = stop.hard.cancelled() => return JobOutcome::Left,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// One pass of the retry scheduler: dead-letters due retries that used
    /// every attempt, moves due retries back to `processing` under new
    /// tokens and publishes each from its parked body, all confirms in
    /// flight at once. A publish that fails puts its row back as due,
    /// token-guarded. Also writes dead-letter copies that a crash left
    /// unwritten. Returns how many retries it published.
    pub async fn schedule_once(&self) -> Result<usize, RuntimeError> {
        let inner = &self.inner;
        let client = inner.pool.get().await.map_err(DbError::from)?;
        deliveries::exhaust_due(&client, &inner.policy, SCHEDULE_BATCH).await?;
        let due = deliveries::schedule_due(&client, &inner.policy, SCHEDULE_BATCH).await?;
        let orphans = deliveries::needing_copy(&client, COPY_GRACE, SCHEDULE_BATCH).await?;
        drop(client);

        let publishes = due.into_iter().map(|parked| async move {
            let key = parked.key.clone();
            let token = parked.token;
            let result = match Job::from_parked(parked) {
                Ok(job) => inner.publisher.publish(&job).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(error) = &result {
                tracing::warn!(delivery_id = %key.delivery_id, %error, "retry publish failed; due again shortly");
                if let Ok(client) = inner.pool.get().await {
                    let _ = deliveries::reschedule(&client, &key, token, REPUBLISH_PAUSE, error).await;
                }
            }
            result.is_ok()
        });
        let published = futures::future::join_all(publishes)
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count();
        metrics::counter!(crate::metrics::RETRIES_PUBLISHED).increment(published as u64);

        for parked in orphans {
            let attempts = parked.attempts;
            let Ok(job) = Job::from_parked(parked) else {
                continue;
            };
            let row = match inner.pool.get().await {
                Ok(client) => deliveries::get(&client, &job.key).await,
                Err(e) => Err(DbError::from(e)),
            };
            let Ok(Some(row)) = row else { continue };
            let failed_at = row.failed_at.unwrap_or(row.created_at);
            let dead = DeadLetter {
                class: row
                    .last_error_class
                    .as_deref()
                    .map(class_from_str)
                    .unwrap_or(ErrorClass::Permanent),
                attempts,
                first_failed_at: row.first_failed_at.unwrap_or(failed_at),
                last_failed_at: failed_at,
            };
            if inner
                .publisher
                .publish_dead_letter(&job, &dead)
                .await
                .is_ok()
                && let Ok(client) = inner.pool.get().await
            {
                let _ = deliveries::mark_dead_lettered(&client, &job.key).await;
            }
        }
        Ok(published)
    }

    /// One pass of the reaper (see [`deliveries::reap`]). Returns how many
    /// claims it turned into `lost`.
    pub async fn reap_once(&self) -> Result<u64, RuntimeError> {
        let client = self.inner.pool.get().await.map_err(DbError::from)?;
        let mut total = 0;
        loop {
            let n = deliveries::reap(&client, self.inner.config.reap_after, SWEEP_BATCH).await?;
            total += n;
            metrics::counter!(crate::metrics::REAPED).increment(n);
            if n < SWEEP_BATCH as u64 {
                return Ok(total);
            }
        }
    }

    /// One retention sweep, if this worker wins the leader lock; `None`
    /// when another worker is sweeping.
    pub async fn sweep_once(&self) -> Result<Option<deliveries::Swept>, RuntimeError> {
        sweep(&self.inner.pool, &self.inner.config).await
    }

    /// The scheduler, reaper and sweeper, until `stop` is cancelled.
    async fn maintain(&self, stop: CancellationToken) {
        let mut sampler = Sampler::default();
        let mut last_sample = tokio::time::Instant::now() - SAMPLE_EVERY;
        let mut last_reap = tokio::time::Instant::now() - REAP_EVERY;
        let mut last_sweep = tokio::time::Instant::now() - SWEEP_EVERY;
        loop {
            if let Err(e) = self.schedule_once().await {
                tracing::warn!(error = %e, "retry scheduler pass failed");
            }
            if last_sample.elapsed() >= SAMPLE_EVERY {
                last_sample = tokio::time::Instant::now();
                if let Err(e) = sampler.sample(self).await {
                    tracing::debug!(error = %e, "state sampling failed");
                }
            }
            if last_reap.elapsed() >= REAP_EVERY {
                last_reap = tokio::time::Instant::now();
                match self.reap_once().await {
                    Ok(0) => {}
                    Ok(n) => tracing::warn!(reaped = n, "abandoned claims marked lost"),
                    Err(e) => tracing::warn!(error = %e, "reaper pass failed"),
                }
            }
            if last_sweep.elapsed() >= SWEEP_EVERY {
                last_sweep = tokio::time::Instant::now();
                match self.sweep_once().await {
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
                _ = tokio::time::sleep(self.inner.config.scheduler_interval) => {}
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
            Ok(Some(row)) if row.status == Status::Failed && row.last_error_class.as_deref() == Some("lost")
        )
    }

    /// Waits until Postgres answers. False when the worker is stopping.
    async fn wait_for_db(&self, stop: &Stop) -> bool {
        let mut delays = reconnect_backoff();
        loop {
            if db::ping(&self.inner.pool).await {
                return true;
            }
            let delay = delays.next().unwrap_or(Duration::from_secs(5));
            tokio::select! {
                _ = stop.hard.cancelled() => return false,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }
}

/// How often the leader samples the state gauges.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// Arbitrary constant naming the sampler's leader lock.
const SAMPLER_LOCK: i64 = 0x686f_6f6b_7361_6d70; // "hooksamp"

/// Samples the state gauges from Postgres and the broker. One worker at a
/// time does it: the one holding the sampler's advisory lock, kept on its
/// own connection for as long as it lives, so that the gauges come from
/// one place and a dead leader's lock dies with its connection.
#[derive(Default)]
struct Sampler {
    leader: Option<deadpool_postgres::Object>,
}

const SAMPLE_STATE: &str = "
select count(*) filter (where status = 'processing'),
       (select count(*) from deliveries where status = 'completed'),
       count(*) filter (where status = 'failed' and retryable),
       count(*) filter (where status = 'failed' and not retryable),
       coalesce(extract(epoch from now() - min(claimed_at) filter (where status = 'processing')), 0)::float8,
       coalesce(extract(epoch from now() - min(next_attempt_at)
           filter (where status = 'failed' and retryable and next_attempt_at <= now())), 0)::float8
from deliveries
where status in ('processing', 'failed')";

impl Sampler {
    async fn sample(&mut self, worker: &Worker) -> Result<(), RuntimeError> {
        let inner = &worker.inner;
        if self.leader.is_none() {
            let client = inner.pool.get().await.map_err(DbError::from)?;
            let won: bool = client
                .query_one("select pg_try_advisory_lock($1)", &[&SAMPLER_LOCK])
                .await
                .map_err(DbError::from)?
                .get(0);
            if won {
                // Keep this session out of the pool: it holds the lock.
                self.leader = Some(client);
            } else {
                metrics::gauge!(crate::metrics::SAMPLER_LEADER).set(0.0);
                return Ok(());
            }
        }
        let Some(client) = self.leader.as_ref() else {
            return Ok(());
        };
        let row = match client.query_one(SAMPLE_STATE, &[]).await {
            Ok(row) => row,
            Err(e) => {
                // Close this session rather than return it to the pool: if
                // it is still alive it holds the lock, and a pooled
                // connection holding it would block every sampler for good.
                if let Some(client) = self.leader.take() {
                    drop(deadpool_postgres::Object::take(client));
                }
                metrics::gauge!(crate::metrics::SAMPLER_LEADER).set(0.0);
                return Err(DbError::from(e).into());
            }
        };
        metrics::gauge!(crate::metrics::SAMPLER_LEADER).set(1.0);
        for (i, state) in ["processing", "completed", "retrying", "dead"]
            .iter()
            .enumerate()
        {
            metrics::gauge!(crate::metrics::DELIVERIES, "state" => *state)
                .set(row.get::<_, i64>(i) as f64);
        }
        metrics::gauge!(crate::metrics::OLDEST_PROCESSING_SECONDS).set(row.get::<_, f64>(4));
        metrics::gauge!(crate::metrics::OLDEST_DUE_RETRY_SECONDS).set(row.get::<_, f64>(5));
        for (label, queue) in [
            ("work", inner.topology.work_queue()),
            ("dlq", inner.topology.dead_letter_queue()),
        ] {
            if let Ok((messages, consumers)) = inner.publisher.queue_stats(&queue).await {
                metrics::gauge!(crate::metrics::QUEUE_MESSAGES, "queue" => label)
                    .set(f64::from(messages));
                metrics::gauge!(crate::metrics::QUEUE_CONSUMERS, "queue" => label)
                    .set(f64::from(consumers));
            }
        }
        Ok(())
    }
}

/// Rows per scheduler or reaper statement.
const SCHEDULE_BATCH: i64 = 100;
/// Rows per retention or reaper delete.
const SWEEP_BATCH: i64 = 500;
/// How long a failed retry publish waits before it is due again.
const REPUBLISH_PAUSE: Duration = Duration::from_secs(1);
/// A dead letter without a confirmed copy this long is given one.
const COPY_GRACE: Duration = Duration::from_secs(60);
/// How often the reaper runs.
const REAP_EVERY: Duration = Duration::from_secs(30);
/// How often the retention sweeper runs.
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// Arbitrary constant naming the retention sweeper's leader lock.
const SWEEP_LOCK: i64 = 0x686f_6f6b_7377_6570; // "hooksweep"

/// One retention sweep under the leader lock: a session advisory lock,
/// taken without waiting, so that one worker at a time sweeps and a dead
/// leader's lock dies with its connection. `None` when another holds it.
pub async fn sweep(
    pool: &Pool,
    config: &WorkerConfig,
) -> Result<Option<deliveries::Swept>, RuntimeError> {
    let client = pool.get().await.map_err(DbError::from)?;
    let leader: bool = client
        .query_one("select pg_try_advisory_lock($1)", &[&SWEEP_LOCK])
        .await
        .map_err(DbError::from)?
        .get(0);
    if !leader {
        return Ok(None);
    }
    let swept = deliveries::sweep(
        &client,
        config.retention_completed,
        config.retention_failed,
        SWEEP_BATCH,
    )
    .await;
    let _ = client
        .execute("select pg_advisory_unlock($1)", &[&SWEEP_LOCK])
        .await;
    Ok(Some(swept?))
}

fn class_from_str(s: &str) -> ErrorClass {
    match s {
        "transient" => ErrorClass::Transient,
        "timeout" => ErrorClass::Timeout,
        "db" => ErrorClass::Db,
        "poison" => ErrorClass::Poison,
        "lost" => ErrorClass::Lost,
        "max_attempts" => ErrorClass::MaxAttempts,
        "publish" => ErrorClass::Publish,
        _ => ErrorClass::Permanent,
    }
}

enum Ran {
    Returned(Result<(), HandlerError>),
    Panicked,
    TimedOut,
    LeaseLost,
    Shutdown,
}

enum Attempt {
    Done(JobOutcome),
    /// Postgres failed while recording the outcome: take again.
    RetryTake,
}

/// Delays for reconnecting and for waiting on Postgres: exponential with
/// jitter, capped at 5 s, never giving up.
fn reconnect_backoff() -> impl Iterator<Item = Duration> {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times()
        .build()
}

/// Renews the lease about every third of it until aborted. If a renewal
/// finds the token gone, it cancels `lost`, which cancels the handler.
async fn heartbeat(
    pool: Pool,
    policy: Policy,
    key: crate::key::DeliveryKey,
    token: ClaimToken,
    lost: CancellationToken,
) {
    let period = (policy.lease / 3).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(period).await;
        let renewed = match pool.get().await {
            Ok(client) => deliveries::renew(&client, &policy, &key, token).await,
            Err(e) => Err(DbError::from(e)),
        };
        match renewed {
            Ok(true) => {
                tracing::trace!("lease renewed");
                metrics::counter!(crate::metrics::LEASE_RENEWALS).increment(1);
            }
            Ok(false) => {
                metrics::counter!(crate::metrics::LEASES_LOST).increment(1);
                tracing::warn!("lease lost: the token no longer holds the delivery");
                lost.cancel();
                return;
            }
            // Keep trying: completion is guarded by the token alone, so a
            // lapsed lease that nobody took over still lets us finish.
            Err(e) => tracing::warn!(error = %e, "lease renewal failed"),
        }
    }
}
