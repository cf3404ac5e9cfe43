//! One pass over one source: walk GitHub's delivery log back to the
//! watermark minus an overlap, group the attempts by GUID, judge each
//! against what hookinbox holds, and ask GitHub to redeliver what it never
//! durably took.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use hookinbox::config::ReconcileTarget;
use hookinbox::deliveries;
use hookinbox::postgres::DbError;
use serde::Serialize;

use super::github::{Api, LoggedDelivery, Redelivery};
use super::judge::{Attempts, Rules, Verdict, judge};
use super::{ReconcileError, state};

/// Deliveries can appear in GitHub's log minutes late: each pass walks this
/// far behind the watermark.
pub(crate) const OVERLAP: Duration = Duration::from_secs(15 * 60);
/// GUIDs looked up per statement.
const CHUNK: usize = 1000;
/// Redeliveries asked are remembered this long: past GitHub's log (7 days
/// at most) they cannot be asked again.
const FORGET_ASKED_AFTER: Duration = Duration::from_secs(14 * 86400);

/// How a pass runs.
#[derive(Clone, Debug)]
pub struct PassOptions {
    /// Judge and report, change nothing, ask GitHub for nothing.
    pub dry_run: bool,
    /// Walk back this far instead of to the watermark (capped at GitHub's
    /// log); such a pass does not move the watermark.
    pub since: Option<Duration>,
    /// The longest single wait for GitHub's rate limit.
    pub max_wait: Duration,
}

/// What a pass found and did. The counts are of GUIDs.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// The source.
    pub source: String,
    /// The hook.
    pub hook: String,
    /// GUIDs in the walked part of the log.
    pub scanned: u64,
    /// Redeliveries GitHub accepted.
    pub redelivered: u64,
    /// GitHub saw no 2xx, hookinbox completed or held them.
    pub late: u64,
    /// GitHub saw a 2xx, hookinbox holds no row.
    pub unexplained: u64,
    /// Redelivered the most times allowed already.
    pub capped: u64,
    /// Left alone: events the source does not take, deliveries younger
    /// than the minimum age, redeliveries asked within it.
    pub skipped: u64,
    /// Redeliveries GitHub refused (422).
    pub refused: u64,
    /// Pages of the log read.
    pub pages: u64,
    /// Whether the pass completed.
    pub complete: bool,
    /// A dry run.
    pub dry_run: bool,
    /// The GUIDs a dry run would ask GitHub to redeliver.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub would_redeliver: Vec<String>,
}

impl Report {
    fn counts(&self) -> serde_json::Value {
        serde_json::json!({
            "scanned": self.scanned, "redelivered": self.redelivered, "late": self.late,
            "unexplained": self.unexplained, "capped": self.capped, "skipped": self.skipped,
            "refused": self.refused, "pages": self.pages,
        })
    }
}

/// How far back GitHub keeps a hook's log: 3 days on github.com, 7 on
/// GitHub Enterprise Server (any other API host).
pub(crate) fn log_window(api: &reqwest::Url) -> Duration {
    let days = if api.host_str() == Some("api.github.com") {
        3
    } else {
        7
    };
    Duration::from_secs(days * 86400)
}

fn ago(now: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    now - chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// Runs one pass. The caller holds the source's leader lock.
pub(crate) async fn pass(
    pool: &Pool,
    target: &ReconcileTarget,
    retention: Duration,
    options: &PassOptions,
) -> Result<Report, ReconcileError> {
    let settings = &target.settings;
    let source = target.source.as_str();
    let hook = settings.hook.to_string();
    let api = Api::new(
        settings.api_url.clone(),
        settings.hook.clone(),
        settings.auth.clone(),
        source,
        options.max_wait,
    )?;
    let client = pool.get().await.map_err(DbError::from)?;
    let progress = state::progress(&client, source)
        .await?
        .filter(|p| p.hook == hook)
        .unwrap_or_default();
    let now = Utc::now();
    let floor = ago(now, log_window(&settings.api_url));
    let cutoff = match (options.since, progress.watermark) {
        (Some(since), _) => ago(now, since).max(floor),
        (None, Some(watermark)) => ago(watermark, OVERLAP).max(floor),
        (None, None) => floor,
    };
    // Everything logged before this is judged by this pass; younger
    // deliveries may still be in flight.
    let judged_before = ago(now, settings.min_age);
    let mut report = Report {
        source: source.to_owned(),
        hook: hook.clone(),
        dry_run: options.dry_run,
        ..Report::default()
    };

    // Newest first, page by page, until the cutoff or the log's end.
    let mut logged: Vec<LoggedDelivery> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = api.list(cursor.as_deref()).await?;
        report.pages += 1;
        let reached = page.deliveries.iter().any(|d| d.delivered_at < cutoff);
        logged.extend(
            page.deliveries
                .into_iter()
                .filter(|d| d.delivered_at >= cutoff),
        );
        match page.next {
            Some(next) if !reached && cursor.as_deref() != Some(next.as_str()) => {
                cursor = Some(next);
            }
            _ => break,
        }
    }
    let mut by_guid: BTreeMap<&str, Vec<&LoggedDelivery>> = BTreeMap::new();
    for delivery in &logged {
        by_guid.entry(&delivery.guid).or_default().push(delivery);
    }
    report.scanned = by_guid.len() as u64;

    // The hook id its deliveries carry: named by a repository or
    // organization hook, learned from a delivery's request for an App's.
    let hook_id = match (settings.hook.hook_id(), &progress.hook_id) {
        (Some(id), _) => Some(id.to_string()),
        (None, Some(id)) => Some(id.clone()),
        (None, None) => match logged.iter().max_by_key(|d| d.id) {
            None => None,
            Some(newest) => {
                let request = api.request_of(newest.id).await?;
                let id = request.header("X-GitHub-Hook-ID").ok_or_else(|| {
                    ReconcileError::Api(super::github::ApiError::Unexpected {
                        status: 200,
                        message: "the delivery's request carries no X-GitHub-Hook-ID".to_owned(),
                    })
                })?;
                if !options.dry_run {
                    state::remember_hook_id(&client, source, &hook, &id).await?;
                }
                Some(id)
            }
        },
    };

    let guids: Vec<&str> = by_guid.keys().copied().collect();
    let mut held = std::collections::HashMap::new();
    let mut asked = std::collections::HashMap::new();
    if let Some(hook_id) = &hook_id {
        for chunk in guids.chunks(CHUNK) {
            held.extend(deliveries::held(&client, &target.source, hook_id, chunk).await?);
            asked.extend(state::asked(&client, &hook, chunk).await?);
        }
    }
    let rules = Rules {
        events: &target.events,
        min_age: settings.min_age,
        max_redeliveries: settings.max_redeliveries,
        retention,
    };
    // Counted in the metrics once: only GUIDs judged for the first time
    // (logged after the last watermark) add to the late and unexplained
    // counters; the overlap is judged again without counting again.
    let first_time = |attempts: &[&LoggedDelivery]| {
        progress
            .watermark
            .is_none_or(|w| attempts.iter().any(|d| d.delivered_at >= w))
    };
    let (mut new_late, mut new_unexplained) = (0u64, 0u64);
    let mut redeliver: Vec<(&str, i64, DateTime<Utc>)> = Vec::new();
    for (guid, attempts) in &by_guid {
        let verdict = judge(
            &Attempts(attempts.clone()),
            held.get(*guid).copied(),
            asked.get(*guid).copied(),
            &rules,
            now,
        );
        match verdict {
            Verdict::Redeliver { id } => {
                let at = attempts.iter().map(|d| d.delivered_at).min().unwrap_or(now);
                redeliver.push((guid, id, at));
            }
            Verdict::Late => {
                report.late += 1;
                new_late += u64::from(first_time(attempts));
            }
            Verdict::Unexplained => {
                report.unexplained += 1;
                if first_time(attempts) {
                    new_unexplained += 1;
                    tracing::warn!(
                        source,
                        delivery_id = guid,
                        "GitHub saw a 2xx, but hookinbox holds no row of this delivery"
                    );
                }
            }
            Verdict::Capped => {
                report.capped += 1;
                if first_time(attempts) {
                    tracing::warn!(
                        source,
                        delivery_id = guid,
                        "redelivered the most times allowed; giving up"
                    );
                }
            }
            Verdict::NotTaken | Verdict::Young | Verdict::AskedRecently => report.skipped += 1,
            Verdict::Fine => {}
        }
    }
    // Oldest first: GitHub's order is not promised, but the gap closes in
    // the order it opened.
    redeliver.sort_by_key(|(_, id, at)| (*at, *id));

    if options.dry_run {
        report.would_redeliver = redeliver.iter().map(|(g, _, _)| (*g).to_owned()).collect();
        report.complete = true;
        return Ok(report);
    }

    let mut pace = tokio::time::interval(Duration::from_secs_f64(1.0 / settings.per_second));
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let label = |result: &'static str| {
        metrics::counter!(hookinbox::metrics::RECONCILE_REDELIVERIES, "source" => source.to_owned(), "result" => result)
            .increment(1);
    };
    for (guid, id, _) in &redeliver {
        pace.tick().await;
        // Counted before the request: a crash between the two still
        // counts against the cap.
        state::ask(&client, &hook, guid, source).await?;
        match api.redeliver(*id).await {
            Ok(Redelivery::Accepted) => {
                state::answered(&client, &hook, guid, "accepted").await?;
                report.redelivered += 1;
                label("accepted");
            }
            Ok(Redelivery::Refused(message)) => {
                state::answered(&client, &hook, guid, "refused").await?;
                report.refused += 1;
                label("refused");
                tracing::warn!(source, delivery_id = guid, %message, "GitHub refused the redelivery (422)");
            }
            Err(e) => {
                let _ = state::answered(&client, &hook, guid, "failed").await;
                label("failed");
                return Err(e.into());
            }
        }
    }

    let watermark = options.since.is_none().then_some(judged_before);
    state::completed(
        &client,
        source,
        &hook,
        hook_id.as_deref(),
        watermark,
        &report.counts(),
    )
    .await?;
    let _ = state::forget(&client, FORGET_ASKED_AFTER).await;
    report.complete = true;
    metrics::counter!(hookinbox::metrics::RECONCILE_LATE_ANSWERS, "source" => source.to_owned())
        .increment(new_late);
    metrics::counter!(hookinbox::metrics::RECONCILE_UNEXPLAINED, "source" => source.to_owned())
        .increment(new_unexplained);
    Ok(report)
}
