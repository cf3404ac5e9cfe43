//! GitHub's platform as it is now: GitHub Enterprise Cloud with data
//! residency (GHE.com) sends `X-GitHub-Tenant`, kept with the delivery and
//! shown to operators, and serves its API at `https://api.<tenant>.ghe.com`.

use hookinbox_tests::admin::VIEWER;
use hookinbox_tests::github::FakeGithub;
use hookinbox_tests::{Hook, TestEnv, worker_cli, worker_command};

#[tokio::test]
async fn the_tenant_header_is_kept_with_the_delivery_and_a_bad_one_is_refused() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let mut hook = Hook::fixture("push");
    hook.extra
        .push(("x-github-tenant".to_owned(), "octo-corp".to_owned()));
    assert_eq!(ingest.send(&hook).await.status, 202);
    let github = Hook::fixture("push");
    assert_eq!(ingest.send(&github).await.status, 202);
    assert_eq!(
        env.count("select count(*) from deliveries where github_tenant = 'octo-corp'")
            .await,
        1
    );
    assert_eq!(
        env.count("select count(*) from deliveries where github_tenant is null")
            .await,
        1,
        "github.com sends none"
    );
    for bad in ["octo corp", "octo.corp", &"a".repeat(64)] {
        let mut hook = Hook::fixture("push");
        hook.extra
            .push(("x-github-tenant".to_owned(), bad.to_owned()));
        let answer = ingest.send(&hook).await;
        assert_eq!(answer.status, 400, "{bad}");
        assert!(
            answer.body["error"]
                .as_str()
                .is_some_and(|e| e.contains("X-GitHub-Tenant")),
            "{bad}: {}",
            answer.body
        );
    }
    assert_eq!(
        env.deliveries().await,
        2,
        "a refused request writes nothing"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn operators_see_the_tenant_in_the_cli_the_api_and_the_console() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let mut tenant = Hook::fixture("push");
    tenant
        .extra
        .push(("x-github-tenant".to_owned(), "octo-corp".to_owned()));
    assert_eq!(ingest.send(&tenant).await.status, 202);
    let github = Hook::fixture("push");
    assert_eq!(ingest.send(&github).await.status, 202);

    // The CLI: `deliveries show` as `key: value` lines and as JSON.
    for (hook, shown, json) in [
        (&tenant, "octo-corp", serde_json::json!("octo-corp")),
        (&github, "null", serde_json::Value::Null),
    ] {
        let (code, out) = worker_cli(&env, &["deliveries", "show", hook.id()]);
        assert_eq!(code, 0, "{out}");
        let line = out
            .lines()
            .find_map(|l| l.trim_start().strip_prefix("github_tenant: "))
            .unwrap_or_else(|| panic!("a github_tenant line in:\n{out}"));
        assert_eq!(line, shown);
        let (code, out) = worker_cli(&env, &["deliveries", "show", hook.id(), "--json"]);
        assert_eq!(code, 0, "{out}");
        let rows: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(rows[0]["github_tenant"], json, "{out}");
    }

    // The API (each answer checked against docs/admin-openapi.json) and
    // the delivery's page.
    let admin = env.admin().await;
    let cookie = admin.sign_in(VIEWER).await;
    for (hook, json) in [
        (&tenant, serde_json::json!("octo-corp")),
        (&github, serde_json::Value::Null),
    ] {
        let path = format!("/deliveries/default/{}", hook.id());
        let detail = admin.get(&format!("/api/v1{path}"), Some(VIEWER)).await;
        assert_eq!(detail.status, 200, "{}", detail.text);
        assert_eq!(detail.body["delivery"]["github_tenant"], json);
        let (status, html) = admin.page(&path, &cookie).await;
        assert_eq!(status, 200);
        if json.is_null() {
            assert!(!html.contains("GHE.com tenant"), "github.com: no tenant");
        } else {
            assert!(
                html.contains(
                    "<dt>GHE.com tenant</dt><dd class=\"mono\" id=\"tenant\">octo-corp</dd>"
                ),
                "{html}"
            );
        }
    }
    let list = admin.get("/api/v1/deliveries", Some(VIEWER)).await;
    assert_eq!(list.status, 200, "{}", list.text);
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_ghe_com_api_url_is_accepted_as_the_reconcilers_api() {
    let env = TestEnv::new().await;
    let token = std::env::temp_dir().join(format!("{}-ghe-token", env.prefix));
    std::fs::write(&token, "ghp_x\n").expect("token");
    let token = token.to_string_lossy().into_owned();
    // Checked at start (`migrate` validates every setting, then touches
    // only Postgres); the requests' shape against such a base is the
    // reconciler's own test (`reconcile::github`).
    for url in [
        "https://api.octo-corp.ghe.com",
        "https://ghes.example.com/api/v3",
    ] {
        let out = worker_command(
            &env,
            &["migrate"],
            &[
                ("HOOKINBOX_RECONCILE_HOOK", "repo:acme/widgets/1"),
                ("HOOKINBOX_GITHUB_API_URL", url),
                ("HOOKINBOX_GITHUB_TOKEN_FILE", &token),
            ],
        )
        .output()
        .expect("runs");
        assert!(
            out.status.success(),
            "{url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    env.cleanup().await;
}

#[tokio::test]
async fn a_reconcile_pass_asks_a_ghe_com_api_by_its_name_and_redelivers() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let token = "ghp_ghe_com_test_token";
    let fake = FakeGithub::start(token);
    let hook = fake.add_acme_widgets_hook(format!("{}/webhooks/github", ingest.base));
    // GitHub sent a push ten minutes ago and got no answer: the
    // reconciler's to bring back.
    let guid = fake.record_unanswered_push(hook);
    // The tenant's API by its name, which only the hosts file resolves (to
    // the fake on 127.0.0.1): no DNS, no traffic off this machine.
    let port = fake.base.rsplit(':').next().expect("a port").to_owned();
    let api = format!("http://api.acme.ghe.com:{port}");
    let hosts = std::env::temp_dir().join(format!("{}-hosts", env.prefix));
    std::fs::write(&hosts, "127.0.0.1 api.acme.ghe.com\n").expect("hosts file");
    let token_file = std::env::temp_dir().join(format!("{}-ghe-token", env.prefix));
    std::fs::write(&token_file, format!("{token}\n")).expect("token");
    let (hosts, token_file) = (
        hosts.to_string_lossy().into_owned(),
        token_file.to_string_lossy().into_owned(),
    );
    let out = tokio::process::Command::from(worker_command(
        &env,
        &["reconcile", "--json"],
        &[
            ("HOOKINBOX_RECONCILE_HOOK", "repo:acme/widgets/123456"),
            ("HOOKINBOX_GITHUB_API_URL", &api),
            ("HOOKINBOX_GITHUB_API_HOSTS_FILE", &hosts),
            ("HOOKINBOX_GITHUB_TOKEN_FILE", &token_file),
            ("HOOKINBOX_RECONCILE_MIN_AGE_SECS", "0"),
            ("HOOKINBOX_RECONCILE_PER_SECOND", "200"),
        ],
    ))
    .output()
    .await
    .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(stdout.lines().next().unwrap_or("")).expect("a JSON report");
    println!("reconcile against {api}: {report}");
    assert_eq!(report["redelivered"], 1, "{report}");
    assert_eq!(fake.resent(&guid), 1, "GitHub sent it again");
    assert_eq!(
        env.count(&format!(
            "select count(*) from deliveries where delivery_id = '{guid}'"
        ))
        .await,
        1,
        "and ingest claimed it"
    );
    let asked = fake.api_hosts();
    println!("Host headers the fake saw: {asked:?}");
    assert!(asked.len() >= 2, "a list and a redelivery: {asked:?}");
    let expected = format!("api.acme.ghe.com:{port}");
    assert!(
        asked.iter().all(|h| *h == expected),
        "every request asked for the tenant's API by name: {asked:?}"
    );
    let _ = std::fs::remove_file(&hosts);
    let _ = std::fs::remove_file(&token_file);
    env.cleanup().await;
}
