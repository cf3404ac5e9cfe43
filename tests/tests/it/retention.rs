//! The retention sweeper and the reaper.

use std::sync::Arc;

use hookinbox::deliveries::{self, ClaimRequest};
use hookinbox_tests::{Hook, TestEnv, settle, worker_cli};
use hookinbox_worker::JobOutcome;
use sha2::{Digest, Sha256};

use hookinbox_tests::handlers::AlwaysPermanent;

#[tokio::test]
async fn the_sweeper_deletes_only_expired_rows_of_each_state() {
    let (env, ingest) = TestEnv::with_ingest().await;
    for _ in 0..6 {
        let hook = Hook::fixture("push");
        assert_eq!(ingest.send(&hook).await.status, 202);
    }
    // Two completed, two dead letters, two left processing.
    let store = env.store_worker().await;
    let failing = env.worker(Arc::new(AlwaysPermanent)).await;
    for worker in [&store, &store, &failing, &failing] {
        assert!(worker.drain_one().await.expect("drain one").is_some());
    }
    let old = "now() - interval '40 days'";
    env.db
        .batch_execute(&format!(
            "update deliveries set completed_at = {old} where delivery_id = '{}';
             update deliveries set failed_at = {old} where delivery_id = '{}';
             update deliveries set created_at = {old}, lease_until = now() + interval '1 hour' where status = 'processing';",
            ids_by_status(&env, "completed").await[0],
            ids_by_status(&env, "failed").await[0],
        ))
        .await
        .expect("age rows");
    let (code, out) = worker_cli(&env, &["sweep"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("swept 1 completed and 1 failed"), "{out}");
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'completed'")
            .await,
        1
    );
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'failed'")
            .await,
        1
    );
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'processing'")
            .await,
        2
    );
    assert_eq!(
        env.count("select count(*) from bodies").await,
        6,
        "bodies go with a retention of their own, by the day they came"
    );
    env.cleanup().await;
}

async fn ids_by_status(env: &TestEnv, status: &str) -> Vec<String> {
    env.db
        .query(
            "select delivery_id from deliveries where status = $1 order by delivery_id",
            &[&status],
        )
        .await
        .expect("ids")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test]
async fn the_reaper_marks_only_abandoned_claims_lost_and_both_ways_out_complete() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let worker = env.store_worker().await;
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");

    // A: its job message is still queued (it carries the token).
    let a = Hook::fixture("push");
    assert_eq!(ingest.send(&a).await.status, 202);
    // B: its ingest died after the claim; no message exists.
    let b = Hook::fixture("push");
    let sha: [u8; 32] = Sha256::digest(&b.body).into();
    let claim = deliveries::claim(
        &client,
        &env.policy(),
        &ClaimRequest {
            origin: Default::default(),
            key: b.key().clone(),
            event: "push".into(),
            action: None,
            repository: None,
            body_sha256: sha,
            guarded: false,
            pinned: false,
            legs: vec![hookinbox_tests::store_leg()],
            body: hookinbox_tests::json_body(&b.body),
        },
    )
    .await
    .expect("claim");
    assert!(hookinbox_tests::claimed_token(&claim).is_some());
    // C: a live claim; D: expired only a moment ago.
    let c = Hook::fixture("push");
    let d = Hook::fixture("push");
    for h in [&c, &d] {
        assert_eq!(ingest.send(h).await.status, 202);
    }
    // E: a worker took it (installing its own token, which no message
    // carries) and died; its message went back to the queue.
    let e = Hook::fixture("push");
    assert_eq!(ingest.send(&e).await.status, 202);
    let t0: uuid::Uuid = env
        .db
        .query_one(
            "select claim_token from deliveries where delivery_id = $1",
            &[&e.id()],
        )
        .await
        .expect("row")
        .get(0);
    let taken = deliveries::take(
        &client,
        &env.policy(),
        &e.leg(),
        hookinbox::key::ClaimToken(t0),
        env.policy().max_attempts,
    )
    .await
    .expect("take");
    assert!(matches!(taken, deliveries::Take::Taken { .. }));
    env.db
        .execute(
            "update deliveries set lease_until = now() - interval '1 hour' where delivery_id = any($1)",
            &[&vec![a.id().to_owned(), b.id().to_owned(), e.id().to_owned()]],
        )
        .await
        .expect("abandon");
    env.db
        .execute(
            "update deliveries set lease_until = now() - interval '1 second' where delivery_id = $1",
            &[&d.id()],
        )
        .await
        .expect("expire");
    let token_a: uuid::Uuid = env
        .db
        .query_one(
            "select claim_token from deliveries where delivery_id = $1",
            &[&a.id()],
        )
        .await
        .expect("row")
        .get(0);

    assert_eq!(worker.reap_once().await.expect("reap"), 3);
    let lost: Vec<String> = env
        .db
        .query(
            "select delivery_id from deliveries where last_error_class = 'lost' and retryable and status = 'failed'",
            &[],
        )
        .await
        .expect("lost")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(lost.len(), 3);
    assert!(lost.contains(&a.id().to_owned()) && lost.contains(&b.id().to_owned()));
    assert!(lost.contains(&e.id().to_owned()));
    let kept: uuid::Uuid = env
        .db
        .query_one(
            "select claim_token from deliveries where delivery_id = $1",
            &[&a.id()],
        )
        .await
        .expect("row")
        .get(0);
    assert_eq!(kept, token_a, "the reaper keeps the token");

    // Way out 1: a message of the delivery takes it: A's carries the kept
    // token; E's carries the ingest token, not the dead worker's.
    // Way out 2: B is taken at once by GitHub's redelivery.
    let answer = ingest.send(&b).await;
    assert_eq!((answer.status, answer.kind()), (202, "accepted"));
    let outcomes = settle(&env, &worker).await;
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == JobOutcome::Completed)
            .count(),
        5
    );
    assert_eq!(env.events().await, 5);
    env.cleanup().await;
}

#[tokio::test]
async fn stored_events_are_swept_after_their_own_retention_and_0_keeps_them() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let worker = env.store_worker().await;
    // One event 50 days old, one 35, one fresh; their deliveries are fresh.
    hookinbox_tests::stored_events_aged(&env, &ingest, &worker, &[50, 35, 0]).await;
    let sweep = |extra: &[(&str, &str)]| {
        let out = hookinbox_tests::worker_command(&env, &["sweep"], extra)
            .output()
            .expect("runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // 0 keeps every event.
    let out = sweep(&[("HOOKINBOX_EVENTS_RETENTION_DAYS", "0")]);
    assert!(out.contains("0 stored events"), "{out}");
    assert_eq!(env.events().await, 3);
    // 40 days: only the 50-day-old one goes.
    let out = sweep(&[("HOOKINBOX_EVENTS_RETENTION_DAYS", "40")]);
    assert!(out.contains("1 stored events"), "{out}");
    assert_eq!(env.events().await, 2);
    // The default, 30 days: the 35-day-old one goes too.
    let out = sweep(&[]);
    assert!(out.contains("1 stored events"), "{out}");
    assert_eq!(env.events().await, 1);
    assert_eq!(env.deliveries().await, 3, "their deliveries are kept");
    env.cleanup().await;
}
