//! Replaying dead letters, and keeping the dead-letter queue's copies in
//! step with Postgres.

use std::collections::HashSet;
use std::io::Write;
use std::time::Duration;

use deadpool_postgres::Pool;
use hookinbox::broker;
use hookinbox::config::WorkerConfig;
use hookinbox::deliveries::{self, Delivery, Filter, Replayed, Status};
use hookinbox::postgres::DbError;
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde_json::json;

use super::print::{print_table, to_json};
use super::{Found, OpsError};

/// How `dlq replay` runs.
#[derive(Clone, Copy, Debug)]
pub(super) struct Options {
    /// Show what would be replayed; change nothing.
    pub dry_run: bool,
    /// At most this many replays per second.
    pub rate: Option<f64>,
    /// Print JSON.
    pub json: bool,
}

/// What a delivery is, as an operator reads it: `retrying` and `dead` for
/// failures, with the class.
fn state(d: &Delivery) -> String {
    let state = match d.status {
        Status::Failed if d.retryable => "retrying",
        Status::Failed => "dead",
        other => other.as_str(),
    };
    match d.last_error_class {
        Some(class) if d.status == Status::Failed => format!("{state} ({})", class.as_str()),
        _ => state.to_owned(),
    }
}

/// Why each `named` id that is in none of `acted_on` was left alone:
/// unknown, not a dead letter, or not one the filters match.
async fn unmatched_reasons(
    client: &impl hookinbox::postgres::sql::Session,
    named: Option<&[String]>,
    acted_on: &[&[Delivery]],
) -> Result<Vec<(String, String)>, OpsError> {
    let seen: HashSet<&str> = acted_on
        .iter()
        .flat_map(|rows| rows.iter())
        .map(|d| d.key.delivery_id.as_str())
        .collect();
    let rest: Vec<String> = named
        .unwrap_or_default()
        .iter()
        .filter(|id| !seen.contains(id.as_str()))
        .cloned()
        .collect();
    if rest.is_empty() {
        return Ok(Vec::new());
    }
    let rows = deliveries::list(
        client,
        &Filter {
            ids: Some(rest.clone()),
            limit: i64::MAX,
            ..Filter::default()
        },
    )
    .await?;
    let mut reasons = Vec::new();
    for id in rest {
        let of_id: Vec<&Delivery> = rows
            .iter()
            .filter(|d| d.key.delivery_id.as_str() == id)
            .collect();
        if of_id.is_empty() {
            reasons.push((id, "no delivery has this id".to_owned()));
            continue;
        }
        for d in of_id {
            let why = if d.is_dead() {
                "a dead letter, but not one the filters match".to_owned()
            } else {
                format!("{}, not a dead letter", state(d))
            };
            reasons.push((id.clone(), why));
        }
    }
    Ok(reasons)
}

/// `dlq replay`: replays the dead letters `filter` selects. Deliveries it
/// names or matches that hookinbox holds no body of (awaiting a redelivery
/// from GitHub) are listed with what brings them back, and each named id
/// left alone with why.
pub(super) async fn replay(
    pool: &Pool,
    config: &WorkerConfig,
    filter: &Filter,
    named: Option<&[String]>,
    options: Options,
    out: &mut impl Write,
) -> Result<Found, OpsError> {
    let client = pool.get().await.map_err(DbError::from)?;
    let targets = deliveries::list(&client, filter).await?;
    // Never dead letters, so never among the targets: only GitHub has
    // their bodies.
    let mut no_body = deliveries::list(
        &client,
        &Filter {
            dead: false,
            awaiting_redelivery: true,
            ..filter.clone()
        },
    )
    .await?;
    if options.dry_run {
        let unmatched = unmatched_reasons(&client, named, &[&targets, &no_body]).await?;
        if options.json {
            writeln!(
                out,
                "{}",
                json!({
                    "dry_run": true,
                    "would_replay": targets.iter().map(to_json).collect::<Vec<_>>(),
                    "no_body": ids_of(&no_body),
                    "not_replayed": not_replayed_json(&unmatched),
                })
            )?;
        } else {
            print_table(out, &targets)?;
            writeln!(out, "would replay {} dead letter(s)", targets.len())?;
            print_left_alone(out, &no_body, &unmatched, true)?;
        }
        return Ok(Found::from_count(targets.len()));
    }
    let publisher = config.common.publisher("hookinbox-ops");
    // The publisher is closed however the replays end (see
    // `broker::close`).
    let published = async {
        if !targets.is_empty() {
            publisher.connect().await?;
        }
        replay_each(&client, config, &publisher, &targets, options, &mut no_body).await
    }
    .await;
    publisher.close().await;
    let (replayed, skipped, failed) = published?;
    if !replayed.is_empty() {
        reconcile_dead_letter_queue(pool, config).await?;
    }
    let unmatched = unmatched_reasons(&client, named, &[&targets, &no_body]).await?;
    if options.json {
        writeln!(
            out,
            "{}",
            json!({
                "replayed": replayed,
                "skipped": skipped,
                "failed": failed,
                "no_body": ids_of(&no_body),
                "not_replayed": not_replayed_json(&unmatched),
            })
        )?;
    } else {
        writeln!(
            out,
            "replayed {}, skipped {skipped} (no longer dead), failed {failed}",
            replayed.len()
        )?;
        print_left_alone(out, &no_body, &unmatched, false)?;
    }
    if failed > 0 {
        return Err(OpsError::Publish { failed });
    }
    Ok(Found::from_count(replayed.len()))
}

/// Replays each target at the rate asked: its delivery ids replayed, and
/// how many were skipped and failed. Deliveries without a body join
/// `no_body`.
async fn replay_each(
    client: &deadpool_postgres::Client,
    config: &WorkerConfig,
    publisher: &broker::Publisher,
    targets: &[Delivery],
    options: Options,
    no_body: &mut Vec<Delivery>,
) -> Result<(Vec<String>, usize, usize), OpsError> {
    let policy = config.common.policy();
    let mut ticker = options.rate.map(|r| {
        let mut t = tokio::time::interval(Duration::from_secs_f64(1.0 / r));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    let (mut replayed, mut skipped, mut failed) = (Vec::new(), 0usize, 0usize);
    for target in targets {
        if let Some(t) = ticker.as_mut() {
            t.tick().await;
        }
        // The compare-and-set decides: a delivery replayed meanwhile (or by
        // a second run of this command) is skipped, never started twice.
        let parked = match deliveries::replay(client, &policy, &target.key).await? {
            Replayed::Started(parked) => parked,
            Replayed::NotFailed => {
                skipped += 1;
                continue;
            }
            Replayed::NoBody => {
                no_body.push(target.clone());
                continue;
            }
            Replayed::Unreadable(unreadable) => {
                // Its parked body cannot become a job: back among the dead
                // letters, with the reason.
                deliveries::dead_letter_unreadable(client, &unreadable).await?;
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
                deliveries::unreplay(client, &target.key, token, &error).await?;
                failed += 1;
            }
        }
    }
    Ok((replayed, skipped, failed))
}

fn ids_of(rows: &[Delivery]) -> Vec<&str> {
    rows.iter().map(|d| d.key.delivery_id.as_str()).collect()
}

fn not_replayed_json(unmatched: &[(String, String)]) -> Vec<serde_json::Value> {
    unmatched
        .iter()
        .map(|(id, why)| json!({"delivery_id": id, "reason": why}))
        .collect()
}

/// The deliveries without a body, once, with what brings them back; then
/// each named id left alone, with why.
fn print_left_alone(
    out: &mut impl Write,
    no_body: &[Delivery],
    unmatched: &[(String, String)],
    dry_run: bool,
) -> std::io::Result<()> {
    let not = if dry_run {
        "would not replay"
    } else {
        "not replayed"
    };
    if !no_body.is_empty() {
        writeln!(out, "{not}, {} delivery(ies):", no_body.len())?;
        for d in no_body {
            writeln!(
                out,
                "  {}  source {}  hook {}  {}",
                d.key.delivery_id.as_str(),
                d.key.source.as_str(),
                d.key.hook_id.as_str(),
                state(d)
            )?;
        }
        writeln!(out, "{}.", deliveries::NO_BODY_TO_REPLAY)?;
    }
    for (id, why) in unmatched {
        writeln!(out, "{not} {id}: {why}")?;
    }
    Ok(())
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
) -> Result<(), OpsError> {
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
    Ok(())
}
