//! One body Postgres cannot store must not hurt the deliveries that share
//! its batched completion: every good one completes on its first attempt,
//! and the bad one is a permanent dead letter naming Postgres's reason.

use std::time::Duration;

use futures::future::join_all;
use hookinbox_tests::{Hook, TestEnv, fixtures, wait_until};

/// Signed JSON objects that `jsonb` refuses, each with the SQLSTATE
/// Postgres answers.
const UNSTORABLE: [(&str, &str); 3] = [
    (r#"{"action":"opened","text":"nul \u0000 here"}"#, "22P05"),
    (
        r#"{"action":"opened","text":"half a pair \ud800"}"#,
        "22P02",
    ),
    (r#"{"action":"opened","number":1e999999}"#, "22003"),
];

#[tokio::test]
async fn one_unstorable_body_fails_alone_and_its_batch_completes_on_the_first_attempt() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let mut hooks: Vec<(Hook, Option<&str>)> = (0..600)
        .map(|_| {
            (
                Hook::new("issues", fixtures::unique(&fixtures::own("issues"))),
                None,
            )
        })
        .collect();
    for i in 0..20 {
        let (body, code) = UNSTORABLE[i % UNSTORABLE.len()];
        let mut body = body.replace("opened", &format!("opened-{i}")).into_bytes();
        body = fixtures::unique(&body);
        hooks.insert(i * 30, (Hook::new("issues", body), Some(code)));
    }
    // Every delivery is claimed and published before the worker starts, so
    // its completions go out in batches that mix good and bad rows.
    let answers = join_all(hooks.iter().map(|(h, _)| ingest.send(h))).await;
    assert!(answers.iter().all(|a| a.status == 202), "all accepted");
    let worker = env.spawn(
        "hookinbox-worker",
        &[
            ("HOOKINBOX_CONCURRENCY", "64"),
            ("HOOKINBOX_MAX_ATTEMPTS", "3"),
            ("HOOKINBOX_RETRY_BASE_MS", "100"),
        ],
    );
    wait_until("every delivery resolved", Duration::from_secs(120), || async {
        env.count("select count(*) from deliveries where status = 'processing' or (status = 'failed' and retryable)")
            .await
            == 0
    })
    .await;
    for (hook, code) in &hooks {
        let row = env
            .db
            .query_one(
                "select status, attempts, last_error_class, last_error from deliveries where delivery_id = $1",
                &[&hook.id()],
            )
            .await
            .expect("row");
        let (status, attempts): (String, i32) = (row.get(0), row.get(1));
        match code {
            None => assert_eq!(
                (status.as_str(), attempts),
                ("completed", 1),
                "a good delivery completes on its first attempt"
            ),
            Some(code) => {
                let class: String = row.get(2);
                let error: String = row.get(3);
                assert_eq!((status.as_str(), class.as_str()), ("failed", "permanent"));
                assert_eq!(attempts, 1, "dead-lettered at once, not retried");
                assert!(error.contains(code), "{error} names {code}");
            }
        }
    }
    assert_eq!(env.events().await, 600);
    assert!(
        !worker.logs().contains("nul ") && !worker.logs().contains("half a pair"),
        "no payload text in the logs"
    );
    assert!(
        worker.logs().contains("22P05"),
        "the logs name the SQLSTATE"
    );
    env.cleanup().await;
}
