//! The dead-letter queue kept in step with Postgres: after a replay or a
//! purge (from the CLI or the console), its copies of deliveries that are
//! no longer dead letters are dropped.

use std::collections::HashSet;

use deadpool_postgres::Pool;
use hookinbox::broker;
use hookinbox::config::WorkerConfig;
use hookinbox::deliveries::{self, State};
use hookinbox::postgres::DbError;
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

use crate::OperatorError;

/// Rewrites the dead-letter queue so that it holds one copy per dead
/// letter in Postgres: copies of replayed, purged or completed deliveries
/// are dropped, duplicates folded, unknown messages kept. Each kept copy is
/// republished (with a confirm) before its original is acked, so a crash
/// half way leaves a duplicate, never a loss.
pub async fn reconcile_dead_letter_queue(
    pool: &Pool,
    config: &WorkerConfig,
) -> Result<(), OperatorError> {
    let common = &config.common;
    let topology = common.topology();
    let (connection, channel) = broker::open_channel(
        &common.amqp_url,
        "hookinbox-ops",
        common.publish_timeout,
        &topology,
    )
    .await?;
    let publisher = common.publisher("hookinbox-ops");
    let rewritten = rewrite_dead_letters(pool, &topology, &channel, &publisher).await;
    // However the rewrite ended: the publisher, then this connection, its
    // channel after it (see `broker::close`).
    publisher.close().await;
    broker::close(connection, channel, "reconciled").await;
    rewritten
}

/// Takes each message of the dead-letter queue once, republishing the
/// copies to keep before acking their originals.
async fn rewrite_dead_letters(
    pool: &Pool,
    topology: &broker::Topology,
    channel: &lapin::Channel,
    publisher: &broker::Publisher,
) -> Result<(), OperatorError> {
    let queue = channel
        .queue_declare(
            &topology.dead_letter_queue(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    let client = pool.get().await.map_err(DbError::from)?;
    let mut seen = HashSet::new();
    for _ in 0..queue.message_count() {
        let Some(message) = channel
            .basic_get(&topology.dead_letter_queue(), BasicGetOptions::default())
            .await?
        else {
            break;
        };
        let delivery = message.delivery;
        let keep = match broker::decode(&delivery.properties, delivery.data.clone()) {
            Err(_) => true,
            Ok(job) => {
                let row = deliveries::get(&client, &job.key).await?;
                let dead = row.is_some_and(|r| State::of(&r) == State::Dead);
                dead && seen.insert(job.key)
            }
        };
        if keep {
            publisher
                .republish_dead_letter(&delivery.data, delivery.properties.clone())
                .await?;
        }
        delivery.acker.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}
