//! Worker shutdown and Postgres outages under a running worker.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use hookinbox::handler::Store;
use hookinbox::runtime::JobOutcome;
use hookinbox_tests::{Hook, TestEnv, bin, connect, fixtures, proxy::Proxy, wait_until};
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

#[tokio::test]
async fn sigterm_releases_unfinished_leases_and_leaves_messages_for_another_worker() {
    let env = TestEnv::new().await;
    let ingest = env.ingest().await;
    let blocker = connect(&env.database_url).await;
    blocker
        .batch_execute("begin; lock table github_events in access exclusive mode")
        .await
        .expect("lock");
    let mut child = tokio::process::Command::new(bin("hookinbox-worker"))
        .env("DATABASE_URL", &env.database_url)
        .env("AMQP_URL", hookinbox_tests::amqp_url())
        .env("HOOKINBOX_QUEUE_PREFIX", &env.prefix)
        .env("HOOKINBOX_AUTO_MIGRATE", "false")
        .env("HOOKINBOX_METRICS_LISTEN", "127.0.0.1:0")
        .env("HOOKINBOX_SHUTDOWN_GRACE_SECS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("worker starts");
    let hook = Hook::new("push", fixtures::own("push"));
    assert_eq!(ingest.send(&hook).await.status, 202);
    wait_until(
        "the job to block in its effect",
        Duration::from_secs(20),
        || blocked_on_lock(&env),
    )
    .await;

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
    blocker.batch_execute("rollback").await.expect("unlock");
    wait_until(
        "the message to be back in the queue",
        Duration::from_secs(10),
        || async { env.work_depth().await == 1 },
    )
    .await;
    // Taken at once (no deferred wait for a lease), completed once.
    let report = env.store_worker().await.drain().await.expect("drain");
    assert_eq!(report.outcomes, vec![JobOutcome::Completed]);
    assert_eq!(env.events().await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn worker_holds_messages_while_postgres_is_unreachable_and_finishes_after() {
    let env = TestEnv::new().await;
    let ingest = env.ingest().await;
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let mut args = env.worker_args();
    args.common.database_url = env
        .database_url
        .replace("127.0.0.1:5432", &format!("127.0.0.1:{}", proxy.port()));
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
        let hook = Hook::new("push", fixtures::own("push"));
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
