//! The test driver: process messages one at a time with `basic.get` until
//! the work queue is empty, and report what happened to each. Tests and
//! tools drive the runtime with it instead of sleeping.

use lapin::options::BasicGetOptions;

use super::acks::Settle;
use super::{JobOutcome, Received, Stop, Worker};
use crate::context::RuntimeError;

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

impl Worker {
    /// Processes messages one at a time with `basic.get` until every queue
    /// of this worker (each destination's, and the legacy one) is empty, and
    /// reports what happened to each. Tests and tools use it to drive the
    /// runtime without sleeping.
    pub async fn drain(&self) -> Result<DrainReport, RuntimeError> {
        self.drain_at_most(usize::MAX).await
    }

    /// Processes at most one message; `None` when the queue was empty.
    pub async fn drain_one(&self) -> Result<Option<JobOutcome>, RuntimeError> {
        Ok(self.drain_at_most(1).await?.outcomes.pop())
    }

    async fn drain_at_most(&self, limit: usize) -> Result<DrainReport, RuntimeError> {
        let (connection, channel) = self.open_channel("hookinbox-worker-drain").await?;
        let drained = self.drain_on(&channel, limit).await;
        hookinbox::broker::close(connection, channel, "drained").await;
        drained
    }

    async fn drain_on(
        &self,
        channel: &lapin::Channel,
        limit: usize,
    ) -> Result<DrainReport, RuntimeError> {
        let inner = &self.inner;
        for lane in inner.lanes.consumed() {
            if !lane.destination.is_legacy() {
                inner
                    .topology
                    .declare_leg_queue(channel, &lane.source, &lane.destination)
                    .await?;
            }
        }
        // Legs a claim held for fairness are released as this drain's legs
        // end, as a running worker's scheduler would have told it to: with
        // no pass before it, the drain would stop with them still waiting.
        if let Ok(mut known) = inner.ctx.fair_waiting.write() {
            known.extend(inner.lanes.consumed().filter(|lane| lane.fair).map(|lane| {
                (
                    lane.source.as_str().to_owned(),
                    lane.destination.as_str().to_owned(),
                )
            }));
        }
        let stop = Stop::default();
        let mut report = DrainReport::default();
        // Round the queues, one message each, until a whole round finds
        // them all empty.
        let mut empty_round = false;
        while report.outcomes.len() < limit && !empty_round {
            empty_round = true;
            for lane in inner.lanes.consumed() {
                if report.outcomes.len() >= limit {
                    break;
                }
                let Some(message) = channel
                    .basic_get(&lane.queue, BasicGetOptions::default())
                    .await?
                else {
                    continue;
                };
                empty_round = false;
                let delivery = message.delivery;
                let outcome = self
                    .process(
                        delivery.properties,
                        delivery.data,
                        Received {
                            redelivered: delivery.redelivered,
                            shared: lane.destination.is_legacy(),
                        },
                        Settle::Alone(delivery.acker),
                        &stop,
                    )
                    .await;
                report.outcomes.push(outcome);
            }
        }
        Ok(report)
    }
}
