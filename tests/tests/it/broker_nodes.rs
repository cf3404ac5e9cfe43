//! `AMQP_URL` listing several broker nodes: ingest and the worker connect
//! to one that answers, and move to another when theirs goes away, with
//! every delivery completed once. Each node is a closable proxy in front
//! of the shared RabbitMQ (a cluster's nodes on this machine are the
//! cluster fault suite's: `scripts/faults.sh --cluster`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hookinbox_tests::{Hook, TestEnv, proxy::Proxy, settle};
use hookinbox_worker::{JobOutcome, Store};

#[tokio::test]
async fn a_node_down_is_skipped_and_a_lost_node_is_left_for_the_next() {
    let env = TestEnv::new().await;
    let first = Proxy::start("127.0.0.1:5672").await;
    let second = Proxy::start("127.0.0.1:5672").await;
    let nodes = format!(
        "amqp://guest:guest@127.0.0.1:{}/%2f?heartbeat=1, amqp://guest:guest@127.0.0.1:{}/%2f?heartbeat=1",
        first.port(),
        second.port()
    );
    // Every process tries the node it reached last first, and starts at
    // one its id picks: close the first so both must reach the second.
    first.close();
    let mut args = env.ingest_args();
    args.common.amqp_url = nodes.clone();
    args.common.publish_timeout_ms = 1000;
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let mut worker_args = env.worker_args();
    worker_args.common.amqp_url = nodes;
    let worker = env
        .worker_with(worker_args.validate().expect("valid"), Arc::new(Store))
        .await;
    let send = |hook: Hook| {
        let ingest = &ingest;
        async move { ingest.send_accepted(&hook).await }
    };
    for _ in 0..3 {
        assert!(
            !send(Hook::fixture("push")).await,
            "published through the node that answers"
        );
    }
    assert_eq!(settle(&env, &worker).await, vec![JobOutcome::Completed; 3]);

    // The node in use goes away: what ingest cannot publish is parked (a
    // 202 all the same), and it reconnects to the other node.
    first.reopen();
    second.close();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut sent = 3;
    loop {
        sent += 1;
        if !send(Hook::fixture("push")).await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ingest never moved to the other node"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes.len(), sent - 3);
    assert!(
        outcomes.iter().all(|o| *o == JobOutcome::Completed),
        "{outcomes:?}"
    );
    assert_eq!(env.events().await, sent as i64, "each delivery once");
    env.cleanup().await;
}
