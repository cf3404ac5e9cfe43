//! The reconciler against a local fake of GitHub's delivery API
//! (`hookinbox_tests::github`): every delivery GitHub sent and hookinbox
//! never durably took is brought back, once, with no human in the loop.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use chrono::Utc;
use hookinbox_tests::github::{self, FakeGithub, Fault, HookPath};
use hookinbox_tests::{
    Hook, SECRET, TestEnv, TestIngest, counter, fixtures, free_port, settle, worker_command,
};
use serde_json::Value;

const TOKEN: &str = "ghp_reconciler_test_token";
/// The hook id `Hook::new` sends, and the fake's repository hook.
const HOOK_ID: u64 = 123456;

/// A test's fake GitHub, with one hook pointed at `target`.
struct Github {
    fake: FakeGithub,
    hook: usize,
    token_file: PathBuf,
    /// `HOOKINBOX_RECONCILE_HOOK` naming that hook.
    spec: String,
}

impl Github {
    /// With the repository hook `repo:acme/widgets/HOOK_ID`.
    fn start(env: &TestEnv, target: String) -> Self {
        let path = HookPath::Repo {
            owner: "acme".into(),
            repo: "widgets".into(),
            id: HOOK_ID,
        };
        Self::start_at(env, target, path, format!("repo:acme/widgets/{HOOK_ID}"))
    }

    /// With the hook at `path`, which `spec` names.
    fn start_at(env: &TestEnv, target: String, path: HookPath, spec: String) -> Self {
        let fake = FakeGithub::start(TOKEN);
        let hook = fake.add_hook(github::Hook {
            path,
            hook_id: HOOK_ID.to_string(),
            target,
            secret: SECRET.to_owned(),
        });
        let token_file = std::env::temp_dir().join(format!("{}-github-token", env.prefix));
        std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token file");
        Self {
            fake,
            hook,
            token_file,
            spec,
        }
    }

    /// Logs a fresh push as GitHub would after sending it at `at` (status
    /// `status_code`, 0 for no answer, and its `status` text), without
    /// sending anything; `visible`: shown in the log yet. Returns its GUID.
    fn log(
        &self,
        at: chrono::DateTime<Utc>,
        status_code: u16,
        status: &str,
        visible: bool,
    ) -> String {
        let guid = uuid::Uuid::new_v4().to_string();
        self.fake.record(
            self.hook,
            &guid,
            "push",
            &fixtures::unique(&fixtures::own("push")),
            status_code,
            status,
            false,
            at,
            visible,
        );
        guid
    }

    /// The variables that point the default source's reconciler at the fake.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("HOOKINBOX_RECONCILE_HOOK", self.spec.clone()),
            ("HOOKINBOX_GITHUB_API_URL", self.fake.base.clone()),
            (
                "HOOKINBOX_GITHUB_TOKEN_FILE",
                self.token_file.to_string_lossy().into_owned(),
            ),
            ("HOOKINBOX_RECONCILE_MIN_AGE_SECS", "0".into()),
            ("HOOKINBOX_RECONCILE_PER_SECOND", "200".into()),
        ]
    }

    /// Runs `hookinbox-worker reconcile --json` with `args`; returns the
    /// exit code, the one report (source `default`) and standard error.
    async fn reconcile(
        &self,
        env: &TestEnv,
        args: &[&str],
        extra: &[(&str, &str)],
    ) -> (i32, Value, String) {
        let vars = self.env();
        let mut all: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        all.extend_from_slice(extra);
        let mut argv = vec!["reconcile", "--json"];
        argv.extend_from_slice(args);
        let out = tokio::process::Command::from(worker_command(env, &argv, &all))
            .output()
            .await
            .expect("runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let report = stdout
            .lines()
            .next()
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or(Value::Null);
        (
            out.status.code().unwrap_or(-1),
            report,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// A `hookinbox-worker` subcommand with `extra` variables, without
/// blocking the test's runtime (the fake GitHub serves from it).
async fn run(env: &TestEnv, args: &[&str], extra: &[(&str, &str)]) -> std::process::Output {
    tokio::process::Command::from(worker_command(env, args, extra))
        .output()
        .await
        .expect("runs")
}

/// [`run`]'s exit code and standard output.
async fn cli(env: &TestEnv, args: &[&str]) -> (i32, String) {
    let out = run(env, args, &[]).await;
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The one JSON report of a `reconcile --json` that succeeded.
fn report_of(out: &std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON report")
}

fn count(report: &Value, key: &str) -> u64 {
    report[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not an integer in {report}"))
}

/// Effects per GUID in `github_events`.
async fn effects(env: &TestEnv) -> BTreeMap<String, i64> {
    env.db
        .query(
            "select delivery_id, count(*) from github_events group by delivery_id",
            &[],
        )
        .await
        .expect("effects")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// GitHub sends `n` pushes while ingest is down (each logged failed), then
/// ingest starts: the test's environment, GitHub, the GUIDs and ingest.
async fn sent_while_down(n: usize) -> (TestEnv, Github, Vec<String>, TestIngest) {
    let repo = HookPath::Repo {
        owner: "acme".into(),
        repo: "widgets".into(),
        id: HOOK_ID,
    };
    sent_while_down_at(n, repo, format!("repo:acme/widgets/{HOOK_ID}")).await
}

/// [`sent_while_down`] through the hook at `path`, which `spec` names.
async fn sent_while_down_at(
    n: usize,
    path: HookPath,
    spec: String,
) -> (TestEnv, Github, Vec<String>, TestIngest) {
    let env = TestEnv::new().await;
    let port = free_port();
    let target = format!("http://127.0.0.1:{port}/webhooks/github");
    let gh = Github::start_at(&env, target, path, spec);
    let body = fixtures::own("push");
    let mut guids = Vec::new();
    for _ in 0..n {
        let (guid, status) = gh
            .fake
            .deliver(gh.hook, "push", &fixtures::unique(&body))
            .await;
        assert_eq!(status, 0, "nobody answered");
        guids.push(guid);
    }
    let ingest = ingest_on(&env, port).await;
    (env, gh, guids, ingest)
}

/// Ingest on a port chosen before it starts, so that GitHub can be sending
/// to it while it is down.
async fn ingest_on(env: &TestEnv, port: u16) -> TestIngest {
    let mut args = env.ingest_args();
    args.listen = format!("127.0.0.1:{port}").parse().expect("address");
    env.ingest_with(args.validate().expect("valid")).await
}

#[tokio::test]
async fn deliveries_sent_while_ingest_was_down_are_redelivered_once_each_and_complete_once() {
    // Ingest is down: GitHub logs every attempt as failed, and forgets it.
    let (env, gh, failed, ingest) = sent_while_down(200).await;
    let body = fixtures::own("push");
    let mut answered = Vec::new();
    for _ in 0..5 {
        let (guid, status) = gh
            .fake
            .deliver(gh.hook, "push", &fixtures::unique(&body))
            .await;
        assert_eq!(status, 202);
        answered.push(guid);
    }

    let (code, report, stderr) = gh.reconcile(&env, &[], &[]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(count(&report, "scanned"), 205);
    assert_eq!(count(&report, "redelivered"), 200, "{report}");
    assert_eq!(count(&report, "late") + count(&report, "unexplained"), 0);

    let worker = env.store_worker().await;
    settle(&env, &worker).await;
    let effects = effects(&env).await;
    for guid in &failed {
        assert_eq!(gh.fake.resent(guid), 1, "{guid} redelivered once");
        assert_eq!(effects.get(guid), Some(&1), "{guid} has one effect");
    }
    for guid in &answered {
        assert_eq!(gh.fake.resent(guid), 0, "{guid} needed nothing");
        assert_eq!(effects.get(guid), Some(&1));
    }
    assert_eq!(
        effects.len(),
        205,
        "no effect for anything GitHub did not send"
    );
    assert!(
        gh.fake.guids().values().all(|ok| *ok),
        "every GUID got a 2xx in the end"
    );

    // A second pass has nothing left to do.
    let (code, report, _) = gh.reconcile(&env, &[], &[]).await;
    assert_eq!((code, count(&report, "redelivered")), (0, 0));
    assert_eq!(gh.fake.redeliveries_total(), 200);
    drop(ingest);
    env.cleanup().await;
}

#[tokio::test]
async fn a_claim_whose_ingest_died_before_publishing_is_listed_then_redelivered_and_completed_once()
{
    let (env, ingest) = TestEnv::with_ingest().await;
    let gh = Github::start(&env, format!("{}/webhooks/github", ingest.base));
    // GitHub sent it; ingest claimed it and died before the publish and
    // the answer: GitHub logged no answer, and nothing carries the claim.
    let hook = Hook::fixture("push");
    env.claim_unpublished(&hook).await;
    gh.fake.record(
        gh.hook,
        hook.id(),
        "push",
        &hook.body,
        0,
        "timed out",
        false,
        Utc::now() - chrono::Duration::minutes(10),
        true,
    );
    // Operators see it, with what will bring it back.
    let (code, listed) = cli(
        &env,
        &["deliveries", "list", "--status", "awaiting_redelivery"],
    )
    .await;
    assert_eq!(code, 0, "{listed}");
    assert!(listed.contains(hook.id()), "{listed}");
    assert!(
        listed.contains("awaiting redelivery from GitHub"),
        "{listed}"
    );

    let (code, report, stderr) = gh.reconcile(&env, &[], &[]).await;
    assert_eq!(
        (code, count(&report, "redelivered")),
        (0, 1),
        "{stderr} {report}"
    );
    let worker = env.store_worker().await;
    settle(&env, &worker).await;
    assert_eq!(effects(&env).await.get(hook.id()), Some(&1));
    assert_eq!(gh.fake.resent(hook.id()), 1);
    let (code, _) = cli(
        &env,
        &["deliveries", "list", "--status", "awaiting_redelivery"],
    )
    .await;
    assert_eq!(code, 1, "nothing awaits a redelivery any more");
    env.cleanup().await;
}

#[tokio::test]
async fn deliveries_completed_here_but_failed_at_github_are_counted_late_and_not_redelivered() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let gh = Github::start(&env, format!("{}/webhooks/github", ingest.base));
    let worker = env.store_worker().await;
    let body = fixtures::own("push");
    let mut late = Vec::new();
    for _ in 0..4 {
        let (guid, status) = gh
            .fake
            .deliver(gh.hook, "push", &fixtures::unique(&body))
            .await;
        assert_eq!(status, 202);
        // Ingest answered after GitHub's 10 seconds: GitHub logs a failure.
        gh.fake.mark_timed_out(&guid);
        late.push(guid);
    }
    settle(&env, &worker).await;
    let (code, report, stderr) = gh.reconcile(&env, &[], &[]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(count(&report, "late"), 4, "{report}");
    assert_eq!(count(&report, "redelivered"), 0);
    for guid in &late {
        assert_eq!(gh.fake.redeliveries_asked(guid), 0);
    }
    assert!(effects(&env).await.values().all(|n| *n == 1));

    // The admin console's overview shows the pass, in the API and the page.
    let admin = env.admin().await;
    let overview = admin
        .get("/api/v1/overview", Some(hookinbox_tests::admin::VIEWER))
        .await;
    assert_eq!(overview.status, 200);
    let state = &overview.body["reconciler"][0];
    assert_eq!(state["source"], "default");
    assert_eq!(state["last_counts"]["late"], 4, "{state}");
    assert_eq!(state["last_counts"]["redelivered"], 0, "{state}");
    assert!(state["last_pass_at"].is_string() && state["last_error"].is_null());
    let cookie = admin.sign_in(hookinbox_tests::admin::VIEWER).await;
    let (status, page) = admin.page("/", &cookie).await;
    assert_eq!(status, 200);
    assert!(page.contains("<h2>Reconciler</h2>"), "{page}");
    assert!(
        page.contains(state["hook"].as_str().expect("hook")),
        "{page}"
    );
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_delivery_that_fails_every_time_is_redelivered_at_most_the_cap_across_passes() {
    let (env, ingest) = TestEnv::with_ingest().await;
    // A hook pointed at a source ingest does not serve: every attempt 404.
    let gh = Github::start(&env, format!("{}/webhooks/github/nowhere", ingest.base));
    let (guid, status) = gh
        .fake
        .deliver(gh.hook, "push", &fixtures::unique(&fixtures::own("push")))
        .await;
    assert_eq!(status, 404);
    let mut capped = 0;
    for _ in 0..6 {
        let (code, report, stderr) = gh
            .reconcile(&env, &[], &[("HOOKINBOX_RECONCILE_MAX_REDELIVERIES", "3")])
            .await;
        assert_eq!(code, 0, "{stderr}");
        capped = count(&report, "capped");
    }
    assert_eq!(
        gh.fake.redeliveries_asked(&guid),
        3,
        "at most three, across six passes"
    );
    assert_eq!(capped, 1, "the last passes report it capped");
    let asked: i32 = env
        .db
        .query_one(
            "select asked from reconcile_redeliveries where guid = $1",
            &[&guid],
        )
        .await
        .expect("counted in Postgres")
        .get(0);
    assert_eq!(asked, 3);
    env.cleanup().await;
}

#[tokio::test]
async fn a_long_log_is_walked_to_the_watermark_nothing_is_missed_and_nothing_redelivered_twice() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let gh = Github::start(&env, format!("{}/webhooks/github", ingest.base));
    // 520 failed deliveries over the last two hours: six pages of 100.
    let mut guids = Vec::new();
    for i in 0..520 {
        let at = Utc::now() - chrono::Duration::seconds(7200 - i * 13);
        guids.push(gh.log(at, 0, "failed to connect to host", true));
    }
    // The first pass is killed after asking for 200 redeliveries.
    gh.fake.hang_after(200);
    let vars = gh.env();
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut first = tokio::process::Command::from(worker_command(&env, &["reconcile"], &vars))
        .kill_on_drop(true)
        .spawn()
        .expect("starts");
    hookinbox_tests::wait_until(
        "201 redelivery requests",
        Duration::from_secs(60),
        || async { gh.fake.redeliveries_total() > 200 },
    )
    .await;
    first.kill().await.expect("kill");
    gh.fake.unhang();

    // The next pass finishes the job: every GUID sent again exactly once.
    let (code, report, stderr) = gh.reconcile(&env, &[], &[]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(count(&report, "pages") >= 6, "{report}");
    assert_eq!(count(&report, "scanned"), 520);
    for guid in &guids {
        assert_eq!(gh.fake.resent(guid), 1, "{guid}");
    }

    // A delivery that shows up in the log late, dated inside the overlap
    // behind the watermark, is still found; the walk stops near the
    // watermark instead of reading the whole log again.
    let late = gh.log(
        Utc::now() - chrono::Duration::minutes(5),
        0,
        "failed to connect to host",
        false,
    );
    let (code, report, _) = gh.reconcile(&env, &[], &[]).await;
    assert_eq!(
        (code, count(&report, "redelivered")),
        (0, 0),
        "not in the log yet"
    );
    gh.fake.reveal();
    let (code, report, _) = gh.reconcile(&env, &[], &[]).await;
    assert_eq!((code, count(&report, "redelivered")), (0, 1), "{report}");
    assert_eq!(gh.fake.resent(&late), 1);
    // The log now holds 1,041 attempts (11 pages); the walk reads only
    // those logged within the overlap behind the watermark.
    let whole_log = (gh.fake.log().len() as u64).div_ceil(100);
    assert!(
        count(&report, "pages") < whole_log,
        "walked back to the watermark only: {report}, {whole_log} pages in all"
    );

    let worker = env.store_worker().await;
    settle(&env, &worker).await;
    let effects = effects(&env).await;
    assert_eq!(effects.len(), 521);
    assert!(effects.values().all(|n| *n == 1), "one effect each");
    env.cleanup().await;
}

#[tokio::test]
async fn rate_limits_are_waited_out_and_a_422_is_recorded() {
    let env = TestEnv::new().await;
    let port = free_port();
    let gh = Github::start(&env, format!("http://127.0.0.1:{port}/webhooks/github"));
    let body = fixtures::own("push");
    let (refused, _) = gh
        .fake
        .deliver(gh.hook, "push", &fixtures::unique(&body))
        .await;
    let (other, _) = gh
        .fake
        .deliver(gh.hook, "push", &fixtures::unique(&body))
        .await;
    let _ingest = ingest_on(&env, port).await;
    gh.fake.refuse(&refused);
    gh.fake
        .push_fault(Fault::RateLimited403 { reset_in_secs: 1 });
    gh.fake.push_fault(Fault::TooMany429 {
        retry_after_secs: 1,
    });
    let started = std::time::Instant::now();
    let (code, report, stderr) = gh.reconcile(&env, &[], &[]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "both limits waited out"
    );
    assert_eq!(count(&report, "refused"), 1, "{report}");
    assert_eq!(
        gh.fake.redeliveries_asked(&refused),
        1,
        "not retried in the pass"
    );
    let result: String = env
        .db
        .query_one(
            "select last_result from reconcile_redeliveries where guid = $1",
            &[&refused],
        )
        .await
        .expect("recorded")
        .get(0);
    assert_eq!(result, "refused");
    assert_eq!(gh.fake.resent(&other), 1, "the pass went on past the 422");

    // A limit longer than --max-wait ends the pass with a clear error.
    gh.fake
        .push_fault(Fault::RateLimited403 { reset_in_secs: 600 });
    let (code, _, stderr) = gh.reconcile(&env, &["--max-wait", "1s"], &[]).await;
    assert_eq!(code, 2);
    assert!(stderr.contains("rate limit"), "{stderr}");
    env.cleanup().await;
}

#[tokio::test]
async fn two_reconcilers_at_once_take_turns_and_redeliver_nothing_twice() {
    let (env, gh, guids, _ingest) = sent_while_down(40).await;
    let vars = gh.env();
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let spawn = || {
        tokio::process::Command::from(worker_command(
            &env,
            &["reconcile", "--json"],
            &[&vars[..], &[("HOOKINBOX_RECONCILE_PER_SECOND", "20")]].concat(),
        ))
        .kill_on_drop(true)
        .output()
    };
    let (a, b) = tokio::join!(spawn(), spawn());
    let (a, b) = (a.expect("a"), b.expect("b"));
    assert!(a.status.success() && b.status.success());
    let redelivered: u64 = [a, b]
        .iter()
        .map(|o| {
            let r: Value = serde_json::from_slice(&o.stdout).expect("json");
            count(&r, "redelivered")
        })
        .sum();
    assert_eq!(
        redelivered, 40,
        "one pass redelivered them, the other found them answered"
    );
    for guid in &guids {
        assert_eq!(gh.fake.redeliveries_asked(guid), 1);
    }
    env.cleanup().await;
}

#[tokio::test]
async fn a_dry_run_lists_what_it_would_redeliver_and_changes_nothing() {
    let env = TestEnv::new().await;
    let gh = Github::start(
        &env,
        format!("http://127.0.0.1:{}/webhooks/github", free_port()),
    );
    let (guid, _) = gh
        .fake
        .deliver(gh.hook, "push", &fixtures::unique(&fixtures::own("push")))
        .await;
    let (code, report, stderr) = gh.reconcile(&env, &["--dry-run"], &[]).await;
    assert_eq!(code, 0, "{stderr}");
    for key in [
        "scanned",
        "redelivered",
        "late",
        "unexplained",
        "capped",
        "skipped",
    ] {
        count(&report, key);
    }
    assert_eq!(report["would_redeliver"], serde_json::json!([guid]));
    assert_eq!(report["dry_run"], true);
    assert_eq!(count(&report, "redelivered"), 0);
    assert_eq!(gh.fake.redeliveries_total(), 0);
    assert_eq!(env.count("select count(*) from reconcile_state").await, 0);
    assert_eq!(
        env.count("select count(*) from reconcile_redeliveries")
            .await,
        0
    );
    env.cleanup().await;
}

#[tokio::test]
async fn an_app_hook_is_read_with_the_apps_jwt_and_its_hook_id_learned() {
    let env = TestEnv::new().await;
    let port = free_port();
    let (private, public) = github::app_keys();
    let fake = FakeGithub::start(TOKEN).with_app("4242", &public, 77);
    let hook = fake.add_hook(github::Hook {
        path: HookPath::App,
        hook_id: "31337".into(),
        target: format!("http://127.0.0.1:{port}/webhooks/github"),
        secret: SECRET.into(),
    });
    let (guid, status) = fake
        .deliver(hook, "push", &fixtures::unique(&fixtures::own("push")))
        .await;
    assert_eq!(status, 0);
    let key_file = std::env::temp_dir().join(format!("{}-app.pem", env.prefix));
    std::fs::write(&key_file, &private).expect("key file");
    let key_path = key_file.to_string_lossy().into_owned();
    let vars = [
        ("HOOKINBOX_RECONCILE_HOOK", "app"),
        ("HOOKINBOX_GITHUB_API_URL", fake.base.as_str()),
        ("HOOKINBOX_GITHUB_APP_ID", "4242"),
        ("HOOKINBOX_GITHUB_APP_KEY_FILE", key_path.as_str()),
        ("HOOKINBOX_RECONCILE_MIN_AGE_SECS", "0"),
    ];
    let _ingest = ingest_on(&env, port).await;
    let report = report_of(&run(&env, &["reconcile", "--json"], &vars).await);
    assert_eq!(count(&report, "redelivered"), 1, "{report}");
    assert_eq!(fake.resent(&guid), 1);
    let hook_id: String = env
        .db
        .query_one("select hook_id from reconcile_state", &[])
        .await
        .expect("state")
        .get(0);
    assert_eq!(hook_id, "31337", "learned from the delivery's request");
    env.cleanup().await;
}

#[test]
fn bad_reconciler_settings_refuse_to_start_naming_the_field() {
    let dir = std::env::temp_dir().join(format!(
        "hookinbox-reconcile-settings-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "not a key").expect("write");
    let garbage = garbage.to_string_lossy().into_owned();
    let token = dir.join("token");
    std::fs::write(&token, "t0ken\n").expect("write");
    let token = token.to_string_lossy().into_owned();
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (
            vec![
                ("HOOKINBOX_RECONCILE_HOOK", "user:acme/1"),
                ("HOOKINBOX_GITHUB_TOKEN_FILE", &token),
            ],
            "HOOKINBOX_RECONCILE_HOOK",
        ),
        (
            vec![("HOOKINBOX_RECONCILE_HOOK", "repo:acme/widgets/1")],
            "HOOKINBOX_GITHUB_TOKEN_FILE",
        ),
        (
            vec![
                ("HOOKINBOX_RECONCILE_HOOK", "app"),
                ("HOOKINBOX_GITHUB_APP_ID", "1"),
                ("HOOKINBOX_GITHUB_APP_KEY_FILE", "/nonexistent/app.pem"),
            ],
            "HOOKINBOX_GITHUB_APP_KEY_FILE",
        ),
        (
            vec![
                ("HOOKINBOX_RECONCILE_HOOK", "app"),
                ("HOOKINBOX_GITHUB_APP_ID", "1"),
                ("HOOKINBOX_GITHUB_APP_KEY_FILE", &garbage),
            ],
            "HOOKINBOX_GITHUB_APP_KEY_FILE: is not an RSA private key",
        ),
        (
            vec![
                ("HOOKINBOX_RECONCILE_HOOK", "app"),
                ("HOOKINBOX_GITHUB_TOKEN_FILE", &token),
            ],
            "HOOKINBOX_RECONCILE_HOOK",
        ),
        (
            vec![("HOOKINBOX_GITHUB_TOKEN_FILE", &token)],
            "HOOKINBOX_RECONCILE_HOOK: is required",
        ),
        (
            vec![
                ("HOOKINBOX_RECONCILE_HOOK", "repo:acme/widgets/1"),
                ("HOOKINBOX_GITHUB_TOKEN_FILE", &token),
                ("HOOKINBOX_RECONCILE_PER_SECOND", "0"),
            ],
            "HOOKINBOX_RECONCILE_PER_SECOND",
        ),
    ];
    for (env, expected) in cases {
        let out = std::process::Command::new(hookinbox_tests::bin("hookinbox-worker"))
            .arg("reconcile")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")
            .envs(env.iter().copied())
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{env:?} must refuse");
        assert!(
            stderr.contains(expected),
            "{env:?}: expected '{expected}' in {stderr}"
        );
        assert!(!stderr.contains("t0ken"), "never prints a credential");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn workers_reconcile_on_their_own_one_leader_at_a_time() {
    let (env, gh, guids, _ingest) = sent_while_down(20).await;
    let vars = gh.env();
    let mut vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    vars.push(("HOOKINBOX_RECONCILE_INTERVAL_SECS", "1"));
    let workers = [
        env.spawn("hookinbox-worker", &vars),
        env.spawn("hookinbox-worker", &vars),
    ];
    hookinbox_tests::wait_until(
        "every delivery completed",
        Duration::from_secs(60),
        || async { env.events().await == 20 },
    )
    .await;
    for guid in &guids {
        assert_eq!(
            gh.fake.redeliveries_asked(guid),
            1,
            "one leader asked, once"
        );
    }
    // Both workers keep passing over the log; nothing is asked again.
    let lists = gh.fake.list_requests();
    hookinbox_tests::wait_until("more passes", Duration::from_secs(30), || async {
        gh.fake.list_requests() >= lists + 3
    })
    .await;
    assert_eq!(gh.fake.redeliveries_total(), 20);
    let mut seen = false;
    for worker in &workers {
        let (_, metrics) = worker.scrape("/metrics").await;
        assert!(
            metrics
                .contains("hookinbox_reconcile_last_success_timestamp_seconds{source=\"default\"}"),
            "every reconciling worker starts the clock"
        );
        if metrics.contains(
            "hookinbox_reconcile_redeliveries_total{source=\"default\",result=\"accepted\"}",
        ) {
            seen = true;
            assert!(metrics.contains("hookinbox_github_rate_limit_remaining{source=\"default\"}"));
        }
    }
    assert!(seen, "a leader reports its passes");
    env.cleanup().await;
}

#[tokio::test]
async fn a_toml_source_names_its_hook_in_a_github_table() {
    let env = TestEnv::new().await;
    let port = free_port();
    let gh = Github::start(
        &env,
        format!("http://127.0.0.1:{port}/webhooks/github/main"),
    );
    let (guid, _) = gh
        .fake
        .deliver(gh.hook, "push", &fixtures::unique(&fixtures::own("push")))
        .await;
    let config = std::env::temp_dir().join(format!("{}-sources.toml", env.prefix));
    std::fs::write(
        &config,
        format!(
            "[[sources]]\nname = \"main\"\nsecrets = [\"{SECRET}\"]\n\n[sources.github]\n\
             reconcile_hook = \"repo:acme/widgets/{HOOK_ID}\"\napi_url = \"{}\"\n\
             token_file = \"{}\"\nmin_age_secs = 0\n",
            gh.fake.base,
            gh.token_file.display()
        ),
    )
    .expect("config");
    let mut args = env.ingest_args();
    args.listen = format!("127.0.0.1:{port}").parse().expect("address");
    args.sources.github_secret = None;
    args.sources.config = Some(config.clone());
    let _ingest = env.ingest_with(args.validate().expect("valid")).await;
    let path = config.to_string_lossy().into_owned();
    let out = tokio::process::Command::from(worker_command(
        &env,
        &["reconcile", "--json", "--source", "main"],
        &[("HOOKINBOX_CONFIG", &path)],
    ))
    .output()
    .await
    .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["source"], "main");
    assert_eq!(count(&report, "redelivered"), 1);
    assert_eq!(gh.fake.resent(&guid), 1);

    // A bad table stops the worker, naming the field.
    std::fs::write(
        &config,
        "[[sources]]\nname = \"main\"\nsecrets = [\"s\"]\n[sources.github]\nreconcile_hook = \"repo:acme\"\ntoken_file = \"/x\"\n",
    )
    .expect("config");
    let out = tokio::process::Command::from(worker_command(
        &env,
        &["reconcile"],
        &[("HOOKINBOX_CONFIG", &path)],
    ))
    .output()
    .await
    .expect("runs");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("sources[0].github.reconcile_hook"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_file(config);
    env.cleanup().await;
}

#[tokio::test]
async fn a_repository_hook_read_as_an_app_uses_an_installation_token() {
    let env = TestEnv::new().await;
    let port = free_port();
    let (private, public) = github::app_keys();
    let gh = Github::start(&env, format!("http://127.0.0.1:{port}/webhooks/github"));
    let fake = gh.fake.clone().with_app("4242", &public, 77);
    let (guid, _) = fake
        .deliver(gh.hook, "push", &fixtures::unique(&fixtures::own("push")))
        .await;
    let _ingest = ingest_on(&env, port).await;
    let key_file = std::env::temp_dir().join(format!("{}-app.pem", env.prefix));
    std::fs::write(&key_file, &private).expect("key file");
    let key_path = key_file.to_string_lossy().into_owned();
    let hook = format!("repo:acme/widgets/{HOOK_ID}");
    let vars = [
        ("HOOKINBOX_RECONCILE_HOOK", hook.as_str()),
        ("HOOKINBOX_GITHUB_API_URL", fake.base.as_str()),
        ("HOOKINBOX_GITHUB_APP_ID", "4242"),
        ("HOOKINBOX_GITHUB_APP_KEY_FILE", key_path.as_str()),
        ("HOOKINBOX_GITHUB_INSTALLATION_ID", "77"),
        ("HOOKINBOX_RECONCILE_MIN_AGE_SECS", "0"),
    ];
    let out = run(&env, &["reconcile", "--json"], &vars).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fake.resent(&guid), 1);
    // The wrong App id: its JWT is refused, and the pass says so.
    let vars = [
        ("HOOKINBOX_RECONCILE_HOOK", hook.as_str()),
        ("HOOKINBOX_GITHUB_API_URL", fake.base.as_str()),
        ("HOOKINBOX_GITHUB_APP_ID", "9999"),
        ("HOOKINBOX_GITHUB_APP_KEY_FILE", key_path.as_str()),
        ("HOOKINBOX_GITHUB_INSTALLATION_ID", "77"),
    ];
    let out = run(&env, &["reconcile"], &vars).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refused the credentials"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    env.cleanup().await;
}

/// What the alerts read, from a running worker: its passes
/// (`hookinbox_reconcile_runs_total`), the late answers
/// (`hookinbox_reconcile_late_answers_total`), and a delivery GitHub saw
/// answered 2xx that hookinbox holds no row of
/// (`hookinbox_reconcile_unexplained_total`, which raises
/// HookinboxReconcileUnexplained): each counted once however many passes
/// judge it again, and nothing redelivered for either.
#[tokio::test]
async fn a_running_worker_counts_its_passes_late_answers_and_unexplained_successes_once() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let gh = Github::start(&env, format!("{}/webhooks/github", ingest.base));
    let store = env.store_worker().await;
    let body = fixtures::own("push");
    // Late: completed here, but GitHub gave up waiting for the answer.
    let (late, status) = gh
        .fake
        .deliver(gh.hook, "push", &fixtures::unique(&body))
        .await;
    assert_eq!(status, 202);
    gh.fake.mark_timed_out(&late);
    settle(&env, &store).await;
    // Unexplained: GitHub logged a 2xx for a delivery hookinbox never
    // stored (well inside the completed retention, so not swept).
    gh.log(Utc::now() - chrono::Duration::minutes(2), 202, "OK", true);

    let vars = gh.env();
    let mut vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    vars.push(("HOOKINBOX_RECONCILE_INTERVAL_SECS", "1"));
    let worker = env.spawn("hookinbox-worker", &vars);
    let complete = [("source", "default"), ("outcome", "complete")];
    hookinbox_tests::wait_until("three complete passes", Duration::from_secs(60), || async {
        let (_, scrape) = worker.scrape("/metrics").await;
        counter(&scrape, "hookinbox_reconcile_runs_total", &complete).is_some_and(|n| n >= 3.0)
    })
    .await;
    let (_, scrape) = worker.scrape("/metrics").await;
    let source = [("source", "default")];
    assert_eq!(
        counter(&scrape, "hookinbox_reconcile_unexplained_total", &source),
        Some(1.0),
        "{scrape}"
    );
    assert_eq!(
        counter(&scrape, "hookinbox_reconcile_late_answers_total", &source),
        Some(1.0),
        "{scrape}"
    );
    assert_eq!(
        counter(
            &scrape,
            "hookinbox_reconcile_runs_total",
            &[("outcome", "incomplete")]
        ),
        None,
        "{scrape}"
    );
    assert_eq!(
        worker
            .logs()
            .matches("GitHub saw a 2xx, but hookinbox holds no row of this delivery")
            .count(),
        1,
        "warned once"
    );
    assert_eq!(gh.fake.redeliveries_total(), 0, "neither is redelivered");
    env.cleanup().await;
}

/// `reconcile --since 1h` walks GitHub's log back one hour only, and leaves
/// the watermark where it was; a regular pass then walks back to the
/// watermark (the whole log, the first time) and finds the older one.
#[tokio::test]
async fn reconcile_since_walks_back_only_that_far_and_leaves_the_watermark() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let gh = Github::start(&env, format!("{}/webhooks/github", ingest.base));
    // Two deliveries GitHub could not send, three hours and half an hour ago.
    let unsent = |ago| gh.log(Utc::now() - ago, 0, "failed to connect to host", true);
    let old = &unsent(chrono::Duration::hours(3));
    let recent = &unsent(chrono::Duration::minutes(30));
    let watermark = || async {
        env.db
            .query_opt(
                "select watermark from reconcile_state where source = 'default'",
                &[],
            )
            .await
            .expect("state")
            .and_then(|r| r.get::<_, Option<chrono::DateTime<Utc>>>(0))
    };

    let (code, report, stderr) = gh.reconcile(&env, &["--since", "1h"], &[]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        (count(&report, "scanned"), count(&report, "redelivered")),
        (1, 1),
        "{report}"
    );
    assert_eq!(gh.fake.redeliveries_asked(recent), 1);
    assert_eq!(gh.fake.redeliveries_asked(old), 0, "past --since");
    assert_eq!(watermark().await, None, "a --since pass sets no watermark");

    let (code, report, stderr) = gh.reconcile(&env, &[], &[]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(count(&report, "redelivered"), 1, "{report}");
    assert_eq!(gh.fake.redeliveries_asked(old), 1);
    assert_eq!(gh.fake.redeliveries_asked(recent), 1, "answered 202 by now");
    let set = watermark()
        .await
        .expect("a regular pass sets the watermark");

    let (code, _, stderr) = gh.reconcile(&env, &["--since", "10m"], &[]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(watermark().await, Some(set), "nor moves it");
    assert_eq!(env.deliveries().await, 2);
    drop(ingest);
    env.cleanup().await;
}

/// An organization's hook (`org:ORG/HOOK_ID`), end to end: deliveries sent
/// while ingest was down are read from the organization's log, redelivered
/// once each, and completed once each.
#[tokio::test]
async fn an_organization_hook_is_reconciled_end_to_end() {
    let org = HookPath::Org {
        org: "acme".into(),
        id: HOOK_ID,
    };
    let (env, gh, guids, ingest) = sent_while_down_at(3, org, format!("org:acme/{HOOK_ID}")).await;
    let (code, report, stderr) = gh.reconcile(&env, &[], &[]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["hook"], format!("org:acme/{HOOK_ID}"), "{report}");
    assert_eq!(count(&report, "redelivered"), 3, "{report}");
    let worker = env.store_worker().await;
    settle(&env, &worker).await;
    let effects = effects(&env).await;
    for guid in &guids {
        assert_eq!(gh.fake.resent(guid), 1);
        assert_eq!(effects.get(guid), Some(&1));
    }
    // A second pass finds nothing left to do.
    let (code, report, _) = gh.reconcile(&env, &[], &[]).await;
    assert_eq!((code, count(&report, "redelivered")), (0, 0));
    drop(ingest);
    env.cleanup().await;
}

/// Completed rows for `guids`, as if hookinbox took them (the `default`
/// source, the fake's hook id).
async fn hold(env: &TestEnv, guids: &[String]) {
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    client
        .execute(
            "insert into deliveries (provider, source, hook_id, delivery_id, destination, event,
                                     body_sha256, status, claim_token, completed_at)
             select 'github', 'default', $2, g, 'store', 'push', sha256(g::bytea), 'completed',
                    gen_random_uuid(), now()
             from unnest($1::text[]) g",
            &[&guids, &HOOK_ID.to_string()],
        )
        .await
        .expect("rows");
}

#[tokio::test]
async fn most_passes_ask_for_failures_only_and_a_whole_log_walk_still_finds_unexplained_successes()
{
    let env = TestEnv::new().await;
    let gh = Github::start(
        &env,
        format!("http://127.0.0.1:{}/webhooks/github", free_port()),
    );
    // A day of traffic: 1,000 deliveries hookinbox took (GitHub saw 2xx),
    // 3 GitHub saw succeed that hookinbox holds no row of, and 20 GitHub
    // saw fail that hookinbox never took.
    let now = Utc::now();
    let minutes = |m: i64| now - chrono::Duration::seconds(m * 60 + 30);
    let taken: Vec<String> = (0..1000)
        .map(|i| gh.log(minutes(i), 200, "OK", true))
        .collect();
    hold(&env, &taken).await;
    let unexplained: Vec<String> = (0..3)
        .map(|i| gh.log(minutes(1000 + i), 200, "OK", true))
        .collect();
    let mut failed: Vec<String> = (0..20)
        .map(|i| gh.log(minutes(7 * i + 3), 502, "Invalid HTTP Response: 502", true))
        .collect();
    failed.sort();

    // The first pass walks the whole log (there is no whole-log watermark
    // yet); the next, within HOOKINBOX_RECONCILE_FULL_EVERY_SECS, asks for
    // the failures only. Both dry runs over the same day.
    let (code, first, stderr) = gh.reconcile(&env, &[], &[]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(first["walk"], "full");
    assert_eq!(count(&first, "unexplained"), 3);
    assert_eq!(count(&first, "redelivered"), 20);

    let api = |f: &FakeGithub| (f.list_requests(), f.api_requests());
    let before = api(&gh.fake);
    let (code, failures, stderr) = gh
        .reconcile(&env, &["--dry-run", "--since", "2d"], &[])
        .await;
    assert_eq!(code, 0, "{stderr}");
    let after_failures = api(&gh.fake);
    let (code, whole, stderr) = gh
        .reconcile(&env, &["--dry-run", "--since", "2d", "--full"], &[])
        .await;
    assert_eq!(code, 0, "{stderr}");
    let after_whole = api(&gh.fake);
    assert_eq!(failures["walk"], "failures");
    assert_eq!(whole["walk"], "full");
    let lists = |a: (u32, u32), b: (u32, u32)| (b.0 - a.0, b.1 - a.1);
    let (failure_lists, failure_requests) = lists(before, after_failures);
    let (whole_lists, whole_requests) = lists(after_failures, after_whole);
    println!(
        "API requests per pass over a day's log of {} attempts ({} successes, {} failed \
         attempts): status=failure {failure_requests} ({failure_lists} list page(s)), \
         the whole log {whole_requests} ({whole_lists} list page(s))",
        gh.fake.log().len(),
        gh.fake
            .log()
            .iter()
            .filter(|d| d.status_code == 200)
            .count(),
        gh.fake
            .log()
            .iter()
            .filter(|d| d.status_code != 200)
            .count(),
    );
    assert_eq!(
        count(&failures, "api_requests"),
        u64::from(failure_requests)
    );
    assert_eq!(count(&whole, "api_requests"), u64::from(whole_requests));
    assert_eq!(failure_lists, 1, "40 failed attempts fit one page");
    assert_eq!(whole_lists, 11, "1,043 attempts at 100 a page");

    // The failures walk finds what the whole walk finds, but unexplained
    // successes, which only the whole walk can see.
    assert_eq!(failures["would_redeliver"], whole["would_redeliver"]);
    assert_eq!(count(&failures, "unexplained"), 0);
    assert_eq!(count(&whole, "unexplained"), 3);
    let _ = (unexplained, failed);

    // A pass of a running schedule, past the whole-log interval, walks
    // the whole log again: 0 makes every pass one.
    let (code, again, stderr) = gh
        .reconcile(
            &env,
            &["--dry-run"],
            &[("HOOKINBOX_RECONCILE_FULL_EVERY_SECS", "0")],
        )
        .await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(again["walk"], "full");
    env.cleanup().await;
}

#[tokio::test]
async fn throttled_deliveries_are_counted_on_their_own() {
    let env = TestEnv::new().await;
    let gh = Github::start(
        &env,
        format!("http://127.0.0.1:{}/webhooks/github", free_port()),
    );
    let at = Utc::now() - chrono::Duration::minutes(5);
    let throttled = gh.log(at, 0, "throttled", true);
    gh.fake.throttle(&throttled);
    let _ok = gh.log(at, 200, "OK", true);
    let (code, report, stderr) = gh.reconcile(&env, &["--dry-run"], &[]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(count(&report, "throttled"), 1);
    assert_eq!(report["would_redeliver"], serde_json::json!([throttled]));
    // The text report says it too.
    let vars = gh.env();
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = run(&env, &["reconcile", "--dry-run"], &vars).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("throttled 1"), "{text}");
    env.cleanup().await;
}

/// A delivery is what its neediest leg is: one leg claimed and never
/// published (its ingest died after publishing the others) awaits a
/// redelivery from GitHub however many of its other legs completed, in
/// whatever order Postgres returns the legs.
#[tokio::test]
async fn a_delivery_with_one_leg_awaiting_a_redelivery_awaits_it_though_its_other_legs_completed() {
    use hookinbox::deliveries::{self, Held, LegRequest};
    use hookinbox::key::{DestinationName, SourceName};

    let env = TestEnv::new().await;
    let hook = Hook::fixture("push");
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    let legs: Vec<LegRequest> = ["a", "m", "z"]
        .into_iter()
        .map(|name| LegRequest {
            destination: DestinationName::parse(name).expect("name"),
            ..hookinbox_tests::store_leg()
        })
        .collect();
    deliveries::claim(
        &client,
        &env.policy(),
        &hookinbox_tests::claim_request(&hook, legs),
    )
    .await
    .expect("claim");
    let source = SourceName::default_source();
    let hook_id = hook.key().hook_id.as_str().to_owned();
    let id = hook.key().delivery_id.as_str().to_owned();
    // Claimed before the claim wrote bodies: none kept.
    env.db
        .execute("delete from bodies", &[])
        .await
        .expect("no body");
    for awaiting in ["a", "m", "z"] {
        env.db
            .execute(
                "update deliveries set status = 'completed', completed_at = now(), \
                 last_error_class = null where destination <> $1",
                &[&awaiting],
            )
            .await
            .expect("complete the others");
        env.db
            .execute(
                "update deliveries set status = 'failed', retryable = true, failed_at = now(), \
                 last_error_class = 'lost', completed_at = null where destination = $1",
                &[&awaiting],
            )
            .await
            .expect("one leg lost without a body");
        let held = deliveries::held(&client, &source, &hook_id, &[id.as_str()])
            .await
            .expect("held");
        assert_eq!(
            held.get(&id),
            Some(&Held::AwaitingRedelivery),
            "with leg {awaiting} lost and no body parked"
        );
    }
    env.db
        .execute(
            "update deliveries set status = 'completed', completed_at = now(), last_error_class = null",
            &[],
        )
        .await
        .expect("all completed");
    let held = deliveries::held(&client, &source, &hook_id, &[id.as_str()])
        .await
        .expect("held");
    assert_eq!(held.get(&id), Some(&Held::Completed));
    env.cleanup().await;
}
