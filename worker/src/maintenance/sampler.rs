//! The state gauges (deliveries by state, the oldest processing claim and
//! due retry, claims awaiting a redelivery, queue depths, the oldest
//! transaction holding back vacuum), sampled by one worker at a time. What
//! each figure counts is `deliveries::gauges` (and `postgres::horizon`);
//! this keeps the leader lock and writes the metrics.

use hookinbox::deliveries::{self, State};
use hookinbox::postgres::{DbError, advisory};

use crate::context::{Context, RuntimeError};

/// Samples the state gauges from Postgres and the broker. One worker at a
/// time does it: the one holding the sampler's advisory lock, kept on its
/// own connection for as long as it lives, so that the gauges come from
/// one place and a dead leader's lock dies with its connection.
#[derive(Default)]
pub(super) struct Sampler {
    leader: Option<deadpool_postgres::Object>,
}

impl Sampler {
    pub(super) async fn sample(&mut self, ctx: &Context) -> Result<(), RuntimeError> {
        if self.leader.is_none() {
            let client = ctx.leaders.get().await.map_err(DbError::from)?;
            if advisory::try_lock(&client, advisory::SAMPLER).await? {
                // Keep this session out of the pool: it holds the lock.
                self.leader = Some(client);
            } else {
                metrics::gauge!(hookinbox::metrics::SAMPLER_LEADER).set(0.0);
                return Ok(());
            }
        }
        let Some(client) = self.leader.as_ref() else {
            return Ok(());
        };
        let gauges = match deliveries::gauges(client).await {
            Ok(gauges) => gauges,
            Err(e) => {
                // Close this session rather than return it to the pool: if
                // it is still alive it holds the lock, and a pooled
                // connection holding it would block every sampler for good.
                if let Some(client) = self.leader.take() {
                    drop(deadpool_postgres::Object::take(client));
                }
                metrics::gauge!(hookinbox::metrics::SAMPLER_LEADER).set(0.0);
                return Err(e.into());
            }
        };
        metrics::gauge!(hookinbox::metrics::SAMPLER_LEADER).set(1.0);
        for (state, n) in [
            (State::Processing, gauges.processing),
            (State::Completed, gauges.completed),
            (State::Retrying, gauges.retrying),
            (State::Waiting, gauges.waiting),
            (State::Dead, gauges.dead),
        ] {
            metrics::gauge!(hookinbox::metrics::DELIVERIES, "state" => state.as_str())
                .set(n as f64);
        }
        metrics::gauge!(hookinbox::metrics::OLDEST_PROCESSING_SECONDS)
            .set(gauges.oldest_processing_secs);
        metrics::gauge!(hookinbox::metrics::OLDEST_DUE_RETRY_SECONDS)
            .set(gauges.oldest_due_retry_secs);
        metrics::gauge!(hookinbox::metrics::AWAITING_REDELIVERY)
            .set(gauges.awaiting_redelivery as f64);
        metrics::gauge!(hookinbox::metrics::OLDEST_AWAITING_REDELIVERY_SECONDS)
            .set(gauges.oldest_awaiting_redelivery_secs);
        match hookinbox::postgres::horizon::oldest_transaction_secs(client).await {
            Ok(secs) => metrics::gauge!(hookinbox::metrics::OLDEST_TRANSACTION_SECONDS).set(secs),
            Err(error) => tracing::debug!(%error, "the oldest transaction's age not read"),
        }
        // The legacy shared queue, the dead letters, and each configured
        // destination's queue (labelled `work.<source>.<destination>`).
        let mut queues = vec![
            ("work".to_owned(), ctx.topology.work_queue(), None),
            ("dlq".to_owned(), ctx.topology.dead_letter_queue(), None),
        ];
        for route in ctx.config.routes.iter() {
            let name = &route.destination.name;
            queues.push((
                format!("work.{}.{name}", route.source),
                ctx.topology.leg_queue(&route.source, name),
                route.destination.is_fair().then_some(route),
            ));
        }
        for (label, queue, fair) in queues {
            if let Ok((messages, consumers)) = ctx.publisher.queue_stats(&queue).await {
                metrics::gauge!(hookinbox::metrics::QUEUE_MESSAGES, "queue" => label.clone())
                    .set(f64::from(messages));
                metrics::gauge!(hookinbox::metrics::QUEUE_CONSUMERS, "queue" => label)
                    .set(f64::from(consumers));
                // A fair destination's claims size their holds by it.
                if let Some(route) = fair {
                    let consumers = i32::try_from(consumers).unwrap_or(i32::MAX);
                    if let Err(error) = deliveries::set_consumers(
                        client,
                        &route.source,
                        &route.destination.name,
                        consumers,
                    )
                    .await
                    {
                        tracing::debug!(%error, "consumers of a fair destination not recorded");
                    }
                }
            }
        }
        Self::sample_destinations(client, ctx).await
    }

    /// Legs waiting per destination and the age of the oldest, for every
    /// configured destination (0 when none wait), so that an alert can
    /// follow each.
    async fn sample_destinations(
        client: &deadpool_postgres::Object,
        ctx: &Context,
    ) -> Result<(), RuntimeError> {
        let waiting = hookinbox::deliveries::waiting(client).await?;
        let halted = hookinbox::deliveries::halted_counts(client).await?;
        for route in ctx.config.routes.iter() {
            let (source, name) = (route.source.as_str(), route.destination.name.as_str());
            let n = halted
                .iter()
                .find(|(s, d, _)| s == source && d == name)
                .map(|(_, _, n)| *n);
            // A destination configured without ordering may still have
            // halted keys, from legs claimed while it was ordered.
            let Some(n) = n.or(route.destination.ordering.map(|_| 0)) else {
                continue;
            };
            metrics::gauge!(
                hookinbox::metrics::ORDERING_HALTED_KEYS,
                "source" => source.to_owned(),
                "destination" => name.to_owned()
            )
            .set(n as f64);
        }
        for route in ctx.config.routes.iter() {
            let (source, name) = (route.source.as_str(), route.destination.name.as_str());
            let found = waiting
                .iter()
                .find(|w| w.source == source && w.destination == name);
            metrics::gauge!(
                hookinbox::metrics::DESTINATION_WAITING,
                "source" => source.to_owned(),
                "destination" => name.to_owned()
            )
            .set(found.map_or(0.0, |w| w.legs as f64));
            metrics::gauge!(
                hookinbox::metrics::DESTINATION_OLDEST_WAITING_SECONDS,
                "source" => source.to_owned(),
                "destination" => name.to_owned()
            )
            .set(found.map_or(0.0, |w| w.oldest_secs));
        }
        Ok(())
    }
}
