//! What ingest answers without a claim: pings, events a source does not
//! take, health and readiness, and routes it does not serve.

use hookinbox_tests::{Hook, TestEnv};

fn push() -> Hook {
    Hook::fixture("push")
}

#[tokio::test]
async fn ping_and_events_not_taken_answer_200_without_a_claim() {
    let env = TestEnv::new().await;
    let mut args = env.ingest_args();
    args.sources.allowed_events = "push,pull_request".to_owned();
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let answer = ingest.send(&Hook::fixture("ping")).await;
    assert_eq!((answer.status, answer.kind()), (200, "pong"));
    let answer = ingest.send(&Hook::fixture("issues")).await;
    assert_eq!((answer.status, answer.kind()), (200, "ignored"));
    assert_eq!(env.deliveries().await, 0);
    let answer = ingest.send(&push()).await;
    assert_eq!((answer.status, answer.kind()), (202, "accepted"));
    assert_eq!(env.deliveries().await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn health_and_readiness_answer_and_other_routes_are_refused() {
    let (env, ingest) = TestEnv::with_ingest().await;
    assert_eq!(ingest.get("/healthz").await, 200);
    assert_eq!(ingest.get("/readyz").await, 200);
    assert_eq!(ingest.get("/webhooks/github").await, 405);
    assert_eq!(ingest.get("/nothing-here").await, 404);
    env.cleanup().await;
}
