//! The admin console's JSON API: each filter and the pages against known
//! rows, the status codes, bulk replay at a set rate and its cancel, a
//! replay of a delivery only GitHub has the body of, and the audit row of
//! each action. Every answer is checked against
//! `docs/admin-openapi.json` by the client itself.

use std::time::{Duration, Instant};

use hookinbox_tests::admin::{OPERATOR, Seed, VIEWER, seed, seed_dead_letters};
use hookinbox_tests::{Hook, TestEnv, settle, wait_until};
use serde_json::{Value, json};

fn seeds() -> Vec<Seed> {
    let mut rows = Vec::new();
    let mut add = |id: &str, f: &dyn Fn(&mut Seed)| {
        let mut s = Seed::dead(id, "push", 0);
        f(&mut s);
        rows.push(s);
    };
    // Ages are distinct so the order (newest first) is known: a1 newest.
    add("a1-done", &|s| {
        s.status = "completed".into();
        s.class = None;
        s.age_secs = 10;
        s.repository = Some("octo/one".into());
    });
    add("a2-dead", &|s| {
        s.age_secs = 20;
        s.event = "issues".into();
        s.action = Some("opened".into());
        s.repository = Some("octo/two".into());
    });
    add("a3-retry", &|s| {
        s.retryable = true;
        s.class = Some("transient".into());
        s.age_secs = 30;
        s.source = "billing".into();
    });
    add("b4-proc", &|s| {
        s.status = "processing".into();
        s.class = None;
        s.age_secs = 40;
        s.event = "issues".into();
        s.action = Some("closed".into());
    });
    add("b5-dead", &|s| {
        s.age_secs = 7200;
        s.class = Some("poison".into());
        s.repository = Some("octo/one".into());
    });
    rows
}

fn ids(answer: &Value) -> Vec<String> {
    answer["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["delivery_id"].as_str().expect("id").to_owned())
        .collect()
}

#[tokio::test]
async fn each_filter_and_its_count_answer_the_known_rows_and_pages_cover_them_once() {
    let env = TestEnv::new().await;
    seed(&env, &seeds()).await;
    let admin = env.admin().await;
    let t = Some(VIEWER);
    for (query, want) in [
        (
            "",
            vec!["a1-done", "a2-dead", "a3-retry", "b4-proc", "b5-dead"],
        ),
        ("status=completed", vec!["a1-done"]),
        ("status=failed", vec!["a2-dead", "a3-retry", "b5-dead"]),
        ("status=dead", vec!["a2-dead", "b5-dead"]),
        ("status=retrying", vec!["a3-retry"]),
        ("status=processing", vec!["b4-proc"]),
        ("source=billing", vec!["a3-retry"]),
        ("event=issues", vec!["a2-dead", "b4-proc"]),
        ("event=issues&action=closed", vec!["b4-proc"]),
        ("action=opened", vec!["a2-dead"]),
        ("repository=octo/one", vec!["a1-done", "b5-dead"]),
        ("error_class=poison", vec!["b5-dead"]),
        ("error_class=permanent&status=dead", vec!["a2-dead"]),
        (
            "since=1h",
            vec!["a1-done", "a2-dead", "a3-retry", "b4-proc"],
        ),
        ("until=1h", vec!["b5-dead"]),
        ("delivery_id=b", vec!["b4-proc", "b5-dead"]),
        ("delivery_id=a2-dead", vec!["a2-dead"]),
        ("delivery_id=zz", vec![]),
    ] {
        let listed = admin.get(&format!("/api/v1/deliveries?{query}"), t).await;
        assert_eq!(listed.status, 200, "{query}: {}", listed.text);
        assert_eq!(ids(&listed.body), want, "{query}");
        let counted = admin
            .get(&format!("/api/v1/deliveries/count?{query}"), t)
            .await;
        assert_eq!(counted.body["count"], want.len(), "{query}");
    }
    let item = &admin
        .get("/api/v1/deliveries?delivery_id=a2-dead", t)
        .await
        .body["items"][0];
    for (field, value) in [
        ("source", json!("default")),
        ("hook_id", json!("1")),
        ("event", json!("issues")),
        ("action", json!("opened")),
        ("repository", json!("octo/two")),
        ("status", json!("failed")),
        ("state", json!("dead")),
        ("attempts", json!(1)),
        ("error_class", json!("permanent")),
    ] {
        assert_eq!(item[field], value, "{field}");
    }
    assert!(item["created_at"].is_string());

    // Pages of two, following next_cursor, cover every row once, in order.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let q = match &cursor {
            Some(c) => format!("/api/v1/deliveries?limit=2&cursor={c}"),
            None => "/api/v1/deliveries?limit=2".to_owned(),
        };
        let page = admin.get(&q, t).await;
        assert!(ids(&page.body).len() <= 2);
        seen.extend(ids(&page.body));
        match page.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(
        seen,
        vec!["a1-done", "a2-dead", "a3-retry", "b4-proc", "b5-dead"]
    );
    // A filtered page follows its filter.
    let first = admin
        .get("/api/v1/deliveries?status=failed&limit=1", t)
        .await;
    let c = first.body["next_cursor"].as_str().expect("more").to_owned();
    let second = admin
        .get(
            &format!("/api/v1/deliveries?status=failed&limit=1&cursor={c}"),
            t,
        )
        .await;
    assert_eq!(ids(&second.body), vec!["a3-retry"]);
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn tokens_roles_and_bad_requests_get_their_status_codes() {
    let env = TestEnv::new().await;
    seed(&env, &seeds()).await;
    let admin = env.admin().await;
    // 401 without a token or with a wrong one.
    assert_eq!(admin.get("/api/v1/deliveries", None).await.status, 401);
    assert_eq!(
        admin
            .get("/api/v1/deliveries", Some("not-a-token-at-all"))
            .await
            .status,
        401
    );
    assert_eq!(admin.get("/api/v1/audit", None).await.status, 401);
    // A viewer reads, and may dry-run, but never changes anything.
    assert_eq!(
        admin.get("/api/v1/overview", Some(VIEWER)).await.status,
        200
    );
    let dry = admin
        .post(
            "/api/v1/replays",
            Some(VIEWER),
            &json!({"filter": {"status": "dead"}, "dry_run": true}),
        )
        .await;
    assert_eq!((dry.status, dry.body["count"].clone()), (200, json!(2)));
    let refused = admin
        .post(
            "/api/v1/replays",
            Some(VIEWER),
            &json!({"filter": {"status": "dead"}}),
        )
        .await;
    assert_eq!(refused.status, 403, "{}", refused.text);
    let refused = admin
        .post("/api/v1/purges", Some(VIEWER), &json!({"ids": ["a2-dead"]}))
        .await;
    assert_eq!(refused.status, 403);
    assert_eq!(
        admin.delete("/api/v1/replays/1", Some(VIEWER)).await.status,
        403
    );
    assert_eq!(
        env.count("select count(*) from admin_jobs").await,
        0,
        "nothing written"
    );
    // 400 naming the field.
    for (path, field) in [
        ("/api/v1/deliveries?status=sleeping", "status"),
        ("/api/v1/deliveries?error_class=bad", "error_class"),
        ("/api/v1/deliveries?since=soonish", "since"),
        ("/api/v1/deliveries?limit=9999", "limit"),
        ("/api/v1/deliveries?cursor=nonsense", "cursor"),
        ("/api/v1/deliveries?colour=red", "colour"),
        ("/api/v1/deliveries/count?delivery_id=a%20b", "delivery_id"),
    ] {
        let a = admin.get(path, Some(VIEWER)).await;
        assert_eq!(
            (a.status, a.body["field"].as_str()),
            (400, Some(field)),
            "{path}: {}",
            a.text
        );
    }
    for (body, field) in [
        (
            json!({"filter": {"status": "dead"}, "ids": ["x"]}),
            "filter",
        ),
        (json!({"filter": {"status": "completed"}}), "filter.status"),
        (json!({"filter": {"event": 3}}), "filter.event"),
        (json!({"ids": []}), "ids"),
        (json!({"ids": ["ok", "bad id"]}), "ids[1]"),
        (json!({"ids": ["x"], "per_second": 0}), "per_second"),
        (json!({"ids": ["x"], "colour": "red"}), "body"),
    ] {
        let a = admin.post("/api/v1/replays", Some(OPERATOR), &body).await;
        assert_eq!(
            (a.status, a.body["field"].as_str()),
            (400, Some(field)),
            "{body}: {}",
            a.text
        );
    }
    // 404 for an unknown delivery or job.
    assert_eq!(
        admin
            .get("/api/v1/deliveries/default/nope", Some(VIEWER))
            .await
            .status,
        404
    );
    assert_eq!(
        admin
            .get("/api/v1/replays/12345", Some(VIEWER))
            .await
            .status,
        404
    );
    // 409: nothing matches.
    let none = admin
        .post("/api/v1/replays", Some(OPERATOR), &json!({"ids": ["nope"]}))
        .await;
    assert_eq!(none.status, 409, "{}", none.text);
    assert_eq!(
        env.count("select count(*) from admin_jobs").await,
        0,
        "nothing written"
    );
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_bulk_replay_of_1000_dead_letters_at_a_set_rate_completes_each_once() {
    let env = TestEnv::new().await;
    let n = 1000;
    seed_dead_letters(&env, n).await;
    let admin = env.admin().await;
    let dry = admin
        .post(
            "/api/v1/replays",
            Some(OPERATOR),
            &json!({"filter": {"status": "dead"}, "dry_run": true}),
        )
        .await;
    assert_eq!(dry.body["count"], n);
    assert_eq!(dry.body["sample"].as_array().map(Vec::len), Some(20));
    let rate = 250.0;
    let started = Instant::now();
    let job = admin
        .post(
            "/api/v1/replays",
            Some(OPERATOR),
            &json!({"filter": {"status": "dead", "source": "default"}, "per_second": rate}),
        )
        .await;
    assert_eq!(
        (job.status, job.body["count"].clone()),
        (202, json!(n)),
        "{}",
        job.text
    );
    let id = job.body["job"].as_i64().expect("job id");
    // Its progress is visible while it runs.
    let progress = admin
        .get(&format!("/api/v1/replays/{id}"), Some(VIEWER))
        .await;
    assert_eq!(progress.body["total"], n);
    wait_until("the job to finish", Duration::from_secs(60), || async {
        admin
            .get(&format!("/api/v1/replays/{id}"), Some(VIEWER))
            .await
            .body["status"]
            == "finished"
    })
    .await;
    let took = started.elapsed();
    // n items at `rate` per second: the last starts (n - 1) / rate after the first.
    assert!(
        took >= Duration::from_secs_f64((n - 1) as f64 / rate),
        "{took:?}"
    );
    let done = admin
        .get(&format!("/api/v1/replays/{id}"), Some(VIEWER))
        .await;
    assert_eq!(
        (done.body["replayed"].clone(), done.body["done"].clone()),
        (json!(n), json!(n))
    );
    assert!(
        done.body["items"][0]["replay_of"]["delivery_id"].is_string(),
        "lineage: {}",
        done.body
    );
    assert_eq!(env.work_depth().await as i64, n);
    // The store worker completes each exactly once.
    let outcomes = settle(&env, &env.store_worker().await).await;
    assert_eq!(outcomes.len() as i64, n);
    assert_eq!(env.events().await, n);
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'completed' and replays = 1 and attempts = 1")
            .await,
        n
    );
    // A delivery's lineage names the job and the operator.
    let one = admin
        .get(
            "/api/v1/deliveries/default/bulk-7?hook_id=1",
            Some(OPERATOR),
        )
        .await;
    assert_eq!(one.body["lineage"][0]["job"], id);
    assert_eq!(one.body["lineage"][0]["by"], "olivia");
    assert_eq!(one.body["delivery"]["state"], "completed");
    // A second replay of the same filter matches nothing.
    let again = admin
        .post(
            "/api/v1/replays",
            Some(OPERATOR),
            &json!({"filter": {"status": "dead"}}),
        )
        .await;
    assert_eq!(again.status, 409);
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn cancelling_a_bulk_replay_stops_it() {
    let env = TestEnv::new().await;
    seed_dead_letters(&env, 200).await;
    let admin = env.admin().await;
    let job = admin
        .post(
            "/api/v1/replays",
            Some(OPERATOR),
            &json!({"filter": {"status": "dead"}, "per_second": 20}),
        )
        .await;
    let id = job.body["job"].as_i64().expect("job id");
    wait_until("a few replays", Duration::from_secs(20), || async {
        admin
            .get(&format!("/api/v1/replays/{id}"), Some(VIEWER))
            .await
            .body["done"]
            .as_i64()
            >= Some(3)
    })
    .await;
    let cancelled = admin
        .delete(&format!("/api/v1/replays/{id}"), Some(OPERATOR))
        .await;
    assert_eq!(
        (cancelled.status, cancelled.body["status"].clone()),
        (200, json!("cancelled"))
    );
    let done_then = cancelled.body["done"].as_i64().expect("done");
    assert!(done_then < 200);
    // No item starts after the cancel's answer: wait longer than several
    // items would take, then nothing moved.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = admin
        .get(&format!("/api/v1/replays/{id}"), Some(VIEWER))
        .await;
    assert_eq!(later.body["done"].as_i64(), Some(done_then));
    assert_eq!(
        env.count("select count(*) from deliveries where replays = 1")
            .await,
        done_then
    );
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'failed' and not retryable")
            .await,
        200 - done_then
    );
    // Cancelling again is a conflict.
    assert_eq!(
        admin
            .delete(&format!("/api/v1/replays/{id}"), Some(OPERATOR))
            .await
            .status,
        409
    );
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn each_change_writes_one_audit_row_with_who_what_count_and_result() {
    let env = TestEnv::new().await;
    seed(&env, &seeds()).await;
    seed_dead_letters(&env, 30).await;
    let admin = env.admin().await;
    // A replay by ids, a purge by filter, a slow replay cancelled.
    let r = admin
        .post(
            "/api/v1/replays",
            Some(OPERATOR),
            &json!({"ids": ["a2-dead"], "per_second": 100}),
        )
        .await;
    let replay = r.body["job"].as_i64().expect("job");
    let p = admin
        .post(
            "/api/v1/purges",
            Some(OPERATOR),
            &json!({"filter": {"error_class": "poison"}, "per_second": 100}),
        )
        .await;
    let purge = p.body["job"].as_i64().expect("job");
    let s = admin
        .post(
            "/api/v1/replays",
            Some(OPERATOR),
            &json!({"filter": {"delivery_id": "bulk-"}, "per_second": 1}),
        )
        .await;
    let slow = s.body["job"].as_i64().expect("job");
    assert_eq!(
        admin
            .delete(&format!("/api/v1/replays/{slow}"), Some(OPERATOR))
            .await
            .status,
        200
    );
    for (path, id) in [("replays", replay), ("purges", purge)] {
        wait_until("the job to end", Duration::from_secs(20), || async {
            admin
                .get(&format!("/api/v1/{path}/{id}"), Some(VIEWER))
                .await
                .body["status"]
                == "finished"
        })
        .await;
    }
    // Dry runs and reads write nothing.
    admin
        .post(
            "/api/v1/replays",
            Some(OPERATOR),
            &json!({"ids": ["b5-dead"], "dry_run": true}),
        )
        .await;
    wait_until(
        "the job results in the audit",
        Duration::from_secs(20),
        || async {
            let a = admin.get("/api/v1/audit", Some(VIEWER)).await;
            a.body["items"].as_array().is_some_and(|rows| {
                rows.iter().filter(|r| r["action"] != "cancel").all(|r| {
                    r["result"]
                        .as_str()
                        .is_some_and(|s| !s.starts_with("started"))
                })
            })
        },
    )
    .await;
    let audit = admin.get("/api/v1/audit", Some(VIEWER)).await;
    let rows = audit.body["items"].as_array().expect("rows");
    assert_eq!(rows.len(), 4, "{}", audit.body);
    let find = |action: &str, job: i64| {
        rows.iter()
            .find(|r| r["action"] == action && r["job"] == job)
            .unwrap_or_else(|| panic!("no {action} row for job {job}: {}", audit.body))
    };
    let row = find("replay", replay);
    assert_eq!(
        (row["actor"].clone(), row["role"].clone()),
        (json!("olivia"), json!("operator"))
    );
    assert_eq!(row["target"], json!({"ids": ["a2-dead"]}));
    assert_eq!(row["count"], 1);
    assert!(
        row["result"]
            .as_str()
            .expect("result")
            .starts_with("finished: 1 replayed"),
        "{row}"
    );
    let row = find("purge", purge);
    assert_eq!(row["target"], json!({"filter": {"error_class": "poison"}}));
    assert!(
        row["result"].as_str().expect("result").contains("1 purged"),
        "{row}"
    );
    assert_eq!(
        env.count("select count(*) from deliveries where delivery_id = 'b5-dead'")
            .await,
        0
    );
    let row = find("cancel", slow);
    assert_eq!(row["target"], json!({"job": slow}));
    let row = find("replay", slow);
    assert_eq!(row["count"], 30);
    assert!(
        row["result"]
            .as_str()
            .expect("result")
            .starts_with("cancelled"),
        "{row}"
    );
    // Pages of the audit log.
    let first = admin.get("/api/v1/audit?limit=3", Some(VIEWER)).await;
    let cursor = first.body["next_cursor"].as_i64().expect("a next page");
    let rest = admin
        .get(
            &format!("/api/v1/audit?limit=3&cursor={cursor}"),
            Some(VIEWER),
        )
        .await;
    assert_eq!(rest.body["items"].as_array().map(Vec::len), Some(1));
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_replay_of_a_delivery_without_a_body_fails_saying_only_github_has_it() {
    let env = TestEnv::new().await;
    // Claimed by an ingest that died before publishing, then reaped `lost`:
    // failed, so the console selects it, but only GitHub has its body.
    let hook = Hook::fixture("push");
    env.claim_unpublished(&hook).await;
    assert_eq!(env.reap_now().await, 1);
    let admin = env.admin().await;
    let r = admin
        .post(
            "/api/v1/replays",
            Some(OPERATOR),
            &json!({"ids": [hook.id()], "per_second": 100}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    let job = r.body["job"].as_i64().expect("job");
    wait_until("the job to end", Duration::from_secs(20), || async {
        admin
            .get(&format!("/api/v1/replays/{job}"), Some(VIEWER))
            .await
            .body["status"]
            == "finished"
    })
    .await;
    let done = admin
        .get(&format!("/api/v1/replays/{job}"), Some(VIEWER))
        .await;
    assert_eq!(
        (
            done.body["replayed"].clone(),
            done.body["skipped"].clone(),
            done.body["failed"].clone()
        ),
        (json!(0), json!(0), json!(1)),
        "{}",
        done.text
    );
    let item = &done.body["items"][0];
    assert_eq!(item["result"], "failed", "{item}");
    let says_why = |text: &str| {
        text.contains("No body to replay")
            && text.contains("only GitHub has its body")
            && text.contains("hookinbox-worker reconcile")
            && text.contains("Redeliver")
    };
    assert!(says_why(item["error"].as_str().unwrap_or("")), "{item}");
    assert_eq!(
        env.count(
            "select count(*) from deliveries
             where status = 'failed' and retryable and last_error_class = 'lost' and replays = 0"
        )
        .await,
        1,
        "the row is as it was"
    );
    // Its timeline says the same; its page too, and offers no Replay.
    let detail = admin
        .get(
            &format!("/api/v1/deliveries/default/{}", hook.id()),
            Some(VIEWER),
        )
        .await;
    let step = detail.body["timeline"]
        .as_array()
        .expect("timeline")
        .iter()
        .find(|s| s["event"] == "replay failed")
        .unwrap_or_else(|| panic!("a failed replay in {}", detail.text))
        .clone();
    assert!(says_why(step["detail"].as_str().unwrap_or("")), "{step}");
    let cookie = admin.sign_in(OPERATOR).await;
    let (status, html) = admin
        .page(&format!("/deliveries/default/{}", hook.id()), &cookie)
        .await;
    assert_eq!(status, 200);
    assert!(html.contains("id=\"no-body\""), "{html}");
    assert!(html.contains("hookinbox-worker reconcile"), "{html}");
    assert!(!html.contains("id=\"replay\""), "no Replay button: {html}");
    assert!(
        !html.contains("id=\"purge\""),
        "not a dead letter: no Purge"
    );
    admin.stop().await;
    env.cleanup().await;
}
