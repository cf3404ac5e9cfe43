//! Concurrent copies of one delivery.

use futures::future::join_all;
use hookinbox_tests::{Hook, TestEnv, fixtures};
use hookinbox_worker::JobOutcome;

#[tokio::test]
async fn fifty_concurrent_copies_give_one_claim_one_job_one_row() {
    let env = TestEnv::new().await;
    let ingest = env.ingest().await;
    let worker = env.store_worker().await;
    let hook = Hook::new("push", fixtures::own("push"));
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
    use hookinbox::deliveries::{self, Claim, ClaimRequest, Status};
    use hookinbox::key::{DeliveryId, DeliveryKey, HookId, SourceName};

    let env = TestEnv::new().await;
    let pool = hookinbox::postgres::pool(
        &env.database_url,
        1,
        hookinbox::postgres::DEFAULT_REQUEST_TIMEOUT,
    )
    .expect("pool");
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
        key: key(id),
        event: "push".to_owned(),
        action: None,
        body_sha256: [sha; 32],
    };
    // An existing completed delivery and an untaken, overdue claim.
    let first = deliveries::claim_batch(&client, &policy, &[req("done", 1), req("stale", 1)])
        .await
        .expect("batch");
    assert!(first.iter().all(|c| matches!(
        c,
        Claim::Claimed {
            reclaimed: false,
            attempts: 0,
            ..
        }
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
    assert!(matches!(
        answers[0],
        Claim::Claimed {
            reclaimed: false,
            ..
        }
    ));
    assert!(matches!(
        answers[1],
        Claim::Claimed {
            reclaimed: false,
            ..
        }
    ));
    assert_eq!(answers[2], Claim::Duplicate(Status::Processing));
    assert_eq!(answers[3], Claim::Conflict);
    assert_eq!(answers[4], Claim::Duplicate(Status::Completed));
    assert_eq!(answers[5], Claim::Conflict);
    assert!(matches!(answers[6], Claim::Republish { .. }));
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
    assert_eq!(answers[0], Claim::Conflict);
    assert!(
        matches!(
            answers[1],
            Claim::Claimed {
                reclaimed: true,
                ..
            }
        ),
        "{answers:?}"
    );
    env.cleanup().await;
}
