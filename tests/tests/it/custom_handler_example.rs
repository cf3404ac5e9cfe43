//! The custom-handler example, run as a process, end to end.

use std::process::Stdio;
use std::time::Duration;

use hookinbox_tests::{Hook, TestEnv, wait_until};

#[tokio::test]
async fn the_custom_handler_example_runs_end_to_end() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let exe = hookinbox_tests::bin("examples/custom_handler");
    let mut child = tokio::process::Command::new(exe)
        .env("DATABASE_URL", &env.database_url)
        .env("AMQP_URL", hookinbox_tests::amqp_url())
        .env("HOOKINBOX_QUEUE_PREFIX", &env.prefix)
        .env("HOOKINBOX_AUTO_MIGRATE", "false")
        .env("HOOKINBOX_METRICS_LISTEN", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("example starts");
    let push = Hook::fixture("push");
    assert_eq!(ingest.send(&push).await.status, 202);
    // Another event completes without an effect.
    assert_eq!(ingest.send(&Hook::fixture("issues")).await.status, 202);
    wait_until(
        "both deliveries to complete",
        Duration::from_secs(30),
        || async {
            env.count("select count(*) from deliveries where status = 'completed'")
                .await
                == 2
        },
    )
    .await;
    // A redelivery is a duplicate: the count does not move twice.
    assert_eq!(ingest.send(&push).await.status, 200);
    let commits: i64 = env
        .db
        .query_one(
            "select commits from commit_counts where repository = 'acme/inbox'",
            &[],
        )
        .await
        .expect("counted")
        .get(0);
    assert_eq!(commits, 1);
    child.kill().await.expect("stop");
    env.cleanup().await;
}
