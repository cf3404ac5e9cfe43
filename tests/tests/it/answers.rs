//! One test per row of the design's Answers table. Every refused request
//! leaves `deliveries` empty and publishes nothing.

use std::sync::Arc;

use hookinbox_tests::{Hook, SECRET, TestEnv, fixtures, sign};

use crate::AlwaysPermanent;

fn push() -> Hook {
    Hook::new("push", fixtures::own("push"))
}

#[tokio::test]
async fn every_bad_input_gets_its_status_and_writes_nothing() {
    let env = TestEnv::new().await;
    let mut args = env.ingest_args();
    args.max_body_bytes = 64 * 1024;
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let body = fixtures::own("push");
    let good = sign(SECRET, &body);

    type Case = (&'static str, u16, Box<dyn Fn(&mut Hook)>);
    let cases: Vec<Case> = vec![
        (
            "signature with another secret",
            401,
            Box::new(|h| h.signature = Some(sign("wrong", &h.body))),
        ),
        ("missing signature", 401, Box::new(|h| h.signature = None)),
        (
            "sha1 signature only",
            401,
            Box::new(|h| {
                h.signature = None;
                h.extra.push((
                    "x-hub-signature".into(),
                    "sha1=0123456789abcdef0123456789abcdef01234567".into(),
                ));
            }),
        ),
        (
            "signature without prefix",
            401,
            Box::new(move |h| {
                h.signature = Some(
                    sign(SECRET, &h.body)
                        .trim_start_matches("sha256=")
                        .to_owned(),
                )
            }),
        ),
        (
            "signature too short",
            401,
            Box::new(|h| {
                let s = sign(SECRET, &h.body);
                h.signature = Some(s[..s.len() - 2].to_owned());
            }),
        ),
        (
            "signature not hex",
            401,
            Box::new(|h| h.signature = Some(format!("sha256={}", "z".repeat(64)))),
        ),
        (
            "signature sent twice",
            401,
            Box::new(move |h| {
                h.extra.push(("x-hub-signature-256".into(), good.clone()));
            }),
        ),
        ("missing delivery id", 400, Box::new(|h| h.delivery = None)),
        (
            "delivery id of 129 bytes",
            400,
            Box::new(|h| h.delivery = Some("a".repeat(129))),
        ),
        (
            "delivery id with a control character",
            400,
            Box::new(|h| h.delivery = Some("abc\tdef".into())),
        ),
        (
            "delivery id with a space",
            400,
            Box::new(|h| h.delivery = Some("abc def".into())),
        ),
        (
            "delivery id sent twice",
            400,
            Box::new(|h| h.extra.push(("x-github-delivery".into(), "other".into()))),
        ),
        ("missing event", 400, Box::new(|h| h.event = None)),
        (
            "malformed event",
            400,
            Box::new(|h| h.event = Some("Push Event".into())),
        ),
        (
            "hook id not digits",
            400,
            Box::new(|h| h.hook_id = Some("12ab".into())),
        ),
        (
            "hook id of 21 digits",
            400,
            Box::new(|h| h.hook_id = Some("1".repeat(21))),
        ),
        (
            "gzip encoding",
            415,
            Box::new(|h| h.extra.push(("content-encoding".into(), "gzip".into()))),
        ),
        (
            "deflate encoding",
            415,
            Box::new(|h| h.extra.push(("content-encoding".into(), "deflate".into()))),
        ),
        (
            "plain text content type",
            415,
            Box::new(|h| h.content_type = "text/plain".into()),
        ),
        (
            "body over the cap",
            413,
            Box::new(|h| {
                let mut big = b"{\"pad\":\"".to_vec();
                big.extend(std::iter::repeat_n(b'x', 70 * 1024));
                big.extend(b"\"}");
                h.signature = Some(sign(SECRET, &big));
                h.body = big;
            }),
        ),
        (
            "signed body that is not JSON",
            400,
            Box::new(|h| {
                h.body = b"Hello, World!".to_vec();
                h.signature = Some(sign(SECRET, &h.body));
            }),
        ),
        (
            "form body without payload field",
            400,
            Box::new(|h| {
                h.content_type = "application/x-www-form-urlencoded".into();
                h.body = b"other=1".to_vec();
                h.signature = Some(sign(SECRET, &h.body));
            }),
        ),
        (
            "unknown source",
            404,
            Box::new(|h| h.path = "/webhooks/github/nope".into()),
        ),
    ];
    for (name, status, mutate) in cases {
        let mut hook = Hook::new("push", body.clone());
        mutate(&mut hook);
        let answer = ingest.send(&hook).await;
        assert_eq!(answer.status, status, "{name}: {:?}", answer.body);
        assert_eq!(answer.kind(), "error", "{name}");
        let error = answer.body["error"].as_str().unwrap_or("");
        assert!(!error.is_empty(), "{name}: the error says what was wrong");
        if let Some(sig) = &hook.signature {
            assert!(
                !error.contains(sig.trim_start_matches("sha256=")),
                "{name}: never echoes a signature"
            );
        }
        assert_eq!(env.deliveries().await, 0, "{name}: nothing claimed");
    }
    assert_eq!(env.work_depth().await, 0, "nothing published");
    env.cleanup().await;
}

#[tokio::test]
async fn chunked_body_over_the_cap_is_refused_while_streaming() {
    let env = TestEnv::new().await;
    let mut args = env.ingest_args();
    args.max_body_bytes = 1024;
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..64).map(|_| Ok(vec![b' '; 512])).collect();
    let resp = ingest
        .http
        .post(format!("{}/webhooks/github", ingest.base))
        .header("content-type", "application/json")
        .header("x-github-event", "push")
        .header("x-github-delivery", "chunked-1")
        .header("x-hub-signature-256", sign(SECRET, b"x"))
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status().as_u16(), 413);
    assert_eq!(env.deliveries().await, 0);
    env.cleanup().await;
}

#[tokio::test]
async fn same_key_with_another_body_is_a_conflict_and_never_processed() {
    let env = TestEnv::new().await;
    let ingest = env.ingest().await;
    let worker = env.store_worker().await;
    let first = push();
    assert_eq!(ingest.send(&first).await.status, 202);
    let mut other = first.clone();
    other.body = fixtures::own("issues");
    other = other.signed_with(SECRET);
    let answer = ingest.send(&other).await;
    assert_eq!((answer.status, answer.kind()), (409, "conflict"));
    let report = worker.drain().await.expect("drain");
    assert_eq!(
        report.outcomes.len(),
        1,
        "only the first body was published"
    );
    let stored: String = env
        .db
        .query_one("select event from github_events", &[])
        .await
        .expect("one row")
        .get(0);
    assert_eq!(stored, "push");
    // Still a conflict after completion.
    assert_eq!(ingest.send(&other).await.status, 409);
    env.cleanup().await;
}

#[tokio::test]
async fn duplicate_while_processing_is_accepted_without_a_second_job() {
    let env = TestEnv::new().await;
    let ingest = env.ingest().await;
    let hook = push();
    assert_eq!(ingest.send(&hook).await.status, 202);
    let answer = ingest.send(&hook).await;
    assert_eq!((answer.status, answer.kind()), (202, "duplicate"));
    assert_eq!(answer.body["state"], "processing");
    assert_eq!(env.work_depth().await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn duplicate_of_a_dead_lettered_delivery_is_accepted_without_a_job() {
    let env = TestEnv::new().await;
    let ingest = env.ingest().await;
    let worker = env.worker(Arc::new(AlwaysPermanent)).await;
    let hook = push();
    assert_eq!(ingest.send(&hook).await.status, 202);
    let report = worker.drain().await.expect("drain");
    assert_eq!(
        report.outcomes,
        vec![hookinbox_worker::JobOutcome::Failed {
            class: hookinbox::deliveries::ErrorClass::Permanent,
            retryable: false
        }]
    );
    let row = env
        .db
        .query_one(
            "select status, retryable, last_error_class, last_error, dead_lettered_at is not null from deliveries",
            &[],
        )
        .await
        .expect("row");
    assert_eq!(row.get::<_, String>(0), "failed");
    assert!(!row.get::<_, bool>(1));
    assert_eq!(row.get::<_, String>(2), "permanent");
    assert_eq!(row.get::<_, String>(3), "receiver refused the event");
    assert!(row.get::<_, bool>(4), "the dead-letter copy was confirmed");
    assert_eq!(env.dead_depth().await, 1);

    let answer = ingest.send(&hook).await;
    assert_eq!((answer.status, answer.kind()), (202, "duplicate"));
    assert_eq!(answer.body["state"], "failed");
    assert_eq!(env.work_depth().await, 0);
    assert_eq!(env.events().await, 0);
    env.cleanup().await;
}

#[tokio::test]
async fn ping_and_events_not_taken_answer_200_without_a_claim() {
    let env = TestEnv::new().await;
    let mut args = env.ingest_args();
    args.allowed_events = "push,pull_request".to_owned();
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let answer = ingest.send(&Hook::new("ping", fixtures::own("ping"))).await;
    assert_eq!((answer.status, answer.kind()), (200, "pong"));
    let answer = ingest
        .send(&Hook::new("issues", fixtures::own("issues")))
        .await;
    assert_eq!((answer.status, answer.kind()), (200, "ignored"));
    assert_eq!(env.deliveries().await, 0);
    let answer = ingest.send(&push()).await;
    assert_eq!((answer.status, answer.kind()), (202, "accepted"));
    assert_eq!(env.deliveries().await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn health_and_readiness() {
    let env = TestEnv::new().await;
    let ingest = env.ingest().await;
    assert_eq!(ingest.get("/healthz").await, 200);
    assert_eq!(ingest.get("/readyz").await, 200);
    assert_eq!(ingest.get("/webhooks/github").await, 405);
    assert_eq!(ingest.get("/nothing-here").await, 404);
    env.cleanup().await;
}

#[tokio::test]
async fn rotation_any_secret_in_the_file_verifies() {
    let env = TestEnv::new().await;
    let dir = std::env::temp_dir().join(format!("hookinbox-secrets-{}", env.prefix));
    std::fs::write(&dir, "new-secret\r\nIt's a Secret to Everybody\n").expect("write");
    let mut args = env.ingest_args();
    args.github_secret = None;
    args.github_secret_file = Some(dir.clone());
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    assert_eq!(ingest.send(&push()).await.status, 202);
    assert_eq!(
        ingest.send(&push().signed_with("new-secret")).await.status,
        202
    );
    assert_eq!(
        ingest.send(&push().signed_with("retired")).await.status,
        401
    );
    let _ = std::fs::remove_file(dir);
    env.cleanup().await;
}
