//! Per-source rate limits: a token bucket spent by signed deliveries just
//! before their claim; past it, 429 with `Retry-After`, counted.

use std::time::Duration;

use hookinbox_tests::{Hook, SECRET, TestEnv, wait_until};

#[tokio::test]
async fn over_its_limit_a_source_answers_429_with_retry_after_and_unsigned_requests_spend_nothing()
{
    let env = TestEnv::new().await;
    let ingest = env.spawn(
        "hookinbox-ingest",
        &[
            ("HOOKINBOX_GITHUB_SECRET", SECRET),
            ("HOOKINBOX_RATE_LIMIT_PER_SECOND", "1"),
            ("HOOKINBOX_RATE_LIMIT_BURST", "3"),
        ],
    );
    ingest.wait_ready().await;
    let base = format!("http://127.0.0.1:{}", ingest.port);
    let http = reqwest::Client::new();

    for _ in 0..10 {
        let unsigned = Hook::fixture("push").signed_with("not the secret");
        assert_eq!(unsigned.post(&http, &base).await.status, 401);
    }
    for _ in 0..3 {
        let answer = Hook::fixture("push").post(&http, &base).await;
        assert_eq!(answer.status, 202, "the burst is whole: {:?}", answer.body);
    }
    let limited = Hook::fixture("push");
    let answer = limited.post(&http, &base).await;
    assert_eq!(answer.status, 429, "{:?}", answer.body);
    assert_eq!(
        answer.body["error"],
        "this source's rate limit is reached, retry later"
    );
    assert_eq!(answer.retry_after.as_deref(), Some("1"));
    assert_eq!(
        env.deliveries().await,
        3,
        "a limited delivery writes nothing"
    );

    // A refused request spends nothing either: the same delivery is taken
    // once a token is back.
    wait_until("a token to come back", Duration::from_secs(5), || async {
        limited.post(&http, &base).await.status == 202
    })
    .await;
    assert_eq!(env.deliveries().await, 4);

    let (_, metrics) = ingest.scrape("/metrics").await;
    let series = metrics
        .lines()
        .find(|l| l.contains("outcome=\"rate_limited\""))
        .unwrap_or_else(|| panic!("no rate_limited series in:\n{metrics}"));
    assert!(series.contains("source=\"default\""), "{series}");
    env.cleanup().await;
}

#[tokio::test]
async fn each_source_has_its_own_bucket_and_a_source_without_one_is_not_limited() {
    let env = TestEnv::new().await;
    let path = std::env::temp_dir().join(format!("{}.toml", env.prefix));
    std::fs::write(
        &path,
        format!(
            "[[sources]]\nname = \"limited\"\nsecrets = [\"{SECRET}\"]\n\
             rate_limit = {{ per_second = 1, burst = 2 }}\n\n\
             [[sources]]\nname = \"open\"\nsecrets = [\"{SECRET}\"]\n"
        ),
    )
    .expect("write config");
    let mut args = env.ingest_args();
    args.sources.github_secret = None;
    args.sources.config = Some(path.clone());
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let at = |source: &str| {
        let mut hook = Hook::fixture("push");
        hook.path = format!("/webhooks/github/{source}");
        hook
    };
    let mut limited = Vec::new();
    for _ in 0..4 {
        limited.push(ingest.send(&at("limited")).await.status);
    }
    assert_eq!(limited, [202, 202, 429, 429]);
    for _ in 0..20 {
        assert_eq!(ingest.send(&at("open")).await.status, 202);
    }
    let _ = std::fs::remove_file(path);
    env.cleanup().await;
}

/// GitHub does not retry a failed delivery: a `429` ingest answers a
/// source with a rate limit is final unless the reconciler brings it back.
/// A worker says so at its start, one line naming each such source; a
/// rate-limited source that names its hook, and one without a limit, are
/// not named.
#[tokio::test]
async fn a_worker_warns_at_start_of_each_rate_limited_source_without_a_reconciler() {
    let env = TestEnv::new().await;
    let token = std::env::temp_dir().join(format!("{}-token", env.prefix));
    std::fs::write(&token, "ghp_test\n").expect("token file");
    let path = std::env::temp_dir().join(format!("{}.toml", env.prefix));
    std::fs::write(
        &path,
        format!(
            "[[sources]]\nname = \"limited\"\nsecrets = [\"{SECRET}\"]\n\
             rate_limit = {{ per_second = 5 }}\n\n\
             [[sources]]\nname = \"reconciled\"\nsecrets = [\"{SECRET}\"]\n\
             rate_limit = {{ per_second = 5 }}\n\
             [sources.github]\nreconcile_hook = \"repo:acme/widgets/1\"\n\
             github_api_url = \"http://127.0.0.1:1\"\ngithub_token_file = \"{}\"\n\n\
             [[sources]]\nname = \"open\"\nsecrets = [\"{SECRET}\"]\n",
            token.display()
        ),
    )
    .expect("write config");
    let config = path.to_string_lossy().into_owned();
    let worker = env.spawn("hookinbox-worker", &[("HOOKINBOX_CONFIG", &config)]);
    let said = "has a rate limit and no reconciler";
    wait_until("the worker's warning", Duration::from_secs(20), || async {
        worker.logs().contains(said)
    })
    .await;
    let warnings: Vec<String> = worker
        .logs()
        .lines()
        .filter(|l| l.contains(said))
        .map(str::to_owned)
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("\"source\":\"limited\""),
        "{}",
        warnings[0]
    );
    assert!(
        warnings[0].contains("final from GitHub's side"),
        "{}",
        warnings[0]
    );
    assert!(
        warnings[0].contains("\"level\":\"WARN\""),
        "{}",
        warnings[0]
    );

    // The default source, by its variables.
    let worker = env.spawn(
        "hookinbox-worker",
        &[("HOOKINBOX_RATE_LIMIT_PER_SECOND", "5")],
    );
    wait_until("the worker's warning", Duration::from_secs(20), || async {
        worker.logs().contains(said)
    })
    .await;
    assert!(worker.logs().contains("\"source\":\"default\""));
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(token);
    env.cleanup().await;
}
