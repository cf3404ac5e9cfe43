//! The operator CLI: list, replay (one, filtered, dry run, at a rate) and
//! purge dead letters, and its exit codes.

use std::time::{Duration, Instant};

use hookinbox::deliveries::ErrorClass;
use hookinbox_tests::handlers::Scripted;
use hookinbox_tests::{Hook, TestEnv, settle, worker_cli};
use hookinbox_worker::HandlerError;
use hookinbox_worker::JobOutcome;

#[tokio::test]
async fn permanent_failure_is_listed_then_replayed_once_from_the_cli() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let hook = Hook::fixture("push");
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
    let (env, ingest) = TestEnv::with_ingest().await;
    for _ in 0..5 {
        assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
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
    let (env, ingest) = TestEnv::with_ingest().await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let hook = Hook::fixture("push");
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
