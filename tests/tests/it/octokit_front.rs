//! hookinbox in front of an unmodified `@octokit/webhooks` app (the
//! library under Probot): the app is down while deliveries arrive, then
//! starts, and every delivery reaches its handler once, verified with the
//! app's own secret. The control run sends the same deliveries straight to
//! the app while it is down, as GitHub would: they are lost, since GitHub
//! does not retry. A worker killed (SIGKILL) after the app answered and
//! before the completion committed makes the one duplicate the design
//! allows: the same delivery sent again, with the same `X-GitHub-Delivery`
//! and `Idempotency-Key`, only for the deliveries in flight at the crash.

use std::collections::BTreeSet;
use std::time::Duration;

use hookinbox_tests::octokit::{self, OctokitApp};
use hookinbox_tests::{Hook, SECRET, TestEnv, connect, free_port, settle, sign, wait_until};
use hookinbox_worker::JobOutcome;

/// The app's own secret; hookinbox receives with [`SECRET`].
const APP_SECRET: &str = "the-octokit-apps-own-secret";

/// How many deliveries arrive while the app is down.
const SENT: usize = 20;

/// Deliveries of the events the app handles, each with a body of its own.
fn deliveries() -> Vec<Hook> {
    let events = ["push", "pull_request", "issues"];
    (0..SENT)
        .map(|i| Hook::fixture(events[i % events.len()]))
        .collect()
}

/// Node.js's version with the app's dependencies installed, or `None`
/// (the test is skipped, saying why) when there is no Node.js.
fn node() -> Option<String> {
    match octokit::node_version() {
        Ok(version) => {
            octokit::install();
            Some(version)
        }
        Err(why) => {
            println!(
                "SKIPPED: Node.js is not installed ({why}); .ci/run installs nodejs and npm from \
                 Debian"
            );
            None
        }
    }
}

#[tokio::test]
async fn an_octokit_app_that_was_down_handles_every_delivery_once_and_a_direct_one_loses_them() {
    let Some(node) = node() else { return };
    let env = TestEnv::new().await;
    let port = free_port();
    let hooks = deliveries();

    // Control: GitHub straight to the app, while it is down. GitHub signs
    // with the hook's secret, which is then the app's.
    let mut control_app = OctokitApp::new(&format!("{}-control", env.prefix), port, APP_SECRET);
    let http = reqwest::Client::new();
    let mut control_refused = 0;
    for hook in &hooks {
        let sent = http
            .post(control_app.url())
            .header("content-type", "application/json")
            .header("user-agent", "GitHub-Hookshot/test")
            .header("x-github-event", hook.event.as_deref().unwrap_or(""))
            .header("x-github-delivery", hook.id())
            .header("x-hub-signature-256", sign(APP_SECRET, &hook.body))
            .body(hook.body.clone())
            .send()
            .await;
        if sent.is_err() {
            control_refused += 1;
        }
    }
    control_app.start().await;
    let control = control_app.record();
    control_app.stop().await;
    let control_lost = SENT - control.handled.len();

    // hookinbox in front: ingest receives with its secret, the worker
    // forwards signed the GitHub way with the app's.
    let config = env.config_file(&format!(
        r#"
[[sources]]
name = "default"
secrets = ["{SECRET}"]

[[sources.destinations]]
name = "app"
kind = "forward"
url = "http://127.0.0.1:{port}/api/github/webhooks"
signature = "github"
secret = "{APP_SECRET}"
retry = ["200ms", "500ms", "1s", "2s", "5s", "10s", "30s", "1m"]
breaker = {{ min_requests = 3, window_secs = 60, probe_secs = 1 }}
"#
    ));
    let ingest = env.ingest_on(&config).await;
    let worker = env.worker_on(&config, Default::default()).await;
    let mut app = OctokitApp::new(&env.prefix, port, APP_SECRET);
    for hook in &hooks {
        let answer = ingest.send(hook).await;
        assert_eq!((answer.status, answer.kind()), (202, "accepted"));
    }
    // The app is down: every attempt fails, and the breaker opens.
    let down = worker.drain().await.expect("drain").outcomes;
    // Legs past the installation's round wait in Postgres (fairness), and
    // none is released while the breaker is open: not every leg was tried.
    assert!(!down.is_empty() && down.len() <= SENT, "{down:?}");
    assert!(down.iter().all(|o| *o != JobOutcome::Completed), "{down:?}");
    let state: String = env
        .db
        .query_one(
            "select state from destinations where source = 'default' and name = 'app'",
            &[],
        )
        .await
        .expect("the destination")
        .get(0);
    assert_eq!(state, "open", "the breaker opened while the app was down");
    assert_eq!(app.record().runs(), 0);

    // The app starts: the probe finds it, and every leg follows.
    app.start().await;
    settle(&env, &worker).await;
    app.stop().await;
    let record = app.record();
    let completed = env
        .count("select count(*) from deliveries where status = 'completed'")
        .await;
    let sent_ids: std::collections::BTreeSet<&str> = hooks.iter().map(Hook::id).collect();
    let handled_ids: std::collections::BTreeSet<&str> =
        record.handled.keys().map(String::as_str).collect();

    println!("\nhookinbox in front of an unmodified @octokit/webhooks 13.9.1 app (Node.js {node})");
    println!("| figure | hookinbox in front | control (straight to the app) |");
    println!("|---|---|---|");
    println!("| sent while the app was down | {SENT} | {SENT} |");
    println!("| refused at the time | (accepted 202 by ingest: {SENT}) | {control_refused} |");
    println!(
        "| handled by the app's webhooks.on handlers | {} | {} |",
        record.handled.len(),
        control.handled.len()
    );
    println!(
        "| lost | {} | {control_lost} |",
        SENT - record.handled.len()
    );
    println!(
        "| signature failures (webhooks.onError) | {} | {} |",
        record.signature_failures, control.signature_failures
    );
    println!(
        "| other app errors | {} | {} |",
        record.errors, control.errors
    );
    println!(
        "| duplicates (handler runs past the first) | {} | {} |",
        record.duplicates(),
        control.duplicates()
    );
    println!("| legs completed in hookinbox | {completed} | - |");

    assert_eq!(handled_ids, sent_ids, "every delivery reached its handler");
    assert_eq!(record.duplicates(), 0, "each delivery id handled once");
    assert_eq!(record.signature_failures, 0, "{}", app.logs());
    assert_eq!(record.errors, 0, "{}", app.logs());
    assert_eq!(completed as usize, SENT);
    assert_eq!(control_refused, SENT, "the app was down for the control");
    assert_eq!(control_lost, SENT, "the control run lost the window");
    env.cleanup().await;
}

#[tokio::test]
async fn a_worker_killed_mid_forward_duplicates_only_the_deliveries_in_flight_with_the_same_ids() {
    let Some(node) = node() else { return };
    let env = TestEnv::new().await;
    let port = free_port();
    let hooks = deliveries();
    let config = env.config_file(&format!(
        r#"
[[sources]]
name = "default"
secrets = ["{SECRET}"]

[[sources.destinations]]
name = "app"
kind = "forward"
url = "http://127.0.0.1:{port}/api/github/webhooks"
signature = "github"
secret = "{APP_SECRET}"
retry = ["200ms", "500ms", "1s"]
"#
    ));
    let path = config.to_string_lossy().into_owned();
    let mut app = OctokitApp::new(&env.prefix, port, APP_SECRET);
    app.start().await;
    let ingest = env.ingest_on(&config).await;

    // The crash point: a forward leg's attempt is logged (its row in
    // `destination_attempts`) after the app answered and before the
    // completion. Holding that table makes the worker stop exactly there,
    // with the app's handler run and nothing of it recorded in hookinbox.
    let blocker = connect(&env.database_url).await;
    blocker
        .batch_execute("begin; lock table destination_attempts in share mode")
        .await
        .expect("lock");
    let mut worker = env.spawn(
        "hookinbox-worker",
        &[
            ("HOOKINBOX_CONFIG", &path),
            ("HOOKINBOX_LEASE_SECS", "3"),
            ("HOOKINBOX_CONCURRENCY", "4"),
        ],
    );
    for hook in &hooks {
        let answer = ingest.send(hook).await;
        assert_eq!((answer.status, answer.kind()), (202, "accepted"));
    }
    let db_name = env.db_name.clone();
    wait_until(
        "the worker to hold an answered forward",
        Duration::from_secs(30),
        || {
            let (db, db_name) = (&env.db, db_name.clone());
            async move {
                db.query_one(
                    "select count(*) from pg_stat_activity where datname = $1 \
                     and wait_event_type = 'Lock' and query like '%insert into destination_attempts%'",
                    &[&db_name],
                )
                .await
                .is_ok_and(|r| r.get::<_, i64>(0) > 0)
            }
        },
    )
    .await;
    let before_crash = app.record();
    worker.child.kill().await.expect("kill -9");
    blocker.batch_execute("rollback").await.expect("unlock");
    // In flight at the crash: the legs the killed worker held.
    let in_flight: BTreeSet<String> = env
        .db
        .query(
            "select delivery_id from deliveries where status = 'processing' and attempts > 0",
            &[],
        )
        .await
        .expect("in flight")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let completed_before = env
        .count("select count(*) from deliveries where status = 'completed'")
        .await;
    let left = hooks.len() as u32 - completed_before as u32;
    wait_until(
        "the broker to requeue the killed worker's messages",
        Duration::from_secs(20),
        || async {
            // Past the installation's round, fairness held the rest in
            // Postgres at the claim.
            let held = env
                .count("select count(*) from deliveries where last_error_class = 'fair'")
                .await;
            i64::from(env.work_depth().await) + held == i64::from(left)
        },
    )
    .await;

    // A new worker takes over once the killed one's leases run out.
    let successor = env.worker_on(&config, Default::default()).await;
    settle(&env, &successor).await;
    app.stop().await;
    let record = app.record();
    let completed = env
        .count("select count(*) from deliveries where status = 'completed'")
        .await;
    let sent_ids: BTreeSet<&str> = hooks.iter().map(Hook::id).collect();
    let handled_ids: BTreeSet<&str> = record.handled.keys().map(String::as_str).collect();
    let duplicated = record.duplicated_ids();
    let answered_in_flight: BTreeSet<String> = before_crash
        .handled
        .keys()
        .filter(|id| in_flight.contains(*id))
        .cloned()
        .collect();

    println!(
        "\nhookinbox in front of an unmodified @octokit/webhooks 13.9.1 app (Node.js {node}), \
         its worker killed (SIGKILL) between the app's answer and the completion"
    );
    println!("| figure | value |");
    println!("|---|---|");
    println!("| sent | {} |", hooks.len());
    println!(
        "| handled by the app's webhooks.on handlers | {} |",
        record.handled.len()
    );
    println!(
        "| signature failures (webhooks.onError) | {} |",
        record.signature_failures
    );
    println!("| other app errors | {} |", record.errors);
    println!(
        "| in flight at the crash (taken by the killed worker) | {} |",
        in_flight.len()
    );
    println!(
        "| of them answered by the app before the crash | {} |",
        answered_in_flight.len()
    );
    println!(
        "| duplicates (handler runs past the first) | {} over {} delivery id(s) |",
        record.duplicates(),
        duplicated.len()
    );
    println!("| legs completed in hookinbox | {completed} |");

    assert_eq!(handled_ids, sent_ids, "every delivery reached its handler");
    assert_eq!(record.signature_failures, 0, "{}", app.logs());
    assert_eq!(record.errors, 0, "{}", app.logs());
    assert_eq!(completed as usize, hooks.len());
    assert!(
        !answered_in_flight.is_empty(),
        "the crash caught a forward the app had answered"
    );
    assert!(
        duplicated.is_subset(&in_flight),
        "duplicates only for the deliveries in flight at the crash: {duplicated:?} of {in_flight:?}"
    );
    assert!(
        answered_in_flight.is_subset(&duplicated),
        "what the app answered and hookinbox never recorded is sent again: \
         {answered_in_flight:?}, duplicated {duplicated:?}"
    );
    for id in &duplicated {
        let keys = &record.received[id];
        assert_eq!(
            keys.len(),
            record.handled[id],
            "{id}: each run came from a request carrying X-GitHub-Delivery {id}"
        );
        let expected = format!("github:default:123456:{id}:app");
        assert!(
            keys.iter().all(|k| *k == expected),
            "{id}: every copy carries the same Idempotency-Key: {keys:?}"
        );
    }
    ingest.stop().await;
    env.cleanup().await;
}
