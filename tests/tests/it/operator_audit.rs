//! The CLI is audited like the console: a replay from either face is the
//! same kind of job, writes the same audit rows and the same lineage, and
//! shows on the other face; a foreground CLI job stops on Ctrl-C by
//! cancelling its job, and `jobs cancel` cancels the console's.

use std::process::Stdio;
use std::time::Duration;

use hookinbox_tests::admin::{OPERATOR, Seed, VIEWER, seed, seed_dead_letters};
use hookinbox_tests::{TestEnv, wait_until, worker_cli, worker_command};
use serde_json::{Value, json};

/// Every audit row: actor, role, action, target, count, result, oldest
/// first.
async fn audit_rows(env: &TestEnv) -> Vec<(String, String, String, Value, i64, String)> {
    env.db
        .query(
            "select actor, role, action, target, count, result from admin_audit order by id",
            &[],
        )
        .await
        .expect("audit rows")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect()
}

/// The lineage of a delivery: each job's kind and actor, the item's result
/// and error.
async fn lineage(env: &TestEnv, id: &str) -> Vec<(String, String, Option<String>, Option<String>)> {
    env.db
        .query(
            "select j.kind, j.actor, i.result, i.error
             from admin_job_items i join admin_jobs j on j.id = i.job_id
             where i.delivery_id = $1 order by i.job_id",
            &[&id],
        )
        .await
        .expect("lineage")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

async fn job_status(env: &TestEnv, job: i64) -> String {
    env.db
        .query_one("select status from admin_jobs where id = $1", &[&job])
        .await
        .expect("job")
        .get(0)
}

#[tokio::test]
async fn the_same_replay_through_the_cli_and_the_console_writes_the_same_audit_rows() {
    let env = TestEnv::new().await;
    seed(
        &env,
        &[
            Seed::dead("via-cli", "push", 60),
            Seed::dead("via-console", "push", 60),
        ],
    )
    .await;
    let admin = env.admin().await;

    // The CLI, as the console's operator token is named.
    let (code, out) = worker_cli(&env, &["dlq", "replay", "via-cli", "--as", "olivia"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("replayed 1, skipped 0"), "{out}");

    // The console, with that token.
    let r = admin
        .post(
            "/api/v1/replays",
            Some(OPERATOR),
            &json!({"ids": ["via-console"]}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    let job = r.body["job"].as_i64().expect("job");
    // Its audit row says what came of it once the job has ended.
    let ended = format!(
        "select count(*) from admin_audit where job_id = {job} and result like 'finished%'"
    );
    wait_until(
        "the console's job to end",
        Duration::from_secs(20),
        || async { env.count(&ended).await == 1 },
    )
    .await;

    let rows = audit_rows(&env).await;
    for row in &rows {
        println!("audit row: {row:?}");
    }
    assert_eq!(rows.len(), 2, "{rows:?}");
    // The same row but for the delivery each named.
    let named = |target: &Value| target["ids"][0].as_str().unwrap_or_default().to_owned();
    let without_ids = |(actor, role, action, target, count, result): &(
        String,
        String,
        String,
        Value,
        i64,
        String,
    )| {
        let shape = target
            .as_object()
            .map(|o| o.keys().cloned().collect::<Vec<_>>());
        (
            actor.clone(),
            role.clone(),
            action.clone(),
            shape,
            *count,
            result.clone(),
        )
    };
    assert_eq!(named(&rows[0].3), "via-cli");
    assert_eq!(named(&rows[1].3), "via-console");
    assert_eq!(without_ids(&rows[0]), without_ids(&rows[1]));
    assert_eq!(
        without_ids(&rows[0]),
        (
            "olivia".to_owned(),
            "operator".to_owned(),
            "replay".to_owned(),
            Some(vec!["ids".to_owned()]),
            1,
            "finished: 1 replayed, 0 purged, 0 skipped, 0 failed, 0 not done".to_owned()
        )
    );
    let (cli, console) = (
        lineage(&env, "via-cli").await,
        lineage(&env, "via-console").await,
    );
    println!("lineage via the CLI: {cli:?}\nlineage via the console: {console:?}");
    assert_eq!(cli, console);
    assert_eq!(
        cli,
        vec![(
            "replay".to_owned(),
            "olivia".to_owned(),
            Some("replayed".to_owned()),
            None
        )]
    );

    // Each face shows the other's job, by the same JSON.
    let listed = admin.get("/api/v1/jobs", Some(VIEWER)).await;
    let (code, out) = worker_cli(&env, &["jobs", "list", "--json"]);
    assert_eq!(code, 0, "{out}");
    let from_cli: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(from_cli, listed.body["items"], "{out}");
    assert_eq!(from_cli.as_array().map(Vec::len), Some(2));

    // A purge from the CLI is a job too, audited, with the OS user when no
    // --as is given.
    seed(&env, &[Seed::dead("old-dead", "push", 3600)]).await;
    let (code, out) = worker_cli(&env, &["dlq", "purge", "--older-than", "30m"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "purged 1 dead letter(s)\n");
    let rows = audit_rows(&env).await;
    let purge = rows.last().expect("a purge row");
    let os_user = String::from_utf8(
        std::process::Command::new("whoami")
            .output()
            .expect("whoami")
            .stdout,
    )
    .expect("a name");
    assert_eq!(
        (purge.0.as_str(), purge.2.as_str(), purge.4),
        (os_user.trim(), "purge", 1),
        "{purge:?}"
    );
    assert_eq!(
        purge.3,
        json!({"filter": {"status": "dead", "older_than": "30m"}})
    );
    assert_eq!(
        lineage(&env, "old-dead").await,
        vec![(
            "purge".to_owned(),
            os_user.trim().to_owned(),
            Some("purged".to_owned()),
            None
        )]
    );
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn ctrl_c_on_a_foreground_cli_replay_cancels_its_job_which_the_console_shows() {
    let env = TestEnv::new().await;
    seed_dead_letters(&env, 30).await;
    let admin = env.admin().await;
    let child = worker_command(
        &env,
        &["dlq", "replay", "--all", "--rate", "2", "--as", "carol"],
        &[],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("runs");
    wait_until(
        "the CLI's job to replay an item",
        Duration::from_secs(20),
        || async {
            env.count("select count(*) from admin_job_items where result = 'replayed'")
                .await
                > 0
        },
    )
    .await;
    // The console shows it, running, by its actor.
    let jobs = admin.get("/api/v1/jobs", Some(VIEWER)).await;
    let job = &jobs.body["items"][0];
    assert_eq!(
        (
            job["actor"].clone(),
            job["status"].clone(),
            job["total"].clone()
        ),
        (json!("carol"), json!("running"), json!(30)),
        "{}",
        jobs.text
    );
    let id = job["id"].as_i64().expect("id");

    let interrupted = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(interrupted.success());
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("joined")
        .expect("exits");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!("stdout: {stdout}stderr: {stderr}");
    assert!(
        stderr.contains(&format!(
            "interrupted: cancelled job {id} (replay by carol)"
        )),
        "{stderr}"
    );
    assert_eq!(job_status(&env, id).await, "cancelled");
    let done = env
        .count(&format!(
            "select count(*) from admin_job_items where job_id = {id} and result is not null"
        ))
        .await;
    assert!((1..30).contains(&done), "{done} items done");
    assert!(
        stdout.starts_with(&format!("replayed {done}, ")),
        "{stdout}"
    );
    let rows = audit_rows(&env).await;
    assert!(
        rows.iter()
            .any(|r| r.0 == "carol" && r.2 == "cancel" && r.3 == json!({"job": id})),
        "{rows:?}"
    );
    // Nothing goes on after it: no item starts once it is cancelled.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        env.count(&format!(
            "select count(*) from admin_job_items where job_id = {id} and result is not null"
        ))
        .await,
        done
    );
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn jobs_cancel_stops_a_console_job_and_says_when_it_had_ended() {
    let env = TestEnv::new().await;
    seed_dead_letters(&env, 30).await;
    let admin = env.admin().await;
    let r = admin
        .post(
            "/api/v1/replays",
            Some(OPERATOR),
            &json!({"filter": {"status": "dead"}, "per_second": 1}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text);
    let job = r.body["job"].as_i64().expect("job");
    let (code, out) = worker_cli(&env, &["jobs", "list"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("{job:>6} replay  running   olivia")),
        "{out}"
    );
    let (code, out) = worker_cli(&env, &["jobs", "cancel", &job.to_string(), "--as", "dave"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with(&format!("cancelled job {job}; ")), "{out}");
    assert_eq!(job_status(&env, job).await, "cancelled");
    let shown = admin
        .get(&format!("/api/v1/replays/{job}"), Some(VIEWER))
        .await;
    assert_eq!(shown.body["cancelled_by"], "dave", "{}", shown.text);
    let (code, out) = worker_cli(&env, &["jobs", "cancel", &job.to_string(), "--as", "dave"]);
    assert_eq!(
        (code, out),
        (1, format!("job {job} is cancelled already\n"))
    );
    let (code, _) = worker_cli(&env, &["jobs", "cancel", "999999"]);
    assert_eq!(code, 2, "an unknown job is a usage error");
    admin.stop().await;
    env.cleanup().await;
}
