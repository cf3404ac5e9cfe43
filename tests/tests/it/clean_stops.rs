//! A normal stop: SIGTERM to each binary (ingest, the worker, the console)
//! after a little load ends with exit code 0 and only `info` lines. A
//! broker connection still open when the runtime stops makes lapin's I/O
//! loop log `ERROR … A Tokio 1.x context was found, but it is being
//! shutdown`; an operator who alerts on ERROR lines would be paged on every
//! deploy.

use std::time::Duration;

use hookinbox_tests::admin::{OPERATOR, seed_dead_letters};
use hookinbox_tests::{Hook, SECRET, Spawned, TestEnv, wait_until};
use serde_json::{Value, json};

/// Sends SIGTERM, waits for the exit, and returns its code with every line
/// logged after the signal was sent.
async fn terminate(process: &mut Spawned) -> (Option<i32>, Vec<String>) {
    let before = process.logs().len();
    let pid = process.child.id().expect("still running").to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(sent.success());
    let status = tokio::time::timeout(Duration::from_secs(30), process.child.wait())
        .await
        .expect("exits within 30 s of SIGTERM")
        .expect("wait");
    let logs = process.logs();
    let after = logs.get(before..).unwrap_or_default();
    (status.code(), after.lines().map(str::to_owned).collect())
}

/// The lines at WARN or ERROR among `lines` (JSON lines by their level,
/// anything else by its text).
fn warnings_and_errors(lines: &[String]) -> Vec<&String> {
    lines
        .iter()
        .filter(|line| match serde_json::from_str::<Value>(line) {
            Ok(v) => matches!(v["level"].as_str(), Some("WARN" | "ERROR")),
            Err(_) => line.contains("ERROR") || line.contains("WARN"),
        })
        .collect()
}

/// What was wrong with a stop, if anything: its exit code if not 0, and
/// its WARN and ERROR lines, with every line it logged after SIGTERM.
fn unclean(binary: &str, (code, lines): (Option<i32>, Vec<String>)) -> Option<String> {
    let bad = warnings_and_errors(&lines);
    (code != Some(0) || !bad.is_empty()).then(|| {
        format!(
            "{binary}: exit code {code:?}, WARN/ERROR lines after SIGTERM: {bad:#?}\n\
             every line after SIGTERM:\n{}",
            lines.join("\n")
        )
    })
}

/// Nothing left for the worker: every work queue empty and no delivery
/// still processing.
async fn worker_idle(env: &TestEnv) -> bool {
    env.work_depth().await == 0
        && env
            .count("select count(*) from deliveries where status = 'processing'")
            .await
            == 0
}

#[tokio::test]
async fn a_sigterm_stops_each_binary_without_an_error_line() {
    let env = TestEnv::new().await;
    let info = ("RUST_LOG", "info");
    let mut ingest = env.spawn(
        "hookinbox-ingest",
        &[("HOOKINBOX_GITHUB_SECRET", SECRET), info],
    );
    ingest.wait_ready().await;
    let mut worker = env.spawn("hookinbox-worker", &[info]);

    // A few signed deliveries through ingest, each taken by the worker.
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{}", ingest.port);
    for _ in 0..5 {
        let answer = Hook::fixture("push").post(&http, &base).await;
        assert_eq!(answer.status, 202, "{:?}", answer.body);
    }
    wait_until(
        "the worker to complete the deliveries",
        Duration::from_secs(30),
        || async {
            env.count("select count(*) from deliveries where status = 'completed'")
                .await
                == 5
                && worker_idle(&env).await
        },
    )
    .await;

    // The console replays dead letters slowly: it is publishing when
    // SIGTERM arrives.
    seed_dead_letters(&env, 40).await;
    let mut console = env.spawn_admin(&[], &[info]).await;
    let started = http
        .post(format!("{}/api/v1/replays", console.base))
        .bearer_auth(OPERATOR)
        .json(&json!({"filter": {"status": "dead"}, "per_second": 10.0}))
        .send()
        .await
        .expect("the console answers");
    assert_eq!(started.status(), 202);
    wait_until(
        "the console to replay a few",
        Duration::from_secs(30),
        || async {
            env.count("select count(*) from deliveries where replays > 0")
                .await
                >= 3
        },
    )
    .await;
    let mut unclean_stops = Vec::new();
    unclean_stops.extend(unclean(
        "hookinbox-worker admin",
        terminate(&mut console.process).await,
    ));

    wait_until(
        "the worker to complete the replays",
        Duration::from_secs(30),
        || async { worker_idle(&env).await },
    )
    .await;
    unclean_stops.extend(unclean("hookinbox-ingest", terminate(&mut ingest).await));
    unclean_stops.extend(unclean("hookinbox-worker", terminate(&mut worker).await));
    console.stop().await;
    env.cleanup().await;
    assert!(unclean_stops.is_empty(), "{}", unclean_stops.join("\n\n"));
}
