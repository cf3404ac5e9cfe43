//! Destinations: a delivery's legs, their filters, their queues, and the
//! circuit breaker, against local receivers.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hookinbox_tests::receiver::{Receiver, Reply};
use hookinbox_tests::{Hook, SECRET, TestEnv, settle, wait_until};
use hookinbox_worker::JobOutcome;
use sha2::Digest;

/// A delivery of `event` about `repository`, with a body of its own.
fn about(event: &str, action: &str, repository: &str) -> Hook {
    Hook::new(
        event,
        format!(
            r#"{{"action":"{action}","repository":{{"full_name":"{repository}"}},"nonce":"{}"}}"#,
            uuid::Uuid::new_v4()
        ),
    )
}

/// A leg's status, attempts, error class and filter reason.
type Leg = (String, i32, Option<String>, Option<String>);

/// Each leg of delivery `id`, by destination.
async fn legs(env: &TestEnv, id: &str) -> BTreeMap<String, Leg> {
    env.db
        .query(
            "select destination, status, attempts, last_error_class, filter_reason
             from deliveries where delivery_id = $1",
            &[&id],
        )
        .await
        .expect("legs")
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3), r.get(4))))
        .collect()
}

/// The state of destination `name` of the default source.
async fn state(env: &TestEnv, name: &str) -> String {
    env.db
        .query_one(
            "select state from destinations where source = 'default' and name = $1",
            &[&name],
        )
        .await
        .expect("the destination's row")
        .get(0)
}

fn statuses(legs: &BTreeMap<String, Leg>) -> Vec<(&str, &str)> {
    legs.iter()
        .map(|(d, (status, ..))| (d.as_str(), status.as_str()))
        .collect()
}

#[tokio::test]
async fn a_delivery_fans_out_to_the_destinations_its_filters_take_and_records_the_others() {
    let env = TestEnv::new().await;
    let everything = Receiver::ok().await;
    let pull_requests = Receiver::ok().await;
    let config = env.config_file(&format!(
        r#"
[[sources]]
name = "default"
secrets = ["{SECRET}"]

[[sources.destinations]]
name = "all"
kind = "forward"
url = "{}"

[[sources.destinations]]
name = "prs"
kind = "forward"
url = "{}"
events = ["pull_request.opened"]
repositories = ["ACME/*"]

[[sources.destinations]]
name = "archive"
kind = "store"
events = ["pull_request"]
"#,
        everything.url, pull_requests.url
    ));
    let ingest = env.ingest_on(&config).await;
    let worker = env.worker_on(&config, Default::default()).await;

    let push = about("push", "none", "acme/widgets");
    let pr = about("pull_request", "opened", "acme/widgets");
    let other_repo = about("pull_request", "opened", "someone/else");
    let closed = about("pull_request", "closed", "acme/widgets");
    for hook in [&push, &pr, &other_repo, &closed] {
        let answer = ingest.send(hook).await;
        assert_eq!((answer.status, answer.kind()), (202, "accepted"));
    }
    settle(&env, &worker).await;

    assert_eq!(
        statuses(&legs(&env, push.id()).await),
        vec![
            ("all", "completed"),
            ("archive", "filtered"),
            ("prs", "filtered")
        ]
    );
    assert_eq!(
        statuses(&legs(&env, pr.id()).await),
        vec![
            ("all", "completed"),
            ("archive", "completed"),
            ("prs", "completed")
        ]
    );
    let other = legs(&env, other_repo.id()).await;
    assert_eq!(other["prs"].0, "filtered");
    assert!(
        other["prs"]
            .3
            .as_deref()
            .is_some_and(|r| r.contains("repositories")),
        "why prs did not get it: {:?}",
        other["prs"].3
    );
    assert!(
        legs(&env, closed.id()).await["prs"]
            .3
            .as_deref()
            .is_some_and(|r| r.contains("event")),
    );
    // Each destination got what its filters take, once, under its own key.
    assert_eq!(everything.received().len(), 4);
    let to_prs: Vec<_> = pull_requests.received();
    assert_eq!(to_prs.len(), 1);
    assert_eq!(
        to_prs[0].header("idempotency-key"),
        Some(format!("github:default:123456:{}:prs", pr.id()).as_str())
    );
    assert_eq!(env.events().await, 3, "archive stored the pull requests");

    // A redelivery of a completed delivery is a duplicate, adds no leg and
    // sends nothing.
    let again = ingest.send(&pr).await;
    assert_eq!((again.status, again.kind()), (200, "duplicate"));
    assert_eq!(legs(&env, pr.id()).await.len(), 3);
    env.cleanup().await;
}

#[tokio::test]
async fn a_delivery_no_destination_takes_is_recorded_as_filtered() {
    let env = TestEnv::new().await;
    let config = env.config_file(&format!(
        r#"
[[sources]]
name = "default"
secrets = ["{SECRET}"]

[[sources.destinations]]
name = "archive"
kind = "store"
repositories = ["acme/*"]
"#
    ));
    let ingest = env.ingest_on(&config).await;
    let hook = about("push", "none", "someone/else");
    let answer = ingest.send(&hook).await;
    assert_eq!((answer.status, answer.kind()), (200, "filtered"));
    assert_eq!(
        statuses(&legs(&env, hook.id()).await),
        vec![("archive", "filtered")]
    );
    assert_eq!(env.work_depth().await, 0, "nothing to run");
    let again = ingest.send(&hook).await;
    assert_eq!((again.status, again.kind()), (200, "duplicate"));
    env.cleanup().await;
}

/// A forward destination `name` with a breaker that probes every second.
fn breaking_forward(name: &str, url: &str, extra: &str) -> String {
    format!(
        r#"
[[sources.destinations]]
name = "{name}"
kind = "forward"
url = "{url}"
timeout_ms = 2000
retry = ["100ms", "200ms", "400ms"]
{extra}
"#
    )
}

#[tokio::test]
async fn a_destination_that_answers_404_holds_its_legs_and_delivers_them_all_once_fixed() {
    let env = TestEnv::new().await;
    let fixed = Arc::new(AtomicBool::new(false));
    let receiver = Receiver::start({
        let fixed = fixed.clone();
        move |_, _| {
            Reply::status(if fixed.load(Ordering::SeqCst) {
                200
            } else {
                404
            })
        }
    })
    .await;
    let config = env.config_file(&format!(
        "[[sources]]\nname = \"default\"\nsecrets = [\"{SECRET}\"]\n{}",
        breaking_forward(
            "ci",
            &receiver.url,
            "breaker = { probe_secs = 1, min_requests = 100 }"
        )
    ));
    let ingest = env.ingest_on(&config).await;
    let worker = env.worker_on(&config, Default::default()).await;
    let hooks: Vec<Hook> = (0..5)
        .map(|_| about("push", "none", "acme/widgets"))
        .collect();
    for hook in &hooks {
        assert_eq!(ingest.send(hook).await.status, 202);
    }
    let report = worker.drain().await.expect("drain");
    // The first attempt learns the destination is wrong; the others are
    // held at their take, none attempted.
    assert_eq!(report.count(JobOutcome::Held), 5, "{:?}", report.outcomes);
    assert_eq!(receiver.received().len(), 1);
    assert_eq!(state(&env, "ci").await, "open");
    assert_eq!(
        env.count(
            "select count(*) from deliveries where status = 'failed' and retryable \
             and last_error_class = 'held' and attempts = 0"
        )
        .await,
        5,
        "held, no attempt spent"
    );
    assert_eq!(env.dead_depth().await, 0);
    // While open, only the probe goes, one per probe_secs.
    let opened = std::time::Instant::now();
    while opened.elapsed() < Duration::from_millis(2500) {
        worker.schedule_once().await.expect("scheduler");
        worker.drain().await.expect("drain");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let during = receiver.received().len() - 1;
    assert!(
        (1..=3).contains(&during),
        "{during} requests in 2.5 s at one probe a second"
    );
    assert_eq!(state(&env, "ci").await, "open");

    // The route is fixed: the next probe closes the breaker, and every
    // held leg goes, once.
    fixed.store(true, Ordering::SeqCst);
    settle(&env, &worker).await;
    assert_eq!(state(&env, "ci").await, "closed");
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'completed'")
            .await,
        5
    );
    let ok: HashSet<String> = receiver
        .received()
        .iter()
        .skip(1 + during)
        .filter_map(|r| r.header("idempotency-key").map(str::to_owned))
        .collect();
    assert_eq!(ok.len(), 5, "each leg delivered once after the fix");
    assert_eq!(env.dead_depth().await, 0, "nothing dead-lettered");
    env.cleanup().await;
}

/// Under a running worker, the legs of an open destination wait in its
/// queue: the worker holds only the head, unacked, and writes nothing for
/// them (no hold), while the probe still goes every
/// `probe_secs` past that head (through the shared queue). Once a probe
/// succeeds, every leg goes, once.
#[tokio::test]
async fn an_open_destinations_legs_wait_in_its_queue_while_its_probes_go() {
    let env = TestEnv::new().await;
    let fixed = Arc::new(AtomicBool::new(false));
    let receiver = Receiver::start({
        let fixed = fixed.clone();
        move |_, _| {
            Reply::status(if fixed.load(Ordering::SeqCst) {
                200
            } else {
                404
            })
        }
    })
    .await;
    let config = env.config_file(&format!(
        "[[sources]]\nname = \"default\"\nsecrets = [\"{SECRET}\"]\n{}",
        breaking_forward(
            "ci",
            &receiver.url,
            // Not fair: the legs past its installation's round would wait
            // in Postgres, held at the claim, instead of in the queue.
            "concurrency = 1\nfairness = false\nbreaker = { probe_secs = 1, min_requests = 100 }"
        )
    ));
    let ingest = env.ingest_on(&config).await;
    let worker = env.worker_on(&config, Default::default()).await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn({
        let worker = worker.clone();
        let shutdown = shutdown.clone();
        async move { worker.run(shutdown).await }
    });
    let first = about("push", "none", "acme/widgets");
    assert_eq!(ingest.send(&first).await.status, 202);
    wait_until(
        "the 404 to open the breaker",
        Duration::from_secs(15),
        || async { state(&env, "ci").await != "closed" },
    )
    .await;
    for _ in 0..10 {
        let hook = about("push", "none", "acme/widgets");
        assert_eq!(ingest.send(&hook).await.status, 202);
    }
    // Probes pass the waiting head of the queue: the first leg (held when
    // it failed) is tried again, once a second.
    wait_until("two probes", Duration::from_secs(20), || async {
        receiver.received().len() >= 3
    })
    .await;
    assert_eq!(
        env.count("select count(*) from deliveries where status <> 'processing'")
            .await,
        1,
        "only the leg that failed is held in Postgres; the others wait in the broker"
    );
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'processing' and attempts = 0")
            .await,
        10,
        "untaken, no attempt spent"
    );
    let keys: HashSet<String> = receiver
        .received()
        .iter()
        .filter_map(|r| r.header("idempotency-key").map(str::to_owned))
        .collect();
    assert_eq!(keys.len(), 1, "only the first leg was sent while broken");
    // Their claims' leases running out says nothing of a lost message: the
    // reaper leaves them, and none is awaiting a redelivery from GitHub.
    env.db
        .execute(
            "update deliveries set lease_until = now() - interval '1 day' \
             where status = 'processing' and attempts = 0",
            &[],
        )
        .await
        .expect("age the claims");
    assert_eq!(worker.reap_once().await.expect("reaper"), 0);
    let client = worker.pool().get().await.expect("a connection");
    let gauges = hookinbox::deliveries::gauges(&client)
        .await
        .expect("gauges");
    drop(client);
    assert_eq!(gauges.awaiting_redelivery, 0);

    // Fixed downstream: the next probe closes the breaker, and every leg
    // goes, once.
    let broken = receiver.received().len();
    fixed.store(true, Ordering::SeqCst);
    wait_until("every leg to complete", Duration::from_secs(30), || async {
        env.count("select count(*) from deliveries where status = 'completed'")
            .await
            == 11
    })
    .await;
    assert_eq!(state(&env, "ci").await, "closed");
    let after: Vec<String> = receiver
        .received()
        .iter()
        .skip(broken)
        .filter_map(|r| r.header("idempotency-key").map(str::to_owned))
        .collect();
    // A probe that was on its way when the fix landed may add one 404.
    assert!(
        (11..=12).contains(&after.len()),
        "each leg sent once after the fix: {after:?}"
    );
    assert_eq!(after.iter().collect::<HashSet<_>>().len(), 11);
    assert_eq!(env.dead_depth().await, 0, "nothing dead-lettered");
    shutdown.cancel();
    running.await.expect("join").expect("worker");
    env.cleanup().await;
}

#[tokio::test]
async fn failures_past_the_ratio_open_the_breaker_and_a_success_closes_it() {
    let env = TestEnv::new().await;
    let up = Arc::new(AtomicBool::new(false));
    let receiver = Receiver::start({
        let up = up.clone();
        move |_, _| Reply::status(if up.load(Ordering::SeqCst) { 200 } else { 503 })
    })
    .await;
    let config = env.config_file(&format!(
        "[[sources]]\nname = \"default\"\nsecrets = [\"{SECRET}\"]\n{}",
        breaking_forward(
            "ci",
            &receiver.url,
            "breaker = { probe_secs = 1, min_requests = 3, failure_ratio = 0.5 }"
        )
    ));
    let ingest = env.ingest_on(&config).await;
    let worker = env.worker_on(&config, Default::default()).await;
    for _ in 0..8 {
        assert_eq!(
            ingest
                .send(&about("push", "none", "acme/widgets"))
                .await
                .status,
            202
        );
    }
    let report = worker.drain().await.expect("drain");
    assert_eq!(
        report.count(JobOutcome::Failed {
            class: hookinbox::deliveries::ErrorClass::Transient,
            retryable: true
        }),
        3,
        "three real attempts fail: {:?}",
        report.outcomes
    );
    assert_eq!(report.count(JobOutcome::Held), 5);
    assert_eq!(state(&env, "ci").await, "open");
    up.store(true, Ordering::SeqCst);
    settle(&env, &worker).await;
    assert_eq!(state(&env, "ci").await, "closed");
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'completed'")
            .await,
        8
    );
    assert_eq!(env.dead_depth().await, 0);
    let attempts: i64 = env
        .count("select count(*) from destination_attempts where result = 'ok'")
        .await;
    assert_eq!(attempts, 8, "the attempt log has each success");
    env.cleanup().await;
}

#[tokio::test]
async fn failures_in_a_row_open_the_breaker_though_the_window_still_holds_successes() {
    let env = TestEnv::new().await;
    let up = Arc::new(AtomicBool::new(true));
    let receiver = Receiver::start({
        let up = up.clone();
        move |_, _| Reply::status(if up.load(Ordering::SeqCst) { 200 } else { 503 })
    })
    .await;
    let config = env.config_file(&format!(
        "[[sources]]\nname = \"default\"\nsecrets = [\"{SECRET}\"]\n{}",
        breaking_forward(
            "ci",
            &receiver.url,
            "breaker = { probe_secs = 1, min_requests = 3, failure_ratio = 0.5, window_secs = 600 }"
        )
    ));
    let ingest = env.ingest_on(&config).await;
    let worker = env.worker_on(&config, Default::default()).await;
    let send = || async {
        assert_eq!(
            ingest
                .send(&about("push", "none", "acme/widgets"))
                .await
                .status,
            202
        );
    };
    for _ in 0..20 {
        send().await;
    }
    let report = worker.drain().await.expect("drain");
    assert_eq!(report.count(JobOutcome::Completed), 20);
    // Down: 3 failures against 20 successes in the window is a ratio of
    // 0.13, far under 0.5; 3 in a row open it all the same.
    up.store(false, Ordering::SeqCst);
    for _ in 0..8 {
        send().await;
    }
    let report = worker.drain().await.expect("drain");
    assert_eq!(
        report.count(JobOutcome::Failed {
            class: hookinbox::deliveries::ErrorClass::Transient,
            retryable: true
        }),
        3,
        "three real attempts fail, then the rest wait: {:?}",
        report.outcomes
    );
    assert_eq!(report.count(JobOutcome::Held), 5);
    assert_eq!(state(&env, "ci").await, "open");
    let error: String = {
        let pool = env.pool(1);
        let client = pool.get().await.expect("client");
        client
            .query_one("select last_error from destinations where name = 'ci'", &[])
            .await
            .expect("row")
            .get(0)
    };
    assert!(error.contains("3 attempts failed in a row"), "{error}");
    up.store(true, Ordering::SeqCst);
    settle(&env, &worker).await;
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'completed'")
            .await,
        28
    );
    assert_eq!(env.dead_depth().await, 0);
    env.cleanup().await;
}

#[tokio::test]
async fn gone_disables_the_destination_until_an_operator_resumes_it() {
    let env = TestEnv::new().await;
    let back = Arc::new(AtomicBool::new(false));
    let receiver = Receiver::start({
        let back = back.clone();
        move |_, _| {
            Reply::status(if back.load(Ordering::SeqCst) {
                200
            } else {
                410
            })
        }
    })
    .await;
    let config = env.config_file(&format!(
        "[[sources]]\nname = \"default\"\nsecrets = [\"{SECRET}\"]\n{}",
        breaking_forward("ci", &receiver.url, "breaker = { probe_secs = 1 }")
    ));
    let ingest = env.ingest_on(&config).await;
    let worker = env.worker_on(&config, Default::default()).await;
    for _ in 0..3 {
        assert_eq!(
            ingest
                .send(&about("push", "none", "acme/widgets"))
                .await
                .status,
            202
        );
    }
    worker.drain().await.expect("drain");
    assert_eq!(state(&env, "ci").await, "disabled");
    // Disabled: no probe ever goes.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    worker.schedule_once().await.expect("scheduler");
    worker.drain().await.expect("drain");
    assert_eq!(receiver.received().len(), 1);
    back.store(true, Ordering::SeqCst);
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    let resumed = hookinbox::deliveries::set_by_operator(
        &client,
        &hookinbox::SourceName::default_source(),
        &hookinbox::DestinationName::parse("ci").expect("name"),
        hookinbox::deliveries::BreakerState::Closed,
        "operator",
    )
    .await
    .expect("resume");
    assert_eq!(resumed, Some(true));
    settle(&env, &worker).await;
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'completed'")
            .await,
        3
    );
    env.cleanup().await;
}

#[tokio::test]
async fn a_redirect_an_unresolvable_host_and_a_long_answer_are_each_recorded_on_the_leg() {
    let env = TestEnv::new().await;
    let long_body = vec![b'x'; 64 * 1024];
    let redirect = Receiver::start(|_, _| Reply {
        headers: vec![("location".into(), "http://127.0.0.1:1/elsewhere".into())],
        ..Reply::status(308)
    })
    .await;
    let long = Receiver::start(move |_, _| Reply {
        body: long_body.clone(),
        ..Reply::status(400)
    })
    .await;
    let config = env.config_file(&format!(
        "[[sources]]\nname = \"default\"\nsecrets = [\"{SECRET}\"]\n{}{}{}",
        breaking_forward("moved", &redirect.url, ""),
        breaking_forward("nowhere", "http://no-such-host.invalid/hook", ""),
        breaking_forward("wordy", &long.url, ""),
    ));
    let ingest = env.ingest_on(&config).await;
    let worker = env.worker_on(&config, Default::default()).await;
    let hook = about("push", "none", "acme/widgets");
    assert_eq!(ingest.send(&hook).await.status, 202);
    worker.drain().await.expect("drain");
    let legs = legs(&env, hook.id()).await;
    // A redirect is never followed: the destination's URL is wrong, so the
    // leg waits for it, and the error names the status.
    assert_eq!(
        (legs["moved"].0.as_str(), legs["moved"].2.as_deref()),
        ("failed", Some("held"))
    );
    assert_eq!(state(&env, "moved").await, "open");
    assert_eq!(redirect.received().len(), 1);
    assert_eq!(
        (legs["nowhere"].0.as_str(), legs["nowhere"].2.as_deref()),
        ("failed", Some("held"))
    );
    // A 400 is this leg's own failure: dead-lettered, the answer kept to
    // its first 4 KiB.
    assert_eq!(
        (legs["wordy"].0.as_str(), legs["wordy"].2.as_deref()),
        ("failed", Some("permanent"))
    );
    let rows = env
        .db
        .query(
            "select destination, status_code, error, length(response_excerpt)
             from destination_attempts order by destination",
            &[],
        )
        .await
        .expect("the attempt log");
    type Logged = (Option<i32>, Option<String>, Option<i32>);
    let log: BTreeMap<String, Logged> = rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
        .collect();
    assert_eq!(log["moved"].0, Some(308));
    assert!(
        log["moved"]
            .1
            .as_deref()
            .is_some_and(|e| e.contains("308") && e.contains("redirect"))
    );
    assert_eq!(log["nowhere"].0, None);
    assert!(
        log["nowhere"]
            .1
            .as_deref()
            .is_some_and(|e| e.contains("does not resolve")),
        "{:?}",
        log["nowhere"]
    );
    assert_eq!(
        log["wordy"],
        (
            Some(400),
            Some("receiver answered 400".to_owned()),
            Some(4096)
        )
    );
    env.cleanup().await;
}

#[tokio::test]
async fn a_slow_destination_does_not_delay_another() {
    let env = TestEnv::new().await;
    let slow = Receiver::start(|_, _| Reply {
        delay: Duration::from_secs(3),
        ..Reply::status(200)
    })
    .await;
    let config = env.config_file(&format!(
        r#"
[[sources]]
name = "default"
secrets = ["{SECRET}"]

[[sources.destinations]]
name = "slow"
kind = "forward"
url = "{}"
concurrency = 2
timeout_ms = 10000

[[sources.destinations]]
name = "fast"
kind = "store"
"#,
        slow.url
    ));
    let ingest = env.ingest_on(&config).await;
    let worker = env.worker_on(&config, Default::default()).await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn({
        let worker = worker.clone();
        let shutdown = shutdown.clone();
        async move { worker.run(shutdown).await }
    });
    let hooks: Vec<Hook> = (0..20)
        .map(|_| about("push", "none", "acme/widgets"))
        .collect();
    for hook in &hooks {
        assert_eq!(ingest.send(hook).await.status, 202);
    }
    // Every fast leg completes while the slow destination still has most
    // of its backlog: its two handler slots are busy for 3 s a leg.
    wait_until(
        "every fast leg to complete",
        Duration::from_secs(15),
        || async {
            env.count(
                "select count(*) from deliveries where destination = 'fast' and status = 'completed'",
            )
            .await
                == 20
        },
    )
    .await;
    let slow_done = env
        .count(
            "select count(*) from deliveries where destination = 'slow' and status = 'completed'",
        )
        .await;
    assert!(slow_done <= 4, "{slow_done} slow legs done already");
    shutdown.cancel();
    running.await.expect("join").expect("worker");
    env.cleanup().await;
}

#[tokio::test]
async fn a_leg_claimed_before_destinations_runs_with_its_sources_first_destination() {
    let (env, ingest) = TestEnv::with_forward_ingest().await;
    let receiver = Receiver::ok().await;
    // What an ingest of the previous version left: a row without a
    // destination, and its message, without one either, in the old
    // shared queue.
    let hook = Hook::fixture("push");
    let token = uuid::Uuid::new_v4();
    env.db
        .execute(
            "insert into deliveries (provider, source, hook_id, delivery_id, event, body_sha256,
                                     status, claim_token, lease_until)
             values ('github', 'default', $1, $2, 'push', $3, 'processing', $4,
                     now() + interval '1 minute')",
            &[
                &hook.hook_id.as_deref().unwrap_or(""),
                &hook.id(),
                &sha2::Sha256::digest(&hook.body).to_vec(),
                &token,
            ],
        )
        .await
        .expect("an old row");
    let old = hookinbox::Envelope {
        trace: Default::default(),
        key: hook.key().leg(hookinbox::DestinationName::legacy()),
        event: hookinbox::EventName::parse(b"push").expect("event"),
        action: None,
        token: hookinbox::ClaimToken(token),
        attempts: None,
        carried: None,
        copy: None,
    };
    // Its body rides in the message, and Postgres holds none: the worker
    // runs it with the body the message carries.
    hookinbox_tests::old_messages::publish_with_body(
        &hookinbox_tests::amqp_url(),
        &hookinbox::broker::Topology::new(&env.prefix),
        &old,
        "application/json",
        &[("x-github-event", "push")],
        &hook.body,
    )
    .await;
    assert_eq!(
        env.queue_depth(&format!("{}.work", env.prefix)).await,
        1,
        "in the old shared queue"
    );

    // A redelivery from GitHub finds the old leg: a duplicate, no new leg.
    let answer = ingest.send(&hook).await;
    assert_eq!((answer.status, answer.kind()), (202, "duplicate"));
    assert_eq!(legs(&env, hook.id()).await.len(), 1);

    let mut args = env.worker_args();
    args.sources.handler = hookinbox::config::HandlerKind::Forward;
    args.forward_url = Some(receiver.url.clone());
    let config = args.validate().expect("valid");
    let handler =
        hookinbox_worker::from_config(&config.routes, &Default::default()).expect("handlers");
    let worker = env.worker_with(config, handler).await;
    let report = worker.drain().await.expect("drain");
    assert_eq!(report.outcomes, vec![JobOutcome::Completed]);
    assert_eq!(
        statuses(&legs(&env, hook.id()).await),
        vec![("", "completed")]
    );
    let received = receiver.received();
    assert_eq!(received.len(), 1);
    assert_eq!(
        received[0].header("idempotency-key"),
        Some(format!("github:default:123456:{}", hook.id()).as_str()),
        "the key it had before destinations"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn a_worker_consumes_only_the_destinations_it_is_given_and_paces_each_by_its_rate() {
    let env = TestEnv::new().await;
    let receiver = Receiver::ok().await;
    let config = env.config_file(&format!(
        r#"
[[sources]]
name = "default"
secrets = ["{SECRET}"]

[[sources.destinations]]
name = "paced"
kind = "forward"
url = "{}"
rate_limit = {{ per_second = 4, burst = 1 }}

[[sources.destinations]]
name = "archive"
kind = "store"
"#,
        receiver.url
    ));
    let ingest = env.ingest_on(&config).await;
    for _ in 0..6 {
        assert_eq!(
            ingest
                .send(&about("push", "none", "acme/widgets"))
                .await
                .status,
            202
        );
    }
    let mut args = env.worker_args();
    args.sources.config = Some(config.clone());
    args.destinations = "default/paced".to_owned();
    let only_paced = args.validate().expect("valid");
    let handler =
        hookinbox_worker::from_config(&only_paced.routes, &Default::default()).expect("handlers");
    let worker = env.worker_with(only_paced, handler).await;
    let started = std::time::Instant::now();
    let report = worker.drain().await.expect("drain");
    let took = started.elapsed();
    assert_eq!(report.count(JobOutcome::Completed), 6);
    // Four a second after the first: waiting for the rate is not an
    // attempt, and each leg took one.
    assert!(took >= Duration::from_millis(1200), "{took:?}");
    assert_eq!(
        env.count("select count(*) from deliveries where destination = 'paced' and attempts = 1")
            .await,
        6
    );
    // The archive's legs wait in their own queue for a worker of theirs.
    assert_eq!(
        env.queue_depth(&format!("{}.work.default.archive", env.prefix))
            .await,
        6
    );
    env.cleanup().await;
}
