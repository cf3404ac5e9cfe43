//! Deferrals: a destination's "not now, try at T" (a `429` or `503` with
//! `Retry-After`) spends no attempt and dead-letters nothing, within the
//! destination's retry horizon; past it, the leg fails as
//! `deferred_too_long`, visibly.

use hookinbox_tests::receiver::{Received, Receiver, Reply};
use hookinbox_tests::{Hook, SECRET, TestEnv, TestIngest, settle};
use hookinbox_worker::{JobOutcome, Worker};

fn push() -> Hook {
    Hook::new(
        "push",
        format!(
            r#"{{"repository":{{"full_name":"acme/widgets"}},"nonce":"{}"}}"#,
            uuid::Uuid::new_v4()
        ),
    )
}

/// A source forwarding to `url` as destination `ci`: two attempts in all,
/// its retries spanning 30 s (deferrals are bounded by an hour and a
/// minute at least).
fn forwarding(env: &TestEnv, url: &str) -> std::path::PathBuf {
    env.config_file(&format!(
        r#"[[sources]]
name = "default"
secrets = ["{SECRET}"]
[[sources.destinations]]
name = "ci"
kind = "forward"
url = "{url}"
timeout_ms = 2000
retry = ["30s"]
"#
    ))
}

/// Ingest and a worker on [`forwarding`] to a receiver answering as
/// `script` does, and one push sent through them (202).
async fn one_push(
    env: &TestEnv,
    script: impl Fn(&Received, usize) -> Reply + Send + Sync + 'static,
) -> (Receiver, TestIngest, Worker, Hook) {
    let receiver = Receiver::start(script).await;
    let config = forwarding(env, &receiver.url);
    let ingest = env.ingest_on(&config).await;
    let worker = env.worker_on(&config, Default::default()).await;
    let hook = push();
    assert_eq!(ingest.send(&hook).await.status, 202);
    (receiver, ingest, worker, hook)
}

fn asked(status: u16, retry_after: &str) -> Reply {
    Reply {
        headers: vec![("retry-after".into(), retry_after.into())],
        ..Reply::status(status)
    }
}

#[tokio::test]
async fn a_429_or_503_with_retry_after_defers_the_leg_without_spending_an_attempt() {
    let env = TestEnv::new().await;
    // Three deferrals, then a success: with two attempts in all, a
    // deferral that spent one would dead-letter the leg.
    let (receiver, _ingest, worker, hook) = one_push(&env, |_, earlier| match earlier {
        0 | 2 => asked(429, "1"),
        1 => asked(503, "1"),
        _ => Reply::status(200),
    })
    .await;
    let outcomes = settle(&env, &worker).await;
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == JobOutcome::Deferred)
            .count(),
        3,
        "{outcomes:?}"
    );
    assert_eq!(receiver.received().len(), 4);
    let row = env
        .db
        .query_one(
            "select status, attempts, deferred_since is not null from deliveries \
             where delivery_id = $1",
            &[&hook.id()],
        )
        .await
        .expect("leg");
    assert_eq!(row.get::<_, String>(0), "completed");
    assert_eq!(row.get::<_, i32>(1), 1, "only the success was an attempt");
    assert!(row.get::<_, bool>(2));
    let log: Vec<String> = env
        .db
        .query(
            "select result from destination_attempts where delivery_id = $1 order by at",
            &[&hook.id()],
        )
        .await
        .expect("log")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(log, ["deferred", "deferred", "deferred", "ok"]);
    assert_eq!(env.dead_depth().await, 0);
    assert_eq!(
        env.count("select count(*) from destinations where state <> 'closed'")
            .await,
        0,
        "a deferral is an answer: the breaker stays closed"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn a_deferral_past_the_retry_horizon_fails_the_leg_as_deferred_too_long() {
    let env = TestEnv::new().await;
    // Two hours: past the 30-s span of its retries and past the hour and
    // a minute every deferral may wait at least (GitHub's rate limits
    // reset within the hour).
    let (_receiver, _ingest, worker, hook) = one_push(&env, |_, _| asked(429, "7200")).await;
    let report = worker.drain().await.expect("drain");
    assert_eq!(
        report.count(JobOutcome::Failed {
            class: hookinbox::deliveries::ErrorClass::DeferredTooLong,
            retryable: false
        }),
        1,
        "{:?}",
        report.outcomes
    );
    let row = env
        .db
        .query_one(
            "select status, retryable, last_error_class, last_error from deliveries \
             where delivery_id = $1",
            &[&hook.id()],
        )
        .await
        .expect("leg");
    assert_eq!(row.get::<_, String>(0), "failed");
    assert!(!row.get::<_, bool>(1));
    assert_eq!(row.get::<_, String>(2), "deferred_too_long");
    let error: String = row.get(3);
    assert!(
        error.contains("429") && error.contains("retry horizon"),
        "{error}"
    );
    assert_eq!(env.dead_depth().await, 1, "dead-lettered, visibly");
    env.cleanup().await;
}

#[tokio::test]
async fn a_deferral_asking_for_now_still_waits_at_least_a_second() {
    let env = TestEnv::new().await;
    let (_receiver, _ingest, worker, hook) = one_push(&env, |_, _| asked(503, "0")).await;
    let report = worker.drain().await.expect("drain");
    assert_eq!(
        report.count(JobOutcome::Deferred),
        1,
        "{:?}",
        report.outcomes
    );
    let wait: f64 = env
        .db
        .query_one(
            "select extract(epoch from next_attempt_at - failed_at)::float8 from deliveries \
             where delivery_id = $1 and last_error_class = 'deferred'",
            &[&hook.id()],
        )
        .await
        .expect("a deferred leg")
        .get(0);
    assert!(wait >= 0.99, "due after {wait} s");
    env.cleanup().await;
}
