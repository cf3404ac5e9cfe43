//! The admin console's guards: CSRF on every form that changes something,
//! escaped payloads, no signature header or secret in any page or answer,
//! no payload body for a viewer, the security headers on every answer, a
//! console without tokens that answers only loopback hosts, its metrics on
//! loopback unless told otherwise, and a console that refuses to start
//! without tokens or on a bad tokens file. (Sessions: `admin_sessions`;
//! the sign-in throttle: `admin_sign_in_throttle`; input bounds:
//! `admin_input_bounds`.)

use std::time::Duration;

use hookinbox_operator::console::{AdminArgs, DEFAULT_METRICS_LISTEN};
use hookinbox_tests::admin::{OPERATOR, Seed, TestAdmin, VIEWER, csrf_of, raw_status_line, seed};
use hookinbox_tests::handlers::Scripted;
use hookinbox_tests::{Hook, SECRET, TestEnv, bin, defaults, settle, sign};
use hookinbox_worker::HandlerError;

/// Every page and API answer an operator and a viewer can reach for
/// `id`, as text.
async fn everything_shown(admin: &TestAdmin, id: &str) -> Vec<(String, String)> {
    let mut shown = Vec::new();
    for token in [OPERATOR, VIEWER] {
        let cookie = admin.sign_in(token).await;
        for page in [
            "/".to_owned(),
            "/deliveries".to_owned(),
            "/deliveries?status=dead".to_owned(),
            format!("/deliveries/default/{id}?hook_id=123456"),
            "/bulk?kind=replay&status=dead&dry_run=1".to_owned(),
            "/jobs".to_owned(),
            "/audit".to_owned(),
        ] {
            let (status, html) = admin.page(&page, &cookie).await;
            assert_eq!(status, 200, "{page}");
            shown.push((format!("{token} page {page}"), html));
        }
        for call in [
            "/api/v1/overview".to_owned(),
            "/api/v1/deliveries".to_owned(),
            format!("/api/v1/deliveries/default/{id}"),
            "/api/v1/audit".to_owned(),
            "/api/v1/jobs".to_owned(),
        ] {
            let a = admin.get(&call, Some(token)).await;
            assert_eq!(a.status, 200, "{call}: {}", a.text);
            shown.push((format!("{token} call {call}"), a.text));
        }
    }
    shown
}

#[tokio::test]
async fn a_form_without_its_csrf_token_changes_nothing() {
    let env = TestEnv::new().await;
    seed(&env, &[Seed::dead("csrf-1", "push", 5)]).await;
    let admin = env.admin().await;
    let cookie = admin.sign_in(OPERATOR).await;
    let (_, html) = admin
        .page("/deliveries/default/csrf-1?hook_id=1", &cookie)
        .await;
    let csrf = csrf_of(&html);
    let replay = "/deliveries/default/csrf-1/replay";
    for form in [
        vec![("hook_id", "1")],
        vec![("hook_id", "1"), ("csrf", "0123abcd")],
    ] {
        let (status, _) = admin.submit(replay, &cookie, &form).await;
        assert_eq!(status, 403, "{form:?}");
    }
    let (status, _) = admin
        .submit("/bulk", &cookie, &[("kind", "replay"), ("status", "dead")])
        .await;
    assert_eq!(status, 403);
    let (status, _) = admin.submit("/logout", &cookie, &[]).await;
    assert_eq!(status, 403);
    // Another session's token is not this session's.
    let other = admin.sign_in(OPERATOR).await;
    let (_, other_html) = admin.page("/", &other).await;
    let (status, _) = admin
        .submit(
            replay,
            &cookie,
            &[("hook_id", "1"), ("csrf", &csrf_of(&other_html))],
        )
        .await;
    assert_eq!(status, 403);
    assert_eq!(
        env.count("select count(*) from admin_jobs").await,
        0,
        "nothing written"
    );
    assert_eq!(env.count("select count(*) from admin_audit").await, 0);
    // With it, the replay starts, and a viewer's is refused even with its own.
    let (status, location) = admin
        .submit(replay, &cookie, &[("hook_id", "1"), ("csrf", &csrf)])
        .await;
    assert_eq!(
        (status, location.as_str()),
        (303, "/deliveries/default/csrf-1?hook_id=1")
    );
    assert_eq!(env.count("select count(*) from admin_jobs").await, 1);
    let viewer = admin.sign_in(VIEWER).await;
    let (_, vhtml) = admin.page("/", &viewer).await;
    let (status, _) = admin
        .submit(
            replay,
            &viewer,
            &[("hook_id", "1"), ("csrf", &csrf_of(&vhtml))],
        )
        .await;
    assert_eq!(status, 403);
    // Without a session, a page sends the caller to sign in.
    let (status, _) = admin
        .submit(replay, "hookinbox_admin=forged", &[("csrf", &csrf)])
        .await;
    assert_eq!(status, 303);
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_payload_holding_script_and_html_is_shown_escaped() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let body = r#"{"action":"opened","issue":{"title":"<script>alert('x')</script><img src=x onerror=alert(1)>"},"repository":{"full_name":"octo/<b>bold</b>"}}"#;
    let hook = Hook::new("issues", body);
    assert_eq!(ingest.send(&hook).await.status, 202);
    settle(
        &env,
        &env.worker(Scripted::new(vec![HandlerError::permanent(
            "<i>refused</i>",
        )]))
        .await,
    )
    .await;
    let admin = env.admin().await;
    let cookie = admin.sign_in(OPERATOR).await;
    let (_, list) = admin
        .page("/deliveries?repository=octo/%3Cb%3Ebold%3C/b%3E", &cookie)
        .await;
    let (_, page) = admin
        .page(
            &format!("/deliveries/default/{}?hook_id=123456", hook.id()),
            &cookie,
        )
        .await;
    for html in [&list, &page] {
        assert!(!html.contains("<script>alert"), "a script tag came through");
        assert!(!html.contains("<img src=x"), "an HTML tag came through");
        assert!(!html.contains("<b>bold</b>") && !html.contains("<i>refused</i>"));
        assert!(
            html.contains("octo/&lt;b&gt;bold&lt;/b&gt;"),
            "the repository is shown, escaped"
        );
    }
    assert!(
        page.contains("&lt;script&gt;alert("),
        "the payload is shown, escaped"
    );
    assert!(
        page.contains("&lt;i&gt;refused&lt;/i&gt;"),
        "the error is shown, escaped"
    );
    // Pretty-printed: one field a line.
    assert!(
        page.contains("\n  &quot;action&quot;: &quot;opened&quot;"),
        "pretty-printed"
    );
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn signature_headers_and_secrets_never_appear_in_a_page_or_an_answer() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let mut hook = Hook::fixture("push");
    let sha1 = "sha1=0123456789abcdef0123456789abcdef01234567";
    let extra = "sha256=fedcba9876543210fedcba9876543210fedcba9876543210fedcba98765432";
    hook.extra = vec![
        ("x-hub-signature".to_owned(), sha1.to_owned()),
        // Stored (an X-GitHub-* header), so the console's own filter is what hides it.
        ("x-github-signature-copy".to_owned(), extra.to_owned()),
    ];
    assert_eq!(ingest.send(&hook).await.status, 202);
    settle(
        &env,
        &env.worker(Scripted::new(vec![HandlerError::permanent("no")]))
            .await,
    )
    .await;
    let stored: serde_json::Value = env
        .db
        .query_one("select headers from bodies", &[])
        .await
        .expect("kept")
        .get(0);
    assert!(
        stored.to_string().contains("x-github-signature-copy"),
        "stored: {stored}"
    );
    let admin = env.admin().await;
    let signature = sign(SECRET, &hook.body);
    let shown = everything_shown(&admin, hook.id()).await;
    for (what, text) in &shown {
        for secret in [
            signature.as_str(),
            &signature[7..],
            sha1,
            extra,
            SECRET,
            OPERATOR,
            VIEWER,
        ] {
            assert!(
                !text.contains(secret),
                "{what} shows a signature or a secret"
            );
        }
        assert!(
            !text.to_ascii_lowercase().contains("x-hub-signature"),
            "{what}"
        );
        assert!(
            !text.contains("signature-copy"),
            "{what} shows a signature-like header"
        );
    }
    // The other headers are shown.
    let detail = admin
        .get(
            &format!("/api/v1/deliveries/default/{}", hook.id()),
            Some(OPERATOR),
        )
        .await;
    assert!(detail.text.contains("x-github-event"), "{}", detail.text);
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_viewer_never_receives_a_payload_body() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let marker = "payload-marker-7f3a91";
    let done = Hook::new(
        "issues",
        format!(r#"{{"action":"opened","note":"{marker}"}}"#),
    );
    let dead = Hook::new(
        "issues",
        format!(r#"{{"action":"closed","note":"{marker}"}}"#),
    );
    assert_eq!(ingest.send(&done).await.status, 202);
    settle(&env, &env.store_worker().await).await;
    assert_eq!(ingest.send(&dead).await.status, 202);
    settle(
        &env,
        &env.worker(Scripted::new(vec![HandlerError::permanent("no")]))
            .await,
    )
    .await;
    let admin = env.admin().await;
    let viewer = admin.sign_in(VIEWER).await;
    let operator = admin.sign_in(OPERATOR).await;
    for hook in [&done, &dead] {
        let path = format!("/deliveries/default/{}?hook_id=123456", hook.id());
        let (_, html) = admin.page(&path, &viewer).await;
        assert!(!html.contains(marker), "a viewer's page holds the payload");
        assert!(html.contains("no payload"), "the page says why");
        let (_, html) = admin.page(&path, &operator).await;
        assert!(html.contains(marker), "an operator's page holds it");
        let api = format!("/api/v1/deliveries/default/{}", hook.id());
        let a = admin.get(&api, Some(VIEWER)).await;
        assert!(
            a.body.get("payload").is_none() && !a.text.contains(marker),
            "{}",
            a.text
        );
        let a = admin.get(&api, Some(OPERATOR)).await;
        assert_eq!(a.body["payload"]["note"], marker);
    }
    // Nor in a dry run's sample, a list or the overview.
    for (what, text) in everything_shown(&admin, dead.id()).await {
        if what.starts_with(VIEWER) {
            assert!(!text.contains(marker), "{what} holds the payload");
        }
    }
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn the_console_refuses_to_start_without_tokens_or_on_a_bad_tokens_file() {
    let env = TestEnv::new().await;
    let dir = std::env::temp_dir().join(format!("{}-tokens", env.prefix));
    std::fs::create_dir_all(&dir).expect("dir");
    let bad = dir.join("bad");
    std::fs::write(
        &bad,
        "# ok\nalice operator a-very-long-secret-aaaa\nbob root bob-secret-value-xyz-123\n",
    )
    .expect("write");
    let short = dir.join("short");
    std::fs::write(&short, "carol viewer tiny-secret\n").expect("write");
    let run = |args: &[&str], extra: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(bin("hookinbox-worker"));
        cmd.arg("admin")
            .args(args)
            .env_clear()
            .env("DATABASE_URL", &env.database_url)
            .env("HOOKINBOX_QUEUE_PREFIX", &env.prefix)
            .env("HOOKINBOX_AUTO_MIGRATE", "false")
            .env("HOOKINBOX_METRICS_LISTEN", "127.0.0.1:0")
            .env("HOOKINBOX_ADMIN_LISTEN", "127.0.0.1:0")
            .env("RUST_LOG", "warn");
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&[], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("HOOKINBOX_ADMIN_TOKENS_FILE: is required"),
        "{err}"
    );
    let (code, err) = run(
        &[],
        &[("HOOKINBOX_ADMIN_TOKENS_FILE", bad.to_str().expect("path"))],
    );
    assert_eq!(code, Some(2));
    assert!(
        err.contains("HOOKINBOX_ADMIN_TOKENS_FILE: line 3: role 'root'"),
        "{err}"
    );
    assert!(
        !err.contains("bob-secret-value") && !err.contains("a-very-long-secret"),
        "{err}"
    );
    let (code, err) = run(
        &[],
        &[("HOOKINBOX_ADMIN_TOKENS_FILE", short.to_str().expect("path"))],
    );
    assert_eq!(code, Some(2));
    assert!(
        err.contains("line 1: the secret of 'carol' is shorter than 16"),
        "{err}"
    );
    assert!(!err.contains("tiny-secret"), "{err}");
    let (code, err) = run(
        &["--insecure-loopback"],
        &[("HOOKINBOX_ADMIN_LISTEN", "0.0.0.0:0")],
    );
    assert_eq!(code, Some(2));
    assert!(err.contains("HOOKINBOX_ADMIN_LISTEN: --insecure-loopback serves without tokens, so only on a loopback address"), "{err}");
    // On loopback, with the flag, it serves without tokens.
    let port = hookinbox_tests::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = tokio::process::Command::new(bin("hookinbox-worker"))
        .args(["admin", "--insecure-loopback"])
        .env("DATABASE_URL", &env.database_url)
        .env("HOOKINBOX_QUEUE_PREFIX", &env.prefix)
        .env("HOOKINBOX_AUTO_MIGRATE", "false")
        .env("HOOKINBOX_METRICS_LISTEN", "127.0.0.1:0")
        .env("HOOKINBOX_ADMIN_LISTEN", &listen)
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starts");
    let url = format!("http://{listen}/api/v1/overview");
    hookinbox_tests::wait_until(
        "the console to answer",
        std::time::Duration::from_secs(20),
        || async { reqwest::get(&url).await.is_ok_and(|r| r.status() == 200) },
    )
    .await;
    let _ = child.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
    env.cleanup().await;
}

#[tokio::test]
async fn every_console_answer_carries_the_security_headers() {
    let env = TestEnv::new().await;
    seed(&env, &[Seed::dead("hdr-1", "push", 5)]).await;
    let admin = env.admin().await;
    let cookie = admin.sign_in(OPERATOR).await;
    let mut checked = 0;
    for (path, with_cookie, bearer) in [
        ("/login", false, false),
        ("/", false, false),
        ("/", true, false),
        ("/deliveries?status=dead", true, false),
        ("/deliveries/default/hdr-1?hook_id=1", true, false),
        ("/bulk?kind=replay&status=dead&dry_run=1", true, false),
        ("/sessions", true, false),
        ("/deliveries?since=nonsense", true, false),
        ("/api/v1/deliveries/default/hdr-1", false, true),
        ("/api/v1/overview", false, false),
        ("/api/v1/no-such-call", false, true),
        ("/static/admin.css", false, false),
    ] {
        let mut req = admin.http.get(format!("{}{path}", admin.base));
        if with_cookie {
            req = req.header("cookie", &cookie);
        }
        if bearer {
            req = req.bearer_auth(OPERATOR);
        }
        let resp = req.send().await.expect("answers");
        let h = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        let csp = h("content-security-policy");
        assert!(csp.contains("default-src 'self'"), "{path}: {csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert_eq!(h("x-frame-options"), "DENY", "{path}");
        assert_eq!(h("x-content-type-options"), "nosniff", "{path}");
        assert_eq!(h("referrer-policy"), "no-referrer", "{path}");
        if path == "/static/admin.css" {
            assert!(h("cache-control").starts_with("max-age"), "{path}");
        } else {
            assert_eq!(h("cache-control"), "no-store", "{path}");
        }
        let text = resp.text().await.unwrap_or_default();
        if path != "/static/admin.css" {
            // The policy would block inline script and style; there is none.
            for inline in ["<script", "style=", " onclick=", " onload="] {
                assert!(!text.contains(inline), "{path} holds {inline}");
            }
        }
        checked += 1;
    }
    assert_eq!(checked, 12);
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn without_tokens_the_console_answers_only_loopback_hosts() {
    let env = TestEnv::new().await;
    let admin = env.spawn_admin(&["--insecure-loopback"], &[]).await;
    let port = admin.port;
    let status = |host: String| async move {
        let request =
            format!("GET /api/v1/overview HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        raw_status_line(port, request.as_bytes(), Duration::from_secs(10)).await
    };
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        "localhost".to_owned(),
    ] {
        assert_eq!(
            status(host.clone()).await.as_deref(),
            Some("HTTP/1.1 200 OK"),
            "{host}"
        );
    }
    // A name rebound to 127.0.0.1 by its DNS, or any other host: 421.
    for host in [
        format!("rebind.example:{port}"),
        "attacker.example".to_owned(),
        format!("127.0.0.1.nip.io:{port}"),
        format!("localhost.attacker.example:{port}"),
    ] {
        assert_eq!(
            status(host.clone()).await.as_deref(),
            Some("HTTP/1.1 421 Misdirected Request"),
            "{host}"
        );
    }
    // Without a Host at all (HTTP/1.0): refused too.
    let line = raw_status_line(
        port,
        b"GET /api/v1/overview HTTP/1.0\r\n\r\n",
        Duration::from_secs(10),
    )
    .await;
    assert!(
        line.as_deref().is_some_and(|l| l.contains(" 421 ")),
        "{line:?}"
    );
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn the_consoles_metrics_listen_on_loopback_unless_set() {
    let env = TestEnv::new().await;
    let mut args: AdminArgs = defaults();
    args.insecure_loopback = true;
    let worker = || {
        let mut args = env.worker_args();
        args.metrics_listen = defaults::<hookinbox::config::WorkerArgs>().metrics_listen;
        args.validate().expect("valid worker settings")
    };
    assert_eq!(
        worker().metrics_listen.to_string(),
        "0.0.0.0:9899",
        "the worker's own default"
    );
    let config = args
        .clone()
        .validate(worker(), false)
        .expect("valid console settings");
    assert_eq!(
        config.worker.metrics_listen.to_string(),
        DEFAULT_METRICS_LISTEN
    );
    assert!(config.worker.metrics_listen.ip().is_loopback());
    // Given (HOOKINBOX_METRICS_LISTEN or --metrics-listen): as given.
    let mut given = worker();
    given.metrics_listen = "0.0.0.0:9899".parse().expect("address");
    let config = args.validate(given, true).expect("valid console settings");
    assert_eq!(config.worker.metrics_listen.to_string(), "0.0.0.0:9899");
    env.cleanup().await;
}
