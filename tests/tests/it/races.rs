//! Concurrent copies of one delivery.

use futures::future::join_all;
use hookinbox::runtime::JobOutcome;
use hookinbox_tests::{Hook, TestEnv, fixtures};

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
