//! The consume loop: a worker attaches to the work queue, hands each
//! message to its own task (see `job`), reconnects when the broker goes
//! away, and stops in two stages on shutdown.

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::Pool;
use futures::StreamExt;
use hookinbox::config::WorkerConfig;
use hookinbox::deliveries::group_commit::{self, CompletionBatcher, TakeBatcher};
use hookinbox::deliveries::{ErrorClass, Swept};
use hookinbox::metrics::{Readiness, Ready};
use hookinbox::postgres::{self, BatchShape};
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::context::{Context, RuntimeError};
use crate::handlers::Handler;
use crate::{maintenance, reconcile};

mod acks;
mod dead_letter;
mod drain;
mod fused;
mod heartbeat;
mod job;

pub use drain::DrainReport;
use heartbeat::reconnect_backoff;

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

/// Two-stage stop: the shutdown token stops consuming; `hard` (after the
/// grace period) cancels jobs still running, which release their leases.
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
    /// Settings and connections, shared with the maintenance.
    ctx: Context,
    handler: Arc<dyn Handler>,
    /// Handler slots. A deferred copy waits without one.
    slots: Semaphore,
    /// Group commit of completions.
    completions: CompletionBatcher,
    /// Group commit of takes.
    takes: TakeBatcher,
    /// Whether the consumer is attached (for `/readyz`).
    consuming: AtomicBool,
}

impl Deref for Inner {
    type Target = Context;

    fn deref(&self) -> &Context {
        &self.ctx
    }
}

impl Worker {
    /// Builds the runtime: the pool (migrated when `HOOKINBOX_AUTO_MIGRATE`
    /// is on) and the publisher. Consuming starts with [`Worker::run`].
    pub async fn build(
        config: WorkerConfig,
        handler: Arc<dyn Handler>,
    ) -> Result<Self, RuntimeError> {
        let ctx = Context::build(config).await?;
        let linger = ctx.config.common.batch_linger;
        let completions = group_commit::completions(
            ctx.pool.clone(),
            ctx.policy,
            BatchShape {
                max_batch: ctx.config.complete_batch,
                linger,
                observe: hookinbox::metrics::complete_batch_rows,
            },
        );
        let takes = group_commit::takes(
            ctx.pool.clone(),
            ctx.policy,
            BatchShape {
                max_batch: ctx.config.take_batch,
                linger,
                observe: hookinbox::metrics::take_batch_rows,
            },
        );
        Ok(Self {
            inner: Arc::new(Inner {
                slots: Semaphore::new(usize::from(ctx.config.concurrency)),
                completions,
                takes,
                handler,
                consuming: AtomicBool::new(false),
                ctx,
            }),
        })
    }

    /// The Postgres pool.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// A worker is ready while it consumes and Postgres answers.
    fn readiness(&self) -> Readiness {
        let worker = self.clone();
        Arc::new(move || {
            let worker = worker.clone();
            Box::pin(async move {
                let consuming = worker.inner.consuming.load(Ordering::Relaxed);
                let postgres = postgres::ping(&worker.inner.pool).await;
                Ready {
                    ok: consuming && postgres,
                    checks: vec![("consuming", consuming), ("postgres", postgres)],
                }
            })
        })
    }

    /// Consumes until `shutdown` is cancelled, reconnecting to RabbitMQ as
    /// needed. On shutdown it stops consuming, gives in-flight jobs the
    /// grace period, then cancels the rest: they release their leases and
    /// stay unacked, so the broker hands them to another worker at once.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), RuntimeError> {
        let (port, metrics_server) =
            hookinbox::metrics::serve(self.inner.config.metrics_listen, self.readiness())
                .map_err(RuntimeError::MetricsListener)?;
        let metrics_handle = metrics_server.handle();
        tokio::spawn(metrics_server);
        tracing::info!(port, "metrics listening");
        metrics::gauge!(hookinbox::metrics::LEASE_SECONDS)
            .set(self.inner.policy.lease.as_secs_f64());
        let stop = Stop::default();
        let mut jobs = JoinSet::new();
        let mut delays = reconnect_backoff();
        let maintenance_stop = CancellationToken::new();
        let maintenance = tokio::spawn({
            let worker = self.clone();
            let stop = maintenance_stop.clone();
            async move { maintenance::maintain(&worker.inner, stop).await }
        });
        // GitHub's delivery logs, read beside the jobs (nothing to do when
        // no source names a hook).
        let reconciler = tokio::spawn(reconcile::periodically(
            self.inner.pool.clone(),
            self.inner.leaders.clone(),
            self.inner.config.clone(),
            maintenance_stop.clone(),
        ));
        // Each connection with its channel and its ack collector: the acks
        // of jobs still running go through that channel, and dropping it
        // closes it.
        let mut connections: Vec<(
            lapin::Connection,
            lapin::Channel,
            tokio::task::JoinHandle<()>,
        )> = Vec::new();
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
            self.inner.consuming.store(true, Ordering::Relaxed);
            let (acks, collector) = acks::Acks::start();
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
                            // Known unsettled before its job can start, so
                            // no later tag's `multiple` ack covers it.
                            acks.received(delivery.delivery_tag);
                            let settle = acks::Settle::Collected {
                                tag: delivery.delivery_tag,
                                acker: delivery.acker,
                                acks: acks.clone(),
                            };
                            jobs.spawn(async move {
                                worker.process(delivery.properties, delivery.data, delivery.redelivered, settle, &stop).await
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
            self.inner.consuming.store(false, Ordering::Relaxed);
            // Jobs of a lost channel go on: their acks fail harmlessly and
            // the broker redelivers those messages, whose takes then find
            // the deliveries resolved. The collector ends once its jobs
            // have dropped their handles too, which is why the shutdown
            // below can await it.
            drop(acks);
            connections.push((connection, channel, collector));
            connections.retain(|(c, _, _)| c.status().connected());
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
        let _ = reconciler.await;
        // Every job is done, so every collector has all its acks: let them
        // go out, then close. Closing the connection returns every unacked
        // message to the queue.
        for (connection, _channel, collector) in connections {
            let _ = collector.await;
            let _ = connection.close(200, "shutdown").await;
        }
        self.inner.publisher.close().await;
        metrics_handle.stop(false).await;
        Ok(())
    }

    async fn consume(
        &self,
    ) -> Result<(lapin::Connection, lapin::Channel, lapin::Consumer), RuntimeError> {
        let (connection, channel) = self.open_channel("hookinbox-worker").await?;
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

    /// Connects to the broker and declares the topology on a new channel.
    async fn open_channel(
        &self,
        name: &str,
    ) -> Result<(lapin::Connection, lapin::Channel), RuntimeError> {
        let common = &self.inner.config.common;
        Ok(hookinbox::broker::open_channel(
            &common.amqp_url,
            name,
            common.publish_timeout,
            &self.inner.topology,
        )
        .await?)
    }

    /// One pass of the retry scheduler (see `maintenance::scheduler`).
    /// Returns how many retries it published.
    pub async fn schedule_once(&self) -> Result<usize, RuntimeError> {
        maintenance::schedule_once(&self.inner).await
    }

    /// One pass of the reaper. Returns how many claims it turned `lost`.
    pub async fn reap_once(&self) -> Result<u64, RuntimeError> {
        maintenance::reap_once(&self.inner).await
    }

    /// One retention sweep, if this worker wins the leader lock; `None`
    /// when another worker is sweeping.
    pub async fn sweep_once(&self) -> Result<Option<Swept>, RuntimeError> {
        maintenance::sweep(&self.inner.pool, &self.inner.config).await
    }
}
