//! Handler failures: panics bounded by the attempts counter, and timeouts.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use hookinbox::Job;
use hookinbox::deliveries::ErrorClass;
use hookinbox_tests::{Hook, TestEnv};
use hookinbox_worker::JobOutcome;
use hookinbox_worker::{Effect, Handler, HandlerError};

struct Panics;

#[async_trait::async_trait]
impl Handler for Panics {
    async fn handle(&self, _job: &Job, _effect: &mut Effect) -> Result<(), HandlerError> {
        panic!("handler bug")
    }
}

struct Hangs;

#[async_trait::async_trait]
impl Handler for Hangs {
    async fn handle(&self, _job: &Job, effect: &mut Effect) -> Result<(), HandlerError> {
        // Holds the row lock while it hangs: the timeout must release it.
        effect.transaction().await?;
        futures::future::pending::<()>().await;
        Ok(())
    }
}

#[tokio::test]
async fn a_job_that_crashes_every_time_is_stopped_by_max_attempts_as_poison() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let mut args = env.worker_args();
    args.common.max_attempts = Some(3);
    let worker = env
        .worker_with(args.validate().expect("valid"), Arc::new(Panics))
        .await;
    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);
    let report = worker
        .drain()
        .await
        .expect("drain: the worker survives panics");
    env.assert_poisoned(&report.outcomes, 3).await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_handler_past_its_time_limit_is_cancelled_recorded_as_timeout_and_retried() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let mut args = env.worker_args();
    args.handler_timeout_ms = 300;
    let worker = env
        .worker_with(args.validate().expect("valid"), Arc::new(Hangs))
        .await;
    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);
    let report = tokio::time::timeout(Duration::from_secs(30), worker.drain())
        .await
        .expect("the hung handler was cancelled")
        .expect("drain");
    assert_eq!(
        report.outcomes,
        vec![JobOutcome::Failed {
            class: ErrorClass::Timeout,
            retryable: true
        }],
        "a timeout is transient: retried with backoff"
    );
    assert_eq!(
        env.count("select count(*) from deliveries where last_error_class = 'timeout'")
            .await,
        1
    );
    env.cleanup().await;
}

#[tokio::test]
async fn a_body_that_stalls_times_out_with_408_and_writes_nothing() {
    let env = TestEnv::new().await;
    let mut args = env.ingest_args();
    args.body_timeout_ms = 300;
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let first: Result<Vec<u8>, std::io::Error> = Ok(b"{\"a\":".to_vec());
    let stalled = futures::stream::iter([first]).chain(futures::stream::pending());
    let resp = ingest
        .http
        .post(format!("{}/webhooks/github", ingest.base))
        .header("content-type", "application/json")
        .header("x-github-event", "push")
        .header("x-github-delivery", "slow-1")
        .header(
            "x-hub-signature-256",
            hookinbox_tests::sign(hookinbox_tests::SECRET, b"x"),
        )
        .body(reqwest::Body::wrap_stream(stalled))
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status().as_u16(), 408);
    assert_eq!(env.deliveries().await, 0);
    env.cleanup().await;
}
