//! Leases, takeovers and fencing: a stale holder changes nothing, and a
//! killed worker's delivery is finished by another after its lease.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use hookinbox::Job;
use hookinbox::deliveries::{self, ClaimRequest, Take};
use hookinbox::key::{DeliveryId, DeliveryKey, HookId, LegKey, SourceName};
use hookinbox_tests::{Hook, TestEnv, bin, connect, fixtures, wait_until};
use hookinbox_worker::JobOutcome;
use hookinbox_worker::{Completion, Effect, Handler, HandlerError, Store};
use tokio::sync::Notify;

/// The leg (to the default settings' `store`) of delivery `id`.
fn key(id: &str) -> LegKey {
    DeliveryKey::github(
        SourceName::default_source(),
        HookId::parse(Some(b"1")).expect("digits"),
        DeliveryId::parse(id.as_bytes()).expect("ascii"),
    )
    .leg(hookinbox_tests::store_destination())
}

#[tokio::test]
async fn stale_worker_cannot_complete() {
    let env = TestEnv::new().await;
    let pool = env.pool(4);
    let policy = env.policy();
    let k = key("stale-1");
    let client = pool.get().await.expect("client");

    let (t0, stale) = taken(&env, &client, "stale-1").await;
    // Worker A stalls past its lease (backdated rather than slept for).
    env.db
        .execute(
            "update deliveries set lease_until = now() - interval '1 second'",
            &[],
        )
        .await
        .expect("backdate");
    // The redelivered message is taken by worker B.
    let Take::Taken {
        token: fresh,
        attempts,
        takeover,
        ..
    } = deliveries::take(&client, &policy, &k, t0, policy.max_attempts)
        .await
        .expect("take")
    else {
        panic!("takeover")
    };
    assert!(takeover);
    assert_eq!(attempts, 2);

    // Worker A wakes up: every write under its token is fenced.
    assert!(
        !deliveries::renew(&client, &policy, &k, stale)
            .await
            .expect("renew")
    );
    let job = Job {
        trace: Default::default(),
        key: k.clone(),
        event: hookinbox::key::EventName::parse(b"push").expect("event"),
        action: None,
        token: t0,
        attempts: Some(0),
        replays: 0,
        content_type: "application/json".to_owned(),
        github_headers: Vec::new(),
        body: fixtures::own("push").into(),
    };
    let mut stale_effect = Effect::new(pool.clone(), k.clone(), stale, 1);
    // The store effect is staged: the completing statement writes it only
    // if this token still holds the row, and it does not.
    Store.handle(&job, &mut stale_effect).await.expect("staged");
    let completion = stale_effect.complete().await.expect("complete");
    assert_eq!(completion, Completion::Fenced);
    let failure = deliveries::Failure {
        class: deliveries::ErrorClass::Transient,
        message: "late".to_owned(),
        retry_in: None,
    };
    assert!(
        deliveries::fail(&client, &k, stale, &failure)
            .await
            .expect("fail")
            .is_none()
    );
    assert!(
        !deliveries::release_lease(&client, &k, stale)
            .await
            .expect("release")
    );
    assert_eq!(env.events().await, 0, "the stale effect never landed");

    // Worker B finishes normally.
    let mut effect = Effect::new(pool.clone(), k.clone(), fresh, 2);
    Store.handle(&job, &mut effect).await.expect("effect");
    assert!(matches!(
        effect.complete().await.expect("complete"),
        Completion::Completed { .. }
    ));
    assert_eq!(env.events().await, 1);
    let row = deliveries::get(&client, &k)
        .await
        .expect("get")
        .expect("row");
    assert_eq!(row.status, deliveries::Status::Completed);
    assert_eq!(row.claim_token, fresh);
    env.cleanup().await;
}

/// Store; the first call waits until the test lets it go.
struct Gated {
    entered: Notify,
    go: Notify,
    first: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Handler for Gated {
    async fn handle(&self, job: &Job, effect: &mut Effect) -> Result<(), HandlerError> {
        if self.first.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.entered.notify_one();
            self.go.notified().await;
        }
        Store.handle(job, effect).await
    }
}

#[tokio::test]
async fn worker_whose_claim_was_taken_over_is_fenced_and_acks() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let gate = Arc::new(Gated {
        entered: Notify::new(),
        go: Notify::new(),
        first: std::sync::atomic::AtomicBool::new(true),
    });
    let worker = env.worker(gate.clone()).await;
    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);
    let mut draining = tokio::spawn(async move { worker.drain().await });
    // The job must reach its effect; a drain that ends first (a broken
    // broker, say) fails the test instead of leaving it waiting.
    tokio::select! {
        () = gate.entered.notified() => {}
        ended = &mut draining => panic!("the drain ended before the job started: {ended:?}"),
        () = tokio::time::sleep(Duration::from_secs(60)) => panic!("the job never started"),
    }

    // Its lease lapses and a redelivery takes the delivery over.
    env.db
        .execute(
            "update deliveries set lease_until = now() - interval '1 second'",
            &[],
        )
        .await
        .expect("backdate");
    let answer = ingest.send(&hook).await;
    assert_eq!(
        (answer.status, answer.kind()),
        (202, "accepted"),
        "reclaimed"
    );

    gate.go.notify_one();
    // The stale job is fenced; the redelivery's job (drained next) completes.
    let report = draining.await.expect("join").expect("drain");
    assert_eq!(
        report.outcomes,
        vec![JobOutcome::Fenced, JobOutcome::Completed]
    );
    assert_eq!(env.events().await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn worker_killed_mid_job_is_finished_by_another_after_the_lease() {
    // The full path: the killed worker took the delivery, and its lease
    // stands until it runs out.
    let (env, attempts) = killed_mid_effect(false).await;
    assert_eq!(attempts, 2, "the killed take, then the one that finished");
    env.cleanup().await;
}

#[tokio::test]
async fn worker_killed_mid_statement_on_the_one_statement_path_leaves_no_take_behind() {
    // The one-statement path: nothing of the killed worker's committed, not
    // even a take, so no lease of its own holds the next worker back. The
    // redelivered message goes the full way (its take counts the attempt).
    let (env, attempts) = killed_mid_effect(true).await;
    assert_eq!(attempts, 1, "only the take that finished counted");
    env.cleanup().await;
}

/// A worker process blocks inside its effect (`github_events` locked) and
/// is killed with SIGKILL; another worker then drains the redelivered
/// message. Returns the environment and the delivery's attempts at the end.
async fn killed_mid_effect(fused: bool) -> (TestEnv, i64) {
    let env = TestEnv::new().await;
    let mut args = env.ingest_args();
    args.common.lease_secs = 3;
    let ingest = env.ingest_with(args.validate().expect("valid")).await;

    // Hold the effect table so the worker blocks mid-effect.
    let blocker = connect(&env.database_url).await;
    blocker
        .batch_execute("begin; lock table github_events in access exclusive mode")
        .await
        .expect("lock");

    let log =
        std::fs::File::create(std::env::temp_dir().join(format!("{}-worker.log", env.prefix)))
            .expect("log");
    let mut child = tokio::process::Command::new(bin("hookinbox-worker"))
        .envs(env.database_env())
        .env("AMQP_URL", hookinbox_tests::amqp_url())
        .env("HOOKINBOX_QUEUE_PREFIX", &env.prefix)
        .env("HOOKINBOX_LEASE_SECS", "3")
        .env("HOOKINBOX_FUSED_TAKE", fused.to_string())
        .env("HOOKINBOX_AUTO_MIGRATE", "false")
        .env("HOOKINBOX_METRICS_LISTEN", "127.0.0.1:0")
        .env("HOOKINBOX_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("worker starts");

    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);
    let db_name = env.db_name.clone();
    wait_until("the worker to block inside its effect", Duration::from_secs(20), || {
        let db = &env.db;
        let db_name = db_name.clone();
        async move {
            db.query_one(
                // The completing statement itself, not a maintenance read that
                // touched the locked table first.
                "select count(*) from pg_stat_activity where datname = $1 and wait_event_type = 'Lock'
                   and query like '%set status = ''completed''%'",
                &[&db_name],
            )
            .await
            .map(|r| r.get::<_, i64>(0) > 0)
            .unwrap_or(false)
        }
    })
    .await;

    child.kill().await.expect("kill -9");
    blocker.batch_execute("rollback").await.expect("unlock");
    wait_until(
        "the broker to requeue the message",
        Duration::from_secs(20),
        || async { env.work_depth().await == 1 },
    )
    .await;

    let mut worker_args = env.worker_args();
    worker_args.common.lease_secs = 3;
    let worker = env
        .worker_with(worker_args.validate().expect("valid"), Arc::new(Store))
        .await;
    // After a killed take, its lease is still live: the copy is deferred,
    // then taken once the lease runs out.
    let report = worker.drain().await.expect("drain");
    assert_eq!(report.outcomes, vec![JobOutcome::Completed]);
    assert_eq!(env.events().await, 1);
    let attempts = env.count("select attempts::bigint from deliveries").await;
    (env, attempts)
}

/// Claims and takes `id`, returning the claim's token and the live one.
async fn taken(
    env: &TestEnv,
    client: &deadpool_postgres::Object,
    id: &str,
) -> (hookinbox::key::ClaimToken, hookinbox::key::ClaimToken) {
    let policy = env.policy();
    let k = key(id);
    let claim = deliveries::claim(
        client,
        &policy,
        &ClaimRequest {
            origin: Default::default(),
            key: k.delivery.clone(),
            event: "push".into(),
            action: None,
            repository: None,
            body_sha256: [7; 32],
            guarded: false,
            pinned: false,
            legs: vec![hookinbox_tests::store_leg()],
            body: hookinbox_tests::json_body(b"{}"),
        },
    )
    .await
    .expect("claim");
    let Some(t0) = hookinbox_tests::claimed_token(&claim) else {
        panic!("new key must be claimed")
    };

    let Take::Taken { token, .. } = deliveries::take(client, &policy, &k, t0, policy.max_attempts)
        .await
        .expect("take")
    else {
        panic!("take")
    };
    (t0, token)
}

#[tokio::test]
async fn a_batch_of_completions_fences_each_row_by_its_own_token() {
    let env = TestEnv::new().await;
    let pool = env.pool(2);
    let client = pool.get().await.expect("client");
    let event = || {
        Some(deliveries::StoredEvent {
            event: "push".to_owned(),
            action: None,
            payload: bytes::Bytes::from_static(br#"{"ok":true}"#),
        })
    };
    let (_, live) = taken(&env, &client, "batch-live").await;
    taken(&env, &client, "batch-stale").await;
    let (_, twice) = taken(&env, &client, "batch-twice").await;
    let (_, plain) = taken(&env, &client, "batch-plain").await;
    let stale = hookinbox::key::ClaimToken::new();
    let item = |id: &str, token, store| deliveries::Completing {
        key: key(id),
        token,
        take: None,
        max_attempts: 3,
        store,
    };
    let answers = deliveries::complete_batch(
        &client,
        &[
            item("batch-live", live, event()),
            // A stale holder rides in the same batch: fenced, no effect.
            item("batch-stale", stale, event()),
            // The same key under a stale and the live token, and the live
            // entry repeated: one completion, one effect.
            item("batch-twice", stale, event()),
            item("batch-twice", twice, event()),
            item("batch-twice", twice, event()),
            // An effect outside Postgres: completion only.
            item("batch-plain", plain, None),
        ],
    )
    .await
    .expect("batch");
    let completed: Vec<bool> = answers.iter().map(Option::is_some).collect();
    assert_eq!(completed, vec![true, false, false, true, false, true]);
    let stored: Vec<String> = env
        .db
        .query("select delivery_id from github_events order by 1", &[])
        .await
        .expect("events")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(stored, vec!["batch-live", "batch-twice"]);
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'completed'")
            .await,
        3
    );
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'processing'")
            .await,
        1,
        "the stale holder's row is untouched"
    );
    env.cleanup().await;
}
