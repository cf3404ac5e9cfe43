//! One pass over one source: walk GitHub's delivery log back to the
//! watermark minus an overlap, group the attempts by GUID, judge each
//! against what hookinbox holds, and ask GitHub to redeliver what it never
//! durably took.
//!
//! Two walks: most passes ask GitHub for the failed deliveries only
//! (`status=failure`), which is all a redelivery or a late answer needs;
//! every `full_every` a pass walks the whole log, successes too, since
//! only those can show a delivery GitHub saw succeed and hookinbox holds
//! no row of (`unexplained`). Each walk has its own watermark.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use hookinbox::config::{ReconcileTarget, WorkerConfig};
use hookinbox::deliveries;
use hookinbox::postgres::DbError;
use hookinbox::telemetry::{self, SpanTrace};
use serde::Serialize;
use tracing::Instrument;

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
    /// Walk the whole log whatever `full_every` says.
    pub full: bool,
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
    /// GUIDs GitHub logged as throttled (`throttled_at`): held back for the
    /// hook's rate of deliveries.
    pub throttled: u64,
    /// The walk: `failures` (`status=failure`) or `full` (the whole log).
    pub walk: &'static str,
    /// Requests sent to GitHub's API in this pass.
    pub api_requests: u64,
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
            "refused": self.refused, "pages": self.pages, "throttled": self.throttled,
            "walk": self.walk, "api_requests": self.api_requests,
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

/// Runs one pass with `config`'s retention and hosts file, in its steps:
/// walk GitHub's log back to the cutoff,
/// group the attempts by GUID, learn the hook id they carry, judge each
/// GUID against what hookinbox holds, ask GitHub to redeliver (unless a
/// dry run), and record the pass. The caller holds the source's leader
/// lock.
pub(crate) async fn pass(
    pool: &Pool,
    target: &ReconcileTarget,
    config: &WorkerConfig,
    options: &PassOptions,
) -> Result<Report, ReconcileError> {
    let retention = config.retention.completed;
    let hosts_file = config.github_api_hosts_file.clone();
    let mut pass = Pass::start(pool, target, hosts_file, options).await?;
    let logged = pass.walk_log().await?;
    let by_guid = group(&logged);
    pass.report.scanned = by_guid.len() as u64;
    let hook_id = pass.hook_id(&logged).await?;
    let judged = pass.judge(&by_guid, hook_id.as_deref(), retention).await?;
    if options.dry_run {
        return Ok(pass.dry_run(&judged));
    }
    pass.redeliver(&judged).await?;
    pass.record(hook_id.as_deref(), &judged).await
}

/// One pass under way: what every step reads, and the report they fill.
struct Pass<'a> {
    target: &'a ReconcileTarget,
    options: &'a PassOptions,
    source: &'a str,
    /// The hook, as the reconciler's tables name it.
    hook: String,
    api: Api,
    client: deadpool_postgres::Object,
    /// The last pass of this hook: its watermark and the hook id learned.
    progress: state::Progress,
    /// Whether this pass walks the whole log (else the failures only).
    full: bool,
    now: DateTime<Utc>,
    report: Report,
}

/// The span of one redelivery request, when traces are on: its source and
/// GUID, never a URL or a credential. Its `traceparent` is kept with the
/// ask, so that ingest's span of the redelivered request links to it. A
/// disabled span otherwise.
fn redeliver_span(source: &str, guid: &str) -> tracing::Span {
    if !telemetry::enabled() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "redeliver",
        otel.name = "reconcile.redeliver",
        otel.kind = "client",
        source,
        delivery_id = guid,
        result = tracing::field::Empty,
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
    );
    span.record_ids();
    span
}

/// What the judging found to do.
struct Judged<'l> {
    /// GUIDs to redeliver, each with the id of the attempt to send again
    /// and when GitHub first tried it; oldest first.
    redeliver: Vec<(&'l str, i64, DateTime<Utc>)>,
    /// Late answers, unexplained and throttled deliveries judged for the
    /// first time, for the metrics.
    new_late: u64,
    new_unexplained: u64,
    new_throttled: u64,
}

/// The log's attempts by GUID.
fn group(logged: &[LoggedDelivery]) -> BTreeMap<&str, Vec<&LoggedDelivery>> {
    let mut by_guid: BTreeMap<&str, Vec<&LoggedDelivery>> = BTreeMap::new();
    for delivery in logged {
        by_guid.entry(&delivery.guid).or_default().push(delivery);
    }
    by_guid
}

impl<'a> Pass<'a> {
    /// The client of GitHub's API, a Postgres session, and the last pass.
    async fn start(
        pool: &Pool,
        target: &'a ReconcileTarget,
        hosts_file: Option<PathBuf>,
        options: &'a PassOptions,
    ) -> Result<Self, ReconcileError> {
        let settings = &target.settings;
        let source = target.source.as_str();
        let hook = settings.hook.to_string();
        let api = Api::new(
            settings.api_url.clone(),
            settings.hook.clone(),
            settings.auth.clone(),
            source,
            options.max_wait,
            hosts_file,
        )?;
        let client = pool.get().await.map_err(DbError::from)?;
        let progress = state::progress(&client, source)
            .await?
            .filter(|p| p.hook == hook)
            .unwrap_or_default();
        let now = Utc::now();
        let full = options.full
            || settings.full_every.is_zero()
            || progress
                .full_watermark
                .is_none_or(|w| (now - w).to_std().unwrap_or_default() >= settings.full_every);
        Ok(Self {
            target,
            options,
            source,
            report: Report {
                source: source.to_owned(),
                hook: hook.clone(),
                dry_run: options.dry_run,
                walk: if full { "full" } else { "failures" },
                ..Report::default()
            },
            hook,
            api,
            client,
            progress,
            full,
            now,
        })
    }

    /// GitHub's log, newest first, page by page, back to the cutoff (the
    /// watermark minus the overlap, or `--since`; never past the log's
    /// window) or the log's end.
    async fn walk_log(&mut self) -> Result<Vec<LoggedDelivery>, ReconcileError> {
        let floor = ago(self.now, log_window(&self.target.settings.api_url));
        let watermark = if self.full {
            self.progress.full_watermark
        } else {
            self.progress.watermark
        };
        let cutoff = match (self.options.since, watermark) {
            (Some(since), _) => ago(self.now, since).max(floor),
            (None, Some(watermark)) => ago(watermark, OVERLAP).max(floor),
            (None, None) => floor,
        };
        let mut logged: Vec<LoggedDelivery> = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = self.api.list(cursor.as_deref(), !self.full).await?;
            self.report.pages += 1;
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
        Ok(logged)
    }

    /// The hook id its deliveries carry: named by a repository or
    /// organization hook, learned from a delivery's request for an App's
    /// (and remembered, unless a dry run).
    async fn hook_id(&self, logged: &[LoggedDelivery]) -> Result<Option<String>, ReconcileError> {
        if let Some(id) = self.target.settings.hook.hook_id() {
            return Ok(Some(id.to_string()));
        }
        if let Some(id) = &self.progress.hook_id {
            return Ok(Some(id.clone()));
        }
        let Some(newest) = logged.iter().max_by_key(|d| d.id) else {
            return Ok(None);
        };
        let request = self.api.request_of(newest.id).await?;
        let id = request.header("X-GitHub-Hook-ID").ok_or_else(|| {
            ReconcileError::Api(super::github::ApiError::Unexpected {
                status: 200,
                message: "the delivery's request carries no X-GitHub-Hook-ID".to_owned(),
            })
        })?;
        if !self.options.dry_run {
            state::remember_hook_id(&self.client, self.source, &self.hook, &id).await?;
        }
        Ok(Some(id))
    }

    /// Judges each GUID against what hookinbox holds of it and the
    /// redeliveries already asked, counting the verdicts in the report.
    async fn judge<'l>(
        &mut self,
        by_guid: &BTreeMap<&'l str, Vec<&'l LoggedDelivery>>,
        hook_id: Option<&str>,
        retention: Duration,
    ) -> Result<Judged<'l>, ReconcileError> {
        let guids: Vec<&str> = by_guid.keys().copied().collect();
        let mut held = std::collections::HashMap::new();
        let mut asked = std::collections::HashMap::new();
        if let Some(hook_id) = hook_id {
            for chunk in guids.chunks(CHUNK) {
                held.extend(
                    deliveries::held(&self.client, &self.target.source, hook_id, chunk).await?,
                );
                asked.extend(state::asked(&self.client, &self.hook, chunk).await?);
            }
        }
        let settings = &self.target.settings;
        let rules = Rules {
            events: &self.target.events,
            min_age: settings.min_age,
            max_redeliveries: settings.max_redeliveries,
            retention,
        };
        // Counted in the metrics once: only GUIDs judged for the first time
        // (logged after the last watermark) add to the late and unexplained
        // counters; the overlap is judged again without counting again.
        let (watermark, full_watermark) = (self.progress.watermark, self.progress.full_watermark);
        let after = |mark: Option<DateTime<Utc>>, attempts: &[&LoggedDelivery]| {
            mark.is_none_or(|w| attempts.iter().any(|d| d.delivered_at >= w))
        };
        let first_time = |attempts: &[&LoggedDelivery]| after(watermark, attempts);
        // Successes are judged by the whole-log walks only, against theirs.
        let first_time_full = |attempts: &[&LoggedDelivery]| after(full_watermark, attempts);
        let source = self.source;
        let report = &mut self.report;
        let mut judged = Judged {
            redeliver: Vec::new(),
            new_late: 0,
            new_unexplained: 0,
            new_throttled: 0,
        };
        for (guid, attempts) in by_guid {
            // Its own count, whatever the verdict: GitHub held it back.
            if attempts.iter().any(|d| d.throttled_at.is_some()) {
                report.throttled += 1;
                let first = if self.full {
                    first_time_full(attempts)
                } else {
                    first_time(attempts)
                };
                judged.new_throttled += u64::from(first);
            }
            let verdict = judge(
                &Attempts(attempts.clone()),
                held.get(*guid).copied(),
                asked.get(*guid).copied(),
                &rules,
                self.now,
            );
            match verdict {
                Verdict::Redeliver { id } => {
                    let at = attempts
                        .iter()
                        .map(|d| d.delivered_at)
                        .min()
                        .unwrap_or(self.now);
                    judged.redeliver.push((guid, id, at));
                }
                Verdict::Late => {
                    report.late += 1;
                    judged.new_late += u64::from(first_time(attempts));
                }
                Verdict::Unexplained => {
                    report.unexplained += 1;
                    if first_time_full(attempts) {
                        judged.new_unexplained += 1;
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
        judged.redeliver.sort_by_key(|(_, id, at)| (*at, *id));
        Ok(judged)
    }

    /// A dry run's report: what it would redeliver; nothing changed.
    fn dry_run(mut self, judged: &Judged<'_>) -> Report {
        self.report.api_requests = self.api.requests();
        self.report.would_redeliver = judged
            .redeliver
            .iter()
            .map(|(g, _, _)| (*g).to_owned())
            .collect();
        self.report.complete = true;
        self.report
    }

    /// Asks GitHub to redeliver each, at the source's pace, counting each
    /// ask before its request and recording GitHub's answer.
    async fn redeliver(&mut self, judged: &Judged<'_>) -> Result<(), ReconcileError> {
        let source = self.source;
        let per_second = self.target.settings.per_second;
        let mut pace = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let label = |result: &'static str| {
            metrics::counter!(hookinbox::metrics::RECONCILE_REDELIVERIES, "source" => source.to_owned(), "result" => result)
                .increment(1);
        };
        for (guid, id, _) in &judged.redeliver {
            pace.tick().await;
            let span = redeliver_span(source, guid);
            // Counted before the request: a crash between the two still
            // counts against the cap.
            state::ask(
                &self.client,
                &self.hook,
                guid,
                source,
                span.traceparent().as_deref(),
            )
            .instrument(span.clone())
            .await?;
            let answer = self.api.redeliver(*id).instrument(span.clone()).await;
            let result = match answer {
                Ok(Redelivery::Accepted) => {
                    state::answered(&self.client, &self.hook, guid, "accepted").await?;
                    self.report.redelivered += 1;
                    "accepted"
                }
                Ok(Redelivery::Refused(message)) => {
                    state::answered(&self.client, &self.hook, guid, "refused").await?;
                    self.report.refused += 1;
                    tracing::warn!(source, delivery_id = guid, %message, "GitHub refused the redelivery (422)");
                    "refused"
                }
                Err(e) => {
                    let _ = state::answered(&self.client, &self.hook, guid, "failed").await;
                    label("failed");
                    span.record("result", "failed");
                    return Err(e.into());
                }
            };
            label(result);
            span.record("result", result);
        }
        Ok(())
    }

    /// Records the completed pass: its counts, the hook id, and the new
    /// watermark (not for a `--since` pass); forgets old asks; counts the
    /// late and unexplained deliveries judged for the first time.
    async fn record(
        mut self,
        hook_id: Option<&str>,
        judged: &Judged<'_>,
    ) -> Result<Report, ReconcileError> {
        // Everything logged before this was judged by this pass; younger
        // deliveries may still be in flight.
        let judged_before = ago(self.now, self.target.settings.min_age);
        let watermark = self.options.since.is_none().then_some(judged_before);
        // A whole-log walk judged the failures too.
        let full_watermark = watermark.filter(|_| self.full);
        self.report.api_requests = self.api.requests();
        state::completed(
            &self.client,
            self.source,
            &self.hook,
            hook_id,
            watermark,
            full_watermark,
            &self.report.counts(),
        )
        .await?;
        let _ = state::forget(&self.client, FORGET_ASKED_AFTER).await;
        self.report.complete = true;
        let source = self.source.to_owned();
        metrics::counter!(hookinbox::metrics::RECONCILE_LATE_ANSWERS, "source" => source.clone())
            .increment(judged.new_late);
        metrics::counter!(hookinbox::metrics::RECONCILE_UNEXPLAINED, "source" => source.clone())
            .increment(judged.new_unexplained);
        metrics::counter!(hookinbox::metrics::RECONCILE_THROTTLED, "source" => source)
            .increment(judged.new_throttled);
        Ok(self.report)
    }
}
