//! Scheduled retries, dead letters and the operator CLI.

use std::time::{Duration, Instant};

use hookinbox::deliveries::ErrorClass;
use hookinbox_tests::{Hook, TestEnv, fixtures, settle, worker_cli};
use hookinbox_worker::HandlerError;
use hookinbox_worker::JobOutcome;

use crate::retries_support::Scripted;

fn transient() -> HandlerError {
    HandlerError::transient("receiver answered 503")
}

#[tokio::test]
async fn transient_three_times_then_ok_takes_four_attempts_with_growing_gaps_never_early() {
    let env = TestEnv::new().await;
    let ingest = env.ingest().await;
    let mut args = env.worker_args();
    args.retry_base_ms = 200;
    args.retry_max_ms = 5000;
    let handler = Scripted::new(vec![transient(), transient(), transient()]);
    let worker = env
        .worker_with(args.validate().expect("valid"), handler.clone())
        .await;
    assert_eq!(
        ingest
            .send(&Hook::new("push", fixtures::own("push")))
            .await
            .status,
        202
    );
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
        assert!(gap >= d, "retry {} came early: {gap:?} < {d:?}", i + 1);
        // Jitter adds at most d; allow for scheduling latency on a busy box.
        assert!(
            gap <= 2 * d + Duration::from_secs(1),
            "retry {} late: {gap:?}",
            i + 1
        );
    }
    env.cleanup().await;
}

#[tokio::test]
async fn retry_after_from_the_handler_is_respected() {
    let env = TestEnv::new().await;
    let ingest = env.ingest().await;
    let handler = Scripted::new(vec![HandlerError::Transient {
        message: "429".into(),
        retry_after: Some(Duration::from_secs(2)),
    }]);
    let worker = env.worker(handler.clone()).await;
    assert_eq!(
        ingest
            .send(&Hook::new("push", fixtures::own("push")))
            .await
            .status,
        202
    );
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
    let env = TestEnv::new().await;
    let ingest = env.ingest().await;
    let mut args = env.worker_args();
    args.common.max_attempts = 3;
    let handler = Scripted::new((0..10).map(|_| transient()).collect());
    let worker = env
        .worker_with(args.validate().expect("valid"), handler.clone())
        .await;
    assert_eq!(
        ingest
            .send(&Hook::new("push", fixtures::own("push")))
            .await
            .status,
        202
    );
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
        env.count("select count(*) from parked_bodies").await,
        1,
        "body parked"
    );
    assert_eq!(env.dead_depth().await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn redelivery_during_a_backoff_is_a_duplicate_and_starts_no_job() {
    let env = TestEnv::new().await;
    let ingest = env.ingest().await;
    let mut args = env.worker_args();
    args.retry_base_ms = 60_000;
    args.retry_max_ms = 60_000;
    let worker = env
        .worker_with(
            args.validate().expect("valid"),
            Scripted::new(vec![transient()]),
        )
        .await;
    let hook = Hook::new("push", fixtures::own("push"));
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
    let env = TestEnv::new().await;
    let ingest = env.ingest().await;
    let first = Scripted::new(vec![transient()]);
    let worker = env.worker(first.clone()).await;
    assert_eq!(
        ingest
            .send(&Hook::new("push", fixtures::own("push")))
            .await
            .status,
        202
    );
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

#[tokio::test]
async fn permanent_failure_is_listed_then_replayed_once_from_the_cli() {
    let env = TestEnv::new().await;
    let ingest = env.ingest().await;
    let hook = Hook::new("push", fixtures::own("push"));
    assert_eq!(ingest.send(&hook).await.status, 202);
    let broken = Scripted::new(vec![HandlerError::permanent("receiver said 422")]);
    let outcomes = settle(&env, &env.worker(broken.clone()).await).await;
    assert_eq!(
        outcomes,
        vec![JobOutcome::Failed {
            class: ErrorClass::Permanent,
            retryable: false
        }]
    );
    assert_eq!(broken.calls().len(), 1, "one attempt");
    assert_eq!(env.dead_depth().await, 1);

    let (code, out) = worker_cli(&env, &["dlq", "list", "--json"]);
    assert_eq!(code, 0, "{out}");
    let listed: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(listed.as_array().map(Vec::len), Some(1));
    assert_eq!(listed[0]["delivery_id"], hook.id());
    assert_eq!(listed[0]["error_class"], "permanent");

    // The handler is fixed; replay.
    let (code, out) = worker_cli(&env, &["dlq", "replay", hook.id()]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        env.dead_depth().await,
        0,
        "the queue's copy follows Postgres"
    );
    let (code, _) = worker_cli(&env, &["dlq", "replay", hook.id()]);
    assert_eq!(code, 1, "a second replay matches nothing");
    assert_eq!(env.work_depth().await, 1, "one job started");
    let outcomes = settle(&env, &env.store_worker().await).await;
    assert_eq!(outcomes, vec![JobOutcome::Completed]);
    let row = env
        .db
        .query_one("select attempts, replays from deliveries", &[])
        .await
        .expect("row");
    assert_eq!((row.get::<_, i32>(0), row.get::<_, i32>(1)), (1, 1));
    let (code, _) = worker_cli(&env, &["dlq", "list"]);
    assert_eq!(code, 1, "nothing left");
    env.cleanup().await;
}

#[tokio::test]
async fn replay_dry_run_changes_nothing_and_rate_is_honoured() {
    let env = TestEnv::new().await;
    let ingest = env.ingest().await;
    for _ in 0..5 {
        assert_eq!(
            ingest
                .send(&Hook::new("push", fixtures::own("push")))
                .await
                .status,
            202
        );
    }
    let broken = Scripted::new((0..5).map(|_| HandlerError::permanent("no")).collect());
    settle(&env, &env.worker(broken).await).await;
    let dead =
        "select count(*) from deliveries where status = 'failed' and not retryable and replays = 0";
    assert_eq!(env.count(dead).await, 5);

    let (code, out) = worker_cli(&env, &["dlq", "replay", "--all", "--dry-run"]);
    assert_eq!(code, 0);
    assert!(out.contains("would replay 5"), "{out}");
    assert_eq!(env.count(dead).await, 5, "dry run changed nothing");
    assert_eq!(env.work_depth().await, 0);

    let started = Instant::now();
    let (code, out) = worker_cli(&env, &["dlq", "replay", "--all", "--rate", "5"]);
    assert_eq!(code, 0, "{out}");
    // Five replays at 5/s: the fifth starts 0.8 s after the first.
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(env.work_depth().await, 5);
    assert_eq!(
        env.count("select count(*) from deliveries where replays = 1 and attempts = 0")
            .await,
        5
    );
    env.cleanup().await;
}

#[tokio::test]
async fn usage_errors_exit_2() {
    let env = TestEnv::new().await;
    let (code, _) = worker_cli(&env, &["dlq", "replay"]);
    assert_eq!(code, 2, "nothing named");
    let (code, _) = worker_cli(&env, &["dlq", "purge", "--older-than", "soon"]);
    assert_eq!(code, 2);
    let (code, _) = worker_cli(&env, &["deliveries", "show", "nope"]);
    assert_eq!(code, 1, "nothing matched");
    env.cleanup().await;
}

#[tokio::test]
async fn purge_deletes_old_dead_letters_with_their_bodies_and_queue_copies() {
    let env = TestEnv::new().await;
    let ingest = env.ingest().await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let hook = Hook::new("push", fixtures::own("push"));
        assert_eq!(ingest.send(&hook).await.status, 202);
        ids.push(hook.id().to_owned());
    }
    let broken = Scripted::new((0..2).map(|_| HandlerError::permanent("no")).collect());
    settle(&env, &env.worker(broken).await).await;
    assert_eq!(env.dead_depth().await, 2);
    env.db
        .execute(
            "update deliveries set failed_at = now() - interval '20 days' where delivery_id = $1",
            &[&ids[0]],
        )
        .await
        .expect("age one");

    let (code, out) = worker_cli(&env, &["dlq", "purge", "--older-than", "14d", "--dry-run"]);
    assert_eq!((code, out.trim()), (0, "would purge 1 dead letter(s)"));
    assert_eq!(env.deliveries().await, 2, "dry run changed nothing");
    let (code, out) = worker_cli(&env, &["dlq", "purge", "--older-than", "14d"]);
    assert_eq!((code, out.trim()), (0, "purged 1 dead letter(s)"));
    let left: String = env
        .db
        .query_one("select delivery_id from deliveries", &[])
        .await
        .expect("one row left")
        .get(0);
    assert_eq!(left, ids[1]);
    assert_eq!(env.count("select count(*) from parked_bodies").await, 1);
    assert_eq!(
        env.dead_depth().await,
        1,
        "the purged copy left the queue too"
    );
    let (code, _) = worker_cli(&env, &["dlq", "purge", "--older-than", "14d"]);
    assert_eq!(code, 1, "nothing left to purge");
    env.cleanup().await;
}
