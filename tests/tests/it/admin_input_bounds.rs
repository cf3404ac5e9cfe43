//! No input panics the console or the CLI: every filter and parameter
//! (ages, times, limits, cursors, ids, rates) of the pages, the JSON API
//! and the operator commands is bounded and refused with a 400 (the CLI:
//! a usage error, exit 2) that names it. A forged cursor is refused
//! before it reaches SQL, a failing statement never shows Postgres's text,
//! and a body too large or too slow is cut off.
//!
//! The sweeps run the real binary with its standard error in a file, so a
//! panic in any handler thread shows there (and as a dropped connection)
//! even though actix-web restarts the thread.

use std::time::Duration;

use hookinbox_operator::console::FILTER_FIELDS;
use hookinbox_tests::admin::{OPERATOR, Seed, SpawnedAdmin, raw_status_line, seed, sign_in_at};
use hookinbox_tests::{TestEnv, worker_command};
use serde_json::{Value, json};

/// Extreme values: huge, negative, overflowing, unicode, control, empty,
/// very long.
fn extremes() -> Vec<String> {
    vec![
        "99999999999999999999999".to_owned(),
        "1000000000d".to_owned(),
        "-1".to_owned(),
        "-1d".to_owned(),
        "1e309".to_owned(),
        "NaN".to_owned(),
        "日本語".to_owned(),
        "\u{202e}evil".to_owned(),
        "a\u{0}b".to_owned(),
        "+275760-09-13T00:00:00Z".to_owned(),
        "9".repeat(10_000),
        String::new(),
    ]
}

/// Whether `value` is a source's name (a-z, 0-9, '-', '_'; 1 to 64).
fn source_name(value: &str) -> bool {
    (1..=64).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Whether `value` is an event's name (a-z, 0-9, '_'; 1 to 64).
fn event_name(value: &str) -> bool {
    (1..=64).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Whether `value` is a legitimate value of `param` (a free-text filter
/// takes any short text; an empty value is an unset field).
fn valid(param: &str, value: &str) -> bool {
    if value.is_empty() {
        return true;
    }
    let short_printable = value.len() <= 64 && !value.chars().any(char::is_control);
    match param {
        "source" | "destination" | "event" | "action" | "repository" => short_printable,
        "delivery_id" => value.len() <= 128 && value.bytes().all(|b| b.is_ascii_graphic()),
        _ => false,
    }
}

/// Every filter of a list, and its pages' limit and cursor.
fn filter_params() -> impl Iterator<Item = &'static str> {
    FILTER_FIELDS.into_iter().chain(["limit", "cursor"])
}

fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// One request of the sweep and what it must get.
struct Probe {
    method: reqwest::Method,
    path: String,
    body: Option<Value>,
    /// The parameter at fault, `None` when the value is valid.
    refused: Option<String>,
}

fn probes() -> Vec<Probe> {
    let mut out = Vec::new();
    let get = |path: String, refused: Option<&str>| Probe {
        method: reqwest::Method::GET,
        path,
        body: None,
        refused: refused.map(str::to_owned),
    };
    for value in extremes() {
        let v = enc(&value);
        for p in filter_params() {
            let refused = (!valid(p, &value)).then_some(p);
            out.push(get(format!("/api/v1/deliveries?{p}={v}"), refused));
            if p != "cursor" {
                out.push(get(format!("/api/v1/deliveries/count?{p}={v}"), refused));
            }
            out.push(get(format!("/deliveries?{p}={v}"), refused));
            if p != "limit" && p != "cursor" {
                out.push(get(format!("/bulk?kind=replay&dry_run=1&{p}={v}"), refused));
                out.push(Probe {
                    method: reqwest::Method::POST,
                    path: "/api/v1/replays".to_owned(),
                    body: Some(json!({"filter": {p: value}, "dry_run": true})),
                    refused: refused.map(|p| format!("filter.{p}")),
                });
            }
        }
        let empty_ok = |p: &str| (!value.is_empty()).then(|| p.to_owned());
        for p in ["limit", "cursor"] {
            out.push(Probe {
                refused: empty_ok(p),
                ..get(format!("/api/v1/audit?{p}={v}"), None)
            });
        }
        out.push(Probe {
            refused: empty_ok("cursor"),
            ..get(format!("/audit?cursor={v}"), None)
        });
        out.push(Probe {
            refused: empty_ok("per_second"),
            ..get(
                format!("/bulk?kind=replay&status=dead&per_second={v}"),
                None,
            )
        });
        if !value.is_empty() {
            // Path segments: a job, a delivery's source and id, its hook.
            for (path, p) in [
                (format!("/api/v1/replays/{v}"), "job"),
                (format!("/api/v1/purges/{v}"), "job"),
                (format!("/jobs/{v}"), "job"),
                (
                    format!("/api/v1/deliveries/default/x?hook_id={v}"),
                    "hook_id",
                ),
                (format!("/deliveries/default/x?hook_id={v}"), "hook_id"),
            ] {
                out.push(get(path, Some(p)));
            }
            let source = (!source_name(&value)).then_some("source");
            out.push(get(format!("/api/v1/deliveries/{v}/x"), source));
            out.push(get(format!("/deliveries/{v}/x"), source));
            // (A NUL in a path is left to the filter sweep: whether the
            // router decodes it is the router's business.)
            if !valid("delivery_id", &value) && !value.contains('\0') {
                out.push(get(
                    format!("/api/v1/deliveries/default/{v}"),
                    Some("delivery_id"),
                ));
            }
            // A destination's source and name: a bad one is named, a valid
            // one that is not configured is a 404.
            if !value.contains('\0') {
                let source = (!source_name(&value)).then(|| "source".to_owned());
                out.push(Probe {
                    method: reqwest::Method::POST,
                    path: format!("/api/v1/destinations/{v}/ci/pause"),
                    body: None,
                    refused: source,
                });
                let name = (!source_name(&value)).then(|| "destination".to_owned());
                out.push(Probe {
                    method: reqwest::Method::POST,
                    path: format!("/api/v1/destinations/default/{v}/resume"),
                    body: None,
                    refused: name,
                });
            }
            out.push(Probe {
                method: reqwest::Method::DELETE,
                path: format!("/api/v1/sessions/{v}"),
                body: None,
                refused: Some("session".to_owned()),
            });
        }
        // A rate given as text is not a number, and numbers out of range.
        out.push(Probe {
            method: reqwest::Method::POST,
            path: "/api/v1/replays".to_owned(),
            body: Some(json!({"filter": {"status": "dead"}, "per_second": value, "dry_run": true})),
            refused: Some("body".to_owned()),
        });
    }
    for rate in [json!(-1), json!(0), json!(1e308), json!(1001)] {
        out.push(Probe {
            method: reqwest::Method::POST,
            path: "/api/v1/replays".to_owned(),
            body: Some(json!({"filter": {"status": "dead"}, "per_second": rate, "dry_run": true})),
            refused: Some("per_second".to_owned()),
        });
    }
    out
}

/// Runs every probe against `admin`; returns how many were answered.
async fn sweep(admin: &SpawnedAdmin, cookie: &str) -> usize {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let mut answered = 0;
    for probe in probes() {
        let page = !probe.path.starts_with("/api/");
        let mut req = http.request(
            probe.method.clone(),
            format!("{}{}", admin.base, probe.path),
        );
        req = if page {
            req.header("cookie", cookie)
        } else {
            req.bearer_auth(OPERATOR)
        };
        if let Some(b) = &probe.body {
            req = req.json(b);
        }
        let what = format!(
            "{} {}",
            probe.method,
            &probe.path[..probe.path.len().min(120)]
        );
        // A panicking handler drops its connection: an error here.
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("{what}: no answer ({e})"));
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        answered += 1;
        match &probe.refused {
            Some(p) => {
                assert_eq!(status, 400, "{what}: {text}");
                if page {
                    assert!(text.contains(&format!("{p}:")), "{what} does not name {p}");
                } else {
                    let body: Value = serde_json::from_str(&text).expect("JSON");
                    assert_eq!(body["field"], p.as_str(), "{what}: {text}");
                }
            }
            None => assert!(
                status == 200 || status == 404,
                "{what}: a valid value got {status}: {text}"
            ),
        }
    }
    answered
}

#[tokio::test]
async fn every_console_parameter_refuses_extreme_values_with_a_400_naming_it() {
    let env = TestEnv::new().await;
    seed(&env, &[Seed::dead("bounds-1", "push", 5)]).await;
    let admin = env.spawn_admin(&[], &[]).await;
    let page = sign_in_at(&admin.base, OPERATOR).await;
    let sent = probes().len();
    assert_eq!(sweep(&admin, &page).await, sent);
    // Still serving, and nothing panicked on the way.
    let ready = reqwest::get(format!("{}/readyz", admin.base))
        .await
        .expect("answers");
    assert_eq!(ready.status(), 200);
    let logs = admin.logs();
    if let Some(at) = logs.find("panicked") {
        let excerpt: String = logs[at..].chars().take(2000).collect();
        panic!("a handler panicked:\n{excerpt}");
    }
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_forged_cursor_is_refused_before_sql_and_a_failed_statement_shows_no_postgres_text() {
    let env = TestEnv::new().await;
    let rows: Vec<Seed> = (0..3)
        .map(|i| Seed::dead(&format!("cur-{i}"), "push", 10 + i))
        .collect();
    seed(&env, &rows).await;
    let admin = env.admin().await;
    let first = admin
        .get("/api/v1/deliveries?limit=1", Some(OPERATOR))
        .await;
    let next = first.body["next_cursor"].as_str().expect("a next page");
    let a = admin
        .get(
            &format!("/api/v1/deliveries?limit=1&cursor={next}"),
            Some(OPERATOR),
        )
        .await;
    assert_eq!(a.status, 200, "a real cursor: {}", a.text);
    let forge = |v: Value| hex::encode(v.to_string());
    for cursor in [
        forge(json!([
            1_700_000_000_000_000i64,
            "github",
            "default",
            "1",
            "a\u{0}b"
        ])),
        forge(json!([i64::MIN / 2, "github", "default", "1", "x"])),
        forge(json!([
            1_700_000_000_000_000i64,
            "github",
            "日本",
            "1",
            "x"
        ])),
        forge(json!([
            1_700_000_000_000_000i64,
            "github",
            "default",
            "1x",
            "x"
        ])),
        forge(json!([1, "github"])),
        "zz".to_owned(),
    ] {
        for path in ["/api/v1/deliveries", "/deliveries"] {
            let url = format!("{path}?cursor={cursor}");
            let (status, text) = if path.starts_with("/api") {
                let a = admin.get(&url, Some(OPERATOR)).await;
                (a.status, a.text)
            } else {
                let cookie = admin.sign_in(OPERATOR).await;
                admin.page(&url, &cookie).await
            };
            assert_eq!(status, 400, "{url}: {text}");
            assert!(text.contains("cursor"), "{url}: {text}");
            for leak in ["invalid byte sequence", "out of range", "SQLSTATE", "ERROR"] {
                assert!(!text.contains(leak), "{url} shows Postgres's text: {text}");
            }
        }
    }
    // A statement that fails for any reason answers 503 without its text.
    env.db
        .batch_execute("alter table admin_audit rename to admin_audit_gone")
        .await
        .expect("rename");
    let a = admin.get("/api/v1/audit", Some(OPERATOR)).await;
    assert_eq!(a.status, 503);
    assert!(
        !a.text.contains("admin_audit") && !a.text.contains("relation"),
        "the answer shows Postgres's text: {}",
        a.text
    );
    let cookie = admin.sign_in(OPERATOR).await;
    let (status, html) = admin.page("/audit", &cookie).await;
    assert_eq!(status, 503);
    assert!(!html.contains("relation"), "{html}");
    env.db
        .batch_execute("alter table admin_audit_gone rename to admin_audit")
        .await
        .expect("rename back");
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn the_cli_refuses_extreme_values_with_a_usage_error_naming_the_flag() {
    let env = TestEnv::new().await;
    // One dead letter, so that a replay would reach its pacing.
    seed(&env, &[Seed::dead("cli-1", "push", 5)]).await;
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = worker_command(&env, &args, &[]).output().expect("runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let owned = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let mut cases: Vec<(Vec<String>, &str)> = Vec::new();
    for value in extremes() {
        if value.contains('\0') {
            continue; // not an argument a process can be given
        }
        let flag = |cmd: &[&str], name: &str| {
            let mut a = owned(cmd);
            a.push(format!("{name}={value}"));
            a
        };
        for (cmd, name) in [
            (&["deliveries", "list"][..], "--since"),
            (&["dlq", "list"][..], "--since"),
            (&["deliveries", "list"][..], "--limit"),
            (&["dlq", "list"][..], "--limit"),
            (&["dlq", "replay", "--dry-run"][..], "--since"),
            (&["dlq", "purge", "--dry-run"][..], "--older-than"),
            // Not a dry run: with a dead letter to replay, the rate sets
            // the pace (a rate near 0 once overflowed the pause).
            (&["dlq", "replay", "--all"][..], "--rate"),
            (&["reconcile", "--dry-run"][..], "--since"),
            (&["reconcile", "--dry-run"][..], "--max-wait"),
        ] {
            cases.push((flag(cmd, name), name));
        }
        if !source_name(&value) {
            cases.push((flag(&["deliveries", "list"], "--source"), "--source"));
        }
        if !event_name(&value) {
            cases.push((flag(&["deliveries", "list"], "--event"), "--event"));
        }
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_graphic()) || value.len() > 128 {
            let mut show = owned(&["deliveries", "show", "--"]);
            show.push(value.clone());
            cases.push((show, "<ID>"));
            let mut replay = owned(&["dlq", "replay", "--dry-run", "--"]);
            replay.push(value.clone());
            cases.push((replay, "[IDS]"));
        }
    }
    cases.push((
        owned(&["dlq", "replay", "--all", "--rate", "1e-300"]),
        "--rate",
    ));
    for (args, flag) in cases {
        let what = args.join(" ");
        let what = &what[..what.len().min(120)];
        let (code, err) = run(args);
        assert!(!err.contains("panicked"), "{what}: panicked:\n{err}");
        assert_eq!(code, Some(2), "{what}: {err}");
        assert!(
            err.contains(flag),
            "{what}: the error does not name {flag}:\n{err}"
        );
    }
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'failed'")
            .await,
        1,
        "nothing was replayed"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn a_body_too_large_or_too_slow_is_cut_off() {
    let env = TestEnv::new().await;
    let mut config = env.admin_config();
    config.body_timeout = Duration::from_millis(500);
    let admin = env.admin_with(config).await;
    // Declared larger than a form takes: refused before a byte is read.
    let head = |path: &str, length: usize, extra: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\n\
             Content-Length: {length}\r\n{extra}\r\n"
        )
    };
    let line = raw_status_line(
        admin.port,
        head("/login", 10_000_000, "").as_bytes(),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(line.as_deref(), Some("HTTP/1.1 413 Payload Too Large"));
    // A JSON call past its cap, sent whole.
    let big = json!({"ids": vec!["x".repeat(120); 40_000], "dry_run": true});
    let a = admin
        .http
        .post(format!("{}/api/v1/replays", admin.base))
        .bearer_auth(OPERATOR)
        .json(&big)
        .send()
        .await
        .expect("answers");
    assert_eq!(a.status().as_u16(), 413);
    // A body that trickles: cut off with 408 once the timeout passes.
    for (path, extra) in [
        ("/login", String::new()),
        ("/logout", String::new()),
        (
            "/api/v1/replays",
            format!("Authorization: Bearer {OPERATOR}\r\n"),
        ),
    ] {
        let mut request = head(path, 100, &extra).into_bytes();
        request.extend_from_slice(b"token=abc");
        let line = raw_status_line(admin.port, &request, Duration::from_secs(10)).await;
        assert_eq!(
            line.as_deref(),
            Some("HTTP/1.1 408 Request Timeout"),
            "{path}: a slow body was not cut off"
        );
    }
    admin.stop().await;
    env.cleanup().await;
}
