//! Replaying dead letters, and keeping the dead-letter queue's copies in
//! step with Postgres.

use std::io::Write;
use std::time::Duration;

use deadpool_postgres::Pool;
use hookinbox::broker;
use hookinbox::config::WorkerConfig;
use hookinbox::deliveries::{self, Filter};
use hookinbox::postgres::DbError;
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde_json::json;

use super::print::{print_table, to_json};
use super::{Found, OpsError};

pub(super) async fn replay(
    pool: &Pool,
    config: &WorkerConfig,
    filter: &Filter,
    dry_run: bool,
    rate: Option<f64>,
    json: bool,
    out: &mut impl Write,
) -> Result<Found, OpsError> {
    let client = pool.get().await.map_err(DbError::from)?;
    let targets = deliveries::list(&client, filter).await?;
    if dry_run {
        if json {
            writeln!(
                out,
                "{}",
                json!({"dry_run": true, "would_replay": targets.iter().map(to_json).collect::<Vec<_>>()})
            )?;
        } else {
            print_table(out, &targets)?;
            writeln!(out, "would replay {} dead letter(s)", targets.len())?;
        }
        return Ok(Found::from_count(targets.len()));
    }
    let publisher = config.common.publisher("hookinbox-ops");
    publisher.connect().await?;
    let policy = config.common.policy();
    let mut ticker = rate.map(|r| {
        let mut t = tokio::time::interval(Duration::from_secs_f64(1.0 / r));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    let (mut replayed, mut skipped, mut failed) = (Vec::new(), 0usize, 0usize);
    for target in &targets {
        if let Some(t) = ticker.as_mut() {
            t.tick().await;
        }
        // The compare-and-set decides: a delivery replayed meanwhile (or by
        // a second run of this command) is skipped, never started twice.
        let parked = match deliveries::replay(&client, &policy, &target.key).await? {
            None => {
                skipped += 1;
                continue;
            }
            Some(Ok(parked)) => parked,
            Some(Err(unreadable)) => {
                // Its parked body cannot become a job: back among the dead
                // letters, with the reason.
                deliveries::dead_letter_unreadable(&client, &unreadable).await?;
                failed += 1;
                continue;
            }
        };
        let token = parked.job.token;
        let published = publisher
            .publish(&parked.job)
            .await
            .map_err(|e| e.to_string());
        match published {
            Ok(()) => replayed.push(target.key.delivery_id.as_str().to_owned()),
            Err(error) => {
                deliveries::unreplay(&client, &target.key, token, &error).await?;
                failed += 1;
            }
        }
    }
    publisher.close().await;
    if !replayed.is_empty() {
        reconcile_dead_letter_queue(pool, config).await?;
    }
    if json {
        writeln!(
            out,
            "{}",
            json!({"replayed": replayed, "skipped": skipped, "failed": failed})
        )?;
    } else {
        writeln!(
            out,
            "replayed {}, skipped {skipped} (no longer dead), failed {failed}",
            replayed.len()
        )?;
    }
    if failed > 0 {
        return Err(OpsError::Publish { failed });
    }
    Ok(Found::from_count(replayed.len()))
}

/// Rewrites the dead-letter queue so that it holds one copy per dead
/// letter in Postgres: copies of replayed, purged or completed deliveries
/// are dropped, duplicates folded, unknown messages kept. Each kept copy is
/// republished (with a confirm) before its original is acked, so a crash
/// half way leaves a duplicate, never a loss.
pub async fn reconcile_dead_letter_queue(
    pool: &Pool,
    config: &WorkerConfig,
) -> Result<(), OpsError> {
    let common = &config.common;
    let topology = common.topology();
    let (connection, channel) = broker::open_channel(
        &common.amqp_url,
        "hookinbox-ops",
        common.publish_timeout,
        &topology,
    )
    .await?;
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
    let publisher = common.publisher("hookinbox-ops");
    let client = pool.get().await.map_err(DbError::from)?;
    let mut seen = std::collections::HashSet::new();
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
                let dead = row.is_some_and(|r| r.is_dead());
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
    publisher.close().await;
    let _ = connection.close(200, "reconciled").await;
    Ok(())
}
