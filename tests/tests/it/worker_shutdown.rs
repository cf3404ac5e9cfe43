//! Worker shutdown and Postgres outages under a running worker.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use hookinbox_tests::receiver::{Receiver, Reply};
use hookinbox_tests::{Hook, TestEnv, bin, connect, proxy::Proxy, settle, wait_until};
use hookinbox_worker::JobOutcome;
use hookinbox_worker::Store;
use tokio_util::sync::CancellationToken;

async fn blocked_on_lock(env: &TestEnv) -> bool {
    env.db
        .query_one(
            "select count(*) from pg_stat_activity where datname = $1 and wait_event_type = 'Lock'",
            &[&env.db_name],
        )
        .await
        .map(|r| r.get::<_, i64>(0) > 0)
        .unwrap_or(false)
}

fn spawn_worker(env: &TestEnv, extra: &[(&str, &str)]) -> tokio::process::Child {
    let mut cmd = tokio::process::Command::new(bin("hookinbox-worker"));
    cmd.envs(env.database_env())
        .env("AMQP_URL", hookinbox_tests::amqp_url())
        .env("HOOKINBOX_QUEUE_PREFIX", &env.prefix)
        .env("HOOKINBOX_AUTO_MIGRATE", "false")
        .env("HOOKINBOX_METRICS_LISTEN", "127.0.0.1:0")
        .env("HOOKINBOX_SHUTDOWN_GRACE_SECS", "1")
        .env(
            "HOOKINBOX_FORWARD_ALLOW_NETWORKS",
            hookinbox_tests::LOOPBACK_NETWORKS,
        );
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("worker starts")
}

/// Sends SIGTERM and expects a clean exit within the grace period.
async fn terminate(mut child: tokio::process::Child) {
    let pid = child.id().expect("pid").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("exits within the grace period")
        .expect("wait");
    assert!(status.success(), "clean exit: {status:?}");
}

#[tokio::test]
async fn sigterm_releases_unfinished_leases_and_leaves_messages_for_another_worker() {
    let (env, ingest) = TestEnv::with_forward_ingest().await;
    // A forward receiver that never answers in time: the job is stuck in
    // its handler, before any effect.
    let receiver = Receiver::start(|_, _| Reply {
        delay: Duration::from_secs(60),
        ..Reply::status(200)
    })
    .await;
    let child = spawn_worker(
        &env,
        &[
            ("HOOKINBOX_HANDLER", "forward"),
            ("HOOKINBOX_FORWARD_URL", &receiver.url),
        ],
    );
    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);
    wait_until(
        "the job to wait in its handler",
        Duration::from_secs(20),
        || async { !receiver.received().is_empty() },
    )
    .await;
    terminate(child).await;

    let released: bool = env
        .db
        .query_one(
            "select status = 'processing' and lease_until <= now() from deliveries",
            &[],
        )
        .await
        .expect("row")
        .get(0);
    assert!(released, "the unfinished job's lease was released");
    wait_until(
        "the message to be back in the queue",
        Duration::from_secs(10),
        || async { env.work_depth().await == 1 },
    )
    .await;
    // Taken at once (no deferred wait for a lease), completed once: by a
    // worker of the same destination whose own handler stores.
    let mut args = env.worker_args();
    args.sources.handler = hookinbox::config::HandlerKind::Forward;
    args.forward_url = Some(receiver.url.clone());
    let other = env
        .worker_with(
            args.validate().expect("valid"),
            std::sync::Arc::new(hookinbox_worker::Store),
        )
        .await;
    let report = other.drain().await.expect("drain");
    assert_eq!(report.outcomes, vec![JobOutcome::Completed]);
    assert_eq!(env.events().await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn sigterm_during_a_blocked_completion_exits_and_the_effect_still_happens_once() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let blocker = connect(&env.database_url).await;
    blocker
        .batch_execute("begin; lock table github_events in access exclusive mode")
        .await
        .expect("lock");
    // A short lease: the next worker waits it out if the abandoned
    // statement rolled back.
    let child = spawn_worker(&env, &[("HOOKINBOX_LEASE_SECS", "5")]);
    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);
    wait_until(
        "the completion to block on the lock",
        Duration::from_secs(20),
        || blocked_on_lock(&env),
    )
    .await;
    // The completing statement is in Postgres's hands; the worker does not
    // wait for it past its grace period.
    terminate(child).await;
    wait_until(
        "the message to be back in the queue",
        Duration::from_secs(10),
        || async { env.work_depth().await == 1 },
    )
    .await;
    blocker.batch_execute("rollback").await.expect("unlock");
    let worker = env.store_worker().await;
    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes.len(), 1);
    assert!(
        matches!(outcomes[0], JobOutcome::Completed | JobOutcome::Duplicate),
        "{outcomes:?}"
    );
    assert_eq!(env.events().await, 1, "the effect happened exactly once");
    env.cleanup().await;
}

#[tokio::test]
async fn worker_holds_messages_while_postgres_is_unreachable_and_finishes_after() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let mut args = env.worker_args();
    args.common.database_url = env.database_url_via(proxy.port());
    let worker = env
        .worker_with(args.validate().expect("valid"), Arc::new(Store))
        .await;
    proxy.close();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { worker.run(shutdown).await }
    });
    for _ in 0..3 {
        let hook = Hook::fixture("push");
        assert_eq!(ingest.send(&hook).await.status, 202);
    }
    // The worker takes the messages and holds them unacked.
    wait_until(
        "the worker to hold every message",
        Duration::from_secs(20),
        || async { env.work_depth().await == 0 },
    )
    .await;
    assert_eq!(env.events().await, 0);
    assert_eq!(
        env.count("select count(*) from deliveries where attempts = 0")
            .await,
        3
    );

    proxy.reopen();
    wait_until(
        "every delivery to complete",
        Duration::from_secs(30),
        || async { env.events().await == 3 },
    )
    .await;
    // No take happened during the outage: one attempt each.
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'completed' and attempts = 1")
            .await,
        3
    );
    shutdown.cancel();
    running.await.expect("join").expect("clean stop");
    env.cleanup().await;
}

#[tokio::test]
async fn sigterm_lets_in_flight_jobs_finish_within_the_grace_period_and_acks_them() {
    let (env, ingest) = TestEnv::with_forward_ingest().await;
    // Each job spends 2 s in its handler: SIGTERM arrives while all five
    // are running, well inside a 10-second grace period.
    let receiver = Receiver::start(|_, _| Reply {
        delay: Duration::from_secs(2),
        ..Reply::status(200)
    })
    .await;
    let worker = env.spawn(
        "hookinbox-worker",
        &[
            ("HOOKINBOX_HANDLER", "forward"),
            ("HOOKINBOX_FORWARD_URL", &receiver.url),
            ("HOOKINBOX_SHUTDOWN_GRACE_SECS", "10"),
        ],
    );
    for _ in 0..5 {
        assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    }
    wait_until(
        "all five jobs to be in their handler",
        Duration::from_secs(20),
        || async { receiver.received().len() == 5 },
    )
    .await;
    terminate(worker.child).await;

    assert_eq!(
        env.count("select count(*) from deliveries where status = 'completed' and attempts = 1")
            .await,
        5,
        "each in-flight job completed on its first attempt"
    );
    // Acked before the connection closed: nothing went back to the queue,
    // so another worker has nothing to take again.
    assert_eq!(env.work_depth().await, 0);
    let report = env.store_worker().await.drain().await.expect("drain");
    assert!(report.outcomes.is_empty(), "{:?}", report.outcomes);
    assert_eq!(receiver.received().len(), 5, "no effect ran twice");
    env.cleanup().await;
}
