//! The console's page sessions end when they should: at sign-out (the
//! old cookie and its CSRF token start nothing), when an operator revokes
//! one (from the page or the API, audited), and when its token is removed
//! from or changed in the tokens file. Signing in needs the sign-in form's
//! own CSRF token, and the session cookie is `Secure` by configuration,
//! never because a client says it came over https.

use hookinbox_operator::console::{Access, AdminArgs, Tokens};
use hookinbox_tests::admin::{
    OPERATOR, Seed, TOKENS, VIEWER, csrf_of, seed, set_cookie, set_cookie_header,
};
use hookinbox_tests::{TestEnv, defaults};

#[tokio::test]
async fn signing_out_ends_the_session_on_the_server() {
    let env = TestEnv::new().await;
    seed(&env, &[Seed::dead("out-1", "push", 5)]).await;
    let admin = env.admin().await;
    let cookie = admin.sign_in(OPERATOR).await;
    let (status, html) = admin.page("/", &cookie).await;
    assert_eq!(status, 200);
    let csrf = csrf_of(&html);
    let (status, location) = admin.submit("/logout", &cookie, &[("csrf", &csrf)]).await;
    assert_eq!((status, location.as_str()), (303, "/login"));
    // The old cookie and its CSRF token are worth nothing now: not a page,
    // not a bulk replay.
    let (status, location) = admin
        .submit(
            "/bulk",
            &cookie,
            &[("csrf", &csrf), ("kind", "replay"), ("status", "dead")],
        )
        .await;
    assert_eq!(
        (status, location.as_str()),
        (303, "/login"),
        "a signed-out session started a job"
    );
    let (status, _) = admin.page("/", &cookie).await;
    assert_eq!(status, 303, "a signed-out session still reads pages");
    assert_eq!(env.count("select count(*) from admin_jobs").await, 0);
    assert_eq!(
        env.count("select count(*) from admin_sessions where revoked_why = 'signed out'")
            .await,
        1
    );
    // The table holds the cookie's hash, not the cookie.
    let value = cookie.split_once('=').expect("name=value").1;
    let hashed = env
        .count(&format!(
            "select count(*) from admin_sessions where cookie_sha256 = sha256('{value}'::bytea)"
        ))
        .await;
    assert_eq!(hashed, 1, "the session's row holds the cookie's SHA-256");
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_session_ends_when_its_token_is_removed_or_changed() {
    let env = TestEnv::new().await;
    let first = env.admin().await;
    let olivia = first.sign_in(OPERATOR).await;
    let victor = first.sign_in(VIEWER).await;
    first.stop().await;
    // The tokens file now: olivia's secret changed, victor gone.
    let mut config = env.admin_config();
    config.access = Access::Tokens(
        Tokens::parse(
            "olivia operator olivia-NEW-secret-00000001\nwendy viewer wendy-viewer-secret-0003\n",
        )
        .expect("valid"),
    );
    let second = env.admin_with(config).await;
    assert_eq!(
        env.count(
            "select count(*) from admin_sessions \
             where token_name = 'victor' and revoked_why = 'token removed'"
        )
        .await,
        1,
        "a removed token's sessions end when the console starts"
    );
    let (status, _) = second.page("/", &victor).await;
    assert_eq!(status, 303, "a removed token's session still reads pages");
    let (status, _) = second.page("/", &olivia).await;
    assert_eq!(status, 303, "a changed token's session still reads pages");
    assert_eq!(
        env.count(
            "select count(*) from admin_sessions \
             where token_name = 'olivia' and revoked_why = 'token changed'"
        )
        .await,
        1
    );
    // The new secret signs in.
    let fresh = second.sign_in("olivia-NEW-secret-00000001").await;
    assert_eq!(second.page("/", &fresh).await.0, 200);
    second.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn an_operator_revokes_a_session_from_the_page_or_the_api_and_each_is_audited() {
    let env = TestEnv::new().await;
    let admin = env.admin().await;
    let operator = admin.sign_in(OPERATOR).await;
    let first = admin.sign_in(VIEWER).await;
    let second = admin.sign_in(VIEWER).await;
    let list = admin.get("/api/v1/sessions", Some(VIEWER)).await;
    assert_eq!(list.status, 200, "{}", list.text);
    let items = list.body["items"].as_array().expect("items").clone();
    let tokens: Vec<&str> = items
        .iter()
        .map(|i| i["token"].as_str().expect("token"))
        .collect();
    assert_eq!(tokens, ["victor", "victor", "olivia"], "newest first");
    assert_eq!(items[0]["client"], "127.0.0.1");
    let (second_id, first_id) = (
        items[0]["id"].as_i64().expect("id"),
        items[1]["id"].as_i64().expect("id"),
    );
    // A viewer cannot revoke; an operator can, once.
    let path = format!("/api/v1/sessions/{second_id}");
    assert_eq!(admin.delete(&path, Some(VIEWER)).await.status, 403);
    assert_eq!(
        admin.page("/", &second).await.0,
        200,
        "not revoked by a viewer"
    );
    let a = admin.delete(&path, Some(OPERATOR)).await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(
        admin.page("/", &second).await.0,
        303,
        "revoked, yet it reads pages"
    );
    assert_eq!(admin.delete(&path, Some(OPERATOR)).await.status, 404);
    // From the page: a form with the operator's CSRF token.
    let (status, html) = admin.page("/sessions", &operator).await;
    assert_eq!(status, 200);
    assert!(
        html.contains(&format!("/sessions/{first_id}/revoke")),
        "{html}"
    );
    let revoke = format!("/sessions/{first_id}/revoke");
    let (status, _) = admin.submit(&revoke, &operator, &[]).await;
    assert_eq!(status, 403, "without its CSRF token");
    let (_, viewer_html) = admin.page("/sessions", &first).await;
    assert!(
        !viewer_html.contains("/revoke"),
        "a viewer gets no revoke button"
    );
    let (status, _) = admin
        .submit(&revoke, &first, &[("csrf", &csrf_of(&viewer_html))])
        .await;
    assert_eq!(status, 403, "a viewer's form");
    let (status, location) = admin
        .submit(&revoke, &operator, &[("csrf", &csrf_of(&html))])
        .await;
    assert_eq!((status, location.as_str()), (303, "/sessions"));
    assert_eq!(
        admin.page("/", &first).await.0,
        303,
        "revoked from the page"
    );
    assert_eq!(
        admin.page("/", &operator).await.0,
        200,
        "the operator's own"
    );
    // Each revocation is one audit row, as the API lists them.
    let audit = admin.get("/api/v1/audit", Some(VIEWER)).await;
    let revokes: Vec<_> = audit.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|e| e["action"] == "revoke_session")
        .collect();
    assert_eq!(revokes.len(), 2, "{}", audit.text);
    for (e, id) in revokes.iter().zip([first_id, second_id]) {
        assert_eq!(e["actor"], "olivia");
        assert_eq!(e["target"]["session"], id);
        assert_eq!(e["target"]["token"], "victor");
        assert_eq!(e["result"], "revoked");
    }
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn signing_in_needs_the_sign_in_forms_csrf_token() {
    let env = TestEnv::new().await;
    let admin = env.admin().await;
    let url = format!("{}/login", admin.base);
    let (form_cookie, csrf) = admin.login_form().await;
    let other_csrf = admin.login_form().await.1;
    for (what, cookie, fields) in [
        ("no form cookie, no token", None, vec![("token", OPERATOR)]),
        (
            "no form cookie",
            None,
            vec![("token", OPERATOR), ("csrf", csrf.as_str())],
        ),
        (
            "another form's token",
            Some(&form_cookie),
            vec![("token", OPERATOR), ("csrf", other_csrf.as_str())],
        ),
        (
            "no token in the form",
            Some(&form_cookie),
            vec![("token", OPERATOR)],
        ),
    ] {
        let mut req = admin.http.post(&url).form(&fields);
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        let resp = req.send().await.expect("answers");
        assert_eq!(resp.status().as_u16(), 403, "{what}");
        assert_eq!(set_cookie(&resp, "hookinbox_admin"), None, "{what}");
        let html = resp.text().await.expect("html");
        assert!(html.contains("name=\"csrf\""), "{what}: a fresh form");
    }
    assert_eq!(env.count("select count(*) from admin_sessions").await, 0);
    // From the console's own form: signed in.
    let resp = admin
        .http
        .post(&url)
        .header("cookie", &form_cookie)
        .form(&[("token", OPERATOR), ("csrf", csrf.as_str())])
        .send()
        .await
        .expect("answers");
    assert_eq!(resp.status().as_u16(), 303);
    assert!(set_cookie(&resp, "hookinbox_admin").is_some());
    admin.stop().await;
    env.cleanup().await;
}

/// Signs in from a form, with `headers` on both requests; the session
/// cookie's whole `Set-Cookie`.
async fn session_cookie_with(
    admin: &hookinbox_tests::admin::TestAdmin,
    headers: &[(&str, &str)],
) -> String {
    let mut get = admin.http.get(format!("{}/login", admin.base));
    for (k, v) in headers {
        get = get.header(*k, *v);
    }
    let resp = get.send().await.expect("answers");
    let form_cookie = set_cookie(&resp, "hookinbox_login").expect("form cookie");
    let csrf = csrf_of(&resp.text().await.expect("html"));
    let mut post = admin
        .http
        .post(format!("{}/login", admin.base))
        .header("cookie", form_cookie)
        .form(&[("token", OPERATOR), ("csrf", csrf.as_str())]);
    for (k, v) in headers {
        post = post.header(*k, *v);
    }
    let resp = post.send().await.expect("answers");
    assert_eq!(resp.status().as_u16(), 303);
    set_cookie_header(&resp, "hookinbox_admin").expect("a session cookie")
}

fn is_secure(set_cookie: &str) -> bool {
    set_cookie
        .split(';')
        .any(|a| a.trim().eq_ignore_ascii_case("secure"))
}

#[tokio::test]
async fn the_secure_flag_follows_the_public_url_or_a_trusted_proxy_never_a_client_header() {
    let env = TestEnv::new().await;
    let https = [("x-forwarded-proto", "https")];
    // Plain http, no proxy trusted: a client saying https changes nothing.
    let admin = env.admin().await;
    assert!(!is_secure(&session_cookie_with(&admin, &[]).await));
    let claimed = session_cookie_with(&admin, &https).await;
    assert!(
        !is_secure(&claimed),
        "a client header made it Secure: {claimed}"
    );
    admin.stop().await;
    // An https public URL (the setting, as the binary reads it): Secure.
    let tokens = std::env::temp_dir().join(format!("{}-secure.tokens", env.prefix));
    std::fs::write(&tokens, TOKENS).expect("tokens file");
    let mut args: AdminArgs = defaults();
    args.listen = "127.0.0.1:0".parse().expect("address");
    args.tokens_file = Some(tokens.clone());
    args.public_url = Some("https://admin.example.com".to_owned());
    let mut worker = env.worker_args();
    worker.metrics_listen = "127.0.0.1:0".parse().expect("address");
    let config = args
        .validate(worker.validate().expect("valid"), true)
        .expect("valid console settings");
    let admin = env.admin_with(config).await;
    let cookie = session_cookie_with(&admin, &[]).await;
    assert!(is_secure(&cookie), "{cookie}");
    admin.stop().await;
    // Behind a trusted proxy that says https: Secure; when it does not: not.
    let mut config = env.admin_config();
    config.trusted_proxies = "127.0.0.1/32".parse().expect("cidr");
    let admin = env.admin_with(config).await;
    assert!(is_secure(&session_cookie_with(&admin, &https).await));
    assert!(!is_secure(&session_cookie_with(&admin, &[]).await));
    admin.stop().await;
    let _ = std::fs::remove_file(&tokens);
    env.cleanup().await;
}
