//! Ingest deduplicates: the same key is claimed once, whatever races it,
//! and a copy is answered by what the first one became.

use std::sync::Arc;

use futures::future::join_all;
use hookinbox_tests::handlers::AlwaysPermanent;
use hookinbox_tests::{Hook, SECRET, TestEnv, fixtures};
use hookinbox_worker::JobOutcome;

fn push() -> Hook {
    Hook::fixture("push")
}

#[tokio::test]
async fn same_key_with_another_body_is_a_conflict_and_never_processed() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let worker = env.store_worker().await;
    let first = push();
    assert_eq!(ingest.send(&first).await.status, 202);
    let mut other = first.clone();
    other.body = fixtures::own("issues");
    other = other.signed_with(SECRET);
    let answer = ingest.send(&other).await;
    assert_eq!((answer.status, answer.kind()), (409, "conflict"));
    let report = worker.drain().await.expect("drain");
    assert_eq!(
        report.outcomes.len(),
        1,
        "only the first body was published"
    );
    let stored: String = env
        .db
        .query_one("select event from github_events", &[])
        .await
        .expect("one row")
        .get(0);
    assert_eq!(stored, "push");
    // Still a conflict after completion.
    assert_eq!(ingest.send(&other).await.status, 409);
    env.cleanup().await;
}

#[tokio::test]
async fn duplicate_while_processing_is_accepted_without_a_second_job() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let hook = push();
    assert_eq!(ingest.send(&hook).await.status, 202);
    let answer = ingest.send(&hook).await;
    assert_eq!((answer.status, answer.kind()), (202, "duplicate"));
    assert_eq!(answer.body["state"], "processing");
    assert_eq!(env.work_depth().await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn duplicate_of_a_dead_lettered_delivery_is_accepted_without_a_job() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let worker = env.worker(Arc::new(AlwaysPermanent)).await;
    let hook = push();
    assert_eq!(ingest.send(&hook).await.status, 202);
    let report = worker.drain().await.expect("drain");
    assert_eq!(
        report.outcomes,
        vec![JobOutcome::Failed {
            class: hookinbox::deliveries::ErrorClass::Permanent,
            retryable: false
        }]
    );
    let row = env
        .db
        .query_one(
            "select status, retryable, last_error_class, last_error, dead_lettered_at is not null from deliveries",
            &[],
        )
        .await
        .expect("row");
    assert_eq!(row.get::<_, String>(0), "failed");
    assert!(!row.get::<_, bool>(1));
    assert_eq!(row.get::<_, String>(2), "permanent");
    assert_eq!(row.get::<_, String>(3), "receiver refused the event");
    assert!(row.get::<_, bool>(4), "the dead-letter copy was confirmed");
    assert_eq!(env.dead_depth().await, 1);

    let answer = ingest.send(&hook).await;
    assert_eq!((answer.status, answer.kind()), (202, "duplicate"));
    assert_eq!(answer.body["state"], "failed");
    assert_eq!(env.work_depth().await, 0);
    assert_eq!(env.events().await, 0);
    env.cleanup().await;
}

#[tokio::test]
async fn fifty_concurrent_copies_give_one_claim_one_job_one_row() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let worker = env.store_worker().await;
    let hook = Hook::fixture("push");
    let answers = join_all((0..50).map(|_| ingest.send(&hook))).await;
    let accepted = answers.iter().filter(|a| a.kind() == "accepted").count();
    let duplicates = answers
        .iter()
        .filter(|a| a.status == 202 && a.kind() == "duplicate")
        .count();
    assert_eq!(accepted, 1, "{answers:?}");
    assert_eq!(duplicates, 49, "{answers:?}");
    assert_eq!(env.deliveries().await, 1);
    assert_eq!(env.work_depth().await, 1, "one published job");
    let report = worker.drain().await.expect("drain");
    assert_eq!(report.outcomes, vec![JobOutcome::Completed]);
    assert_eq!(env.events().await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn a_claim_batch_answers_each_request_like_a_single_claim() {
    use hookinbox::deliveries::{self, ClaimRequest, LegClaim, Status};
    use hookinbox::key::{DeliveryId, DeliveryKey, HookId, SourceName};
    use hookinbox_tests::{OneLeg, one_leg};

    let env = TestEnv::new().await;
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    let policy = env.policy();
    let key = |id: &str| {
        DeliveryKey::github(
            SourceName::default_source(),
            HookId::parse(Some(b"9")).expect("hook"),
            DeliveryId::parse(id.as_bytes()).expect("id"),
        )
    };
    let req = |id: &str, sha: u8| ClaimRequest {
        origin: Default::default(),
        key: key(id),
        event: "push".to_owned(),
        action: None,
        repository: None,
        body_sha256: [sha; 32],
        guarded: false,
        pinned: false,
        legs: vec![hookinbox_tests::store_leg()],
        body: hookinbox_tests::json_body(b"{}"),
    };
    // An existing completed delivery and an untaken, overdue claim.
    let first = deliveries::claim_batch(&client, &policy, &[req("done", 1), req("stale", 1)])
        .await
        .expect("batch");
    assert!(first.iter().all(|c| matches!(
        one_leg(c),
        OneLeg::Leg(LegClaim::Claimed {
            reclaimed: false,
            attempts: 0,
            ..
        })
    )));
    env.db
        .batch_execute(
            "update deliveries set status = 'completed', completed_at = now() where delivery_id = 'done';
             update deliveries set claimed_at = now() - interval '1 minute' where delivery_id = 'stale';",
        )
        .await
        .expect("arrange");

    let answers = deliveries::claim_batch(
        &client,
        &policy,
        &[
            req("new-b", 1),
            req("new-a", 1),
            req("new-a", 1), // a copy in the same batch
            req("new-a", 2), // same key, another body, same batch
            req("done", 1),
            req("done", 3),
            req("stale", 1),
        ],
    )
    .await
    .expect("batch");
    let answers: Vec<OneLeg> = answers.iter().map(one_leg).collect();
    assert!(matches!(
        answers[0],
        OneLeg::Leg(LegClaim::Claimed {
            reclaimed: false,
            ..
        })
    ));
    assert!(matches!(
        answers[1],
        OneLeg::Leg(LegClaim::Claimed {
            reclaimed: false,
            ..
        })
    ));
    assert_eq!(
        answers[2],
        OneLeg::Leg(LegClaim::Duplicate(Status::Processing))
    );
    assert_eq!(answers[3], OneLeg::Conflict);
    assert_eq!(
        answers[4],
        OneLeg::Leg(LegClaim::Duplicate(Status::Completed))
    );
    assert_eq!(answers[5], OneLeg::Conflict);
    assert!(matches!(
        answers[6],
        OneLeg::Leg(LegClaim::Republish { .. })
    ));
    assert_eq!(env.deliveries().await, 4, "one row per key");

    // The stored body comes second in a batch whose first copy differs:
    // each is still answered as a single claim would be.
    deliveries::claim_batch(&client, &policy, &[req("mixed", 5)])
        .await
        .expect("batch");
    env.db
        .execute(
            "update deliveries set lease_until = now() - interval '1 second' where delivery_id = 'mixed'",
            &[],
        )
        .await
        .expect("expire");
    let answers = deliveries::claim_batch(&client, &policy, &[req("mixed", 6), req("mixed", 5)])
        .await
        .expect("batch");
    assert_eq!(one_leg(&answers[0]), OneLeg::Conflict);
    assert!(
        matches!(
            one_leg(&answers[1]),
            OneLeg::Leg(LegClaim::Claimed {
                reclaimed: true,
                ..
            })
        ),
        "{answers:?}"
    );
    env.cleanup().await;
}
