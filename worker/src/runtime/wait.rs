//! A leg of a destination that takes no legs now (its breaker open or half
//! open, paused, disabled) waits in the broker, not in Postgres.
//!
//! The consumer's prefetch is the destination's `concurrency`: the few
//! messages at the head of its queue wait here, unacked and without a
//! handler slot, and the broker keeps the rest. Nothing is written for
//! them, so a destination that is down costs the other destinations
//! nothing beyond its claims and publishes at ingest. The take's gate in
//! Postgres still decides: this wait only reads what the worker last read
//! of the destination's state (every second, and at once on its own
//! transitions), and a leg that slips through before the state is known is
//! held by the take as before.
//!
//! The wait is bounded by [`HOLD_AFTER`]: a broker closes a channel whose
//! message stays unacked past its `consumer_timeout` (30 minutes by
//! default), and that would return every message of the channel. Past the
//! bound the leg goes on to its take, which holds it in Postgres (body
//! parked, no attempt spent), and the next message takes its place.
//!
//! Probes do not wait: the scheduler publishes them through the shared
//! queue (`Publisher::publish_probe`), which every worker consumes.

use std::time::{Duration, Instant};

use hookinbox::deliveries::BreakerState;

use super::lanes::Lane;
use super::{Stop, Worker};

/// How long a leg waits in a worker, unacked, for its destination to take
/// legs again before its take holds it in Postgres. Well under RabbitMQ's
/// default `consumer_timeout` (30 minutes).
pub(super) const HOLD_AFTER: Duration = Duration::from_secs(300);

/// How often a waiting leg looks at the state this worker last read (no
/// query: the read is the runtime's, every second).
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// What the wait ended with.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Waited {
    /// The destination takes legs again (or the bound passed, or the lane
    /// has no state to wait on): go on to the take.
    Go,
    /// The worker is stopping: leave the message unacked, for the broker
    /// to hand to another worker.
    Leave,
}

impl Worker {
    /// Waits while `lane`'s destination takes no legs, as this worker last
    /// read it. Only under the consume loop (`stop.soft` set): a drain
    /// takes each message at once, as the take's gate decides.
    pub(super) async fn wait_for_destination(&self, lane: &Lane, stop: &Stop) -> Waited {
        let Some(soft) = &stop.soft else {
            return Waited::Go;
        };
        if lane.destination.is_legacy() {
            return Waited::Go;
        }
        let lanes = &self.inner.lanes;
        let since = Instant::now();
        let mut counted = false;
        while lanes.state(lane) != BreakerState::Closed && since.elapsed() < HOLD_AFTER {
            if !counted {
                counted = true;
                metrics::counter!(
                    hookinbox::metrics::DESTINATION_WAITS,
                    "source" => lane.source.as_str().to_owned(),
                    "destination" => lane.destination.as_str().to_owned()
                )
                .increment(1);
            }
            tokio::select! {
                _ = soft.cancelled() => return Waited::Leave,
                _ = stop.hard.cancelled() => return Waited::Leave,
                _ = tokio::time::sleep(LOOK_EVERY) => {}
            }
        }
        Waited::Go
    }
}
