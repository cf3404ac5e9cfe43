//! RabbitMQ or Postgres unreachable (through a closable proxy, never by
//! stopping the shared services), and a claim whose publish was lost.

use hookinbox::deliveries::{self, ClaimRequest};
use hookinbox_worker::JobOutcome;
use std::sync::Arc;

use hookinbox_tests::{Hook, TestEnv, proxy::Proxy, settle};
use hookinbox_worker::Store;
use sha2::{Digest, Sha256};

#[tokio::test]
async fn broker_down_at_ingest_parks_answers_202_and_everything_completes_once_it_is_back() {
    let env = TestEnv::new().await;
    let proxy = Proxy::start("127.0.0.1:5672").await;
    let through_proxy = format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port());
    let mut args = env.ingest_args();
    args.common.amqp_url = through_proxy.clone();
    args.common.publish_timeout_ms = 2000;
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let mut worker_args = env.worker_args();
    worker_args.common.amqp_url = through_proxy;
    let worker = env
        .worker_with(worker_args.validate().expect("valid"), Arc::new(Store))
        .await;

    proxy.close();
    let hooks: Vec<Hook> = (0..3).map(|_| Hook::fixture("push")).collect();
    for hook in &hooks {
        let answer = ingest.send(hook).await;
        assert_eq!(
            (answer.status, answer.kind()),
            (202, "accepted"),
            "{:?}",
            answer.body
        );
        assert_eq!(answer.body["parked"], true);
    }
    assert_eq!(
        env.count(
            "select count(*) from deliveries d join bodies b \
             on b.provider = d.provider and b.source = d.source and b.hook_id = d.hook_id \
              and b.delivery_id = d.delivery_id and b.received_at = d.created_at \
             where d.status = 'failed' and d.retryable and d.next_attempt_at <= now() and d.attempts = 0 \
             and d.last_error_class = 'publish'"
        )
        .await,
        3,
        "recorded as due, with the bodies their claims wrote"
    );
    // While the broker is away, the scheduler cannot publish and puts the
    // rows back as due.
    assert_eq!(worker.schedule_once().await.expect("pass"), 0);
    assert_eq!(env.events().await, 0);

    proxy.reopen();
    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes, vec![JobOutcome::Completed; 3]);
    assert_eq!(env.events().await, 3);
    assert_eq!(
        env.count("select count(*) from bodies").await,
        3,
        "one body a delivery, written once: the broker's outage wrote none again"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn postgres_unreachable_gives_503_and_publishes_nothing() {
    let env = TestEnv::new().await;
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let mut args = env.ingest_args();
    args.common.database_url = env.database_url_via(proxy.port());
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    proxy.close();
    let hook = Hook::fixture("push");
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
    let (env, ingest) = TestEnv::with_ingest().await;
    let hook = Hook::fixture("push");
    // An ingest claimed this delivery and died before publishing.
    let key = hook.key();
    let sha: [u8; 32] = Sha256::digest(&hook.body).into();
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    let claim = deliveries::claim(
        &client,
        &env.policy(),
        &ClaimRequest {
            origin: Default::default(),
            key: key.clone(),
            event: "push".into(),
            action: None,
            repository: None,
            body_sha256: sha,
            guarded: false,
            pinned: false,
            legs: vec![hookinbox_tests::store_leg()],
            body: hookinbox_tests::json_body(b"{}"),
        },
    )
    .await
    .expect("claim");
    let Some(token) = hookinbox_tests::claimed_token(&claim) else {
        panic!("{claim:?}")
    };
    let key = hook.leg();

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
    assert_eq!(
        row.claim_token, token,
        "completed by the job's own token, the completion being its take"
    );
    assert_eq!(env.events().await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn a_copy_answered_while_the_first_ingest_died_before_publishing_is_not_lost() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let worker = env.store_worker().await;
    let hook = Hook::fixture("push");
    // An ingest claimed the delivery and died before publishing.
    let key = hook.key();
    let sha: [u8; 32] = Sha256::digest(&hook.body).into();
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    deliveries::claim(
        &client,
        &env.policy(),
        &ClaimRequest {
            origin: Default::default(),
            key: key.clone(),
            event: "push".into(),
            action: None,
            repository: None,
            body_sha256: sha,
            guarded: false,
            pinned: false,
            legs: vec![hookinbox_tests::store_leg()],
            body: hookinbox_tests::json_body(&hook.body),
        },
    )
    .await
    .expect("claim");
    // A copy arrives before the publish timeout: answered 202 without a
    // job, and nothing written: the claim wrote the body.
    let answer = ingest.send(&hook).await;
    assert_eq!((answer.status, answer.kind()), (202, "duplicate"));
    assert_eq!(env.work_depth().await, 0);
    assert_eq!(env.count("select count(*) from bodies").await, 1);
    // The claim is abandoned; the reaper marks it lost and the scheduler
    // publishes it again from the body its claim wrote.
    env.db
        .execute(
            "update deliveries set lease_until = now() - interval '1 hour'",
            &[],
        )
        .await
        .expect("abandon");
    assert_eq!(worker.reap_once().await.expect("reap"), 1);
    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes, vec![JobOutcome::Completed]);
    assert_eq!(env.events().await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn a_half_open_postgres_connection_is_given_up_and_the_job_still_completes_once() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let mut args = env.worker_args();
    args.common.database_url = env.database_url_via(proxy.port());
    args.common.db_timeout_ms = 1000;
    let worker = env
        .worker_with(args.validate().expect("valid"), Arc::new(Store))
        .await;
    let first = Hook::fixture("push");
    assert_eq!(ingest.send(&first).await.status, 202);
    assert_eq!(settle(&env, &worker).await, vec![JobOutcome::Completed]);

    // Every pooled connection goes silent: the far end still accepts bytes
    // but never answers, which keepalives cannot see.
    proxy.stall();
    let second = Hook::fixture("push");
    assert_eq!(ingest.send(&second).await.status, 202);
    let draining = tokio::spawn({
        let worker = worker.clone();
        async move { worker.drain().await.expect("drain").outcomes }
    });
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(!draining.is_finished(), "no job can finish while stalled");
    proxy.open();
    let outcomes = tokio::time::timeout(std::time::Duration::from_secs(60), draining)
        .await
        .expect("the worker gave up the silent connections")
        .expect("join");
    assert_eq!(outcomes, vec![JobOutcome::Completed]);
    assert_eq!(env.events().await, 2);
    env.cleanup().await;
}

#[tokio::test]
async fn a_half_open_broker_connection_at_ingest_parks_then_reconnects() {
    let env = TestEnv::new().await;
    let proxy = Proxy::start("127.0.0.1:5672").await;
    let mut args = env.ingest_args();
    args.common.amqp_url = format!(
        "amqp://guest:guest@127.0.0.1:{}/%2f?heartbeat=1",
        proxy.port()
    );
    args.common.publish_timeout_ms = 1000;
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let worker = env.store_worker().await;
    let send = |hook: Hook| {
        let ingest = &ingest;
        async move { ingest.send_accepted(&hook).await }
    };
    assert!(!send(Hook::fixture("push")).await);

    proxy.stall();
    // No confirm comes back: the body is parked and the answer is still 202.
    let started = std::time::Instant::now();
    assert!(send(Hook::fixture("push")).await);
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    proxy.open();

    // The heartbeat finds the dead connection; ingest reconnects and
    // publishes directly again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut sent = 2;
    loop {
        sent += 1;
        if !send(Hook::fixture("push")).await {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "ingest never reconnected"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes.len(), sent);
    assert!(outcomes.iter().all(|o| *o == JobOutcome::Completed));
    assert_eq!(env.events().await, sent as i64);
    env.cleanup().await;
}

/// Ingest's publish failed only after its claim's lease and the reaper's
/// grace ran out (a broker that stalls for many seconds): the reaper has
/// marked the claim `lost`, keeping its token. Ingest records the leg as
/// due all the same and answers 202, so the scheduler must publish it from
/// the body the claim wrote: GitHub saw a success and never redelivers. A
/// claim taken since (a new token) is never recorded over.
#[tokio::test]
async fn a_publish_that_fails_after_the_reaper_marked_the_claim_lost_is_still_due() {
    let env = TestEnv::new().await;
    let worker = env.store_worker().await;
    let hook = Hook::fixture("push");
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    let token = env
        .claim_expired(&client, &hook, hookinbox_tests::store_leg())
        .await;
    assert_eq!(env.reap_now().await, 1, "the reaper marks the claim lost");

    // Another token (a take since) is refused: that leg is in flight.
    let other = hookinbox::ClaimToken(uuid::Uuid::new_v4());
    let refused = deliveries::publish_failed(&client, &hook.leg(), other, "publish timed out", 0)
        .await
        .expect("record");
    assert!(!refused, "a claim under another token is not recorded over");

    let recorded = deliveries::publish_failed(&client, &hook.leg(), token, "publish timed out", 0)
        .await
        .expect("record");
    assert!(
        recorded,
        "the lost claim's own failed publish records it as due"
    );
    assert_eq!(
        env.count(
            "select count(*) from deliveries d join bodies b \
             on b.provider = d.provider and b.source = d.source and b.hook_id = d.hook_id \
              and b.delivery_id = d.delivery_id and b.received_at = d.created_at \
             where d.status = 'failed' and d.retryable and d.next_attempt_at <= now() and d.last_error_class = 'publish'"
        )
        .await,
        1,
        "recorded as due with its body"
    );
    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes, vec![JobOutcome::Completed]);
    assert_eq!(env.events().await, 1);
    env.cleanup().await;
}
