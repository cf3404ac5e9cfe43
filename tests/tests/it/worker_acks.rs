//! Acks collected per channel (`multiple` for runs of finished messages):
//! every message is acked once its job is done, and a job that runs long
//! holds back no other message's ack.

use std::sync::Arc;
use std::time::Duration;

use hookinbox::Job;
use hookinbox_tests::{Hook, TestEnv, wait_until};
use hookinbox_worker::{Effect, Handler, HandlerError, Store};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// `store`, but the delivery `held` waits until `release` has a permit.
struct HoldsOne {
    held: String,
    release: Arc<Semaphore>,
}

#[async_trait::async_trait]
impl Handler for HoldsOne {
    async fn handle(&self, job: &Job, effect: &mut Effect) -> Result<(), HandlerError> {
        if job.key.delivery_id.as_str() == self.held {
            let _ = self.release.acquire().await;
        }
        Store.handle(job, effect).await
    }
}

async fn completed(env: &TestEnv) -> i64 {
    env.count("select count(*) from deliveries where status = 'completed'")
        .await
}

#[tokio::test]
async fn a_job_that_runs_long_holds_back_no_other_ack() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let hooks: Vec<Hook> = (0..24).map(|_| Hook::fixture("push")).collect();
    let release = Arc::new(Semaphore::new(0));
    let handler = Arc::new(HoldsOne {
        held: hooks[0].id().to_owned(),
        release: release.clone(),
    });
    let mut args = env.worker_args();
    // Four messages unacked at most: were the acks behind the held job
    // kept back, the broker would stop after the next three.
    args.concurrency = 4;
    // Far past the waits below: the held job must not end by timing out.
    args.handler_timeout_ms = 50_000;
    let worker = env
        .worker_with(args.validate().expect("valid"), handler)
        .await;
    for hook in &hooks {
        assert_eq!(ingest.send(hook).await.status, 202);
    }
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { worker.run(shutdown).await }
    });
    // Without its acks the broker would have stopped at three: this would
    // wait out the handler's time limit instead.
    wait_until(
        "every delivery but the held one to complete",
        Duration::from_secs(10),
        || async { completed(&env).await == 23 },
    )
    .await;
    release.add_permits(1);
    wait_until("the held one too", Duration::from_secs(30), || async {
        completed(&env).await == 24
    })
    .await;
    shutdown.cancel();
    running.await.expect("join").expect("run");
    // Every message was acked before the worker closed its connection;
    // one left unacked would be back in the queue now.
    assert_eq!(env.work_depth().await, 0);
    assert_eq!(env.events().await, 24);
    env.cleanup().await;
}
