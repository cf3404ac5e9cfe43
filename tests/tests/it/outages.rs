//! RabbitMQ or Postgres unreachable (through a closable proxy, never by
//! stopping the shared services), and a claim whose publish was lost.

use std::time::Duration;

use hookinbox::deliveries::{self, Claim, NewClaim};
use hookinbox::key::{DeliveryId, DeliveryKey, HookId, SourceName};
use hookinbox::runtime::JobOutcome;
use hookinbox_tests::{Hook, TestEnv, fixtures, proxy::Proxy, wait_until};
use sha2::{Digest, Sha256};

#[tokio::test]
async fn broker_unreachable_gives_503_and_releases_the_claim_then_redelivery_completes() {
    let env = TestEnv::new().await;
    let proxy = Proxy::start("127.0.0.1:5672").await;
    let mut args = env.ingest_args();
    args.common.amqp_url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port());
    args.common.publish_timeout_ms = 2000;
    let ingest = env.ingest_with(args.validate().expect("valid")).await;

    proxy.close();
    let hook = Hook::new("push", fixtures::own("push"));
    let answer = ingest.send(&hook).await;
    assert_eq!(
        (answer.status, answer.kind()),
        (503, "error"),
        "{:?}",
        answer.body
    );
    let row = env
        .db
        .query_one(
            "select status, retryable, attempts, last_error_class from deliveries",
            &[],
        )
        .await
        .expect("claim row");
    assert_eq!(row.get::<_, String>(0), "failed");
    assert!(row.get::<_, bool>(1), "released as retryable");
    assert_eq!(row.get::<_, i32>(2), 0);
    assert_eq!(row.get::<_, String>(3), "publish");
    assert_eq!(env.work_depth().await, 0);

    proxy.reopen();
    wait_until("ingest to reconnect", Duration::from_secs(20), || async {
        ingest.get("/readyz").await == 200
    })
    .await;
    let answer = ingest.send(&hook).await;
    assert_eq!((answer.status, answer.kind()), (202, "accepted"));
    let report = env.store_worker().await.drain().await.expect("drain");
    assert_eq!(report.outcomes, vec![JobOutcome::Completed]);
    assert_eq!(env.events().await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn postgres_unreachable_gives_503_and_publishes_nothing() {
    let env = TestEnv::new().await;
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let mut args = env.ingest_args();
    args.common.database_url = env
        .database_url
        .replace("127.0.0.1:5432", &format!("127.0.0.1:{}", proxy.port()));
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    proxy.close();
    let hook = Hook::new("push", fixtures::own("push"));
    let answer = ingest.send(&hook).await;
    assert_eq!((answer.status, answer.kind()), (503, "error"));
    assert_eq!(ingest.get("/readyz").await, 503);
    assert_eq!(env.work_depth().await, 0);
    assert_eq!(env.deliveries().await, 0);
    proxy.reopen();
    let answer = ingest.send(&hook).await;
    assert_eq!((answer.status, answer.kind()), (202, "accepted"));
    env.cleanup().await;
}

#[tokio::test]
async fn untaken_claim_is_rescued_by_a_redelivery_that_republishes_it() {
    let env = TestEnv::new().await;
    let ingest = env.ingest().await;
    let hook = Hook::new("push", fixtures::own("push"));
    // An ingest claimed this delivery and died before publishing.
    let key = DeliveryKey::github(
        SourceName::default_source(),
        HookId::parse(hook.hook_id.as_deref().map(str::as_bytes)).expect("hook id"),
        DeliveryId::parse(hook.id().as_bytes()).expect("id"),
    );
    let sha: [u8; 32] = Sha256::digest(&hook.body).into();
    let pool = hookinbox::db::pool(&env.database_url, 1).expect("pool");
    let client = pool.get().await.expect("client");
    let claim = deliveries::claim(
        &client,
        &env.common().policy(),
        NewClaim {
            key: &key,
            event: "push",
            action: None,
            body_sha256: &sha,
        },
    )
    .await
    .expect("claim");
    let Claim::Claimed { token, .. } = claim else {
        panic!("{claim:?}")
    };

    // A copy racing the first publish does not republish.
    let answer = ingest.send(&hook).await;
    assert_eq!((answer.status, answer.kind()), (202, "duplicate"));
    assert_eq!(env.work_depth().await, 0);

    // Once the claim is older than the publish timeout, a redelivery does.
    env.db
        .execute(
            "update deliveries set claimed_at = now() - interval '1 minute'",
            &[],
        )
        .await
        .expect("age the claim");
    let answer = ingest.send(&hook).await;
    assert_eq!(
        (answer.status, answer.kind()),
        (202, "accepted"),
        "{:?}",
        answer.body
    );
    assert_eq!(answer.body["republished"], true);
    let report = env.store_worker().await.drain().await.expect("drain");
    assert_eq!(report.outcomes, vec![JobOutcome::Completed]);
    let row = deliveries::get(&client, &key)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(
        row.attempts, 1,
        "the republished job carried the original token"
    );
    assert_ne!(row.claim_token, token, "the take installed its own token");
    assert_eq!(env.events().await, 1);
    env.cleanup().await;
}
