//! The worker retries: scheduled retries with backoff, never early, a
//! handler's Retry-After honoured, exhausted attempts dead-lettered, and a
//! retry that survives a worker's death.

use std::time::Duration;

use hookinbox::deliveries::ErrorClass;
use hookinbox_tests::handlers::Scripted;
use hookinbox_tests::{Hook, TestEnv, settle};
use hookinbox_worker::HandlerError;
use hookinbox_worker::JobOutcome;

fn transient() -> HandlerError {
    HandlerError::transient("receiver answered 503")
}

#[tokio::test]
async fn transient_three_times_then_ok_takes_four_attempts_with_growing_gaps_never_early() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let mut args = env.worker_args();
    args.retry_base_ms = Some(200);
    args.retry_max_ms = Some(5000);
    let handler = Scripted::new(vec![transient(), transient(), transient()]);
    let worker = env
        .worker_with(args.validate().expect("valid"), handler.clone())
        .await;
    assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    let outcomes = settle(&env, &worker).await;
    let retried = JobOutcome::Failed {
        class: ErrorClass::Transient,
        retryable: true,
    };
    assert_eq!(
        outcomes,
        vec![retried, retried, retried, JobOutcome::Completed]
    );
    assert_eq!(
        env.count("select attempts::bigint from deliveries").await,
        4
    );
    assert_eq!(env.events().await, 1);
    let calls = handler.calls();
    for (i, pair) in calls.windows(2).enumerate() {
        let gap = pair[1] - pair[0];
        let d = Duration::from_millis(200 << i);
        // Jitter takes the delay to between d/2 and d.
        assert!(
            gap >= d / 2,
            "retry {} came early: {gap:?} < {:?}",
            i + 1,
            d / 2
        );
        // Allow for scheduling latency on a busy box, and for one server
        // login retried behind PgBouncer (`server_login_retry`, 1 s; the
        // suite's core paths also run through one): late by seconds is
        // slow, late by the scheduler's sweep would be a lost delay.
        assert!(
            gap <= d + Duration::from_secs(3),
            "retry {} late: {gap:?}",
            i + 1
        );
    }
    env.cleanup().await;
}

#[tokio::test]
async fn retry_after_from_the_handler_is_respected() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let handler = Scripted::new(vec![HandlerError::Transient {
        message: "429".into(),
        retry_after: Some(Duration::from_secs(2)),
    }]);
    let worker = env.worker(handler.clone()).await;
    assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes.last(), Some(&JobOutcome::Completed));
    let calls = handler.calls();
    assert_eq!(calls.len(), 2);
    assert!(
        calls[1] - calls[0] >= Duration::from_secs(2),
        "{:?}",
        calls[1] - calls[0]
    );
    env.cleanup().await;
}

#[tokio::test]
async fn exhausted_attempts_are_dead_lettered_as_max_attempts() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let mut args = env.worker_args();
    args.common.max_attempts = Some(3);
    let handler = Scripted::new((0..10).map(|_| transient()).collect());
    let worker = env
        .worker_with(args.validate().expect("valid"), handler.clone())
        .await;
    assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    let outcomes = settle(&env, &worker).await;
    assert_eq!(
        outcomes.last(),
        Some(&JobOutcome::Failed {
            class: ErrorClass::MaxAttempts,
            retryable: false
        })
    );
    assert_eq!(handler.calls().len(), 3);
    assert_eq!(
        env.count("select count(*) from deliveries where last_error_class = 'max_attempts' and not retryable").await,
        1
    );
    assert_eq!(
        env.count("select count(*) from bodies").await,
        1,
        "its body kept for a replay"
    );
    assert_eq!(env.dead_depth().await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn redelivery_during_a_backoff_is_a_duplicate_and_starts_no_job() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let mut args = env.worker_args();
    args.retry_base_ms = Some(60_000);
    args.retry_max_ms = Some(60_000);
    let worker = env
        .worker_with(
            args.validate().expect("valid"),
            Scripted::new(vec![transient()]),
        )
        .await;
    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);
    worker.drain().await.expect("drain");
    let answer = ingest.send(&hook).await;
    assert_eq!((answer.status, answer.kind()), (202, "duplicate"));
    assert_eq!(answer.body["state"], "failed");
    assert_eq!(env.work_depth().await, 0);
    assert_eq!(
        worker.schedule_once().await.expect("pass"),
        0,
        "not due yet"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn worker_killed_during_a_backoff_retries_once_after_restart() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let first = Scripted::new(vec![transient()]);
    let worker = env.worker(first.clone()).await;
    assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    worker.drain().await.expect("drain");
    drop(worker); // gone during the backoff; the retry lives in Postgres
    let restarted = Scripted::new(vec![]);
    let worker = env.worker(restarted.clone()).await;
    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes, vec![JobOutcome::Completed]);
    assert_eq!(first.calls().len() + restarted.calls().len(), 2);
    assert_eq!(env.events().await, 1);
    env.cleanup().await;
}
