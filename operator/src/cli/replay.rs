//! Replaying dead letters, and keeping the dead-letter queue's copies in
//! step with Postgres.

use std::collections::HashSet;
use std::io::Write;

use deadpool_postgres::Pool;
use hookinbox::config::WorkerConfig;
use hookinbox::deliveries::{self, Delivery, Filter, State, Status};
use hookinbox::postgres::DbError;
use serde_json::json;

use super::args::RATE_RANGE;
use super::print::{print_table, to_json};
use super::{Found, OpsError, job};
use crate::actor::Identity;
use crate::jobs::Kind;

/// How `dlq replay` runs.
#[derive(Clone, Copy, Debug)]
pub(super) struct Options<'a> {
    /// Who replays (`--as`).
    pub who: &'a Identity,
    /// What the audit row names: the ids or the filter.
    pub target: &'a serde_json::Value,
    /// Show what would be replayed; change nothing.
    pub dry_run: bool,
    /// At most this many replays per second.
    pub rate: Option<f64>,
    /// Print JSON.
    pub json: bool,
}

/// What `dlq replay` selects: the dead letters to replay, and the
/// deliveries awaiting a redelivery it names or matches, to say why they
/// are not replayed.
#[derive(Clone, Copy, Debug)]
pub(super) struct Filters<'a> {
    /// Dead letters.
    pub targets: &'a Filter,
    /// Deliveries awaiting a redelivery.
    pub no_body: &'a Filter,
}

/// The deliveries awaiting a redelivery that `args` (and `named`) match:
/// those a replay would have taken had hookinbox their body. Only when the
/// filter names no state, or awaiting_redelivery, or retrying (a claim
/// reaped `lost` with no body was a retry before it was awaiting).
pub(super) fn no_body_filter(
    args: &super::FilterArgs,
    named: Option<Vec<String>>,
    limit: i64,
) -> Filter {
    let mut f = args.filter(false, named);
    let wanted = f.states.is_empty()
        || f.states.contains(&State::AwaitingRedelivery)
        || f.states.contains(&State::Retrying);
    f.states = vec![State::AwaitingRedelivery];
    if !wanted {
        // No row is in two states: none matches.
        f.ids = Some(Vec::new());
    }
    f.limit = limit;
    f
}

/// What a delivery is, as an operator reads it: its state, with the class
/// of a failure.
fn state(d: &Delivery) -> String {
    let state = State::of(d).as_str();
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
            let why = if State::of(d) == State::Dead {
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
    filters: Filters<'_>,
    named: Option<&[String]>,
    options: Options<'_>,
    out: &mut impl Write,
) -> Result<Found, OpsError> {
    let client = pool.get().await.map_err(DbError::from)?;
    let targets = deliveries::list(&client, filters.targets).await?;
    // Never dead letters, so never among the targets: only GitHub has
    // their bodies.
    let mut no_body = deliveries::list(&client, filters.no_body).await?;
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
    // One job over the dead letters selected: its audit row, its items the
    // lineage of each delivery, paced at --rate (or as fast as it goes).
    let per_second = options.rate.unwrap_or(*RATE_RANGE.end());
    let ran = if targets.is_empty() {
        None
    } else {
        job::run(
            pool,
            config,
            options.who,
            Kind::Replay,
            filters.targets,
            options.target,
            per_second,
        )
        .await?
    };
    let (mut replayed, mut skipped, mut failed) = (Vec::new(), 0usize, 0usize);
    for item in ran.iter().flat_map(|r| r.items.iter()) {
        let [_, source, hook_id, delivery_id, destination] = &item.key;
        let target = targets.iter().find(|d| {
            d.key.source.as_str() == source
                && d.key.hook_id.as_str() == hook_id
                && d.key.delivery_id.as_str() == delivery_id
                && d.key.destination.as_str() == destination
        });
        match (item.result.as_deref(), item.error.as_deref()) {
            (Some("replayed"), _) => replayed.push(delivery_id.clone()),
            (Some("skipped"), _) => skipped += 1,
            // Only GitHub has its body: listed below with what to do.
            (Some("failed"), Some(deliveries::NO_BODY_TO_REPLAY)) => {
                no_body.extend(target.cloned());
            }
            (Some("failed"), _) => failed += 1,
            // Not done: the job was cancelled.
            _ => {}
        }
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
