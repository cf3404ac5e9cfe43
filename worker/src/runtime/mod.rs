//! The consume loop: a worker attaches to the queue of each of its
//! destinations (its lanes, see `lanes`) on a channel of its own, hands
//! each message to its own task (see `job`), reconnects when the broker
//! goes away, and stops in two stages on shutdown.

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::Pool;
use futures::StreamExt;
use hookinbox::config::WorkerConfig;
use hookinbox::deliveries::group_commit::{
    self, AttemptLogBatcher, CompletionBatcher, FetchBatcher, TakeBatcher,
};
use hookinbox::deliveries::{self, ErrorClass, Swept};
use hookinbox::metrics::{Readiness, Ready};
use hookinbox::postgres::{self, BatchShape};
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::context::{Context, RuntimeError};
use crate::handlers::Handler;
use crate::{maintenance, reconcile};

mod acks;
mod breaker;
mod dead_letter;
mod drain;
mod fused;
mod heartbeat;
mod job;
mod lanes;
mod wait;

pub use drain::DrainReport;
use heartbeat::reconnect_backoff;

/// Each connection's channels (one per lane) and their ack collectors:
/// the acks of jobs still running go through those channels, and dropping
/// a channel closes it.
type Lanes = Vec<(lapin::Channel, tokio::task::JoinHandle<()>)>;

/// The work beside the jobs, and what stops it.
struct Background {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Background {
    /// Stops it and waits for each task.
    async fn stop(self) {
        self.stop.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Every job is done, so every collector has all its acks: lets them go
/// out, then closes, each channel after its connection (see
/// `broker::close`). Closing a connection returns every unacked message to
/// the queue.
async fn close(connections: Vec<(lapin::Connection, Lanes)>) {
    for (connection, lanes) in connections {
        let mut channels = Vec::with_capacity(lanes.len());
        for (channel, collector) in lanes {
            let _ = collector.await;
            channels.push(channel);
        }
        hookinbox::broker::close(connection, channels, "shutdown").await;
    }
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
    /// Its destination takes no legs now (breaker open, paused or
    /// disabled): the leg is held in Postgres, no attempt spent.
    Held,
    /// The delivery was already resolved (completed or failed) or is gone.
    Duplicate,
    /// The handler deferred it (not now, try at a time it named): due
    /// then, no attempt spent. Labelled `postponed` (`deferred` is a copy
    /// that waits for another holder's lease).
    Deferred,
    /// An earlier leg of its ordered key is open: the leg waits in
    /// Postgres, no attempt spent, until it is its key's first.
    Waiting,
    /// `skip_stale`: its payload is older than a completed leg's of its
    /// key; completed without its effect.
    Stale,
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
            Self::Held => "held",
            Self::Deferred => "postponed",
            Self::Waiting => "waiting",
            Self::Stale => "stale",
            Self::Duplicate => "duplicate",
            Self::Malformed => "malformed",
            Self::Requeued => "requeued",
            Self::Left => "left",
        }
    }
}

/// How a message reached this worker.
#[derive(Clone, Copy, Debug)]
struct Received {
    /// The broker delivered it before (a worker died or gave it back
    /// holding it).
    redelivered: bool,
    /// It came through the shared queue: a legacy leg, or a destination's
    /// probe, which never waits for its destination.
    shared: bool,
}

/// Two-stage stop: the shutdown token stops consuming; `hard` (after the
/// grace period) cancels jobs still running, which release their leases.
#[derive(Clone, Default)]
struct Stop {
    hard: CancellationToken,
    /// The shutdown token, under the consume loop (a drain has none): a
    /// leg waiting for its destination leaves at once when it fires.
    soft: Option<CancellationToken>,
}

/// A worker: one handler (the router of its destinations), one pool, a
/// consumer per destination.
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

struct Inner {
    /// Settings and connections, shared with the maintenance.
    ctx: Context,
    handler: Arc<dyn Handler>,
    /// Each destination's way through this worker, and the legacy one.
    lanes: lanes::Lanes,
    /// Group commit of completions.
    completions: CompletionBatcher,
    /// Group commit of takes.
    takes: TakeBatcher,
    /// Group commit of the one-statement path's reads of bodies.
    fetches: FetchBatcher,
    /// Group commit of the attempt log.
    attempt_log: AttemptLogBatcher,
    /// Whether the consumers are attached (for `/readyz`).
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
    /// is on), the publisher, and the registration of the configured
    /// destinations (their breakers' rows). Consuming starts with
    /// [`Worker::run`]. `handler` runs every leg: the router of the
    /// configured destinations ([`crate::from_config`]), or one handler of
    /// your own for all.
    pub async fn build(
        config: WorkerConfig,
        handler: Arc<dyn Handler>,
    ) -> Result<Self, RuntimeError> {
        let ctx = Context::build(config).await?;
        // Before anything is consumed: a destination with a breaker must
        // have its row, or the gate could not hold its legs.
        let registrations = lanes::Lanes::registrations(&ctx.config);
        if !registrations.is_empty() {
            let client = ctx.pool.get().await.map_err(postgres::DbError::from)?;
            deliveries::register(&client, &registrations).await?;
        }
        let linger = ctx.config.common.batch_linger;
        let completions = group_commit::completions(
            ctx.pool.clone(),
            BatchShape {
                max_batch: ctx.config.complete_batch,
                linger,
                observe: hookinbox::metrics::complete_batch_rows,
            },
        );
        let attempt_log = group_commit::attempt_log(
            ctx.pool.clone(),
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
        let fetches = group_commit::fetches(
            ctx.pool.clone(),
            BatchShape {
                max_batch: ctx.config.take_batch,
                linger,
                observe: hookinbox::metrics::read_batch_rows,
            },
        );
        Ok(Self {
            inner: Arc::new(Inner {
                lanes: lanes::Lanes::new(&ctx.config, &ctx.topology),
                completions,
                takes,
                fetches,
                attempt_log,
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
        let metrics = self.serve_metrics()?;
        let stop = Stop {
            hard: CancellationToken::new(),
            soft: Some(shutdown.clone()),
        };
        let mut jobs = JoinSet::new();
        let background = self.start_background();
        let connections = self.consume_until(&shutdown, &stop, &mut jobs).await;
        self.finish_jobs(&stop, &mut jobs).await;
        background.stop().await;
        close(connections).await;
        self.inner.publisher.close().await;
        metrics.await;
        Ok(())
    }

    /// Starts the metrics listener, and sets the lease gauge. Returns what
    /// stops the listener, to await at the end.
    fn serve_metrics(&self) -> Result<impl std::future::Future<Output = ()> + use<>, RuntimeError> {
        let (port, metrics_server) =
            hookinbox::metrics::serve(self.inner.config.metrics_listen, self.readiness())
                .map_err(RuntimeError::MetricsListener)?;
        let handle = metrics_server.handle();
        tokio::spawn(metrics_server);
        tracing::info!(port, "metrics listening");
        metrics::gauge!(hookinbox::metrics::LEASE_SECONDS)
            .set(self.inner.policy.lease.as_secs_f64());
        Ok(async move { handle.stop(false).await })
    }

    /// Starts the work beside the jobs: maintenance, the reconciler, and
    /// the destinations' states read every second.
    fn start_background(&self) -> Background {
        let stop = CancellationToken::new();
        let maintenance = tokio::spawn({
            let worker = self.clone();
            let stop = stop.clone();
            async move { maintenance::maintain(&worker.inner, stop).await }
        });
        // GitHub's delivery logs, read beside the jobs (nothing to do when
        // no source names a hook).
        let reconciler = tokio::spawn(reconcile::periodically(
            self.inner.pool.clone(),
            self.inner.leaders.clone(),
            self.inner.config.clone(),
            stop.clone(),
        ));
        // The destinations' states, read every second: a hint for closing
        // a breaker after a success, and the state gauge.
        let breakers = tokio::spawn({
            let worker = self.clone();
            let stop = stop.clone();
            async move {
                loop {
                    if let Err(e) = worker.read_breakers().await {
                        tracing::debug!(error = %e, "reading the destinations' states failed");
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(breaker::READ_EVERY) => {}
                    }
                }
            }
        });
        Background {
            stop,
            tasks: vec![maintenance, reconciler, breakers],
        }
    }

    /// Consumes until `shutdown`: connects (with backoff while it cannot),
    /// runs each message's job in `jobs`, and reconnects when a consumer
    /// ends. Returns every connection still open, with its lanes: the acks
    /// of jobs still running go through them.
    async fn consume_until(
        &self,
        shutdown: &CancellationToken,
        stop: &Stop,
        jobs: &mut JoinSet<JobOutcome>,
    ) -> Vec<(lapin::Connection, Lanes)> {
        let mut delays = reconnect_backoff();
        let mut connections: Vec<(lapin::Connection, Lanes)> = Vec::new();
        while !shutdown.is_cancelled() {
            let (connection, consumers) = match self.consume().await {
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
            let lanes = self.dispatch(consumers, shutdown, stop, jobs).await;
            connections.push((connection, lanes));
            // A lost connection's loop is ending: join it now. Its jobs go
            // on; their collectors are left to end with them.
            let (open, lost): (Vec<_>, Vec<_>) = connections
                .into_iter()
                .partition(|(c, _)| c.status().connected());
            connections = open;
            for (connection, lanes) in lost {
                let channels: Vec<_> = lanes.into_iter().map(|(channel, _)| channel).collect();
                hookinbox::broker::close(connection, channels, "lost").await;
            }
        }
        connections
    }

    /// Runs the jobs of one connection's consumers until `shutdown` (then
    /// cancels the consumers: in-flight jobs go on) or until a consumer
    /// ends. Returns the lanes: each channel and its ack collector.
    async fn dispatch(
        &self,
        consumers: Vec<(lapin::Channel, lapin::Consumer)>,
        shutdown: &CancellationToken,
        stop: &Stop,
        jobs: &mut JoinSet<JobOutcome>,
    ) -> Lanes {
        tracing::info!(queues = consumers.len(), "consuming");
        self.inner.consuming.store(true, Ordering::Relaxed);
        let mut acks = Vec::with_capacity(consumers.len());
        let mut collectors = Vec::with_capacity(consumers.len());
        let mut cancels = Vec::with_capacity(consumers.len());
        let mut streams = Vec::with_capacity(consumers.len());
        // The shared queue's consumer is the last: what comes through it
        // for a destination is a probe (see `Publisher::publish_probe`).
        let shared = consumers.len().saturating_sub(1);
        for (i, (channel, consumer)) in consumers.into_iter().enumerate() {
            let (lane_acks, collector) = acks::Acks::start();
            acks.push(lane_acks);
            collectors.push(collector);
            cancels.push((channel, consumer.tag()));
            // A lane whose consumer ends ends the loop too: every lane
            // reconnects together.
            streams.push(
                consumer
                    .map(move |d| (i, Some(d)))
                    .chain(futures::stream::once(async move { (i, None) }))
                    .boxed(),
            );
        }
        let mut deliveries = futures::stream::select_all(streams);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    // Stop taking new messages; in-flight ones go on.
                    for (channel, tag) in &cancels {
                        let _ = channel.basic_cancel(tag.as_str(), BasicCancelOptions::default()).await;
                    }
                    break;
                }
                next = deliveries.next() => match next {
                    Some((i, Some(Ok(delivery)))) => {
                        let worker = self.clone();
                        let stop = stop.clone();
                        // Known unsettled before its job can start, so
                        // no later tag's `multiple` ack covers it.
                        acks[i].received(delivery.delivery_tag);
                        let settle = acks::Settle::Collected {
                            tag: delivery.delivery_tag,
                            acker: delivery.acker,
                            acks: acks[i].clone(),
                        };
                        jobs.spawn(async move {
                            let received = Received {
                                redelivered: delivery.redelivered,
                                shared: i == shared,
                            };
                            worker.process(delivery.properties, delivery.data, received, settle, &stop).await
                        });
                    }
                    Some((_, Some(Err(e)))) => {
                        tracing::warn!(error = %e, "consumer failed; reconnecting");
                        break;
                    }
                    Some((_, None)) | None => {
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
        // the deliveries resolved. A collector ends once its jobs have
        // dropped their handles too, which is why the shutdown can await
        // it.
        drop(acks);
        drop(deliveries);
        cancels
            .into_iter()
            .map(|(channel, _)| channel)
            .zip(collectors)
            .collect()
    }

    /// Lets the jobs in flight finish within the shutdown grace, then
    /// releases the rest (the second stage of the stop).
    async fn finish_jobs(&self, stop: &Stop, jobs: &mut JoinSet<JobOutcome>) {
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
    }

    /// Connects and attaches a consumer to each lane's queue, each on a
    /// channel of its own: a lane's prefetch is its destination's
    /// concurrency, so a destination that holds its messages (slow, or
    /// waiting on Postgres) holds only its own.
    async fn consume(
        &self,
    ) -> Result<(lapin::Connection, Vec<(lapin::Channel, lapin::Consumer)>), RuntimeError> {
        let inner = &self.inner;
        let common = &inner.config.common;
        let connection = hookinbox::broker::connect(
            &common.amqp_url,
            "hookinbox-worker",
            common.publish_timeout,
        )
        .await?;
        let mut consumers = Vec::new();
        match self.attach(&connection, &mut consumers).await {
            Ok(()) => Ok((connection, consumers)),
            Err(e) => {
                // Closed before the error returns: a connection dropped
                // open keeps its I/O loop running.
                hookinbox::broker::close(connection, consumers, "setup failed").await;
                Err(e)
            }
        }
    }

    /// Opens a lane's channel and consumer on `connection` for each lane,
    /// in order, into `consumers`.
    async fn attach(
        &self,
        connection: &lapin::Connection,
        consumers: &mut Vec<(lapin::Channel, lapin::Consumer)>,
    ) -> Result<(), RuntimeError> {
        let inner = &self.inner;
        for (i, lane) in inner.lanes.consumed().enumerate() {
            let channel = connection.create_channel().await?;
            if i == 0 {
                inner.topology.declare(&channel).await?;
            }
            if !lane.destination.is_legacy() {
                inner
                    .topology
                    .declare_leg_queue(&channel, &lane.source, &lane.destination)
                    .await?;
            }
            // Prefetch = the lane's concurrency: the broker never hands this
            // worker more of the destination's messages than it can run.
            channel
                .basic_qos(lane.concurrency, BasicQosOptions::default())
                .await?;
            let consumer = channel
                .basic_consume(
                    &lane.queue,
                    "",
                    // Manual acks: a message is acked only after its
                    // outcome is committed in Postgres.
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            consumers.push((channel, consumer));
        }
        Ok(())
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
