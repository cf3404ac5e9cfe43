//! Several sources from a TOML file: secrets, handlers, pins, rotation.

use std::path::PathBuf;

use hookinbox_tests::receiver::Receiver;
use hookinbox_tests::{Hook, TestEnv, fixtures, settle};
use hookinbox_worker::JobOutcome;

fn write_config(env: &TestEnv, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("{}.toml", env.prefix));
    std::fs::write(&path, text).expect("write config");
    path
}

#[tokio::test]
async fn two_sources_take_only_their_own_signed_requests_and_run_their_own_handlers() {
    let env = TestEnv::new().await;
    let receiver = Receiver::ok().await;
    let path = write_config(
        &env,
        &format!(
            r#"
[[sources]]
name = "alpha"
secrets = ["alpha-secret"]

[[sources]]
name = "beta"
secrets = ["beta-secret"]
handler = {{ kind = "forward", url = "{}" }}
"#,
            receiver.url
        ),
    );
    let mut args = env.ingest_args();
    args.sources.github_secret = None;
    args.sources.config = Some(path.clone());
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let mut wargs = env.worker_args();
    wargs.sources.config = Some(path.clone());
    let config = wargs.validate().expect("valid");
    let worker = env
        .worker_with(
            config.clone(),
            hookinbox_worker::from_config(&config.routes, &Default::default()).expect("client"),
        )
        .await;

    let to = |source: &str, secret: &str| {
        let mut hook = Hook::fixture("push").signed_with(secret);
        hook.path = format!("/webhooks/github/{source}");
        hook
    };
    let alpha = to("alpha", "alpha-secret");
    let beta = to("beta", "beta-secret");
    assert_eq!(ingest.send(&alpha).await.status, 202);
    assert_eq!(ingest.send(&beta).await.status, 202);
    assert_eq!(ingest.send(&to("alpha", "beta-secret")).await.status, 401);
    assert_eq!(ingest.send(&to("beta", "alpha-secret")).await.status, 401);
    assert_eq!(ingest.send(&to("gamma", "alpha-secret")).await.status, 404);
    let mut default_route = alpha.clone();
    default_route.path = "/webhooks/github".to_owned();
    assert_eq!(
        ingest.send(&default_route).await.status,
        404,
        "no default source configured"
    );

    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes, vec![JobOutcome::Completed; 2]);
    let stored: Vec<String> = env
        .db
        .query("select source from github_events", &[])
        .await
        .expect("rows")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        stored,
        vec!["alpha".to_owned()],
        "alpha is stored, beta is not"
    );
    let forwarded = receiver.received();
    assert_eq!(forwarded.len(), 1);
    assert_eq!(
        forwarded[0].header("idempotency-key"),
        Some(format!("github:beta:123456:{}:forward", beta.id()).as_str())
    );
    let _ = std::fs::remove_file(path);
    env.cleanup().await;
}

#[tokio::test]
async fn a_pinned_source_refuses_unknown_hook_ids_and_filters_actions() {
    let env = TestEnv::new().await;
    let path = write_config(
        &env,
        r#"
[[sources]]
name = "pinned"
secrets = ["It's a Secret to Everybody"]
hook_ids = [111, "222"]
events = ["push", "pull_request.opened"]
"#,
    );
    let mut args = env.ingest_args();
    args.sources.github_secret = None;
    args.sources.config = Some(path.clone());
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let at = |hook_id: Option<&str>, event: &str, body: Vec<u8>| {
        let mut hook = Hook::new(event, body);
        hook.path = "/webhooks/github/pinned".to_owned();
        hook.hook_id = hook_id.map(str::to_owned);
        hook
    };
    assert_eq!(
        ingest
            .send(&at(
                Some("111"),
                "push",
                fixtures::unique(&fixtures::own("push"))
            ))
            .await
            .status,
        202
    );
    assert_eq!(
        ingest
            .send(&at(
                Some("222"),
                "push",
                fixtures::unique(&fixtures::own("push"))
            ))
            .await
            .status,
        202
    );
    let refused = ingest
        .send(&at(
            Some("333"),
            "push",
            fixtures::unique(&fixtures::own("push")),
        ))
        .await;
    assert_eq!((refused.status, refused.kind()), (403, "error"));
    assert_eq!(
        ingest
            .send(&at(None, "push", fixtures::unique(&fixtures::own("push"))))
            .await
            .status,
        403
    );
    // pull_request.opened is taken; another action of it is ignored.
    let opened = fixtures::own("pull_request");
    assert_eq!(
        ingest
            .send(&at(Some("111"), "pull_request", opened.clone()))
            .await
            .status,
        202
    );
    let closed = String::from_utf8(opened)
        .expect("utf8")
        .replace("\"opened\"", "\"closed\"");
    let answer = ingest
        .send(&at(Some("111"), "pull_request", closed.into_bytes()))
        .await;
    assert_eq!((answer.status, answer.kind()), (200, "ignored"));
    assert_eq!(env.deliveries().await, 3);
    let _ = std::fs::remove_file(path);
    env.cleanup().await;
}

#[tokio::test]
async fn rotation_counts_each_secret_and_retiring_the_old_one_refuses_it() {
    let env = TestEnv::new().await;
    let both = write_config(
        &env,
        r#"
[[sources]]
name = "main"
secrets = ["new-secret", "old-secret"]
"#,
    );
    let mut args = env.ingest_args();
    args.sources.github_secret = None;
    args.sources.config = Some(both.clone());
    let config = args.validate().expect("valid");
    let app = hookinbox_ingest::IngestApp::build(config)
        .await
        .expect("starts");
    let counts = app.secret_matches();
    let base = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped());
    let http = reqwest::Client::new();
    let send = |secret: &'static str| {
        let http = http.clone();
        let base = base.clone();
        async move {
            let body = fixtures::unique(&fixtures::own("push"));
            http.post(format!("{base}/webhooks/github/main"))
                .header("content-type", "application/json")
                .header("x-github-event", "push")
                .header("x-github-delivery", uuid::Uuid::new_v4().to_string())
                .header("x-hub-signature-256", hookinbox_tests::sign(secret, &body))
                .body(body)
                .send()
                .await
                .expect("answer")
                .status()
                .as_u16()
        }
    };
    assert_eq!(send("new-secret").await, 202);
    assert_eq!(send("old-secret").await, 202);
    assert_eq!(send("old-secret").await, 202);
    assert_eq!((counts.get("main", 0), counts.get("main", 1)), (1, 2));

    // The old secret's count stopped moving: remove it.
    let only_new = write_config(
        &env,
        "[[sources]]\nname = \"main\"\nsecrets = [\"new-secret\"]\n",
    );
    let mut args = env.ingest_args();
    args.sources.github_secret = None;
    args.sources.config = Some(only_new.clone());
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let mut old = Hook::fixture("push").signed_with("old-secret");
    old.path = "/webhooks/github/main".to_owned();
    assert_eq!(ingest.send(&old).await.status, 401);
    let new = Hook {
        path: "/webhooks/github/main".to_owned(),
        ..Hook::fixture("push").signed_with("new-secret")
    };
    assert_eq!(ingest.send(&new).await.status, 202);
    let _ = std::fs::remove_file(both);
    let _ = std::fs::remove_file(only_new);
    env.cleanup().await;
}

#[tokio::test]
async fn rotation_any_secret_in_the_file_verifies() {
    let env = TestEnv::new().await;
    let dir = std::env::temp_dir().join(format!("hookinbox-secrets-{}", env.prefix));
    std::fs::write(&dir, "new-secret\r\nIt's a Secret to Everybody\n").expect("write");
    let mut args = env.ingest_args();
    args.sources.github_secret = None;
    args.sources.github_secret_file = Some(dir.clone());
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    assert_eq!(
        ingest
            .send(&Hook::fixture("push").signed_with("new-secret"))
            .await
            .status,
        202
    );
    assert_eq!(
        ingest
            .send(&Hook::fixture("push").signed_with("retired"))
            .await
            .status,
        401
    );
    let _ = std::fs::remove_file(dir);
    env.cleanup().await;
}
