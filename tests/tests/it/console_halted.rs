//! The console's face of ordered destinations: the API's halted keys of a
//! destination and the skip or retry of one (operators only, audited,
//! the key's `#` percent-encoded in the path), and the Destinations
//! page's list of them with its CSRF-protected Skip and Retry buttons.

use std::path::PathBuf;

use hookinbox_tests::admin::{OPERATOR, Seed, TestAdmin, VIEWER, csrf_of, seed};
use hookinbox_tests::{SECRET, TestEnv};
use serde_json::{Value, json};

/// A source `default` with `ci`, ordered by pull request (its URL never
/// called: no worker runs), and `plain`, not ordered.
fn config(env: &TestEnv) -> PathBuf {
    env.config_file(&format!(
        r#"
[[sources]]
name = "default"
secrets = ["{SECRET}"]

[[sources.destinations]]
name = "ci"
kind = "forward"
url = "http://127.0.0.1:9/hook"
ordering = "pull_request"

[[sources.destinations]]
name = "plain"
kind = "forward"
url = "http://127.0.0.1:9/hook"
"#
    ))
}

/// Legs of `ci`: key `77#5` halted by `pr-1` (a parked body; `pr-2`
/// waits behind it), key `77#6` halted later by `pr-3` (no body), and key
/// `77#7` whose first leg `pr-4` is still retrying (not halted).
async fn seed_keys(env: &TestEnv) {
    let leg = |id: &str, status: &str, retryable: bool, age: i64| Seed {
        action: Some("opened".to_owned()),
        status: status.to_owned(),
        retryable,
        class: (status == "failed").then(|| "permanent".to_owned()),
        ..Seed::dead(id, "pull_request", age)
    };
    seed(
        env,
        &[
            leg("pr-1", "failed", false, 300),
            leg("pr-2", "processing", false, 200),
            leg("pr-3", "failed", false, 100),
            leg("pr-4", "failed", true, 50),
        ],
    )
    .await;
    env.db
        .batch_execute(
            // pr-3 keeps no body (a leg claimed before bodies were kept).
            "update deliveries set destination = 'ci', order_key = k.key, order_seq = k.seq
             from (values ('pr-1', '77#5', 1), ('pr-2', '77#5', 2), ('pr-3', '77#6', 3),
                          ('pr-4', '77#7', 4)) k (id, key, seq)
             where delivery_id = k.id;
             delete from bodies where delivery_id = 'pr-3';",
        )
        .await
        .expect("order the legs");
}

/// Every audit row: actor, action, target, result.
async fn audit_rows(env: &TestEnv) -> Vec<(String, String, Value, String)> {
    env.db
        .query(
            "select actor, action, target, result from admin_audit order by id",
            &[],
        )
        .await
        .expect("audit rows")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

/// The keys the API lists for `ci`.
async fn listed_keys(admin: &TestAdmin) -> Vec<String> {
    let listed = admin
        .get("/api/v1/destinations/default/ci/halted", Some(VIEWER))
        .await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    listed.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|k| k["key"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[tokio::test]
async fn the_api_lists_halted_keys_and_an_operator_skips_or_retries_one_audited() {
    let env = TestEnv::new().await;
    let config = config(&env);
    seed_keys(&env).await;
    let admin = env.admin_with(env.admin_config_on(&config)).await;

    // Any role reads, oldest halt first, each with its leg.
    let listed = admin
        .get("/api/v1/destinations/default/ci/halted", Some(VIEWER))
        .await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    let items = listed.body["items"].as_array().expect("items");
    assert_eq!(items.len(), 2, "{}", listed.text);
    let first = &items[0];
    assert_eq!(
        (
            &first["key"],
            &first["delivery_id"],
            &first["hook_id"],
            &first["event"],
            &first["action"],
            &first["error_class"],
            &first["error"],
            &first["waiting"],
        ),
        (
            &json!("77#5"),
            &json!("pr-1"),
            &json!("1"),
            &json!("pull_request"),
            &json!("opened"),
            &json!("permanent"),
            &json!("seeded failure"),
            &json!(1),
        )
    );
    assert!(
        first["failed_at"]
            .as_str()
            .is_some_and(|t| chrono::DateTime::parse_from_rfc3339(t).is_ok()),
        "{first}"
    );
    assert_eq!(
        (&items[1]["key"], &items[1]["waiting"]),
        (&json!("77#6"), &json!(0))
    );

    // Refusals: named, and nothing written.
    for (method, path, token, status) in [
        // Halted keys are read from the legs, whatever the configuration
        // says now: a destination without ordering has none (200, empty).
        (
            "GET",
            "/api/v1/destinations/default/plain/halted",
            VIEWER,
            200,
        ),
        (
            "GET",
            "/api/v1/destinations/default/nope/halted",
            VIEWER,
            404,
        ),
        ("GET", "/api/v1/destinations/Default/ci/halted", VIEWER, 400),
        (
            "POST",
            "/api/v1/destinations/default/ci/halted/77%235/skip",
            VIEWER,
            403,
        ),
        (
            "POST",
            "/api/v1/destinations/default/ci/halted/77%235/retry",
            VIEWER,
            403,
        ),
        (
            "POST",
            "/api/v1/destinations/default/ci/halted/abc/skip",
            OPERATOR,
            400,
        ),
        (
            "POST",
            "/api/v1/destinations/default/ci/halted/77%23/skip",
            OPERATOR,
            400,
        ),
        (
            "POST",
            "/api/v1/destinations/default/plain/halted/77/skip",
            OPERATOR,
            409,
        ),
        (
            "POST",
            "/api/v1/destinations/default/ci/halted/77%237/skip",
            OPERATOR,
            409,
        ),
        (
            "POST",
            "/api/v1/destinations/default/ci/halted/77%239/retry",
            OPERATOR,
            409,
        ),
        (
            "POST",
            "/api/v1/destinations/default/ci/halted/77%236/retry",
            OPERATOR,
            409,
        ),
    ] {
        let answer = match method {
            "GET" => admin.get(path, Some(token)).await,
            _ => admin.post(path, Some(token), &json!({})).await,
        };
        assert_eq!(answer.status, status, "{method} {path}: {}", answer.text);
    }
    let bad = admin
        .post(
            "/api/v1/destinations/default/ci/halted/abc/skip",
            Some(OPERATOR),
            &json!({}),
        )
        .await;
    assert_eq!(bad.body["field"], "key", "{}", bad.text);
    let no_body = admin
        .post(
            "/api/v1/destinations/default/ci/halted/77%236/retry",
            Some(OPERATOR),
            &json!({}),
        )
        .await;
    assert!(
        no_body.body["error"]
            .as_str()
            .is_some_and(|e| e.contains("pr-3") && e.contains("no body")),
        "{}",
        no_body.text
    );
    assert!(audit_rows(&env).await.is_empty(), "refusals write nothing");
    assert_eq!(listed_keys(&admin).await, ["77#5", "77#6"]);

    // Retry: the `#` decoded from the path; the leg goes again in place.
    let retried = admin
        .post(
            "/api/v1/destinations/default/ci/halted/77%235/retry",
            Some(OPERATOR),
            &json!({}),
        )
        .await;
    assert_eq!(retried.status, 200, "{}", retried.text);
    assert_eq!(
        retried.body,
        json!({"source": "default", "name": "ci", "key": "77#5", "delivery_id": "pr-1", "action": "retried"})
    );
    assert_eq!(
        env.count(
            "select count(*) from deliveries where delivery_id = 'pr-1' and status = 'failed' \
             and retryable and replays = 1 and order_skipped_at is null"
        )
        .await,
        1
    );

    // Skip: the leg stays dead, skipped by the signed-in operator.
    let skipped = admin
        .post(
            "/api/v1/destinations/default/ci/halted/77%236/skip",
            Some(OPERATOR),
            &json!({}),
        )
        .await;
    assert_eq!(skipped.status, 200, "{}", skipped.text);
    assert_eq!(
        skipped.body,
        json!({"source": "default", "name": "ci", "key": "77#6", "delivery_id": "pr-3", "action": "skipped"})
    );
    assert_eq!(
        env.count(
            "select count(*) from deliveries where delivery_id = 'pr-3' and status = 'failed' \
             and not retryable and order_skipped_by = 'olivia'"
        )
        .await,
        1
    );
    assert!(listed_keys(&admin).await.is_empty());
    let again = admin
        .post(
            "/api/v1/destinations/default/ci/halted/77%236/skip",
            Some(OPERATOR),
            &json!({}),
        )
        .await;
    assert_eq!(again.status, 409, "{}", again.text);

    let rows = audit_rows(&env).await;
    let actions: Vec<(&str, &str, &Value)> = rows
        .iter()
        .map(|(actor, action, target, _)| (actor.as_str(), action.as_str(), &target["key"]))
        .collect();
    assert_eq!(
        actions,
        [
            ("olivia", "retry_halted_key", &json!("77#5")),
            ("olivia", "skip_halted_key", &json!("77#6")),
        ]
    );
    assert_eq!(
        rows[0].2["destination"],
        json!({"source": "default", "name": "ci"})
    );
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn the_destinations_page_lists_halted_keys_with_skip_and_retry_buttons_for_operators() {
    let env = TestEnv::new().await;
    let config = config(&env);
    seed_keys(&env).await;
    let admin = env.admin_with(env.admin_config_on(&config)).await;

    let cookie = admin.sign_in(OPERATOR).await;
    let (status, html) = admin.page("/destinations", &cookie).await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains("Halted keys of default/ci"), "{html}");
    assert!(
        !html.contains("Halted keys of default/plain"),
        "not ordered: no list"
    );
    assert!(html.contains("77#5") && html.contains("77#6"), "{html}");
    assert!(!html.contains("77#7"), "not halted: {html}");
    assert!(
        html.contains(r#"href="/deliveries/default/pr-1?hook_id=1""#),
        "the halting leg's delivery: {html}"
    );
    assert!(html.contains("seeded failure"), "{html}");
    for action in ["skip", "retry"] {
        assert!(
            html.contains(&format!(
                r#"action="/destinations/default/ci/halted/77%235/{action}""#
            )),
            "{action}: {html}"
        );
    }
    let viewer = admin.sign_in(VIEWER).await;
    let (_, seen_by_viewer) = admin.page("/destinations", &viewer).await;
    assert!(seen_by_viewer.contains("77#5"), "a viewer sees the keys");
    assert!(
        !seen_by_viewer.contains("/halted/"),
        "a viewer has no buttons"
    );

    // The buttons need the session's CSRF token, and an operator.
    let skip = "/destinations/default/ci/halted/77%236/skip";
    let (status, _) = admin.submit(skip, &cookie, &[]).await;
    assert_eq!(status, 403, "no CSRF token");
    let (status, _) = admin.submit(skip, &cookie, &[("csrf", "forged")]).await;
    assert_eq!(status, 403, "a wrong CSRF token");
    let (status, _) = admin
        .submit(
            skip,
            &viewer,
            &[("csrf", csrf_of(&seen_by_viewer).as_str())],
        )
        .await;
    assert_eq!(status, 403, "a viewer");
    assert!(audit_rows(&env).await.is_empty());

    let csrf = csrf_of(&html);
    let (status, location) = admin
        .submit(skip, &cookie, &[("csrf", csrf.as_str())])
        .await;
    assert_eq!((status, location.as_str()), (303, "/destinations"));
    let (status, location) = admin
        .submit(
            "/destinations/default/ci/halted/77%235/retry",
            &cookie,
            &[("csrf", csrf.as_str())],
        )
        .await;
    assert_eq!((status, location.as_str()), (303, "/destinations"));
    let actions: Vec<String> = audit_rows(&env).await.into_iter().map(|r| r.1).collect();
    assert_eq!(actions, ["skip_halted_key", "retry_halted_key"]);
    // A key no longer halted: a 409 page, nothing written.
    let (status, _) = admin
        .submit(skip, &cookie, &[("csrf", csrf.as_str())])
        .await;
    assert_eq!(status, 409);
    assert_eq!(audit_rows(&env).await.len(), 2);

    let (_, html) = admin.page("/destinations", &cookie).await;
    assert!(html.contains("No key is halted."), "{html}");
    admin.stop().await;
    env.cleanup().await;
}
