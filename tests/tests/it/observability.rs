//! Metrics and logs of the real binaries.

use std::time::Duration;

use hookinbox::deliveries;
use hookinbox_tests::receiver::{Receiver, Reply};
use hookinbox_tests::{Hook, SECRET, TestEnv, fixtures, wait_until, worker_cli};

/// The value of a series (summed over label sets) in a scrape, if present.
fn value(scrape: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in scrape.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, v)) = line.rsplit_once(' ') else {
            continue;
        };
        let metric = series.split('{').next().unwrap_or("");
        if metric != name {
            continue;
        }
        if labels
            .iter()
            .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
        {
            *found.get_or_insert(0.0) += v.parse::<f64>().unwrap_or(0.0);
        }
    }
    found
}

#[tokio::test]
async fn both_metrics_endpoints_show_every_series_moving_after_real_traffic() {
    let env = TestEnv::new().await;
    let ingest = env.spawn(
        "hookinbox-ingest",
        &[
            ("HOOKINBOX_GITHUB_SECRET", SECRET),
            ("HOOKINBOX_PUBLISH_TIMEOUT_MS", "1000"),
            // As the worker below: the default source's destination is
            // `forward`.
            ("HOOKINBOX_HANDLER", "forward"),
        ],
    );
    let base = format!("http://127.0.0.1:{}", ingest.port);
    ingest.wait_ready().await;
    let http = reqwest::Client::new();
    let send = |hook: Hook| {
        let http = http.clone();
        let base = base.clone();
        async move {
            let mut req = http
                .post(format!("{base}{}", hook.path))
                .header("content-type", &hook.content_type)
                .body(hook.body.clone());
            for (k, v) in [
                ("x-github-event", hook.event.clone()),
                ("x-github-delivery", hook.delivery.clone()),
                ("x-github-hook-id", hook.hook_id.clone()),
                ("x-hub-signature-256", hook.signature.clone()),
            ] {
                if let Some(v) = v {
                    req = req.header(k, v);
                }
            }
            req.send().await.expect("answer").status().as_u16()
        }
    };

    let normal = Hook::fixture("push");
    let flaky = Hook::fixture("push");
    let bad = Hook::fixture("push");
    let slow = Hook::fixture("push");
    let (flaky_id, bad_id, slow_id) = (
        flaky.id().to_owned(),
        bad.id().to_owned(),
        slow.id().to_owned(),
    );
    let receiver = Receiver::start(move |req, seen| {
        let id = req.header("x-github-delivery").unwrap_or("");
        if id == flaky_id && seen == 0 {
            Reply::status(503)
        } else if id == bad_id {
            Reply::status(400)
        } else if id == slow_id && seen == 0 {
            // Hangs: its worker is fenced by the heartbeat, not the reply.
            Reply {
                delay: Duration::from_secs(60),
                ..Reply::status(200)
            }
        } else {
            Reply::status(200)
        }
    })
    .await;

    for hook in [&normal, &flaky, &bad, &slow] {
        assert_eq!(send(hook.clone()).await, 202);
    }
    assert_eq!(
        send(normal.clone()).await,
        202,
        "duplicate while processing"
    );
    assert_eq!(send(normal.clone().signed_with("wrong")).await, 401);
    assert_eq!(send(Hook::fixture("ping")).await, 200);
    // The slow delivery's claim is older than the publish timeout and still
    // untaken: its redelivery republishes it (a second copy).
    wait_until("the slow claim to age", Duration::from_secs(10), || async {
        env.count("select count(*) from deliveries where claimed_at < now() - interval '1100 milliseconds'").await == 4
    })
    .await;
    assert_eq!(send(slow.clone()).await, 202);

    let worker_env = [
        ("HOOKINBOX_HANDLER", "forward"),
        ("HOOKINBOX_FORWARD_URL", receiver.url.as_str()),
        ("HOOKINBOX_LEASE_SECS", "3"),
        ("HOOKINBOX_FORWARD_TIMEOUT_MS", "60000"),
        ("HOOKINBOX_CONCURRENCY", "1"),
        ("HOOKINBOX_RETRY_BASE_MS", "100"),
        ("HOOKINBOX_RETRY_MAX_MS", "500"),
        ("HOOKINBOX_SCHEDULER_INTERVAL_MS", "50"),
    ];
    // Worker A takes the first copy of the slow delivery and waits on the
    // receiver; worker B gets the second copy, which is deferred.
    let a = env.spawn("hookinbox-worker", &worker_env);
    wait_until(
        "the slow delivery to reach the receiver",
        Duration::from_secs(30),
        || async {
            receiver
                .received()
                .iter()
                .any(|r| r.header("x-github-delivery") == Some(slow.id()))
        },
    )
    .await;
    let b = env.spawn("hookinbox-worker", &worker_env);
    wait_until(
        "worker B to defer the second copy",
        Duration::from_secs(30),
        || async {
            value(
                &b.scrape("/metrics").await.1,
                "hookinbox_jobs_total",
                &[("outcome", "deferred")],
            )
            .is_some()
        },
    )
    .await;
    wait_until("A to renew its lease", Duration::from_secs(30), || async {
        value(
            &a.scrape("/metrics").await.1,
            "hookinbox_lease_renewals_total",
            &[],
        )
        .is_some()
    })
    .await;
    // A stalls past its lease; B takes the delivery over and finishes it.
    let pid_a = a.child.id().expect("pid").to_string();
    let signal = |sig: &str| {
        assert!(
            std::process::Command::new("kill")
                .args([sig, &pid_a])
                .status()
                .expect("kill")
                .success()
        );
    };
    signal("-STOP");
    env.db
        .execute(
            "update deliveries set lease_until = now() - interval '1 second' where delivery_id = $1",
            &[&slow.id()],
        )
        .await
        .expect("lapse");
    wait_until(
        "B to complete the slow delivery",
        Duration::from_secs(30),
        || async {
            env.count(&format!(
                "select count(*) from deliveries where delivery_id = '{}' and status = 'completed'",
                slow.id()
            ))
            .await
                == 1
        },
    )
    .await;
    signal("-CONT");
    wait_until(
        "A to find its lease lost and be fenced",
        Duration::from_secs(30),
        || async {
            value(
                &a.scrape("/metrics").await.1,
                "hookinbox_jobs_total",
                &[("outcome", "fenced")],
            )
            .is_some()
        },
    )
    .await;
    wait_until("every delivery to settle", Duration::from_secs(60), || async {
        env.count(
            "select count(*) from deliveries where status = 'completed' or (status = 'failed' and not retryable)",
        )
        .await
            == 4
    })
    .await;
    assert_eq!(
        send(normal.clone()).await,
        200,
        "duplicate of a completed delivery"
    );

    let (status, ingest_metrics) = ingest.scrape("/metrics").await;
    assert_eq!(status, 200);
    for (name, labels) in [
        (
            "hookinbox_ingest_requests_total",
            vec![("outcome", "accepted")],
        ),
        (
            "hookinbox_ingest_requests_total",
            vec![("outcome", "duplicate")],
        ),
        (
            "hookinbox_ingest_requests_total",
            vec![("outcome", "republished")],
        ),
        ("hookinbox_ingest_requests_total", vec![("outcome", "pong")]),
        (
            "hookinbox_ingest_requests_total",
            vec![("outcome", "bad_signature"), ("source", "default")],
        ),
        ("hookinbox_ingest_request_duration_seconds_count", vec![]),
        ("hookinbox_claim_duration_seconds_count", vec![]),
        ("hookinbox_publish_confirm_duration_seconds_count", vec![]),
        (
            "hookinbox_signature_failures_total",
            vec![("source", "default")],
        ),
        (
            "hookinbox_secret_matches_total",
            vec![("source", "default"), ("position", "0")],
        ),
    ] {
        let v = value(&ingest_metrics, name, &labels);
        assert!(
            v.is_some_and(|v| v > 0.0),
            "ingest {name} {labels:?}: {v:?}\n{ingest_metrics}"
        );
    }

    // The state gauges are sampled every 10 s by one leader.
    wait_until(
        "a worker to sample its gauges",
        Duration::from_secs(30),
        || async {
            let scrape = format!(
                "{}\n{}",
                a.scrape("/metrics").await.1,
                b.scrape("/metrics").await.1
            );
            value(&scrape, "hookinbox_deliveries", &[("state", "completed")])
                .is_some_and(|v| v >= 3.0)
        },
    )
    .await;
    // Both workers' series, summed.
    let worker_metrics = format!(
        "{}\n{}",
        a.scrape("/metrics").await.1,
        b.scrape("/metrics").await.1
    );
    for (name, labels) in [
        ("hookinbox_jobs_total", vec![("outcome", "completed")]),
        ("hookinbox_jobs_total", vec![("outcome", "fenced")]),
        ("hookinbox_jobs_total", vec![("outcome", "retried")]),
        ("hookinbox_jobs_total", vec![("outcome", "dead_lettered")]),
        ("hookinbox_jobs_total", vec![("outcome", "deferred")]),
        ("hookinbox_job_duration_seconds_count", vec![]),
        ("hookinbox_lease_renewals_total", vec![]),
        ("hookinbox_lease_takeovers_total", vec![]),
        ("hookinbox_end_to_end_seconds_count", vec![]),
        ("hookinbox_retries_published_total", vec![]),
        ("hookinbox_deliveries", vec![("state", "completed")]),
        ("hookinbox_deliveries", vec![("state", "dead")]),
        ("hookinbox_sampler_leader", vec![]),
        ("hookinbox_leases_lost_total", vec![]),
        ("hookinbox_queue_consumers", vec![("queue", "work")]),
    ] {
        let v = value(&worker_metrics, name, &labels);
        assert!(
            v.is_some_and(|v| v > 0.0),
            "worker {name} {labels:?}: {v:?}\n{worker_metrics}"
        );
    }
    for name in [
        "hookinbox_oldest_processing_age_seconds",
        "hookinbox_oldest_due_retry_age_seconds",
        "hookinbox_queue_messages",
    ] {
        assert!(worker_metrics.contains(name), "worker {name} is exported");
    }
    assert_eq!(b.scrape("/healthz").await.0, 200);
    assert_eq!(b.scrape("/readyz").await.0, 200);
    assert_eq!(ingest.scrape("/healthz").await.0, 200);
    // The container health check asks the same listener.
    for (binary, port) in [
        ("hookinbox-ingest", ingest.metrics_port),
        ("hookinbox-worker", b.metrics_port),
    ] {
        let status = std::process::Command::new(hookinbox_tests::bin(binary))
            .arg("healthcheck")
            .env_clear()
            .env("HOOKINBOX_METRICS_LISTEN", format!("127.0.0.1:{port}"))
            .status()
            .expect("runs");
        assert!(status.success(), "{binary} healthcheck");
    }
    let dead = std::process::Command::new(hookinbox_tests::bin("hookinbox-worker"))
        .arg("healthcheck")
        .env_clear()
        .env(
            "HOOKINBOX_METRICS_LISTEN",
            format!("127.0.0.1:{}", hookinbox_tests::free_port()),
        )
        .status()
        .expect("runs");
    assert!(!dead.success(), "nothing listening is unhealthy");
    env.cleanup().await;
}

/// Distinctive fragments of a payload: its longer string values, except
/// bare identifiers (event and action names are logged on purpose).
fn fragments(body: &[u8]) -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::String(s)
                if s.len() >= 24 && !s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') =>
            {
                out.push(s.clone())
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            serde_json::Value::Object(o) => o.values().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        walk(&v, &mut out);
    }
    out.truncate(8);
    out
}

#[tokio::test]
async fn logs_never_carry_the_secret_the_signature_or_the_payload() {
    let env = TestEnv::new().await;
    let verbose = [
        ("RUST_LOG", "debug,hookinbox=trace"),
        ("HOOKINBOX_GITHUB_SECRET", SECRET),
    ];
    let ingest = env.spawn("hookinbox-ingest", &verbose);
    let worker = env.spawn("hookinbox-worker", &[("RUST_LOG", "debug,hookinbox=trace")]);
    let base = format!("http://127.0.0.1:{}", ingest.port);
    ingest.wait_ready().await;
    let http = reqwest::Client::new();
    let mut signatures = Vec::new();
    let mut payload_bits = Vec::new();
    let all = fixtures::all();
    for fixture in &all {
        let hook = Hook::new(&fixture.event, fixture.body.clone());
        let signature = hook.signature.clone().expect("signed");
        let status = http
            .post(format!("{base}/webhooks/github"))
            .header("content-type", "application/json")
            .header("x-github-event", &fixture.event)
            .header("x-github-delivery", hook.id())
            .header("x-hub-signature-256", &signature)
            .body(fixture.body.clone())
            .send()
            .await
            .expect("answer")
            .status();
        assert!(status.is_success());
        // A bad signature is logged as refused; its value must not be.
        let wrong = hookinbox_tests::sign("wrong", &fixture.body);
        let refused = http
            .post(format!("{base}/webhooks/github"))
            .header("content-type", "application/json")
            .header("x-github-event", &fixture.event)
            .header("x-github-delivery", hook.id())
            .header("x-hub-signature-256", &wrong)
            .body(fixture.body.clone())
            .send()
            .await
            .expect("answer")
            .status();
        assert_eq!(refused.as_u16(), 401);
        if fixture.event != "ping" {
            // A replay under a fresh delivery id is refused and logged; its
            // log line carries no payload either.
            let replay = http
                .post(format!("{base}/webhooks/github"))
                .header("content-type", "application/json")
                .header("x-github-event", &fixture.event)
                .header("x-github-delivery", uuid::Uuid::new_v4().to_string())
                .header("x-hub-signature-256", &signature)
                .body(fixture.body.clone())
                .send()
                .await
                .expect("answer")
                .status();
            assert_eq!(replay.as_u16(), 409);
        }
        signatures.push(signature);
        signatures.push(wrong);
        payload_bits.extend(fragments(&fixture.body));
    }
    let expected = all.iter().filter(|f| f.event != "ping").count() as i64;
    wait_until(
        "every delivery to complete",
        Duration::from_secs(120),
        || async { env.events().await == expected },
    )
    .await;
    let logs = format!("{}\n{}", ingest.logs(), worker.logs());
    assert!(
        logs.contains("webhook answered")
            && logs.contains("job done")
            && logs.contains("replayed_body"),
        "logs were captured"
    );
    assert!(!logs.contains(SECRET), "the secret is never logged");
    for signature in &signatures {
        let hex = signature.trim_start_matches("sha256=");
        assert!(!logs.contains(hex), "a signature value was logged");
    }
    let leaked: Vec<_> = payload_bits
        .iter()
        .filter(|b| logs.contains(b.as_str()))
        .collect();
    assert!(
        leaked.is_empty(),
        "payload fragments in the logs: {leaked:?}"
    );
    assert!(payload_bits.len() > 10, "the check looked for something");
    env.cleanup().await;
}

/// Inserts a delivery of `hook` (default source) as the state machine
/// leaves it: `status`, claimed `claimed_ago` seconds ago, its lease ending
/// `lease_in` seconds from now (negative: expired), failed `failed_ago`
/// seconds ago with `class`, due `due_in` seconds from now, and its body
/// parked if `parked`.
#[allow(clippy::too_many_arguments)]
async fn insert_delivery(
    env: &TestEnv,
    hook: &Hook,
    status: &str,
    retryable: bool,
    attempts: i32,
    claimed_ago: f64,
    lease_in: Option<f64>,
    failure: Option<(&str, f64, f64)>,
    parked: bool,
) {
    let (class, failed_ago, due_in) = match failure {
        Some((class, failed_ago, due_in)) => (Some(class), Some(failed_ago), Some(due_in)),
        None => (None, None, None),
    };
    env.db
        .execute(
            "insert into deliveries (provider, source, hook_id, delivery_id, event, body_sha256,
                 status, retryable, claim_token, lease_until, claimed_at, created_at, attempts,
                 failed_at, first_failed_at, last_error_class, last_error, next_attempt_at)
             select 'github', 'default', $1, $2, $3, sha256($4), $5, $6, gen_random_uuid(),
                 now() + make_interval(secs => $7), t, t, $8,
                 now() - make_interval(secs => $9), now() - make_interval(secs => $9),
                 $10, case when $10::text is not null then 'inserted by the test' end,
                 now() + make_interval(secs => $11)
             from (select now() - make_interval(secs => $12) as t) at",
            &[
                &hook.hook_id.as_deref().expect("hook id"),
                &hook.id(),
                &hook.event.as_deref().expect("event"),
                &hook.body,
                &status,
                &retryable,
                &lease_in,
                &attempts,
                &failed_ago,
                &class,
                &due_in,
                &claimed_ago,
            ],
        )
        .await
        .expect("insert delivery");
    if parked {
        env.db
            .execute(
                "insert into bodies (provider, source, hook_id, delivery_id, received_at,
                                     content_type, headers, size, encoding, body)
                 select 'github', 'default', $1, $2, d.created_at, 'application/json',
                        jsonb_build_array(jsonb_build_array('x-github-event', $3::text),
                                          jsonb_build_array('x-github-delivery', $2::text)),
                        length($4::bytea), 'identity', $4::bytea
                 from deliveries d where d.hook_id = $1 and d.delivery_id = $2 limit 1",
                &[
                    &hook.hook_id.as_deref().expect("hook id"),
                    &hook.id(),
                    &hook.event.as_deref().expect("event"),
                    &hook.body,
                ],
            )
            .await
            .expect("park body");
    }
}

/// Asserts that `got` lies in `[at_least, at_least + slack]`: an age read
/// some seconds after the rows were written.
fn assert_age(name: &str, got: Option<f64>, at_least: f64, scrape: &str) {
    let slack = 30.0;
    assert!(
        got.is_some_and(|v| v >= at_least && v <= at_least + slack),
        "{name}: {got:?}, expected {at_least}..{}\n{scrape}",
        at_least + slack
    );
}

/// The state gauges by value, as a real worker exports them: stuck
/// processing, a due retry the scheduler cannot get to, and a claim the
/// reaper marked `lost` that only a redelivery from GitHub can finish.
/// Once each is resolved, the gauges go back to zero.
#[tokio::test]
async fn stuck_work_gauges_report_their_counts_and_ages_and_clear_once_resolved() {
    let env = TestEnv::new().await;
    // A claim taken by a worker that died: its lease ran out 340 s ago,
    // not yet long enough for the reaper (600 s past the lease).
    let stuck = Hook::fixture("push");
    insert_delivery(
        &env,
        &stuck,
        "processing",
        false,
        1,
        400.0,
        Some(-340.0),
        None,
        false,
    )
    .await;
    // A transient failure due 120 s ago, its body parked.
    let retry = Hook::fixture("push");
    insert_delivery(
        &env,
        &retry,
        "failed",
        true,
        1,
        200.0,
        None,
        Some(("transient", 180.0, -120.0)),
        true,
    )
    .await;
    // An untaken claim whose ingest died before publishing: reaped `lost`
    // 300 s ago (due at once, as the reaper leaves it), nothing parked.
    let lost = Hook::fixture("push");
    insert_delivery(
        &env,
        &lost,
        "failed",
        true,
        0,
        1000.0,
        Some(-940.0),
        Some(("lost", 300.0, -300.0)),
        false,
    )
    .await;
    // The scheduler passes over a row locked elsewhere (`skip locked`):
    // holding the retry's lock keeps it due, as a scheduler that cannot
    // keep up would leave it.
    let locker = hookinbox_tests::connect(&env.database_url).await;
    locker.batch_execute("begin").await.expect("begin");
    locker
        .execute(
            "select 1 from deliveries where delivery_id = $1 for update",
            &[&retry.id()],
        )
        .await
        .expect("lock the retry");

    let worker = env.spawn("hookinbox-worker", &[("HOOKINBOX_LEASE_SECS", "60")]);
    wait_until(
        "the sampler's first sample",
        Duration::from_secs(30),
        || async {
            let scrape = worker.scrape("/metrics").await.1;
            value(&scrape, "hookinbox_sampler_leader", &[]) == Some(1.0)
                && value(&scrape, "hookinbox_deliveries", &[("state", "processing")]).is_some()
        },
    )
    .await;
    // Nothing changes the rows meanwhile: a later sample says the same.
    let scrape = worker.scrape("/metrics").await.1;
    // Each row in one state: the lost claim with nothing parked is
    // awaiting a redelivery, not retrying.
    for (state, n) in [
        ("processing", 1.0),
        ("retrying", 1.0),
        ("waiting", 0.0),
        ("completed", 0.0),
        ("dead", 0.0),
    ] {
        assert_eq!(
            value(&scrape, "hookinbox_deliveries", &[("state", state)]),
            Some(n),
            "hookinbox_deliveries{{state={state}}}\n{scrape}"
        );
    }
    assert_age(
        "hookinbox_oldest_processing_age_seconds",
        value(&scrape, "hookinbox_oldest_processing_age_seconds", &[]),
        400.0,
        &scrape,
    );
    // The scheduler republishes parked bodies only: the due retry it
    // cannot get to is what this gauge is for, not the lost claim.
    assert_age(
        "hookinbox_oldest_due_retry_age_seconds",
        value(&scrape, "hookinbox_oldest_due_retry_age_seconds", &[]),
        120.0,
        &scrape,
    );
    assert_eq!(
        value(&scrape, "hookinbox_deliveries_awaiting_redelivery", &[]),
        Some(1.0),
        "hookinbox_deliveries_awaiting_redelivery\n{scrape}"
    );
    // Aged from when its lease ran out: nothing has held it since.
    assert_age(
        "hookinbox_oldest_awaiting_redelivery_age_seconds",
        value(
            &scrape,
            "hookinbox_oldest_awaiting_redelivery_age_seconds",
            &[],
        ),
        940.0,
        &scrape,
    );

    // Resolve each: the scheduler gets the retry once the lock goes, and
    // GitHub's redeliveries of the other two are claimed by ingest, which
    // takes over the expired lease and the lost claim.
    locker.batch_execute("commit").await.expect("unlock");
    let ingest = env.ingest().await;
    for hook in [&stuck, &lost] {
        let answer = ingest.send(hook).await;
        assert_eq!(answer.status, 202, "{answer:?}");
    }
    wait_until(
        "all three deliveries to complete",
        Duration::from_secs(60),
        || async {
            env.count("select count(*) from deliveries where status = 'completed'")
                .await
                == 3
        },
    )
    .await;
    // The next sample after that sees every delivery completed.
    wait_until("the gauges to clear", Duration::from_secs(40), || async {
        let scrape = worker.scrape("/metrics").await.1;
        value(&scrape, "hookinbox_deliveries", &[("state", "completed")]) == Some(3.0)
    })
    .await;
    let scrape = worker.scrape("/metrics").await.1;
    for (name, labels) in [
        ("hookinbox_deliveries", vec![("state", "processing")]),
        ("hookinbox_deliveries", vec![("state", "retrying")]),
        ("hookinbox_deliveries", vec![("state", "dead")]),
        ("hookinbox_oldest_processing_age_seconds", vec![]),
        ("hookinbox_oldest_due_retry_age_seconds", vec![]),
        ("hookinbox_deliveries_awaiting_redelivery", vec![]),
        ("hookinbox_oldest_awaiting_redelivery_age_seconds", vec![]),
    ] {
        assert_eq!(
            value(&scrape, name, &labels),
            Some(0.0),
            "{name} {labels:?}\n{scrape}"
        );
    }
    ingest.stop().await;
    env.cleanup().await;
}

/// One rule per name: the gauge `hookinbox_deliveries_awaiting_redelivery`
/// (which the alert HookinboxDeliveriesAwaitingRedelivery reads) counts
/// exactly what `deliveries list --status awaiting_redelivery` (which the
/// alert tells the operator to run) lists; and a due retry, in the gauge
/// and the console's overview alike, is one the scheduler can publish, so
/// a claim reaped `lost` with nothing parked is never one.
#[tokio::test]
async fn the_awaiting_gauge_counts_what_the_list_lists_and_a_due_retry_is_one_the_scheduler_can_publish()
 {
    let env = TestEnv::new().await;
    type Row = (
        &'static str,
        bool,
        i32,
        Option<f64>,
        Option<(&'static str, f64, f64)>,
        bool,
    );
    // (status, retryable, attempts, lease_in, failure, parked), each
    // claimed 1000 s ago.
    let rows: [Row; 5] = [
        // Reaped `lost` 300 s ago, due since, nothing parked: awaiting.
        (
            "failed",
            true,
            0,
            Some(-900.0),
            Some(("lost", 300.0, -300.0)),
            false,
        ),
        // Reaped `lost`, its body parked: a due retry (200 s), not awaiting.
        (
            "failed",
            true,
            1,
            Some(-800.0),
            Some(("lost", 250.0, -200.0)),
            true,
        ),
        // Untaken, its lease ran out 120 s ago before the reaper came,
        // nothing parked: awaiting too.
        ("processing", false, 0, Some(-120.0), None, false),
        // Taken (a worker holds or held it): not awaiting.
        ("processing", false, 1, Some(-100.0), None, false),
        // A transient failure due 60 s ago, its body parked: a due retry.
        (
            "failed",
            true,
            1,
            None,
            Some(("transient", 100.0, -60.0)),
            true,
        ),
    ];
    let hooks: Vec<Hook> = rows.iter().map(|_| Hook::fixture("push")).collect();
    for (hook, (status, retryable, attempts, lease_in, failure, parked)) in hooks.iter().zip(rows) {
        insert_delivery(
            &env, hook, status, retryable, attempts, 1000.0, lease_in, failure, parked,
        )
        .await;
    }
    let (lost, untaken) = (&hooks[0], &hooks[2]);

    let (code, listed) = worker_cli(
        &env,
        &[
            "deliveries",
            "list",
            "--status",
            "awaiting_redelivery",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{listed}");
    let listed: Vec<serde_json::Value> = serde_json::from_str(&listed).expect("a JSON list");
    let mut ids: Vec<&str> = listed
        .iter()
        .filter_map(|d| d["delivery_id"].as_str())
        .collect();
    ids.sort_unstable();
    let mut awaiting = vec![lost.id(), untaken.id()];
    awaiting.sort_unstable();
    assert_eq!(ids, awaiting);

    let client = env.pool(1).get().await.expect("client");
    let gauges = deliveries::gauges(&client).await.expect("gauges");
    assert_eq!(
        gauges.awaiting_redelivery,
        listed.len() as i64,
        "{gauges:?}"
    );
    let near = |got: f64, want: f64| (want..want + 30.0).contains(&got);
    assert!(
        near(gauges.oldest_awaiting_redelivery_secs, 900.0),
        "{gauges:?}"
    );
    assert!(near(gauges.oldest_due_retry_secs, 200.0), "{gauges:?}");
    assert_eq!(
        (
            gauges.processing,
            gauges.retrying,
            gauges.dead,
            gauges.completed
        ),
        // Each row in one state: the two awaiting a redelivery are neither
        // processing nor retrying.
        (1, 2, 0, 0)
    );

    // The console's overview: the lost claim with nothing parked, due for
    // 300 s, is no due retry; it is the oldest lost one.
    let overview = deliveries::overview(&client).await.expect("overview");
    assert!(
        overview.oldest_due_secs.is_some_and(|s| near(s, 200.0)),
        "{overview:?}"
    );
    assert!(
        overview.oldest_lost_secs.is_some_and(|s| near(s, 300.0)),
        "{overview:?}"
    );
    drop(client);
    env.cleanup().await;
}

/// The completed gauge is sampled every ten seconds whatever the retention
/// keeps: exact while completed rows are few, Postgres's estimate of its
/// partial index past [`deliveries::EXACT_COMPLETED_UP_TO`], so that a
/// sample never counts them all.
#[tokio::test]
async fn the_completed_gauge_is_exact_while_few_then_postgres_estimate() {
    let env = TestEnv::new().await;
    let insert = |from: i64, to: i64| {
        format!(
            "insert into deliveries (provider, source, hook_id, delivery_id, event, body_sha256,
                 status, claim_token, lease_until, completed_at)
             select 'github', 'default', '1', 'd' || g, 'push', '\\x00', 'completed',
                 gen_random_uuid(), now(), now()
             from generate_series({from}, {to}) g;
             analyze deliveries;"
        )
    };
    let client = env.pool(1).get().await.expect("client");
    let cap = deliveries::EXACT_COMPLETED_UP_TO;
    env.db.batch_execute(&insert(1, cap)).await.expect("rows");
    let gauges = deliveries::gauges(&client).await.expect("gauges");
    assert_eq!(gauges.completed, cap, "exact up to the cap");
    env.db
        .batch_execute(&insert(cap + 1, 3 * cap))
        .await
        .expect("rows");
    let gauges = deliveries::gauges(&client).await.expect("gauges");
    let estimate = gauges.completed as f64 / (3 * cap) as f64;
    assert!(
        (0.9..1.1).contains(&estimate),
        "{} of {} completed rows",
        gauges.completed,
        3 * cap
    );
    drop(client);
    env.cleanup().await;
}

/// Both binaries export the lease they were given, which the
/// stuck-processing alert's threshold is a multiple of.
#[tokio::test]
async fn both_binaries_export_their_configured_lease() {
    let env = TestEnv::new().await;
    let worker = env.spawn("hookinbox-worker", &[("HOOKINBOX_LEASE_SECS", "45")]);
    let ingest = env.spawn(
        "hookinbox-ingest",
        &[
            ("HOOKINBOX_GITHUB_SECRET", SECRET),
            ("HOOKINBOX_LEASE_SECS", "90"),
        ],
    );
    for (who, spawned, lease) in [("worker", &worker, 45.0), ("ingest", &ingest, 90.0)] {
        wait_until(
            &format!("the {who}'s lease gauge"),
            Duration::from_secs(30),
            || async {
                value(
                    &spawned.scrape("/metrics").await.1,
                    "hookinbox_lease_seconds",
                    &[],
                )
                .is_some()
            },
        )
        .await;
        let scrape = spawned.scrape("/metrics").await.1;
        assert_eq!(
            value(&scrape, "hookinbox_lease_seconds", &[]),
            Some(lease),
            "{who}\n{scrape}"
        );
    }
    env.cleanup().await;
}

/// The vacuum horizon's gauge, as a real worker exports it: about 0 while
/// hookinbox's own short transactions are all there is, the age of a
/// `REPEATABLE READ` transaction held open beside them (what keeps vacuum
/// from every delivery's dead rows), and about 0 again once it ends.
#[tokio::test]
async fn the_oldest_transaction_gauge_follows_a_transaction_held_open() {
    const GAUGE: &str = "hookinbox_postgres_oldest_transaction_age_seconds";
    let env = TestEnv::new().await;
    let worker = env.spawn("hookinbox-worker", &[]);
    let gauge = || async { value(&worker.scrape("/metrics").await.1, GAUGE, &[]) };
    wait_until(
        "the sampler's first sample",
        Duration::from_secs(30),
        || async { gauge().await.is_some() },
    )
    .await;
    let before = gauge().await;
    assert!(
        before.is_some_and(|v| v < 1.0),
        "{GAUGE} before: {before:?}"
    );

    // Its own connection: a pool's session would end it after 60 s idle.
    let holder = hookinbox_tests::connect(&env.database_url).await;
    let opened = std::time::Instant::now();
    holder
        .batch_execute("begin isolation level repeatable read; select count(*) from deliveries")
        .await
        .expect("open a snapshot");
    wait_until(
        "a sample of the open transaction",
        Duration::from_secs(40),
        || async { gauge().await.is_some_and(|v| v >= 1.0) },
    )
    .await;
    let held = gauge().await.unwrap_or_default();
    assert!(
        held <= opened.elapsed().as_secs_f64() + 1.0,
        "{GAUGE}: {held} s for a transaction open {:?}",
        opened.elapsed()
    );

    holder.batch_execute("commit").await.expect("commit");
    wait_until("the gauge to clear", Duration::from_secs(40), || async {
        gauge().await.is_some_and(|v| v < 1.0)
    })
    .await;
    env.cleanup().await;
}
