//! Failed sign-ins are throttled per client and counted, and a valid
//! token always passes: a flood of bad tokens from an address (a NAT, a
//! proxy, `kubectl port-forward`) never locks out the operators behind
//! it. The client is the peer, or the `X-Forwarded-For` address only when
//! the peer is a trusted proxy.

use hookinbox_tests::TestEnv;
use hookinbox_tests::admin::{OPERATOR, TestAdmin, VIEWER};

/// `GET /api/v1/overview` with `token`, as if forwarded for `xff`: the
/// status and the `Retry-After`.
async fn call(admin: &TestAdmin, token: &str, xff: Option<&str>) -> (u16, Option<u64>) {
    let mut req = admin
        .http
        .get(format!("{}/api/v1/overview", admin.base))
        .bearer_auth(token);
    if let Some(x) = xff {
        req = req.header("x-forwarded-for", x);
    }
    let resp = req.send().await.expect("answers");
    let retry = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    (resp.status().as_u16(), retry)
}

/// The value of `hookinbox_admin_sign_in_failures_total{via, outcome}`.
fn failures(via: &str, outcome: &str) -> Option<String> {
    let metrics = hookinbox::metrics::install().render();
    metrics
        .lines()
        .find(|l| {
            l.starts_with("hookinbox_admin_sign_in_failures_total")
                && l.contains(&format!("outcome=\"{outcome}\""))
                && l.contains(&format!("via=\"{via}\""))
        })
        .map(|l| l.rsplit(' ').next().unwrap_or("").to_owned())
}

#[tokio::test]
async fn a_valid_token_always_passes_while_its_client_is_throttled_and_failures_are_counted() {
    let env = TestEnv::new().await;
    let admin = env.admin().await;
    for i in 0..5 {
        let (status, _) = call(&admin, &format!("wrong-token-{i}"), None).await;
        assert_eq!(status, 401, "attempt {i}");
    }
    // Past the free failures: 429 with a wait that grows.
    let mut waits = Vec::new();
    for i in 5..12 {
        let (status, retry) = call(&admin, &format!("wrong-token-{i}"), None).await;
        assert_eq!(status, 429, "attempt {i}");
        waits.push(retry.expect("Retry-After"));
    }
    // The owners still pass, from the same address, at once.
    for token in [OPERATOR, VIEWER, OPERATOR] {
        assert_eq!(
            call(&admin, token, None).await.0,
            200,
            "a valid token was refused"
        );
    }
    let resp = admin.post_login(OPERATOR).await;
    assert_eq!(resp.status().as_u16(), 303, "a valid sign-in was refused");
    assert!(waits.windows(2).all(|w| w[0] <= w[1]), "{waits:?}");
    assert!(waits[waits.len() - 1] > waits[0], "{waits:?}");
    // A bad one on the form is throttled too.
    let resp = admin.post_login("still-wrong-token").await;
    assert_eq!(resp.status().as_u16(), 429);
    assert!(resp.headers().contains_key("retry-after"));
    // Counted by way in and outcome; valid tokens are not failures.
    assert_eq!(failures("api", "bad_token").as_deref(), Some("5"));
    assert_eq!(failures("api", "throttled").as_deref(), Some("7"));
    assert_eq!(failures("page", "throttled").as_deref(), Some("1"));
    assert_eq!(failures("page", "bad_token"), None);
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn the_client_is_the_forwarded_address_only_behind_a_trusted_proxy() {
    let env = TestEnv::new().await;
    // No proxy trusted (the default): X-Forwarded-For is ignored, so bad
    // tokens "from" ever new addresses are one client, the peer.
    let admin = env.admin().await;
    for i in 0..8 {
        let (status, _) = call(&admin, "wrong-token", Some(&format!("203.0.113.{i}"))).await;
        assert_eq!(status, if i < 5 { 401 } else { 429 }, "attempt {i}");
    }
    admin.stop().await;
    // The peer (127.0.0.1) trusted: the forwarded address is the client.
    let mut config = env.admin_config();
    config.trusted_proxies = "127.0.0.0/8".parse().expect("cidr");
    let admin = env.admin_with(config).await;
    for i in 0..8 {
        let (status, _) = call(&admin, "wrong-token", Some("198.51.100.7")).await;
        assert_eq!(status, if i < 5 { 401 } else { 429 }, "attempt {i}");
    }
    // Another client behind the same proxy is not throttled...
    assert_eq!(
        call(&admin, "wrong-token", Some("10.0.0.1, 198.51.100.8"))
            .await
            .0,
        401
    );
    // ...nor is the proxy itself, and a valid token passes for anyone.
    assert_eq!(call(&admin, "wrong-token", None).await.0, 401);
    assert_eq!(call(&admin, OPERATOR, Some("198.51.100.7")).await.0, 200);
    // A session signed in through the proxy lists the forwarded client.
    let resp = admin
        .http
        .get(format!("{}/login", admin.base))
        .header("x-forwarded-for", "198.51.100.9")
        .send()
        .await
        .expect("answers");
    let form_cookie =
        hookinbox_tests::admin::set_cookie(&resp, "hookinbox_login").expect("form cookie");
    let csrf = hookinbox_tests::admin::csrf_of(&resp.text().await.expect("html"));
    let resp = admin
        .http
        .post(format!("{}/login", admin.base))
        .header("cookie", form_cookie)
        .header("x-forwarded-for", "198.51.100.9")
        .form(&[("token", OPERATOR), ("csrf", csrf.as_str())])
        .send()
        .await
        .expect("answers");
    assert_eq!(resp.status().as_u16(), 303);
    let sessions = admin.get("/api/v1/sessions", Some(OPERATOR)).await;
    assert_eq!(
        sessions.body["items"][0]["client"], "198.51.100.9",
        "{}",
        sessions.text
    );
    admin.stop().await;
    env.cleanup().await;
}
