//! Tests that restart the shared RabbitMQ. They are `#[ignore]`d so the
//! parallel suite never sees a restart; `scripts/test.sh` runs them alone,
//! one at a time, after the suite.

use std::process::Command;
use std::time::Duration;

use hookinbox_tests::{Hook, TestEnv, wait_until};
use hookinbox_worker::HandlerError;
use tokio_util::sync::CancellationToken;

use hookinbox_tests::handlers::Scripted;

fn rabbitmqctl(args: &[&str]) {
    let status = Command::new("rabbitmqctl")
        .args(args)
        .status()
        .expect("rabbitmqctl");
    assert!(status.success(), "rabbitmqctl {args:?}");
}

#[tokio::test]
#[ignore = "restarts the shared RabbitMQ; scripts/test.sh runs it alone after the suite"]
async fn serial_broker_restarted_during_a_backoff_loses_nothing() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let mut args = env.worker_args();
    args.retry_base_ms = Some(3000);
    args.retry_max_ms = Some(3000);
    let handler = Scripted::new(vec![HandlerError::transient("receiver down")]);
    let worker = env
        .worker_with(args.validate().expect("valid"), handler.clone())
        .await;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { worker.run(shutdown).await }
    });
    assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    wait_until(
        "the first attempt to fail",
        Duration::from_secs(30),
        || async {
            env.count("select count(*) from deliveries where status = 'failed' and retryable")
                .await
                == 1
        },
    )
    .await;

    rabbitmqctl(&["stop_app"]);
    rabbitmqctl(&["start_app"]);
    rabbitmqctl(&["await_startup"]);

    wait_until(
        "the retry to complete after the restart",
        Duration::from_secs(90),
        || async { env.events().await == 1 },
    )
    .await;
    assert_eq!(handler.calls().len(), 2);
    assert_eq!(
        env.count("select attempts::bigint from deliveries").await,
        2
    );
    shutdown.cancel();
    running.await.expect("join").expect("clean stop");
    env.cleanup().await;
}
