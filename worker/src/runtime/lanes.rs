//! Lanes: each destination's own way through a worker, so that a slow,
//! failing or paused destination never delays another. A lane is the
//! destination's queue (consumed on a channel of its own, its prefetch the
//! destination's `concurrency`), its handler slots, its rate limiter, its
//! retries, and what this worker knows of its breaker. One more lane
//! carries the legs claimed before destinations existed, through the old
//! shared queue.

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Instant;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use hookinbox::broker::Topology;
use hookinbox::config::{Breaker, DestinationKind, WorkerConfig};
use hookinbox::deliveries::{BreakerState, Registration};
use hookinbox::key::LegKey;
use hookinbox::key::{DestinationName, SourceName};
use hookinbox::retry::Retries;
use tokio::sync::Semaphore;

/// One destination's way through this worker.
pub(crate) struct Lane {
    /// The destination's source.
    pub(crate) source: SourceName,
    /// The destination (the legacy, empty name for the old shared queue).
    pub(crate) destination: DestinationName,
    /// The queue it consumes.
    pub(crate) queue: String,
    /// Handlers at once, and the queue's prefetch: the destination's
    /// `concurrency`, and one spare slot when it is fair without a cap.
    pub(crate) concurrency: u16,
    /// Handler slots. A deferred copy waits without one.
    pub(crate) slots: Semaphore,
    /// Legs started per second, when limited. Waiting for it is not an
    /// attempt: it comes before the take.
    pub(crate) limiter: Option<DefaultDirectRateLimiter>,
    /// How its legs are retried.
    pub(crate) retries: Retries,
    /// Its breaker, when on.
    pub(crate) breaker: Option<Breaker>,
    /// Whether its attempts go to the attempt log (`forward`, and any
    /// destination with a breaker, whose window is counted over the log).
    pub(crate) logs_attempts: bool,
    /// Whether this worker consumes its queue. A worker given only some
    /// destinations still has a lane for each: a probe of any of them may
    /// reach it through the shared queue, and runs under its own
    /// destination's settings and breaker.
    pub(crate) consumed: bool,
    /// When this worker last started counting the breaker's window (see
    /// `Worker::over_the_ratio`): one count at a time per lane.
    pub(crate) window_counted: tokio::sync::Mutex<Option<Instant>>,
    /// This worker's failed attempts of the destination since its last
    /// answer (see `Worker::in_a_row`).
    pub(crate) failures_in_row: AtomicU32,
    /// Whether the destination orders its legs per key: a leg that ends
    /// wakes the scheduler, whose next pass makes the key's next leg due.
    pub(crate) ordered: bool,
    /// Whether the destination is unordered, so its legs may be fair: a
    /// leg that ends releases its installation's next while the
    /// destination has legs waiting.
    pub(crate) fair: bool,
    /// `skip_stale`: a taken leg older than a completed one of its key is
    /// completed without its effect.
    pub(crate) skip_stale: bool,
}

impl Lane {
    /// Takes a leg may have in all.
    pub(crate) fn max_attempts(&self) -> i32 {
        self.retries.max_attempts()
    }

    /// Waits for the rate limiter, if the destination has one.
    pub(crate) async fn pace(&self) {
        if let Some(limiter) = &self.limiter {
            limiter.until_ready().await;
        }
    }
}

/// Every lane of a worker, and the breaker states it last read.
pub(crate) struct Lanes {
    lanes: Vec<Lane>,
    by_name: HashMap<(SourceName, DestinationName), usize>,
    /// The destinations' states as last read (refreshed every second by
    /// the runtime, and on this worker's own transitions). Only a hint:
    /// the gate in the take decides.
    states: RwLock<HashMap<(String, String), BreakerState>>,
    /// Whether any of those states is not `closed`: the common case (all
    /// closed) is answered without a lookup or an allocation per job.
    any_not_closed: AtomicBool,
}

/// The lane of the old shared queue is the last one.
impl Lanes {
    /// A lane for each configured destination, then the legacy lane.
    pub(crate) fn new(config: &WorkerConfig, topology: &Topology) -> Self {
        let mut lanes: Vec<Lane> = config
            .routes
            .iter()
            .map(|route| {
                let d = &route.destination;
                let limiter = d.rate_limit.map(|limit| {
                    RateLimiter::direct(
                        Quota::per_second(limit.per_second).allow_burst(limit.burst),
                    )
                });
                // A fair destination without a hard cap keeps one slot more
                // than its `concurrency`: the claim holds an installation's
                // legs at a round (`concurrency` per worker), so the spare
                // slot is free for another installation's leg when it comes,
                // which would otherwise wait for one of the flood's legs to
                // end. Not with `concurrency = 1`: that asks for one request
                // at a time.
                let spare = u16::from(
                    d.is_fair() && d.per_key_concurrency.is_none() && route.concurrency > 1,
                );
                let concurrency = route.concurrency.saturating_add(spare);
                Lane {
                    source: route.source.clone(),
                    destination: d.name.clone(),
                    queue: topology.leg_queue(&route.source, &d.name),
                    concurrency,
                    slots: Semaphore::new(usize::from(concurrency)),
                    limiter,
                    retries: route.retries.clone(),
                    breaker: d.breaker,
                    logs_attempts: d.breaker.is_some()
                        || matches!(d.kind, DestinationKind::Forward(_)),
                    window_counted: tokio::sync::Mutex::new(None),
                    failures_in_row: AtomicU32::new(0),
                    ordered: d.ordering.is_some(),
                    // Whatever `fairness` says now: legs claimed while it
                    // was on still wait, and are released as legs end.
                    fair: d.ordering.is_none(),
                    skip_stale: d.skip_stale,
                    consumed: config.consumes.as_ref().is_none_or(|chosen| {
                        chosen.contains(&(route.source.clone(), d.name.clone()))
                    }),
                }
            })
            .collect();
        lanes.push(Lane {
            source: SourceName::default_source(),
            destination: DestinationName::legacy(),
            queue: topology.work_queue(),
            concurrency: config.concurrency,
            slots: Semaphore::new(usize::from(config.concurrency)),
            limiter: None,
            retries: Retries::Exponential(config.retry),
            breaker: None,
            logs_attempts: false,
            consumed: true,
            window_counted: tokio::sync::Mutex::new(None),
            failures_in_row: AtomicU32::new(0),
            ordered: false,
            fair: false,
            skip_stale: false,
        });
        let by_name = lanes
            .iter()
            .enumerate()
            .take(lanes.len() - 1)
            .map(|(i, lane)| ((lane.source.clone(), lane.destination.clone()), i))
            .collect();
        Self {
            lanes,
            by_name,
            states: RwLock::new(HashMap::new()),
            any_not_closed: AtomicBool::new(false),
        }
    }

    /// Every lane whose queue this worker consumes, the legacy one last.
    pub(crate) fn consumed(&self) -> impl Iterator<Item = &Lane> {
        self.lanes.iter().filter(|lane| lane.consumed)
    }

    /// The lane of a job: its destination's, or the legacy lane for a leg
    /// claimed before destinations existed (and for a destination this
    /// worker does not know).
    pub(crate) fn of(&self, key: &LegKey) -> &Lane {
        let i = self
            .by_name
            .get(&(key.source.clone(), key.destination.clone()))
            .copied()
            .unwrap_or(self.lanes.len() - 1);
        &self.lanes[i]
    }

    /// What to register of the configured destinations.
    pub(crate) fn registrations(config: &WorkerConfig) -> Vec<Registration> {
        config
            .routes
            .iter()
            .map(|route| {
                let d = &route.destination;
                let breaker = d.breaker.unwrap_or_default();
                Registration {
                    source: route.source.clone(),
                    name: d.name.clone(),
                    kind: d.kind.name().to_owned(),
                    probe: breaker.probe,
                    disable_after: d.disable_after,
                }
            })
            .collect()
    }

    /// The state this worker last read of `lane`'s destination (closed
    /// when it has none).
    pub(crate) fn state(&self, lane: &Lane) -> BreakerState {
        if !self.any_not_closed.load(Ordering::Relaxed) {
            return BreakerState::Closed;
        }
        let states = self.states.read().unwrap_or_else(|e| e.into_inner());
        states
            .get(&(
                lane.source.as_str().to_owned(),
                lane.destination.as_str().to_owned(),
            ))
            .copied()
            .unwrap_or(BreakerState::Closed)
    }

    /// Notes a state this worker set or read.
    pub(crate) fn note(&self, source: &str, destination: &str, state: BreakerState) {
        let mut states = self.states.write().unwrap_or_else(|e| e.into_inner());
        states.insert((source.to_owned(), destination.to_owned()), state);
        self.any_not_closed.store(
            states.values().any(|s| *s != BreakerState::Closed),
            Ordering::Relaxed,
        );
    }

    /// Replaces every known state with a fresh read.
    pub(crate) fn refresh(&self, read: impl IntoIterator<Item = ((String, String), BreakerState)>) {
        let mut states = self.states.write().unwrap_or_else(|e| e.into_inner());
        states.clear();
        states.extend(read);
        self.any_not_closed.store(
            states.values().any(|s| *s != BreakerState::Closed),
            Ordering::Relaxed,
        );
    }
}
