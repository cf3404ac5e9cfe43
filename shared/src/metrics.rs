//! Prometheus metrics: the names, their help texts, the recorder, and the
//! listener that serves `/metrics` (and, for the worker, `/healthz` and
//! `/readyz`) on `HOOKINBOX_METRICS_LISTEN`.
//!
//! Every name starts `hookinbox_` and uses base units. Labels stay bounded:
//! no delivery ids; `source` only for configured sources (`unknown`
//! otherwise); `event` only once the signature verified.

use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::sync::Arc;

use actix_web::{App, HttpResponse, HttpServer, web};
use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Ingest requests by `source`, `event` and `outcome`.
pub const INGEST_REQUESTS: &str = "hookinbox_ingest_requests_total";
/// Ingest request duration.
pub const INGEST_REQUEST_SECONDS: &str = "hookinbox_ingest_request_duration_seconds";
/// Bytes of request bodies ingest holds now (bounded by
/// `HOOKINBOX_MAX_BUFFERED_BYTES`).
pub const INGEST_BUFFERED_BYTES: &str = "hookinbox_ingest_buffered_bytes";
/// Bodies ingest is receiving and has not verified yet (bounded by
/// `HOOKINBOX_MAX_RECEIVING`).
pub const INGEST_RECEIVING: &str = "hookinbox_ingest_receiving_bodies";
/// Rows per group-commit statement, by `statement` (claim, take,
/// complete): whether batches form.
pub const BATCH_ROWS: &str = "hookinbox_batch_rows";
/// Duration of the claim statement.
pub const CLAIM_SECONDS: &str = "hookinbox_claim_duration_seconds";
/// Time from publish to the broker's confirm.
pub const PUBLISH_CONFIRM_SECONDS: &str = "hookinbox_publish_confirm_duration_seconds";
/// Failed sign-ins to the admin console by `via` (`page`, `api`) and
/// `outcome` (`bad_token`: answered 401; `throttled`: answered 429).
pub const ADMIN_SIGN_IN_FAILURES: &str = "hookinbox_admin_sign_in_failures_total";
/// Signature failures by `source`.
pub const SIGNATURE_FAILURES: &str = "hookinbox_signature_failures_total";
/// Verifications by `source` and secret `position` (rotation).
pub const SECRET_MATCHES: &str = "hookinbox_secret_matches_total";
/// Worker jobs by `outcome`.
pub const JOBS: &str = "hookinbox_jobs_total";
/// Handler run time, one sample per run (a job that falls back from the
/// one-statement path runs twice).
pub const JOB_SECONDS: &str = "hookinbox_job_duration_seconds";
/// Lease renewals.
pub const LEASE_RENEWALS: &str = "hookinbox_lease_renewals_total";
/// Leases found taken by someone else.
pub const LEASES_LOST: &str = "hookinbox_leases_lost_total";
/// Takes that replaced a holder whose lease had expired.
pub const TAKEOVERS: &str = "hookinbox_lease_takeovers_total";
/// Jobs tried on the one-statement path (take and completion in one
/// statement), by `result`: `completed`, or why the full path took over
/// (`handler`, `fenced`, `refused`, `no_answer`).
pub const FUSED: &str = "hookinbox_fused_jobs_total";
/// From the first claim to completion.
pub const END_TO_END_SECONDS: &str = "hookinbox_end_to_end_seconds";
/// Retries published by the scheduler.
pub const RETRIES_PUBLISHED: &str = "hookinbox_retries_published_total";
/// Claims the reaper marked lost.
pub const REAPED: &str = "hookinbox_reaped_total";
/// Deliveries by `state` (processing, completed, retrying, waiting, dead);
/// completed is exact up to `deliveries::EXACT_COMPLETED_UP_TO`, then
/// Postgres's estimate.
pub const DELIVERIES: &str = "hookinbox_deliveries";
/// Age of the oldest processing claim.
pub const OLDEST_PROCESSING_SECONDS: &str = "hookinbox_oldest_processing_age_seconds";
/// How long the oldest due retry the scheduler can republish (its body is
/// parked) has been due.
pub const OLDEST_DUE_RETRY_SECONDS: &str = "hookinbox_oldest_due_retry_age_seconds";
/// Claims with no parked body and no job, reaped `lost` or untaken with
/// their lease run out: only a redelivery from GitHub can finish them (the
/// rule of `deliveries list --status awaiting_redelivery`).
pub const AWAITING_REDELIVERY: &str = "hookinbox_deliveries_awaiting_redelivery";
/// How long since the lease of the oldest of [`AWAITING_REDELIVERY`] ran out.
pub const OLDEST_AWAITING_REDELIVERY_SECONDS: &str =
    "hookinbox_oldest_awaiting_redelivery_age_seconds";
/// Seconds since the start of the oldest transaction in hookinbox's
/// database that holds back vacuum (`postgres::horizon`); 0 when none.
pub const OLDEST_TRANSACTION_SECONDS: &str = "hookinbox_postgres_oldest_transaction_age_seconds";
/// Ready messages by `queue` (work, dlq).
pub const QUEUE_MESSAGES: &str = "hookinbox_queue_messages";
/// Consumers by `queue`.
pub const QUEUE_CONSUMERS: &str = "hookinbox_queue_consumers";
/// Reconciler passes by `source` and `outcome` (complete, incomplete,
/// busy: another worker leads).
pub const RECONCILE_RUNS: &str = "hookinbox_reconcile_runs_total";
/// Redeliveries the reconciler asked for, by `source` and `result`
/// (accepted, refused, failed).
pub const RECONCILE_REDELIVERIES: &str = "hookinbox_reconcile_redeliveries_total";
/// Deliveries GitHub saw fail that hookinbox completed or held (answered
/// too late), by `source`.
pub const RECONCILE_LATE_ANSWERS: &str = "hookinbox_reconcile_late_answers_total";
/// Deliveries GitHub saw succeed that hookinbox holds no row of, by
/// `source`: a data-loss alarm.
pub const RECONCILE_UNEXPLAINED: &str = "hookinbox_reconcile_unexplained_total";
/// Deliveries GitHub logged as throttled (`throttled_at`), by `source`:
/// GitHub held them back for the hook's rate of deliveries.
pub const RECONCILE_THROTTLED: &str = "hookinbox_reconcile_throttled_total";
/// When a reconciler pass of `source` last completed (Unix seconds).
pub const RECONCILE_LAST_SUCCESS: &str = "hookinbox_reconcile_last_success_timestamp_seconds";
/// GitHub's `x-ratelimit-remaining` as the reconciler last saw it, by
/// `source`.
pub const GITHUB_RATE_LIMIT_REMAINING: &str = "hookinbox_github_rate_limit_remaining";
/// 1 on the worker that samples the gauges above, 0 elsewhere.
pub const SAMPLER_LEADER: &str = "hookinbox_sampler_leader";
/// Attempts of each destination's legs, by `source`, `destination` and
/// `result` (`ok`, `transient`, `permanent`, `destination`, `blocked`).
pub const DESTINATION_ATTEMPTS: &str = "hookinbox_destination_attempts_total";
/// Attempts of a `forward` destination refused by the egress policy
/// before anything was sent, by `source`, `destination` and `reason`
/// (`loopback`, `private`, `link_local`, `metadata`, `cgnat`,
/// `unique_local`, `multicast`, `unspecified`, `broadcast`, `reserved`),
/// and redirects not followed (`redirect`).
pub const DESTINATION_BLOCKED: &str = "hookinbox_destination_blocked_total";
/// How long a destination took to answer an attempt, by `source` and
/// `destination`.
pub const DESTINATION_REQUEST_SECONDS: &str = "hookinbox_destination_request_seconds";
/// 1 for a destination's current state (`closed`, `open`, `half_open`,
/// `paused`, `disabled`), 0 for the others, by `source` and `destination`.
pub const DESTINATION_STATE: &str = "hookinbox_destination_state";
/// Legs that waited in a worker, unacked, for their destination to take
/// legs again (breaker open, paused, disabled), by `source` and
/// `destination`; the broker keeps the legs behind them.
pub const DESTINATION_WAITS: &str = "hookinbox_destination_waits_total";
/// Legs waiting for a destination (processing untaken, retrying, held),
/// by `source` and `destination`.
pub const DESTINATION_WAITING: &str = "hookinbox_destination_waiting";
/// Age of a destination's oldest waiting leg, by `source` and
/// `destination`.
pub const DESTINATION_OLDEST_WAITING_SECONDS: &str = "hookinbox_destination_oldest_waiting_seconds";
/// Keys of an ordered destination halted by a leg that failed for good,
/// by `source` and `destination`: their later legs wait for an operator's
/// skip or retry.
pub const ORDERING_HALTED_KEYS: &str = "hookinbox_ordering_halted_keys";
/// How long a leg of an ordered destination waited behind earlier legs of
/// its key, by `source` and `destination`.
pub const ORDERING_WAIT_SECONDS: &str = "hookinbox_ordering_wait_seconds";
/// Legs of a `skip_stale` destination completed without their effect,
/// older than a completed leg of their key, by `source` and `destination`.
pub const LEGS_STALE: &str = "hookinbox_legs_stale_total";
/// New legs of a fair destination that ingest held in Postgres, their
/// installation having its hold of legs queued there.
pub const FAIR_HELD: &str = "hookinbox_fair_held_total";
/// The lease this process gives a claim or a take
/// (`HOOKINBOX_LEASE_SECS`), set at start: the stuck-processing alert's
/// threshold is a multiple of it.
pub const LEASE_SECONDS: &str = "hookinbox_lease_seconds";

/// GitHub's webhook events. `X-GitHub-Event` is not covered by the
/// signature, so only these names become an `event` label; any other is
/// counted as `other`, keeping the label bounded.
const GITHUB_EVENTS: &[&str] = &[
    "branch_protection_configuration",
    "branch_protection_rule",
    "check_run",
    "check_suite",
    "code_scanning_alert",
    "commit_comment",
    "create",
    "custom_property",
    "custom_property_values",
    "delete",
    "dependabot_alert",
    "deploy_key",
    "deployment",
    "deployment_protection_rule",
    "deployment_review",
    "deployment_status",
    "discussion",
    "discussion_comment",
    "fork",
    "github_app_authorization",
    "gollum",
    "installation",
    "installation_repositories",
    "installation_target",
    "issue_comment",
    "issues",
    "label",
    "marketplace_purchase",
    "member",
    "membership",
    "merge_group",
    "meta",
    "milestone",
    "org_block",
    "organization",
    "package",
    "page_build",
    "personal_access_token_request",
    "ping",
    "project",
    "project_card",
    "project_column",
    "projects_v2",
    "projects_v2_item",
    "public",
    "pull_request",
    "pull_request_review",
    "pull_request_review_comment",
    "pull_request_review_thread",
    "push",
    "registry_package",
    "release",
    "repository",
    "repository_advisory",
    "repository_dispatch",
    "repository_import",
    "repository_ruleset",
    "repository_vulnerability_alert",
    "secret_scanning_alert",
    "secret_scanning_alert_location",
    "security_advisory",
    "security_and_analysis",
    "sponsorship",
    "star",
    "status",
    "sub_issues",
    "team",
    "team_add",
    "watch",
    "workflow_dispatch",
    "workflow_job",
    "workflow_run",
];

/// The `event` label for an event name: itself if GitHub sends it, else
/// `other`.
pub fn event_label(event: &str) -> &'static str {
    GITHUB_EVENTS
        .iter()
        .find(|known| **known == event)
        .copied()
        .unwrap_or("other")
}

/// Latency buckets, in seconds, for every histogram.
const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

/// Buckets of [`BATCH_ROWS`], in rows.
const ROW_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// Records the size of a claim batch in [`BATCH_ROWS`].
pub fn claim_batch_rows(rows: usize) {
    metrics::histogram!(BATCH_ROWS, "statement" => "claim").record(rows as f64);
}

/// Records the size of a take batch in [`BATCH_ROWS`].
pub fn take_batch_rows(rows: usize) {
    metrics::histogram!(BATCH_ROWS, "statement" => "take").record(rows as f64);
}

/// Records the size of a batch of body reads (the one-statement path's) in
/// [`BATCH_ROWS`].
pub fn read_batch_rows(rows: usize) {
    metrics::histogram!(BATCH_ROWS, "statement" => "read").record(rows as f64);
}

/// Records the size of a completion batch in [`BATCH_ROWS`].
pub fn complete_batch_rows(rows: usize) {
    metrics::histogram!(BATCH_ROWS, "statement" => "complete").record(rows as f64);
}

/// How often histogram samples are folded into their buckets.
const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Installs the global recorder once per process and describes every
/// series. Later calls return the same handle.
pub fn install() -> PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new();
            let builder = builder
                .set_buckets(BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        metrics_exporter_prometheus::Matcher::Full(BATCH_ROWS.to_owned()),
                        ROW_BUCKETS,
                    )
                })
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // A second recorder (another library installed one) is not fatal:
            // the handle then renders what this recorder saw, which is nothing.
            let _ = metrics::set_global_recorder(recorder);
            describe();
            // Histograms keep every sample until they are folded into their
            // buckets, which rendering does, and so only a scrape would; a
            // recorder built by hand gets no upkeep of its own. Without this
            // thread an unscraped process grows by every sample it records
            // (about 130 bytes a request in ingest: 16.8 MiB to 36.1 MiB in
            // 150 s at 1,000 requests/s).
            let upkeep = handle.clone();
            let spawned = std::thread::Builder::new()
                .name("metrics-upkeep".to_owned())
                .spawn(move || {
                    loop {
                        std::thread::sleep(UPKEEP_INTERVAL);
                        upkeep.run_upkeep();
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "could not start the metrics upkeep thread");
            }
            handle
        })
        .clone()
}

fn describe() {
    describe_counter!(
        INGEST_REQUESTS,
        "Webhook requests by source, event and outcome"
    );
    describe_histogram!(
        INGEST_REQUEST_SECONDS,
        Unit::Seconds,
        "Webhook request duration"
    );
    describe_gauge!(
        INGEST_BUFFERED_BYTES,
        Unit::Bytes,
        "Bytes of request bodies held now"
    );
    describe_gauge!(
        INGEST_RECEIVING,
        Unit::Count,
        "Bodies being received, not yet verified"
    );
    describe_histogram!(CLAIM_SECONDS, Unit::Seconds, "Claim statement duration");
    describe_histogram!(
        BATCH_ROWS,
        Unit::Count,
        "Rows per group-commit statement, by statement"
    );
    describe_histogram!(PUBLISH_CONFIRM_SECONDS, Unit::Seconds, "Publish to confirm");
    describe_counter!(
        SIGNATURE_FAILURES,
        "Requests refused for their signature, by source"
    );
    describe_counter!(
        SECRET_MATCHES,
        "Verifications by source and secret position"
    );
    describe_counter!(JOBS, "Worker jobs by outcome");
    describe_counter!(
        ADMIN_SIGN_IN_FAILURES,
        "Failed sign-ins to the admin console, by way in and outcome"
    );
    describe_histogram!(JOB_SECONDS, Unit::Seconds, "Handler run time");
    describe_counter!(LEASE_RENEWALS, "Lease renewals");
    describe_counter!(LEASES_LOST, "Leases found taken over during a job");
    describe_counter!(
        TAKEOVERS,
        "Takes of deliveries whose holder's lease expired"
    );
    describe_counter!(
        FUSED,
        "Jobs tried with take and completion in one statement, by result"
    );
    describe_histogram!(
        END_TO_END_SECONDS,
        Unit::Seconds,
        "First claim to completion"
    );
    describe_counter!(RETRIES_PUBLISHED, "Retries published by the scheduler");
    describe_counter!(REAPED, "Abandoned claims marked lost");
    describe_gauge!(
        DELIVERIES,
        "Deliveries by state (completed: exact up to 10000, Postgres's estimate past it)"
    );
    describe_gauge!(
        OLDEST_PROCESSING_SECONDS,
        Unit::Seconds,
        "Age of the oldest processing claim"
    );
    describe_gauge!(
        OLDEST_DUE_RETRY_SECONDS,
        Unit::Seconds,
        "How long the oldest due retry with a parked body has waited"
    );
    describe_gauge!(
        AWAITING_REDELIVERY,
        "Claims with no parked body and no job (reaped lost, or untaken with the lease run out): only a redelivery from GitHub finishes them"
    );
    describe_gauge!(
        OLDEST_AWAITING_REDELIVERY_SECONDS,
        Unit::Seconds,
        "How long since the lease of the oldest claim awaiting a redelivery ran out"
    );
    describe_gauge!(
        OLDEST_TRANSACTION_SECONDS,
        Unit::Seconds,
        "Age of the oldest transaction in hookinbox's database holding back vacuum (0 when none)"
    );
    describe_counter!(
        DESTINATION_ATTEMPTS,
        "Attempts of destinations' legs by source, destination and result"
    );
    describe_counter!(
        DESTINATION_WAITS,
        "Legs that waited unacked in a worker while their destination took no legs"
    );
    describe_counter!(
        DESTINATION_BLOCKED,
        "Forward attempts refused by the egress policy (and redirects not followed) by source, destination and reason"
    );
    describe_histogram!(
        DESTINATION_REQUEST_SECONDS,
        Unit::Seconds,
        "How long a destination took over an attempt"
    );
    describe_gauge!(
        DESTINATION_STATE,
        "1 for each destination's current breaker state, 0 for the others"
    );
    describe_gauge!(
        DESTINATION_WAITING,
        "Legs waiting for a destination (untaken, retrying or held)"
    );
    describe_gauge!(
        DESTINATION_OLDEST_WAITING_SECONDS,
        Unit::Seconds,
        "Age of a destination's oldest waiting leg"
    );
    describe_gauge!(
        ORDERING_HALTED_KEYS,
        "Keys of an ordered destination halted by a leg that failed for good"
    );
    describe_counter!(
        LEGS_STALE,
        "Legs of a skip_stale destination completed without their effect, older than a completed leg of their key"
    );
    describe_counter!(
        FAIR_HELD,
        "New legs of a fair destination held in Postgres for their installation's turn"
    );
    describe_histogram!(
        ORDERING_WAIT_SECONDS,
        Unit::Seconds,
        "How long a leg of an ordered destination waited behind its key"
    );
    describe_gauge!(QUEUE_MESSAGES, "Ready messages by queue");
    describe_gauge!(QUEUE_CONSUMERS, "Consumers by queue");
    describe_gauge!(SAMPLER_LEADER, "1 on the worker sampling the state gauges");
    describe_gauge!(
        LEASE_SECONDS,
        Unit::Seconds,
        "The lease of a claim or take (HOOKINBOX_LEASE_SECS)"
    );
    describe_counter!(RECONCILE_RUNS, "Reconciler passes by source and outcome");
    describe_counter!(
        RECONCILE_REDELIVERIES,
        "Redeliveries asked of GitHub by source and result"
    );
    describe_counter!(
        RECONCILE_LATE_ANSWERS,
        "Deliveries GitHub saw fail that hookinbox completed or held"
    );
    describe_counter!(
        RECONCILE_UNEXPLAINED,
        "Deliveries GitHub saw succeed that hookinbox holds no row of"
    );
    describe_counter!(
        RECONCILE_THROTTLED,
        "Deliveries GitHub logged as throttled, by source"
    );
    describe_gauge!(
        RECONCILE_LAST_SUCCESS,
        Unit::Seconds,
        "When a reconciler pass last completed, by source"
    );
    describe_gauge!(
        GITHUB_RATE_LIMIT_REMAINING,
        "GitHub API requests left in the rate-limit window, by source"
    );
}

/// What `/readyz` found: whether this process can do its work now, and
/// the result of each check it ran (reported in the answer's body).
#[derive(Clone, Debug)]
pub struct Ready {
    /// Ready: the probe answers 200, else 503.
    pub ok: bool,
    /// Each check by name, for the answer's body.
    pub checks: Vec<(&'static str, bool)>,
}

/// The readiness check a binary serves at `/readyz`. Each binary has one,
/// served on every listener that answers `/readyz`, so the probe and a
/// person asking get the same answer.
pub type Readiness = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Ready> + Send>> + Send + Sync>;

async fn metrics(handle: web::Data<PrometheusHandle>) -> HttpResponse {
    handle.run_upkeep();
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(handle.render())
}

/// `GET /healthz`: the process is alive.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

/// `GET /readyz`: 200 when the app's [`Readiness`] (its `app_data`) says
/// ready, else 503; the body lists each check.
pub async fn readyz(ready: web::Data<Readiness>) -> HttpResponse {
    let ready = (ready.get_ref())().await;
    let mut body = serde_json::Map::new();
    body.insert(
        "status".to_owned(),
        (if ready.ok { "ok" } else { "error" }).into(),
    );
    for (name, passed) in ready.checks {
        body.insert(name.to_owned(), passed.into());
    }
    if ready.ok {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listen` until the process
/// stops. Returns the bound port (0 picks one).
pub fn serve(
    listen: SocketAddr,
    ready: Readiness,
) -> std::io::Result<(u16, actix_web::dev::Server)> {
    let handle = web::Data::new(install());
    let ready = web::Data::new(ready);
    let listener = TcpListener::bind(listen)?;
    let port = listener.local_addr()?.port();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(handle.clone())
            .app_data(ready.clone())
            .route("/metrics", web::get().to(metrics))
            .route("/healthz", web::get().to(healthz))
            .route("/readyz", web::get().to(readyz))
    })
    .workers(1)
    .disable_signals()
    .listen(listener)?
    .run();
    Ok((port, server))
}

/// Asks this host's metrics listener (the port of `listen`) for `/healthz`
/// and reports whether it answered 200. Container health checks run it
/// (`hookinbox-ingest healthcheck`): the runtime image carries no HTTP
/// client.
pub fn healthcheck(listen: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let addr = SocketAddr::from(([127, 0, 0, 1], listen.port()));
    let timeout = std::time::Duration::from_secs(2);
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    if stream
        .write_all(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") && &head[9..12] == b"200"
}

#[cfg(test)]
mod tests {
    #[test]
    fn event_labels_are_bounded() {
        assert_eq!(super::event_label("push"), "push");
        assert_eq!(
            super::event_label("pull_request_review_thread"),
            "pull_request_review_thread"
        );
        assert_eq!(super::event_label("made_up_event_1234"), "other");
    }
}
