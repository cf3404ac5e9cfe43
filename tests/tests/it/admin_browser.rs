//! The admin console in a real browser (headless Chromium through
//! chromedriver): sign in, filter the dead letters, open one, replay it and
//! see it complete, run a bulk replay with its count and progress, and a
//! viewer who sees no replay button; all under the console's content
//! security policy (no inline script or style). Screenshots of the overview, a list,
//! a delivery and a bulk job go to `target/admin-screenshots/`.

use std::time::Duration;

use fantoccini::Locator;
use hookinbox_tests::admin::{OPERATOR, Seed, VIEWER, seed};
use hookinbox_tests::browser::Browser;
use hookinbox_tests::handlers::Scripted;
use hookinbox_tests::{Hook, TestEnv, settle, wait_until};
use hookinbox_worker::HandlerError;

async fn sign_in(b: &Browser, base: &str, token: &str) {
    b.client
        .goto(&format!("{base}/login"))
        .await
        .expect("login page");
    b.client
        .find(Locator::Css("#token"))
        .await
        .expect("token field")
        .send_keys(token)
        .await
        .expect("type");
    b.client
        .find(Locator::Css("form.login button"))
        .await
        .expect("button")
        .click()
        .await
        .expect("submit");
    wait_until("the overview", Duration::from_secs(10), || async {
        b.client.current_url().await.is_ok_and(|u| u.path() == "/")
    })
    .await;
}

async fn text_of(b: &Browser, css: &str) -> String {
    b.client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .text()
        .await
        .expect("text")
}

/// Reloads until `css`'s text contains `want` (the page shows the
/// database's state; the worker is driven by the test meanwhile).
async fn reload_until(b: &Browser, css: &str, want: &str) {
    wait_until(
        &format!("{css} to show {want}"),
        Duration::from_secs(30),
        || async {
            let _ = b.client.refresh().await;
            match b.client.find(Locator::Css(css)).await {
                Ok(e) => e.text().await.is_ok_and(|t| t.contains(want)),
                Err(_) => false,
            }
        },
    )
    .await;
}

#[tokio::test]
async fn an_operator_filters_dead_letters_replays_one_and_runs_a_bulk_replay() {
    let (env, ingest) = TestEnv::with_ingest().await;
    // Three deliveries complete; five fail for good.
    let mut hooks = Vec::new();
    for (event, body) in [
        (
            "push",
            r#"{"ref":"refs/heads/main","repository":{"full_name":"octo/api"}}"#,
        ),
        (
            "issues",
            r#"{"action":"opened","issue":{"title":"Crash on save"},"repository":{"full_name":"octo/web"}}"#,
        ),
        (
            "pull_request",
            r#"{"action":"closed","number":7,"repository":{"full_name":"octo/web"}}"#,
        ),
    ] {
        let hook = Hook::new(event, body);
        assert_eq!(ingest.send(&hook).await.status, 202);
        hooks.push(hook);
    }
    settle(&env, &env.store_worker().await).await;
    for i in 0..5 {
        let hook = Hook::new(
            "issues",
            format!(
                r#"{{"action":"labeled","issue":{{"number":{i},"title":"Label <b>{i}</b>"}},"repository":{{"full_name":"octo/web"}}}}"#
            ),
        );
        assert_eq!(ingest.send(&hook).await.status, 202);
    }
    let receiver_down = (0..5)
        .map(|_| HandlerError::permanent("receiver answered 422 Unprocessable Entity"))
        .collect();
    settle(&env, &env.worker(Scripted::new(receiver_down)).await).await;
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'failed' and not retryable")
            .await,
        5
    );

    let admin = env.admin().await;
    let b = Browser::start().await;
    sign_in(&b, &admin.base, OPERATOR).await;
    assert!(
        text_of(&b, "main")
            .await
            .contains("Dead letters by error class")
    );
    // The stylesheet applies under the content security policy.
    let header = b.client.find(Locator::Css("header")).await.expect("header");
    assert_eq!(
        header.css_value("background-color").await.expect("a style"),
        "rgba(29, 35, 48, 1)"
    );
    b.screenshot("overview").await;

    // Filter the dead letters with the form; the filter lands in the URL.
    b.client
        .goto(&format!("{}/deliveries", admin.base))
        .await
        .expect("list");
    b.client
        .find(Locator::Css("select[name=status]"))
        .await
        .expect("state")
        .select_by_value("dead")
        .await
        .expect("select dead");
    b.client
        .find(Locator::Css("input[name=repository]"))
        .await
        .expect("repository")
        .send_keys("octo/web")
        .await
        .expect("type");
    b.client
        .find(Locator::Css("form.filter button"))
        .await
        .expect("filter")
        .click()
        .await
        .expect("submit");
    wait_until("the filtered list", Duration::from_secs(10), || async {
        b.client
            .current_url()
            .await
            .is_ok_and(|u| u.query().is_some_and(|q| q.contains("status=dead")))
    })
    .await;
    assert!(
        text_of(&b, "p.count")
            .await
            .starts_with("5 deliveries match")
    );
    let rows = b
        .client
        .find_all(Locator::Css("table.list tbody tr"))
        .await
        .expect("rows");
    assert_eq!(rows.len(), 5);
    b.screenshot("list-dead-letters").await;

    // Open one; replay it; see it complete.
    b.client
        .find(Locator::Css("table.list tbody tr td a"))
        .await
        .expect("a delivery")
        .click()
        .await
        .expect("open");
    let replay = b
        .client
        .wait()
        .for_element(Locator::Css("#replay"))
        .await
        .expect("a replay button");
    assert!(
        text_of(&b, "pre.payload")
            .await
            .contains("\"action\": \"labeled\"")
    );
    b.screenshot("delivery").await;
    let url = b.client.current_url().await.expect("url");
    let id = url.path().rsplit('/').next().expect("id").to_owned();
    replay.click().await.expect("replay");
    // The replay commits its compare-and-set, then publishes: wait for the
    // job in the queue too, or the drain may find it empty.
    wait_until(
        "the replay to be published",
        Duration::from_secs(20),
        || async {
            env.count(&format!(
                "select count(*) from deliveries where delivery_id = '{id}' and replays = 1"
            ))
            .await
                == 1
                && env.work_depth().await == 1
        },
    )
    .await;
    settle(&env, &env.store_worker().await).await;
    b.client.goto(url.as_str()).await.expect("back to it");
    reload_until(&b, "section.card .badge", "completed").await;
    assert!(text_of(&b, "ol.timeline").await.contains("replayed"));
    b.screenshot("delivery-replayed").await;

    // Bulk replay of the other four: count, dry run, confirm, progress.
    b.client
        .goto(&format!(
            "{}/bulk?kind=replay&status=dead&repository=octo/web",
            admin.base
        ))
        .await
        .expect("bulk");
    assert!(
        text_of(&b, "#bulk-count")
            .await
            .starts_with("4 deliveries would be replayed")
    );
    let rate = b.client.find(Locator::Css("#rate")).await.expect("rate");
    rate.clear().await.expect("clear");
    rate.send_keys("2").await.expect("type");
    b.client
        .find(Locator::Css("#dry-run"))
        .await
        .expect("dry run")
        .click()
        .await
        .expect("dry run");
    b.client
        .wait()
        .for_element(Locator::Css("#confirm"))
        .await
        .expect("the dry run's page");
    let sample = b
        .client
        .find_all(Locator::Css("table.list tbody tr"))
        .await
        .expect("sample");
    assert_eq!(sample.len(), 4);
    assert_eq!(
        env.count("select count(*) from admin_jobs where kind = 'replay' and total = 4")
            .await,
        0,
        "a dry run changes nothing"
    );
    b.client
        .find(Locator::Css("#confirm"))
        .await
        .expect("confirm")
        .click()
        .await
        .expect("confirm");
    b.client
        .wait()
        .for_element(Locator::Css("#job-progress"))
        .await
        .expect("the job's page");
    wait_until("the job page", Duration::from_secs(10), || async {
        b.client
            .current_url()
            .await
            .is_ok_and(|u| u.path().starts_with("/jobs/"))
    })
    .await;
    assert!(text_of(&b, "#job-progress").await.contains("/ 4 done"));
    reload_until(&b, "#job-progress", "2 / 4 done").await;
    b.screenshot("bulk-job-running").await;
    reload_until(&b, "#job-status", "finished").await;
    assert!(
        text_of(&b, "#job-progress")
            .await
            .starts_with("4 / 4 done: 4 replayed")
    );
    let bar = b
        .client
        .find(Locator::Css("progress#job-bar"))
        .await
        .expect("the progress bar");
    assert_eq!(
        bar.attr("value").await.expect("value").as_deref(),
        Some("4")
    );
    b.screenshot("bulk-job").await;
    settle(&env, &env.store_worker().await).await;
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'completed'")
            .await,
        8
    );
    assert_eq!(env.events().await, 8);
    // The audit page lists both changes.
    b.client
        .goto(&format!("{}/audit", admin.base))
        .await
        .expect("audit");
    let audit = text_of(&b, "table.list").await;
    assert_eq!(audit.matches("olivia").count(), 2, "{audit}");
    b.close().await;
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_viewer_sees_no_replay_button() {
    let env = TestEnv::new().await;
    seed(&env, &[Seed::dead("viewer-1", "push", 60)]).await;
    let admin = env.admin().await;
    let b = Browser::start().await;
    sign_in(&b, &admin.base, VIEWER).await;
    b.client
        .goto(&format!(
            "{}/deliveries/default/viewer-1?hook_id=1",
            admin.base
        ))
        .await
        .expect("delivery");
    assert!(text_of(&b, "main").await.contains("Signed in as a viewer"));
    assert!(
        b.client.find(Locator::Css("#replay")).await.is_err(),
        "a viewer sees a replay button"
    );
    assert!(b.client.find(Locator::Css("#purge")).await.is_err());
    assert!(
        b.client.find(Locator::Css("pre.payload")).await.is_err(),
        "a viewer sees a payload"
    );
    b.client
        .goto(&format!(
            "{}/bulk?kind=replay&status=dead&dry_run=1",
            admin.base
        ))
        .await
        .expect("bulk");
    assert!(
        b.client.find(Locator::Css("#confirm")).await.is_err(),
        "a viewer sees a confirm button"
    );
    b.close().await;
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn an_operator_replays_a_completed_leg_from_its_page_and_its_destination_gets_it_again() {
    use hookinbox_tests::receiver::Receiver;
    let env = TestEnv::new().await;
    let receiver = Receiver::ok().await;
    let config = env.forward_config(&receiver.url, hookinbox_tests::STORE_TOO);
    let ingest = env.ingest_on(&config).await;
    let worker = env.worker_on(&config, Default::default()).await;
    let hook = Hook::fixture("pull_request");
    assert_eq!(ingest.send(&hook).await.status, 202);
    settle(&env, &worker).await;
    assert_eq!(receiver.received().len(), 1);

    let admin = env.admin_with(env.admin_config_on(&config)).await;
    let b = Browser::start().await;
    sign_in(&b, &admin.base, OPERATOR).await;
    let page = format!(
        "{}/deliveries/default/{}?hook_id={}",
        admin.base,
        hook.id(),
        hook.hook_id.as_deref().unwrap_or("")
    );
    b.client.goto(&page).await.expect("the delivery");
    // Both legs completed: each has its own Replay; the payload shown is
    // the body as received.
    let buttons = b
        .client
        .find_all(Locator::Css("button.replay-leg"))
        .await
        .expect("buttons");
    assert_eq!(buttons.len(), 2);
    assert!(text_of(&b, "main").await.contains("The body as received"));
    b.client
        .find(Locator::Css("button.replay-leg[data-destination=app]"))
        .await
        .expect("app's Replay")
        .click()
        .await
        .expect("click");
    // The console's job runs it: one leg, back to processing, published.
    // The item is marked replayed when the leg's move commits, and its
    // message goes after: the job has finished once it went.
    wait_until("the replay's job", Duration::from_secs(20), || async {
        env.count(
            "select count(*) from admin_jobs j join admin_job_items i on i.job_id = j.id \
             where j.status = 'finished' and i.result = 'replayed'",
        )
        .await
            == 1
    })
    .await;
    settle(&env, &worker).await;
    let received = receiver.received();
    assert_eq!(received.len(), 2, "app got it again; store was not asked");
    assert_eq!(
        received[1].header("idempotency-key"),
        received[0].header("idempotency-key")
    );
    assert_eq!(received[1].header("x-hookinbox-replay"), Some("1"));
    assert_eq!(received[1].body, hook.body);
    assert_eq!(
        env.count(
            "select count(*) from admin_audit where action = 'replay_any' and actor = 'olivia'"
        )
        .await,
        1,
        "audited"
    );
    reload_until(&b, "ol.timeline", "replayed").await;
    b.screenshot("replayed-delivery").await;
    b.close().await;
    admin.stop().await;
    env.cleanup().await;
}
