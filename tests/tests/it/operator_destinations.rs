//! The operator's surfaces for destinations: the CLI's `destinations`
//! (a table, `--json`, pause and resume, audited with `--as`), the
//! console's Destinations page and its CSRF-protected buttons, the API's
//! `/api/v1/destinations` calls, `dlq list|replay --destination`, and the
//! page of a delivery with several legs, each with its attempt log.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hookinbox_tests::admin::{OPERATOR, TestAdmin, VIEWER, csrf_of, openapi_check};
use hookinbox_tests::receiver::{Receiver, Reply};
use hookinbox_tests::{Hook, SECRET, TestEnv, settle, worker_command};
use serde_json::{Value, json};

/// The value of the `Authorization` header the `ci` destination sends,
/// from a file: a secret.
const TOKEN: &str = "Bearer dest-ops-token-Kq3vX8";

/// What the `ci` receiver answers while it is broken: a 404 (the
/// destination is wrong: its breaker opens at once), whose body echoes the
/// token it was sent and carries markup.
fn broken_answer(authorization: Option<&str>) -> Reply {
    Reply {
        body: format!(
            "<script>alert(1)</script> no such hook; you sent {}",
            authorization.unwrap_or("nothing")
        )
        .into_bytes(),
        ..Reply::status(404)
    }
}

/// A source `default` with a forward destination `ci` (its token from a
/// file, a plain header, a short retry schedule and a breaker that probes
/// every second) and a store destination `archive` that takes pushes.
fn config(env: &TestEnv, ci_url: &str) -> (PathBuf, PathBuf) {
    let token = std::env::temp_dir().join(format!("{}-token", env.prefix));
    std::fs::write(&token, format!("{TOKEN}\n")).expect("token file");
    let config = env.config_file(&format!(
        r#"
[[sources]]
name = "default"
secrets = ["{SECRET}"]

[[sources.destinations]]
name = "ci"
kind = "forward"
url = "{ci_url}"
timeout_ms = 2000
retry = ["100ms", "200ms", "400ms"]
breaker = {{ probe_secs = 1, min_requests = 100 }}
headers = {{ Authorization = {{ file = "{token}" }}, X-Team = "ci" }}

[[sources.destinations]]
name = "archive"
kind = "store"
events = ["push"]
"#,
        token = token.display(),
    ));
    (config, token)
}

/// Every audit row: actor, role, action, target, result.
async fn audit_rows(env: &TestEnv) -> Vec<(String, String, String, Value, String)> {
    env.db
        .query(
            "select actor, role, action, target, result from admin_audit order by id",
            &[],
        )
        .await
        .expect("audit rows")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

/// The state of `default/<name>` and who changed it last.
async fn state(env: &TestEnv, name: &str) -> (String, Option<String>) {
    let row = env
        .db
        .query_one(
            "select state, changed_by from destinations where source = 'default' and name = $1",
            &[&name],
        )
        .await
        .expect("the destination's row");
    (row.get(0), row.get(1))
}

/// Runs a `hookinbox-worker` command on `config`: exit code, standard
/// output, standard error.
fn cli(env: &TestEnv, config: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let path = config.to_string_lossy().into_owned();
    let out = worker_command(env, args, &[("HOOKINBOX_CONFIG", path.as_str())])
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A destination's view without the one field that moves by itself.
fn still(mut items: Value) -> Value {
    for item in items.as_array_mut().into_iter().flatten() {
        item.as_object_mut()
            .map(|o| o.remove("oldest_waiting_secs"));
    }
    items
}

/// Sends `n` pushes and drives the worker once: `ci`'s first attempt gets
/// the 404 and opens its breaker, its other legs are held; `archive`
/// stores each.
async fn break_ci(env: &TestEnv, config: &std::path::Path, n: usize) -> Vec<Hook> {
    let ingest = env.ingest_on(config).await;
    let worker = env.worker_on(config, Default::default()).await;
    let hooks: Vec<Hook> = (0..n).map(|_| Hook::fixture("push")).collect();
    for hook in &hooks {
        assert_eq!(ingest.send(hook).await.status, 202);
    }
    worker.drain().await.expect("drain");
    assert_eq!(state(env, "ci").await.0, "open");
    assert_eq!(
        env.count(
            "select count(*) from deliveries where destination = 'archive' and status = 'completed'"
        )
        .await,
        n as i64
    );
    ingest.stop().await;
    hooks
}

#[tokio::test]
async fn the_cli_lists_destinations_and_pauses_and_resumes_one_audited_refusing_bad_names() {
    let env = TestEnv::new().await;
    let receiver = Receiver::start(|req, _| broken_answer(req.header("authorization"))).await;
    let (config, token) = config(&env, &receiver.url);
    break_ci(&env, &config, 3).await;

    // --json: the API's items, the same view.
    let (code, out, err) = cli(&env, &config, &["destinations", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let listed: Value = serde_json::from_str(&out).expect("JSON");
    let names: Vec<&str> = listed
        .as_array()
        .expect("an array")
        .iter()
        .map(|d| d["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(names, ["archive", "ci"]);
    let ci = &listed[1];
    assert_eq!(ci["state"], "open");
    assert_eq!(ci["kind"], "forward");
    assert_eq!(ci["waiting"], 3, "{ci}");
    assert!(ci["oldest_waiting_secs"].as_f64().is_some(), "{ci}");
    assert!(
        ci["last_error"].as_str().is_some_and(|e| e.contains("404")),
        "{ci}"
    );
    let settings = &ci["settings"];
    assert_eq!(settings["url"], receiver.url.as_str());
    assert_eq!(settings["timeout_ms"], 2000);
    assert_eq!(settings["signature"], "none");
    assert_eq!(settings["secret"], "unset");
    assert_eq!(
        settings["headers"],
        json!([{"name": "authorization", "secret": true}, {"name": "x-team", "secret": false}])
    );
    assert_eq!(
        settings["retry"],
        json!({"kind": "schedule", "delays": ["100ms", "200ms", "400ms"], "max_attempts": 4})
    );
    assert_eq!(settings["breaker"]["probe_secs"], 1);
    assert_eq!(listed[0]["settings"]["events"], json!(["push"]));
    assert_eq!(listed[0]["state"], "closed");
    // The console as deployed, on the same settings as the command.
    let path = config.to_string_lossy().into_owned();
    let admin = env
        .spawn_admin(&[], &[("HOOKINBOX_CONFIG", path.as_str())])
        .await;
    let api: Value = reqwest::Client::new()
        .get(format!("{}/api/v1/destinations", admin.base))
        .bearer_auth(VIEWER)
        .send()
        .await
        .expect("answers")
        .json()
        .await
        .expect("JSON");
    openapi_check("GET", "/api/v1/destinations", 200, &api);
    assert_eq!(still(api["items"].clone()), still(listed.clone()));

    // The table: one line each, then each one's settings.
    let (code, table, _) = cli(&env, &config, &["destinations"]);
    assert_eq!(code, 0, "{table}");
    let ci_line = table
        .lines()
        .find(|l| l.starts_with("default/ci "))
        .expect("a line for default/ci");
    for word in ["forward", "open", "3", "breaker", "404"] {
        assert!(ci_line.contains(word), "{word}: {ci_line}");
    }
    assert!(
        table.contains("authorization (set, from a file)") && table.contains("x-team (set)"),
        "{table}"
    );
    assert!(!table.contains("dest-ops-token"), "{table}");

    // Pause, audited with --as; pausing again changes and writes nothing.
    let (code, out, err) = cli(
        &env,
        &config,
        &["destinations", "pause", "default/ci", "--as", "alice"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out.trim(),
        "paused default/ci (was open): its legs wait until it is resumed"
    );
    assert_eq!(
        state(&env, "ci").await,
        ("paused".to_owned(), Some("alice".to_owned()))
    );
    let target = json!({"destination": {"source": "default", "name": "ci"}});
    assert_eq!(
        audit_rows(&env).await,
        vec![(
            "alice".to_owned(),
            "operator".to_owned(),
            "pause_destination".to_owned(),
            target.clone(),
            "paused (was open)".to_owned()
        )]
    );
    let (code, out, _) = cli(
        &env,
        &config,
        &["destinations", "pause", "default/ci", "--as", "alice"],
    );
    assert_eq!((code, out.trim()), (1, "default/ci is paused already"));
    assert_eq!(audit_rows(&env).await.len(), 1);

    // Bad arguments: a clear error, exit 2, nothing written.
    for (args, said) in [
        (
            vec!["destinations", "pause", "ci"],
            "a destination is SOURCE/NAME",
        ),
        (
            vec!["destinations", "resume", "Default/ci"],
            "the source is 1 to 64 characters",
        ),
        (
            vec!["destinations", "resume", "default/nope", "--as", "alice"],
            "no destination default/nope",
        ),
        (
            vec!["destinations", "pause", "other/ci", "--as", "alice"],
            "no destination other/ci",
        ),
        (
            vec!["destinations", "resume", "default/ci", "--as", "a b"],
            "--as",
        ),
    ] {
        let (code, out, err) = cli(&env, &config, &args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(err.contains(said), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
    }
    assert_eq!(audit_rows(&env).await.len(), 1, "nothing written");
    assert_eq!(env.count("select count(*) from destinations").await, 2);
    assert_eq!(state(&env, "ci").await.0, "paused");

    // Resume: closed, audited.
    let (code, out, err) = cli(
        &env,
        &config,
        &["destinations", "resume", "default/ci", "--as", "bob"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out.trim(),
        "resumed default/ci (was paused): closed, its waiting legs go again"
    );
    assert_eq!(
        state(&env, "ci").await,
        ("closed".to_owned(), Some("bob".to_owned()))
    );
    let rows = audit_rows(&env).await;
    assert_eq!(
        rows[1],
        (
            "bob".to_owned(),
            "operator".to_owned(),
            "resume_destination".to_owned(),
            target,
            "closed (was paused)".to_owned()
        )
    );
    admin.stop().await;
    env.cleanup().await;
    let _ = std::fs::remove_file(token);
}

#[tokio::test]
async fn the_console_shows_destinations_and_pauses_and_resumes_them_as_the_signed_in_operator() {
    let env = TestEnv::new().await;
    let fixed = Arc::new(AtomicBool::new(false));
    let receiver = Receiver::start({
        let fixed = fixed.clone();
        move |req, _| {
            if fixed.load(Ordering::SeqCst) {
                Reply::status(200)
            } else {
                broken_answer(req.header("authorization"))
            }
        }
    })
    .await;
    let (config, token) = config(&env, &receiver.url);
    let hooks = break_ci(&env, &config, 2).await;
    let admin: TestAdmin = env.admin_with(env.admin_config_on(&config)).await;

    // The page, linked from the navigation.
    let cookie = admin.sign_in(OPERATOR).await;
    let (status, html) = admin.page("/destinations", &cookie).await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains(r#"href="/destinations""#), "a nav link");
    assert!(html.contains("default/ci") && html.contains("default/archive"));
    assert!(
        html.contains(r#"<span class="badge open">open</span>"#),
        "{html}"
    );
    assert!(html.contains("(set, from a file)"), "{html}");
    assert!(!html.contains("dest-ops-token"), "{html}");
    let viewer = admin.sign_in(VIEWER).await;
    let (_, seen_by_viewer) = admin.page("/destinations", &viewer).await;
    assert!(
        !seen_by_viewer.contains("/destinations/default/ci/pause"),
        "a viewer has no buttons"
    );

    // The API: viewers read, operators change; bad names are named,
    // unknown ones are 404.
    for (path, token, status) in [
        ("/api/v1/destinations/default/ci/pause", VIEWER, 403),
        ("/api/v1/destinations/default/nope/pause", OPERATOR, 404),
        ("/api/v1/destinations/nope/ci/resume", OPERATOR, 404),
        ("/api/v1/destinations/default/CI/pause", OPERATOR, 400),
        ("/api/v1/destinations/Default/ci/pause", OPERATOR, 400),
    ] {
        let answer = admin.post(path, Some(token), &json!({})).await;
        assert_eq!(answer.status, status, "{path}: {}", answer.text);
    }
    let unknown = admin
        .post(
            "/api/v1/destinations/default/nope/pause",
            Some(OPERATOR),
            &json!({}),
        )
        .await;
    assert!(
        unknown.body["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("no destination default/nope")),
        "{}",
        unknown.text
    );
    let bad = admin
        .post(
            "/api/v1/destinations/default/CI/pause",
            Some(OPERATOR),
            &json!({}),
        )
        .await;
    assert_eq!(bad.body["field"], "destination");
    assert!(audit_rows(&env).await.is_empty(), "refusals write nothing");
    assert_eq!(state(&env, "ci").await.0, "open");

    let paused = admin
        .post(
            "/api/v1/destinations/default/ci/pause",
            Some(OPERATOR),
            &json!({}),
        )
        .await;
    assert_eq!(paused.status, 200, "{}", paused.text);
    assert_eq!(
        paused.body,
        json!({"source": "default", "name": "ci", "state": "paused", "from": "open", "changed": true})
    );
    let again = admin
        .post(
            "/api/v1/destinations/default/ci/pause",
            Some(OPERATOR),
            &json!({}),
        )
        .await;
    assert_eq!(again.body["changed"], false);
    assert_eq!(
        state(&env, "ci").await,
        ("paused".to_owned(), Some("olivia".to_owned()))
    );

    // Paused: nothing goes to ci, even once it is fixed (past a probe's
    // interval: a paused destination has no probe).
    fixed.store(true, Ordering::SeqCst);
    let before = receiver.received().len();
    let worker = env.worker_on(&config, Default::default()).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    worker.schedule_once().await.expect("scheduler");
    worker.drain().await.expect("drain");
    assert_eq!(receiver.received().len(), before, "no attempt while paused");

    // The page's resume button needs the session's CSRF token.
    let (status, _) = admin
        .submit("/destinations/default/ci/resume", &cookie, &[])
        .await;
    assert_eq!(status, 403, "no CSRF token");
    let (status, _) = admin
        .submit(
            "/destinations/default/ci/resume",
            &cookie,
            &[("csrf", "forged")],
        )
        .await;
    assert_eq!(status, 403, "a wrong CSRF token");
    assert_eq!(state(&env, "ci").await.0, "paused");
    let (_, html) = admin.page("/destinations", &cookie).await;
    let (status, location) = admin
        .submit(
            "/destinations/default/ci/resume",
            &cookie,
            &[("csrf", csrf_of(&html).as_str())],
        )
        .await;
    assert_eq!((status, location.as_str()), (303, "/destinations"));
    assert_eq!(
        state(&env, "ci").await,
        ("closed".to_owned(), Some("olivia".to_owned()))
    );
    let rows = audit_rows(&env).await;
    let actions: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|(actor, _, action, _, result)| (actor.as_str(), action.as_str(), result.as_str()))
        .collect();
    assert_eq!(
        actions,
        [
            ("olivia", "pause_destination", "paused (was open)"),
            ("olivia", "resume_destination", "closed (was paused)")
        ]
    );
    assert!(rows.iter().all(|r| r.1 == "operator"));

    // Resumed: every held leg goes, once.
    settle(&env, &worker).await;
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'completed'")
            .await,
        2 * hooks.len() as i64
    );
    admin.stop().await;
    env.cleanup().await;
    let _ = std::fs::remove_file(token);
}

#[tokio::test]
async fn a_delivery_with_several_legs_has_one_page_with_each_leg_and_its_attempt_log() {
    let env = TestEnv::new().await;
    let receiver = Receiver::start(|req, _| broken_answer(req.header("authorization"))).await;
    let (config, token) = config(&env, &receiver.url);
    let hooks = break_ci(&env, &config, 1).await;
    let hook = &hooks[0];
    let admin = env.admin_with(env.admin_config_on(&config)).await;

    // The API: every leg, the attempt log of ci with its 404 and the
    // answer's first bytes, the echoed token masked (as the worker kept
    // it).
    let path = format!("/api/v1/deliveries/default/{}", hook.id());
    let answer = admin.get(&path, Some(OPERATOR)).await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    let legs = answer.body["legs"].as_array().expect("legs");
    let by_name: Vec<(&str, &str)> = legs
        .iter()
        .map(|l| {
            (
                l["destination"].as_str().unwrap_or(""),
                l["state"].as_str().unwrap_or(""),
            )
        })
        .collect();
    // ci's answer opened its breaker, which holds the leg: it waits, and
    // nothing of it failed.
    assert_eq!(by_name, [("archive", "completed"), ("ci", "waiting")]);
    assert_eq!(
        answer.body["delivery"]["destination"], "ci",
        "the failed leg"
    );
    let log = legs[1]["attempt_log"].as_array().expect("the attempt log");
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0]["status_code"], 404);
    assert_eq!(log[0]["result"], "destination");
    assert!(log[0]["duration_ms"].as_f64().is_some());
    let excerpt = log[0]["response_excerpt"].as_str().expect("an excerpt");
    assert!(
        excerpt.starts_with("<script>alert(1)</script> no such hook; you sent [redacted]"),
        "{excerpt}"
    );
    assert!(!answer.text.contains("dest-ops-token"), "{}", answer.text);
    assert_eq!(legs[0]["attempt_log"], json!([]), "store keeps no log");
    let received: Vec<&Value> = answer.body["timeline"]
        .as_array()
        .expect("a timeline")
        .iter()
        .filter(|s| s["event"] == "received")
        .collect();
    assert_eq!(received.len(), 1, "received once, whatever its legs");
    assert_eq!(received[0]["destination"], "");
    // The list: one row per leg, and a filter by destination.
    let list = admin
        .get("/api/v1/deliveries?destination=ci", Some(OPERATOR))
        .await;
    let items = list.body["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{}", list.text);
    assert_eq!(
        (
            items[0]["delivery_id"].as_str(),
            items[0]["destination"].as_str()
        ),
        (Some(hook.id()), Some("ci"))
    );
    let stored: Vec<u8> = env
        .db
        .query_one("select response_excerpt from destination_attempts", &[])
        .await
        .expect("the attempt log")
        .get(0);
    let stored = String::from_utf8_lossy(&stored);
    assert!(
        stored.contains("[redacted]") && !stored.contains("dest-ops-token"),
        "kept masked: {stored}"
    );

    // The page: each leg, and ci's attempt with the answer escaped.
    let cookie = admin.sign_in(OPERATOR).await;
    let (status, html) = admin
        .page(
            &format!("/deliveries/default/{}?hook_id=123456", hook.id()),
            &cookie,
        )
        .await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains(r#"id="legs""#), "{html}");
    assert!(html.contains("<code>archive</code>") && html.contains("<code>ci</code>"));
    assert!(html.contains("Attempts to <code>ci</code>"), "{html}");
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;/script&gt; no such hook; you sent [redacted]"),
        "escaped: {html}"
    );
    assert!(!html.contains("<script>alert(1)"), "never raw markup");
    assert!(!html.contains("dest-ops-token"));
    // Without the hook id too, as the list links it.
    let (status, _) = admin
        .page(&format!("/deliveries/default/{}", hook.id()), &cookie)
        .await;
    assert_eq!(status, 200);
    admin.stop().await;
    env.cleanup().await;
    let _ = std::fs::remove_file(token);
}

#[tokio::test]
async fn dlq_list_and_replay_with_destination_touch_only_that_destinations_legs() {
    let env = TestEnv::new().await;
    let refusing = Receiver::start(|_, _| Reply::status(422)).await;
    let config = env.config_file(&format!(
        r#"
[[sources]]
name = "default"
secrets = ["{SECRET}"]

[[sources.destinations]]
name = "a"
kind = "forward"
url = "{url}"

[[sources.destinations]]
name = "b"
kind = "forward"
url = "{url}"
"#,
        url = refusing.url
    ));
    let ingest = env.ingest_on(&config).await;
    let worker = env.worker_on(&config, Default::default()).await;
    for _ in 0..2 {
        assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    }
    settle(&env, &worker).await;
    let dead = |destination: &'static str| {
        format!(
            "select count(*) from deliveries where destination = '{destination}' \
             and status = 'failed' and not retryable and replays = 0"
        )
    };
    assert_eq!(env.count(&dead("a")).await, 2);
    assert_eq!(env.count(&dead("b")).await, 2);

    let (code, out, err) = cli(&env, &config, &["dlq", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let all: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(all.as_array().map(Vec::len), Some(4));
    let (code, out, err) = cli(
        &env,
        &config,
        &["dlq", "list", "--destination", "a", "--json"],
    );
    assert_eq!(code, 0, "{err}");
    let only_a: Value = serde_json::from_str(&out).expect("JSON");
    let destinations: Vec<&str> = only_a
        .as_array()
        .expect("an array")
        .iter()
        .map(|d| d["destination"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(destinations, ["a", "a"]);
    let (code, _, _) = cli(&env, &config, &["dlq", "list", "--destination", "c"]);
    assert_eq!(code, 1, "no leg to c");
    let (code, _, err) = cli(&env, &config, &["dlq", "list", "--destination", "A/b"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--destination"), "{err}");

    let (code, out, err) = cli(
        &env,
        &config,
        &[
            "dlq",
            "replay",
            "--all",
            "--destination",
            "a",
            "--as",
            "carol",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("replayed 2, skipped 0"), "{out}");
    assert_eq!(env.count(&dead("a")).await, 0, "a's legs replayed");
    assert_eq!(env.count(&dead("b")).await, 2, "b's legs untouched");
    assert_eq!(
        env.count("select count(*) from deliveries where destination = 'a' and replays = 1")
            .await,
        2
    );
    let rows = audit_rows(&env).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].0, "carol");
    assert_eq!(rows[0].3["filter"]["destination"], "a", "{:?}", rows[0].3);
    env.cleanup().await;
}

#[tokio::test]
async fn a_configured_destination_no_worker_registered_yet_can_be_paused_before_it_runs() {
    let env = TestEnv::new().await;
    let (config, token) = config(&env, "http://127.0.0.1:9/hook");
    let admin = env.admin_with(env.admin_config_on(&config)).await;
    let listed = admin.get("/api/v1/destinations", Some(VIEWER)).await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    let ci = listed.body["items"]
        .as_array()
        .and_then(|items| items.iter().find(|d| d["name"] == "ci"))
        .expect("ci, from the configuration")
        .clone();
    assert_eq!(
        (
            &ci["state"],
            &ci["registered"],
            &ci["configured"],
            &ci["state_since"]
        ),
        (&json!("closed"), &json!(false), &json!(true), &Value::Null)
    );
    assert_eq!(env.count("select count(*) from destinations").await, 0);

    let paused = admin
        .post(
            "/api/v1/destinations/default/ci/pause",
            Some(OPERATOR),
            &json!({}),
        )
        .await;
    assert_eq!(paused.status, 200, "{}", paused.text);
    assert_eq!(
        (&paused.body["from"], &paused.body["changed"]),
        (&json!("closed"), &json!(true))
    );
    assert_eq!(
        state(&env, "ci").await,
        ("paused".to_owned(), Some("olivia".to_owned()))
    );
    // A worker starting now keeps the operator's state.
    let _worker = env.worker_on(&config, Default::default()).await;
    assert_eq!(state(&env, "ci").await.0, "paused");
    assert_eq!(state(&env, "archive").await.0, "closed");
    admin.stop().await;
    env.cleanup().await;
    let _ = std::fs::remove_file(token);
}
