//! The state gauges (deliveries by state, the oldest processing claim and
//! due retry, claims awaiting a redelivery, queue depths), sampled by one
//! worker at a time.

use hookinbox::postgres::{DbError, advisory, sql};

use crate::context::{Context, RuntimeError};

/// Samples the state gauges from Postgres and the broker. One worker at a
/// time does it: the one holding the sampler's advisory lock, kept on its
/// own connection for as long as it lives, so that the gauges come from
/// one place and a dead leader's lock dies with its connection.
#[derive(Default)]
pub(super) struct Sampler {
    leader: Option<deadpool_postgres::Object>,
}

/// The counts by state, then the ages. A due retry is one the scheduler
/// can republish: a claim reaped `lost` with no parked body is not (only a
/// redelivery from GitHub can finish it), so it is counted apart, as
/// awaiting a redelivery, and aged from when it was reaped.
const SAMPLE_STATE: &str = "
select count(*) filter (where status = 'processing'),
       (select count(*) from deliveries where status = 'completed'),
       count(*) filter (where status = 'failed' and retryable),
       count(*) filter (where status = 'failed' and not retryable),
       coalesce(extract(epoch from now() - min(claimed_at) filter (where status = 'processing')), 0)::float8,
       coalesce(extract(epoch from now() - min(next_attempt_at)
           filter (where status = 'failed' and retryable and next_attempt_at <= now()
                     and not awaiting)), 0)::float8,
       count(*) filter (where awaiting),
       coalesce(extract(epoch from now() - min(failed_at) filter (where awaiting)), 0)::float8
from (
    select d.status, d.retryable, d.claimed_at, d.next_attempt_at, d.failed_at,
           d.status = 'failed' and d.retryable and d.last_error_class is not distinct from 'lost'
             and not exists (select 1 from parked_bodies p
                             where p.provider = d.provider and p.source = d.source
                               and p.hook_id = d.hook_id and p.delivery_id = d.delivery_id
                               and p.destination = d.destination)
             as awaiting
    from deliveries d
    where d.status in ('processing', 'failed')
) d";

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
        let row = match sql::query_one(client, SAMPLE_STATE, &[]).await {
            Ok(row) => row,
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
        for (i, state) in ["processing", "completed", "retrying", "dead"]
            .iter()
            .enumerate()
        {
            metrics::gauge!(hookinbox::metrics::DELIVERIES, "state" => *state)
                .set(row.get::<_, i64>(i) as f64);
        }
        metrics::gauge!(hookinbox::metrics::OLDEST_PROCESSING_SECONDS).set(row.get::<_, f64>(4));
        metrics::gauge!(hookinbox::metrics::OLDEST_DUE_RETRY_SECONDS).set(row.get::<_, f64>(5));
        metrics::gauge!(hookinbox::metrics::AWAITING_REDELIVERY).set(row.get::<_, i64>(6) as f64);
        metrics::gauge!(hookinbox::metrics::OLDEST_AWAITING_REDELIVERY_SECONDS)
            .set(row.get::<_, f64>(7));
        // The legacy shared queue, the dead letters, and each configured
        // destination's queue (labelled `work.<source>.<destination>`).
        let mut queues = vec![
            ("work".to_owned(), ctx.topology.work_queue()),
            ("dlq".to_owned(), ctx.topology.dead_letter_queue()),
        ];
        for route in ctx.config.routes.iter() {
            let name = &route.destination.name;
            queues.push((
                format!("work.{}.{name}", route.source),
                ctx.topology.leg_queue(&route.source, name),
            ));
        }
        for (label, queue) in queues {
            if let Ok((messages, consumers)) = ctx.publisher.queue_stats(&queue).await {
                metrics::gauge!(hookinbox::metrics::QUEUE_MESSAGES, "queue" => label.clone())
                    .set(f64::from(messages));
                metrics::gauge!(hookinbox::metrics::QUEUE_CONSUMERS, "queue" => label)
                    .set(f64::from(consumers));
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
