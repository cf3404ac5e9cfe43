//! `deliveries show` and `deliveries replay`: one delivery by its
//! `X-GitHub-Delivery` id, with the body and headers Postgres keeps of it;
//! and the replay of any of its legs that is not in flight, completed ones
//! too, from that body.

use std::collections::BTreeSet;
use std::io::Write;

use deadpool_postgres::Pool;
use hookinbox::config::WorkerConfig;
use hookinbox::deliveries::{self, Delivery, Filter, Order, State, Status, bodies};
use hookinbox::postgres::DbError;
use hookinbox::postgres::sql::Session;
use serde_json::json;

use super::args::RATE_RANGE;
use super::print::{print_fields, to_json};
use super::{Found, OpsError, job};
use crate::actor::Identity;
use crate::jobs::Kind;

/// The legs with this id, oldest delivery first: of `source`, `hook_id`
/// and `destination` when given.
async fn legs_of(
    client: &impl Session,
    id: &str,
    source: Option<&str>,
    hook_id: Option<&str>,
    destination: Option<&str>,
) -> Result<Vec<Delivery>, OpsError> {
    let filter = Filter {
        ids: Some(vec![id.to_owned()]),
        source: source.map(str::to_owned),
        hook_id: hook_id.map(str::to_owned),
        destination: destination.map(str::to_owned),
        limit: i64::MAX,
        order: Order::RecentlyActive,
        ..Filter::default()
    };
    Ok(deliveries::list(client, &filter).await?)
}

/// What is kept of one delivery's request: its headers and raw body, as
/// JSON.
fn received_json(kept: &Option<bodies::Kept>) -> serde_json::Value {
    match kept {
        None => serde_json::Value::Null,
        Some(kept) => match &kept.body {
            Ok(body) => json!({
                "received_at": kept.received_at,
                "content_type": body.content_type,
                "headers": body.github_headers.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
                "size": body.bytes.len(),
                "body": String::from_utf8_lossy(&body.bytes),
            }),
            Err(e) => json!({"received_at": kept.received_at, "error": e.to_string()}),
        },
    }
}

/// `deliveries show ID`: every leg with this id (`key: value` lines or
/// JSON), then, once per delivery, the request headers and the raw body
/// kept of it (`received`; null once past `HOOKINBOX_RETENTION_BODIES`).
pub(super) async fn show(
    pool: &Pool,
    id: &str,
    json: bool,
    out: &mut impl Write,
) -> Result<Found, OpsError> {
    let client = pool.get().await.map_err(DbError::from)?;
    let rows = legs_of(&client, id, None, None, None).await?;
    // One body per delivery: its legs share it.
    let keys: BTreeSet<_> = rows.iter().map(|d| d.key.delivery.clone()).collect();
    let mut kept = Vec::with_capacity(keys.len());
    for key in keys {
        let body = bodies::read(&client, &key).await?;
        kept.push((key, body));
    }
    let received = |d: &Delivery| {
        kept.iter()
            .find(|(k, _)| *k == d.key.delivery)
            .and_then(|(_, b)| b.as_ref().cloned())
    };
    if json {
        let list: Vec<_> = rows
            .iter()
            .map(|d| {
                let mut v = to_json(d);
                v["received"] = received_json(&received(d));
                v
            })
            .collect();
        writeln!(out, "{}", serde_json::Value::Array(list))?;
    } else if rows.is_empty() {
        writeln!(out, "no delivery has the X-GitHub-Delivery id '{id}'")?;
    } else {
        print_fields(out, &rows)?;
        for (key, body) in &kept {
            writeln!(
                out,
                "received by source {} (hook {}):",
                key.source.as_str(),
                key.hook_id.as_str()
            )?;
            match body {
                None => writeln!(
                    out,
                    "  not kept: past HOOKINBOX_RETENTION_BODIES, or claimed before bodies were kept"
                )?,
                Some(bodies::Kept { body: Err(e), .. }) => writeln!(out, "  {e}")?,
                Some(bodies::Kept {
                    body: Ok(body),
                    received_at,
                }) => {
                    writeln!(out, "  at {}", received_at.to_rfc3339())?;
                    writeln!(out, "  content-type: {}", body.content_type)?;
                    for (name, value) in &body.github_headers {
                        writeln!(out, "  {name}: {value}")?;
                    }
                    writeln!(out, "  body ({} bytes):", body.bytes.len())?;
                    writeln!(out, "{}", String::from_utf8_lossy(&body.bytes))?;
                }
            }
            writeln!(out)?;
        }
    }
    Ok(Found::from_count(rows.len()))
}

/// What `deliveries replay` replays.
pub(super) struct Replay<'a> {
    /// The `X-GitHub-Delivery` id.
    pub id: &'a str,
    /// Only its delivery to this source.
    pub source: Option<&'a str>,
    /// Only its delivery through this hook (a source that pins several
    /// hooks may have the id under each).
    pub hook_id: Option<&'a str>,
    /// Only its leg to this destination.
    pub destination: Option<&'a str>,
    /// Show what would be replayed; change nothing.
    pub dry_run: bool,
    /// Print JSON.
    pub json: bool,
    /// Who replays.
    pub who: &'a Identity,
}

/// Why a leg is not one a replay takes.
fn left_alone(d: &Delivery) -> Option<String> {
    match d.status {
        Status::Processing if State::of(d) == State::AwaitingRedelivery => {
            Some(deliveries::NO_BODY_TO_REPLAY.to_owned())
        }
        Status::Processing => Some("in flight (processing): it runs already".to_owned()),
        Status::Filtered => Some(format!(
            "filtered: {}",
            d.filter_reason
                .as_deref()
                .unwrap_or("its destination does not take it")
        )),
        Status::Completed | Status::Failed => None,
    }
}

/// The name of a leg's destination, for a line about it.
fn destination(d: &Delivery) -> &str {
    match d.key.destination.as_str() {
        "" => "(its source's first)",
        name => name,
    }
}

/// `deliveries replay ID`: replays each leg of the delivery (or the one
/// `--destination` names) that is completed or failed, from its body, as
/// a job in the foreground (audited, its items each leg's lineage). Each
/// leg left alone is named with why.
pub(super) async fn replay(
    pool: &Pool,
    config: &WorkerConfig,
    r: Replay<'_>,
    out: &mut impl Write,
) -> Result<Found, OpsError> {
    let client = pool.get().await.map_err(DbError::from)?;
    let all = legs_of(&client, r.id, r.source, r.hook_id, r.destination).await?;
    if all.is_empty() {
        let scope = match (r.source, r.destination) {
            (None, None) => String::new(),
            (s, d) => format!(
                " ({}{}{})",
                s.map(|s| format!("source {s}")).unwrap_or_default(),
                if s.is_some() && d.is_some() { ", " } else { "" },
                d.map(|d| format!("destination {d}")).unwrap_or_default()
            ),
        };
        writeln!(
            out,
            "no delivery has the X-GitHub-Delivery id '{}'{scope}",
            r.id
        )?;
        return Ok(Found::Nothing);
    }
    let sources: BTreeSet<&str> = all.iter().map(|d| d.key.source.as_str()).collect();
    if sources.len() > 1 {
        return Err(OpsError::Usage(format!(
            "sources {} each have a delivery '{}'; name one with --source",
            sources.into_iter().collect::<Vec<_>>().join(", "),
            r.id
        )));
    }
    let hooks: BTreeSet<&str> = all.iter().map(|d| d.key.hook_id.as_str()).collect();
    if hooks.len() > 1 {
        return Err(OpsError::Usage(format!(
            "hooks {} each have a delivery '{}'; name one with --hook-id",
            hooks.into_iter().collect::<Vec<_>>().join(", "),
            r.id
        )));
    }
    let (targets, alone): (Vec<&Delivery>, Vec<&Delivery>) =
        all.iter().partition(|d| left_alone(d).is_none());
    let not_replayed: Vec<(String, String)> = alone
        .iter()
        .filter_map(|d| left_alone(d).map(|why| (destination(d).to_owned(), why)))
        .collect();
    let mut filter = Filter {
        ids: Some(vec![r.id.to_owned()]),
        source: Some(all[0].key.source.as_str().to_owned()),
        hook_id: Some(all[0].key.hook_id.as_str().to_owned()),
        destination: r.destination.map(str::to_owned),
        states: Kind::ReplayAny.states().to_vec(),
        limit: i64::MAX,
        ..Filter::default()
    };
    if r.dry_run || targets.is_empty() {
        if r.json {
            writeln!(
                out,
                "{}",
                json!({
                    "dry_run": r.dry_run,
                    "would_replay": targets.iter().map(|d| to_json(d)).collect::<Vec<_>>(),
                    "not_replayed": not_replayed_json(&not_replayed),
                })
            )?;
        } else {
            for d in &targets {
                writeln!(
                    out,
                    "would replay {} to {} ({}, {} replay(s) so far)",
                    r.id,
                    destination(d),
                    State::of(d).as_str(),
                    d.replays
                )?;
            }
            print_not_replayed(out, r.id, &not_replayed)?;
        }
        return Ok(Found::from_count(if r.dry_run { targets.len() } else { 0 }));
    }
    // Only the legs that may be replayed now: the job's selection.
    filter.limit = i64::MAX;
    let target = json!({"delivery": {
        "source": all[0].key.source.as_str(),
        "hook_id": all[0].key.hook_id.as_str(),
        "delivery_id": r.id,
        "destination": r.destination,
    }});
    let ran = job::run(
        pool,
        config,
        r.who,
        Kind::ReplayAny,
        &filter,
        &target,
        *RATE_RANGE.end(),
    )
    .await?;
    let mut replayed = Vec::new();
    let mut queued = Vec::new();
    let mut failed = Vec::new();
    let mut skipped = not_replayed;
    for item in ran.iter().flat_map(|run| run.items.iter()) {
        let [_, _, _, _, name] = &item.key;
        let name = if name.is_empty() {
            "(its source's first)".to_owned()
        } else {
            name.clone()
        };
        match (item.result.as_deref(), item.error.as_deref()) {
            (Some("replayed"), None) => replayed.push(name),
            // Its publish failed: due in Postgres, published later.
            (Some("replayed"), Some(why)) => {
                replayed.push(name.clone());
                queued.push((name, why.to_owned()));
            }
            (Some("skipped"), _) => skipped.push((name, "in flight now: it runs already".into())),
            // Nothing changed: no body kept (past its retention).
            (Some("failed"), Some(deliveries::NO_BODY_TO_REPLAY)) => {
                skipped.push((name, deliveries::NO_BODY_TO_REPLAY.to_owned()))
            }
            (Some("failed"), Some(why)) => failed.push((name, why.to_owned())),
            (Some("failed"), None) => failed.push((name, "failed".to_owned())),
            // Not done: the job was cancelled.
            _ => skipped.push((name, "not done: the job was cancelled".into())),
        }
    }
    if r.json {
        writeln!(
            out,
            "{}",
            json!({
                "replayed": replayed,
                "queued": not_replayed_json(&queued),
                "failed": not_replayed_json(&failed),
                "not_replayed": not_replayed_json(&skipped),
            })
        )?;
    } else {
        for name in &replayed {
            match queued.iter().find(|(q, _)| q == name) {
                Some((_, why)) => writeln!(out, "replayed {} to {name}: {why}", r.id)?,
                None => writeln!(out, "replayed {} to {name}", r.id)?,
            }
        }
        for (name, why) in &failed {
            writeln!(out, "replay of {} to {name} failed: {why}", r.id)?;
        }
        print_not_replayed(out, r.id, &skipped)?;
    }
    if !failed.is_empty() {
        return Err(OpsError::Publish {
            failed: failed.len(),
        });
    }
    Ok(Found::from_count(replayed.len()))
}

fn not_replayed_json(legs: &[(String, String)]) -> Vec<serde_json::Value> {
    legs.iter()
        .map(|(destination, why)| json!({"destination": destination, "reason": why}))
        .collect()
}

fn print_not_replayed(
    out: &mut impl Write,
    id: &str,
    legs: &[(String, String)],
) -> std::io::Result<()> {
    for (destination, why) in legs {
        writeln!(out, "not replayed {id} to {destination}: {why}")?;
    }
    Ok(())
}
