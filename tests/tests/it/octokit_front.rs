//! hookinbox in front of an unmodified `@octokit/webhooks` app (the
//! library under Probot): the app is down while deliveries arrive, then
//! starts, and every delivery reaches its handler once, verified with the
//! app's own secret. The control run sends the same deliveries straight to
//! the app while it is down, as GitHub would: they are lost, since GitHub
//! does not retry.

use hookinbox_tests::octokit::{self, OctokitApp};
use hookinbox_tests::{Hook, SECRET, TestEnv, free_port, settle, sign};
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

#[tokio::test]
async fn an_octokit_app_that_was_down_handles_every_delivery_once_and_a_direct_one_loses_them() {
    let node = match octokit::node_version() {
        Ok(version) => version,
        Err(why) => {
            println!(
                "SKIPPED: Node.js is not installed ({why}); .ci/run installs nodejs and npm from \
                 Debian"
            );
            return;
        }
    };
    octokit::install();
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
    assert_eq!(down.len(), SENT);
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
