//! The operator CLI: every filter of the lists against known rows, show,
//! replay (one, filtered, dry run, at a rate, and of deliveries only GitHub
//! has the body of) and purge dead letters (filtered too), and its exit
//! codes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hookinbox::Job;
use hookinbox::deliveries::ErrorClass;
use hookinbox_tests::admin::{Seed, seed};
use hookinbox_tests::handlers::Scripted;
use hookinbox_tests::{Hook, TestEnv, TestIngest, fixtures, settle, worker_cli, worker_command};
use hookinbox_worker::JobOutcome;
use hookinbox_worker::{Effect, Handler, HandlerError};
use serde_json::Value;

#[tokio::test]
async fn permanent_failure_is_listed_then_replayed_once_from_the_cli() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);
    let broken = Scripted::new(vec![HandlerError::permanent("receiver said 422")]);
    let outcomes = settle(&env, &env.worker(broken.clone()).await).await;
    assert_eq!(
        outcomes,
        vec![JobOutcome::Failed {
            class: ErrorClass::Permanent,
            retryable: false
        }]
    );
    assert_eq!(broken.calls().len(), 1, "one attempt");
    assert_eq!(env.dead_depth().await, 1);

    let (code, out) = worker_cli(&env, &["dlq", "list", "--json"]);
    assert_eq!(code, 0, "{out}");
    let listed: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(listed.as_array().map(Vec::len), Some(1));
    assert_eq!(listed[0]["delivery_id"], hook.id());
    assert_eq!(listed[0]["error_class"], "permanent");

    // The handler is fixed; replay.
    let (code, out) = worker_cli(&env, &["dlq", "replay", hook.id()]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        env.dead_depth().await,
        0,
        "the queue's copy follows Postgres"
    );
    let (code, _) = worker_cli(&env, &["dlq", "replay", hook.id()]);
    assert_eq!(code, 1, "a second replay matches nothing");
    assert_eq!(env.work_depth().await, 1, "one job started");
    let outcomes = settle(&env, &env.store_worker().await).await;
    assert_eq!(outcomes, vec![JobOutcome::Completed]);
    let row = env
        .db
        .query_one("select attempts, replays from deliveries", &[])
        .await
        .expect("row");
    assert_eq!((row.get::<_, i32>(0), row.get::<_, i32>(1)), (1, 1));
    let (code, _) = worker_cli(&env, &["dlq", "list"]);
    assert_eq!(code, 1, "nothing left");
    env.cleanup().await;
}

#[tokio::test]
async fn replay_dry_run_changes_nothing_and_rate_is_honoured() {
    let (env, ingest) = TestEnv::with_ingest().await;
    for _ in 0..5 {
        assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    }
    let broken = Scripted::new((0..5).map(|_| HandlerError::permanent("no")).collect());
    settle(&env, &env.worker(broken).await).await;
    let dead =
        "select count(*) from deliveries where status = 'failed' and not retryable and replays = 0";
    assert_eq!(env.count(dead).await, 5);

    let (code, out) = worker_cli(&env, &["dlq", "replay", "--all", "--dry-run"]);
    assert_eq!(code, 0);
    assert!(out.contains("would replay 5"), "{out}");
    assert_eq!(env.count(dead).await, 5, "dry run changed nothing");
    assert_eq!(env.work_depth().await, 0);

    let started = Instant::now();
    let (code, out) = worker_cli(&env, &["dlq", "replay", "--all", "--rate", "5"]);
    assert_eq!(code, 0, "{out}");
    // Five replays at 5/s: the fifth starts 0.8 s after the first.
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(env.work_depth().await, 5);
    assert_eq!(
        env.count("select count(*) from deliveries where replays = 1 and attempts = 0")
            .await,
        5
    );
    env.cleanup().await;
}

#[tokio::test]
async fn usage_errors_exit_2() {
    let env = TestEnv::new().await;
    let (code, _) = worker_cli(&env, &["dlq", "replay"]);
    assert_eq!(code, 2, "nothing named");
    let (code, _) = worker_cli(&env, &["dlq", "purge", "--older-than", "soon"]);
    assert_eq!(code, 2);
    let (code, _) = worker_cli(&env, &["deliveries", "show", "nope"]);
    assert_eq!(code, 1, "nothing matched");
    env.cleanup().await;
}

#[tokio::test]
async fn purge_deletes_old_dead_letters_with_their_bodies_and_queue_copies() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let hook = Hook::fixture("push");
        assert_eq!(ingest.send(&hook).await.status, 202);
        ids.push(hook.id().to_owned());
    }
    let broken = Scripted::new((0..2).map(|_| HandlerError::permanent("no")).collect());
    settle(&env, &env.worker(broken).await).await;
    assert_eq!(env.dead_depth().await, 2);
    env.db
        .execute(
            "update deliveries set failed_at = now() - interval '20 days' where delivery_id = $1",
            &[&ids[0]],
        )
        .await
        .expect("age one");

    let (code, out) = worker_cli(&env, &["dlq", "purge", "--older-than", "14d", "--dry-run"]);
    assert_eq!((code, out.trim()), (0, "would purge 1 dead letter(s)"));
    assert_eq!(env.deliveries().await, 2, "dry run changed nothing");
    let (code, out) = worker_cli(&env, &["dlq", "purge", "--older-than", "14d"]);
    assert_eq!((code, out.trim()), (0, "purged 1 dead letter(s)"));
    let left: String = env
        .db
        .query_one("select delivery_id from deliveries", &[])
        .await
        .expect("one row left")
        .get(0);
    assert_eq!(left, ids[1]);
    assert_eq!(
        env.count("select count(*) from bodies").await,
        2,
        "a purge deletes the dead letter; its body goes with retention"
    );
    assert_eq!(
        env.dead_depth().await,
        1,
        "the purged copy left the queue too"
    );
    let (code, _) = worker_cli(&env, &["dlq", "purge", "--older-than", "14d"]);
    assert_eq!(code, 1, "nothing left to purge");
    env.cleanup().await;
}

/// The known rows of the list tests: every state (awaiting redelivery
/// included), two sources, three events, actions, two repositories, four
/// classes and ages from seconds to days. No id is part of another.
async fn seed_known_rows(env: &TestEnv) {
    let row = |id: &str, event: &str, age: i64, f: &dyn Fn(&mut Seed)| {
        let mut s = Seed::dead(id, event, age);
        s.repository = Some("acme/inbox".into());
        f(&mut s);
        s
    };
    let rows = vec![
        row("r01-dead-push", "push", 60, &|_| {}),
        row("r02-dead-issues", "issues", 120, &|s| {
            s.action = Some("opened".into());
            s.repository = Some("acme/other".into());
            s.class = Some("poison".into());
        }),
        row("r03-retry-billing", "push", 30, &|s| {
            s.source = "billing".into();
            s.retryable = true;
            s.class = Some("transient".into());
        }),
        row("r04-done-pr", "pull_request", 10, &|s| {
            s.status = "completed".into();
            s.class = None;
            s.action = Some("opened".into());
        }),
        row("r05-proc-issues", "issues", 5, &|s| {
            s.status = "processing".into();
            s.class = None;
            s.action = Some("closed".into());
        }),
        row("r06-old-dead", "push", 3 * 86400, &|s| {
            // As GitHub spells it: the filters ignore case.
            s.repository = Some("Acme/Other".into());
            s.class = Some("max_attempts".into());
        }),
        row("r07-lost", "issues", 90, &|s| {
            s.action = Some("opened".into());
            s.retryable = true;
            s.class = Some("lost".into());
        }),
        row("r08-unpublished", "push", 100, &|s| {
            s.status = "processing".into();
            s.class = None;
        }),
        row("r09-lost-parked", "pull_request", 80, &|s| {
            s.retryable = true;
            s.class = Some("lost".into());
            s.repository = None;
        }),
        row("r10-done-old", "push", 5 * 3600, &|s| {
            s.status = "completed".into();
            s.class = None;
        }),
    ];
    seed(env, &rows).await;
    // r07 was reaped `lost` and r08 never published: neither has a body
    // here (r09, reaped too, has one: the scheduler republishes it).
    env.db
        .batch_execute(
            "delete from bodies where delivery_id = 'r07-lost';
             update deliveries set attempts = 0, lease_until = now() - interval '1 minute'
             where delivery_id = 'r08-unpublished';",
        )
        .await
        .expect("rows without a body");
}

const KNOWN: [&str; 10] = [
    "r01-dead-push",
    "r02-dead-issues",
    "r03-retry-billing",
    "r04-done-pr",
    "r05-proc-issues",
    "r06-old-dead",
    "r07-lost",
    "r08-unpublished",
    "r09-lost-parked",
    "r10-done-old",
];

/// Runs a list command as a table and as JSON and checks that each lists
/// exactly the known rows whose ids start with one of `want` (`r01`, …),
/// and none other; exit 0, or 1 when it lists nothing.
fn check_list(env: &TestEnv, args: &[&str], want: &[&str]) {
    let wanted: BTreeSet<&str> = KNOWN
        .into_iter()
        .filter(|id| want.iter().any(|w| id.starts_with(w)))
        .collect();
    assert_eq!(wanted.len(), want.len(), "{want:?} names known rows");
    let code_wanted = if wanted.is_empty() { 1 } else { 0 };
    let (code, table) = worker_cli(env, args);
    assert_eq!(code, code_wanted, "{args:?}:\n{table}");
    assert!(table.starts_with("DELIVERY_ID"), "{args:?}:\n{table}");
    for id in KNOWN {
        assert_eq!(
            table.contains(id),
            wanted.contains(id),
            "{args:?}: is {id} in the table?\n{table}"
        );
    }
    let with_json: Vec<&str> = args.iter().copied().chain(["--json"]).collect();
    let (code, out) = worker_cli(env, &with_json);
    assert_eq!(code, code_wanted, "{with_json:?}:\n{out}");
    let listed: Value = serde_json::from_str(&out).expect("JSON");
    let ids: BTreeSet<&str> = listed
        .as_array()
        .expect("an array")
        .iter()
        .map(|d| d["delivery_id"].as_str().expect("an id"))
        .collect();
    assert_eq!(ids, wanted, "{with_json:?}");
}

#[tokio::test]
async fn a_leg_whose_last_outcome_was_a_wait_is_waiting_not_retrying() {
    let env = TestEnv::new().await;
    seed_known_rows(&env).await;
    // r03's last outcome: held by its destination (a breaker open), which
    // spent no attempt and failed nothing.
    env.db
        .execute(
            "update deliveries set last_error_class = 'held' \
             where delivery_id = 'r03-retry-billing'",
            &[],
        )
        .await
        .expect("hold r03");
    check_list(
        &env,
        &["deliveries", "list", "--status", "waiting"],
        &["r03"],
    );
    check_list(
        &env,
        &["deliveries", "list", "--status", "retrying"],
        &["r09"],
    );
    check_list(
        &env,
        &["deliveries", "list", "--status", "failed"],
        &["r01", "r02", "r03", "r06", "r09"],
    );
    let (code, out) = worker_cli(&env, &["deliveries", "show", "r03-retry-billing", "--json"]);
    assert_eq!(code, 0, "{out}");
    let shown: Value = serde_json::from_str(&out).expect("JSON");
    let states: Vec<&str> = shown
        .as_array()
        .expect("one row a leg")
        .iter()
        .map(|leg| leg["state"].as_str().expect("a state"))
        .collect();
    assert_eq!(states, ["waiting"], "{out}");
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    let overview = hookinbox::deliveries::overview(&client)
        .await
        .expect("overview");
    let billing = overview
        .sources
        .iter()
        .find(|s| s.source == "billing")
        .expect("billing");
    assert_eq!((billing.retrying, billing.waiting), (0, 1));
    let gauges = hookinbox::deliveries::gauges(&client)
        .await
        .expect("gauges");
    assert_eq!((gauges.retrying, gauges.waiting), (1, 1));
    drop(client);
    env.cleanup().await;
}

#[tokio::test]
async fn deliveries_list_filters_match_exactly_the_known_rows_in_table_and_json() {
    let env = TestEnv::new().await;
    seed_known_rows(&env).await;
    let all = [
        "r01", "r02", "r03", "r04", "r05", "r06", "r07", "r08", "r09", "r10",
    ];
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec![], all.to_vec()),
        // `failed` is retrying, waiting or dead; a claim only GitHub can finish
        // (r07 reaped `lost`, r08 never published) is in neither, nor in
        // processing: each row is in one state.
        (
            vec!["--status", "failed"],
            vec!["r01", "r02", "r03", "r06", "r09"],
        ),
        (vec!["--status", "retrying"], vec!["r03", "r09"]),
        (vec!["--status", "dead"], vec!["r01", "r02", "r06"]),
        (vec!["--status", "completed"], vec!["r04", "r10"]),
        (vec!["--status", "processing"], vec!["r05"]),
        (vec!["--status", "awaiting_redelivery"], vec!["r07", "r08"]),
        (vec!["--source", "billing"], vec!["r03"]),
        (
            vec!["--source", "default"],
            vec![
                "r01", "r02", "r04", "r05", "r06", "r07", "r08", "r09", "r10",
            ],
        ),
        (
            vec!["--event", "push"],
            vec!["r01", "r03", "r06", "r08", "r10"],
        ),
        (vec!["--event", "issues"], vec!["r02", "r05", "r07"]),
        (vec!["--error-class", "lost"], vec!["r07", "r09"]),
        (vec!["--error-class", "poison"], vec!["r02"]),
        (
            vec!["--since", "1h"],
            vec!["r01", "r02", "r03", "r04", "r05", "r07", "r08", "r09"],
        ),
        (
            vec!["--since", "1d"],
            vec![
                "r01", "r02", "r03", "r04", "r05", "r07", "r08", "r09", "r10",
            ],
        ),
        (vec!["--action", "opened"], vec!["r02", "r04", "r07"]),
        (vec!["--action", "closed"], vec!["r05"]),
        (vec!["--repository", "acme/other"], vec!["r02", "r06"]),
        // GitHub's repository names ignore case, and so does the filter,
        // on settled rows and processing ones alike.
        (vec!["--repository", "ACME/Other"], vec!["r02", "r06"]),
        (
            vec!["--repository", "Acme/INBOX"],
            vec!["r01", "r03", "r04", "r05", "r07", "r08", "r10"],
        ),
        (vec!["--repository", "acme/nothing"], vec![]),
        (vec!["--event", "deployment"], vec![]),
        // Combinations: every filter narrows the others.
        (
            vec!["--status", "failed", "--event", "push", "--since", "1h"],
            vec!["r01", "r03"],
        ),
        (
            vec!["--source", "default", "--error-class", "permanent"],
            vec!["r01"],
        ),
        (
            vec!["--status", "awaiting_redelivery", "--event", "issues"],
            vec!["r07"],
        ),
        (
            vec!["--status", "awaiting_redelivery", "--source", "billing"],
            vec![],
        ),
        (vec!["--status", "completed", "--since", "1h"], vec!["r04"]),
        (
            vec!["--repository", "acme/other", "--since", "1h"],
            vec!["r02"],
        ),
        (
            vec![
                "--event",
                "issues",
                "--action",
                "opened",
                "--repository",
                "acme/inbox",
            ],
            vec!["r07"],
        ),
        (
            vec!["--action", "closed", "--status", "processing"],
            vec!["r05"],
        ),
        (vec!["--action", "closed", "--status", "failed"], vec![]),
    ];
    for (filters, want) in &cases {
        let args: Vec<&str> = ["deliveries", "list"]
            .into_iter()
            .chain(filters.iter().copied())
            .collect();
        check_list(&env, &args, want);
    }
    // Claims awaiting redelivery come with what brings them back.
    let (_, table) = worker_cli(
        &env,
        &["deliveries", "list", "--status", "awaiting_redelivery"],
    );
    assert!(
        table.contains("2 claim(s) with no body and no job here: awaiting redelivery from GitHub")
            && table.contains("hookinbox-worker reconcile"),
        "{table}"
    );
    // --limit keeps the most recently active.
    let (code, out) = worker_cli(&env, &["deliveries", "list", "--limit", "2", "--json"]);
    assert_eq!(code, 0);
    let listed: Value = serde_json::from_str(&out).expect("JSON");
    let ids: Vec<&str> = listed
        .as_array()
        .expect("array")
        .iter()
        .map(|d| d["delivery_id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["r05-proc-issues", "r04-done-pr"]);
    env.cleanup().await;
}

#[tokio::test]
async fn dlq_list_filters_match_exactly_the_known_dead_letters_in_table_and_json() {
    let env = TestEnv::new().await;
    seed_known_rows(&env).await;
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec![], vec!["r01", "r02", "r06"]),
        (vec!["--since", "1h"], vec!["r01", "r02"]),
        (vec!["--since", "1d"], vec!["r01", "r02"]),
        (vec!["--error-class", "poison"], vec!["r02"]),
        (vec!["--error-class", "max_attempts"], vec!["r06"]),
        // Reaped rows wait for a retry or a redelivery: not dead letters.
        (vec!["--error-class", "lost"], vec![]),
        (vec!["--error-class", "transient"], vec![]),
        (vec!["--source", "billing"], vec![]),
        (vec!["--source", "default"], vec!["r01", "r02", "r06"]),
        (vec!["--event", "push"], vec!["r01", "r06"]),
        (vec!["--event", "pull_request"], vec![]),
        (vec!["--status", "failed"], vec!["r01", "r02", "r06"]),
        (vec!["--status", "completed"], vec![]),
        (vec!["--status", "awaiting_redelivery"], vec![]),
        (vec!["--repository", "acme/other"], vec!["r02", "r06"]),
        (vec!["--repository", "acme/inbox"], vec!["r01"]),
        (vec!["--repository", "Acme/INBOX"], vec!["r01"]),
        (vec!["--action", "opened"], vec!["r02"]),
        (
            vec![
                "--repository",
                "acme/other",
                "--error-class",
                "max_attempts",
            ],
            vec!["r06"],
        ),
        (
            vec![
                "--event",
                "push",
                "--since",
                "1h",
                "--error-class",
                "permanent",
            ],
            vec!["r01"],
        ),
        (
            vec![
                "--status",
                "failed",
                "--source",
                "default",
                "--event",
                "issues",
                "--action",
                "opened",
                "--repository",
                "acme/other",
                "--error-class",
                "poison",
                "--since",
                "1h",
            ],
            vec!["r02"],
        ),
        (vec!["--event", "issues", "--action", "closed"], vec![]),
    ];
    for (filters, want) in &cases {
        let args: Vec<&str> = ["dlq", "list"]
            .into_iter()
            .chain(filters.iter().copied())
            .collect();
        check_list(&env, &args, want);
    }
    // The JSON carries each row's facts.
    let (_, out) = worker_cli(&env, &["dlq", "list", "--error-class", "poison", "--json"]);
    let listed: Value = serde_json::from_str(&out).expect("JSON");
    let row = &listed[0];
    for (field, value) in [
        ("delivery_id", "r02-dead-issues"),
        ("source", "default"),
        ("hook_id", "1"),
        ("event", "issues"),
        ("action", "opened"),
        ("repository", "acme/other"),
        ("status", "failed"),
        ("error_class", "poison"),
        ("error", "seeded failure"),
    ] {
        assert_eq!(row[field], value, "{field}: {row}");
    }
    assert_eq!(row["retryable"], false);
    assert_eq!(row["attempts"], 1);
    env.cleanup().await;
}

/// Fails every job for good, except bodies marked `transient-`, which fail
/// for a while, until their attempts run out (`max_attempts`).
struct FailByBody;

#[async_trait::async_trait]
impl Handler for FailByBody {
    async fn handle(&self, job: &Job, _effect: &mut Effect) -> Result<(), HandlerError> {
        if job.body.windows(10).any(|w| w == b"transient-") {
            Err(HandlerError::transient("receiver is down"))
        } else {
            Err(HandlerError::permanent("receiver said 422"))
        }
    }
}

/// Five real dead letters, each with its copy in the dead-letter queue.
struct DeadLetters {
    /// push, acme/inbox, permanent.
    push: Hook,
    /// push, acme/inbox, max_attempts.
    push_exhausted: Hook,
    /// issues.opened, acme/inbox, permanent.
    issue_opened: Hook,
    /// issues.closed, acme/other, permanent.
    issue_closed_other: Hook,
    /// pull_request.opened, acme/other, permanent.
    pr_opened_other: Hook,
}

impl DeadLetters {
    async fn make(env: &TestEnv, ingest: &TestIngest) -> Self {
        let nonce = format!("transient-{}", uuid::Uuid::new_v4().simple());
        let made = Self {
            push: Hook::fixture("push"),
            push_exhausted: Hook::new(
                "push",
                fixtures::with_nonce(&fixtures::own("push"), &nonce),
            ),
            issue_opened: Hook::fixture("issues"),
            issue_closed_other: Hook::new(
                "issues",
                fixtures::unique(
                    br#"{"action":"closed","issue":{"number":2},"repository":{"full_name":"acme/other"}}"#,
                ),
            ),
            pr_opened_other: Hook::new(
                "pull_request",
                fixtures::unique(
                    br#"{"action":"opened","pull_request":{"number":3},"repository":{"full_name":"acme/other"}}"#,
                ),
            ),
        };
        for hook in made.all() {
            assert_eq!(ingest.send(hook).await.status, 202);
        }
        settle(env, &env.worker(Arc::new(FailByBody)).await).await;
        assert_eq!(
            env.count("select count(*) from deliveries where status = 'failed' and not retryable")
                .await,
            5
        );
        let class: String = env
            .db
            .query_one(
                "select last_error_class from deliveries where delivery_id = $1",
                &[&made.push_exhausted.id()],
            )
            .await
            .expect("row")
            .get(0);
        assert_eq!(class, "max_attempts");
        assert_eq!(env.dead_depth().await, 5);
        made
    }

    fn all(&self) -> [&Hook; 5] {
        [
            &self.push,
            &self.push_exhausted,
            &self.issue_opened,
            &self.issue_closed_other,
            &self.pr_opened_other,
        ]
    }
}

/// Every row's state, one line each, to compare before and after.
async fn snapshot(env: &TestEnv) -> BTreeMap<String, String> {
    env.db
        .query(
            "select delivery_id, concat_ws(' ', status, retryable, attempts, replays, claim_token,
                    last_error_class, failed_at, dead_lettered_at,
                    exists (select 1 from bodies b where b.delivery_id = d.delivery_id))
             from deliveries d",
            &[],
        )
        .await
        .expect("rows")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The ids a `dlq replay --dry-run --json` would replay.
fn would_replay(out: &str) -> BTreeSet<String> {
    let v: Value = serde_json::from_str(out).expect("JSON");
    assert_eq!(v["dry_run"], true, "{v}");
    v["would_replay"]
        .as_array()
        .expect("would_replay")
        .iter()
        .map(|d| d["delivery_id"].as_str().expect("id").to_owned())
        .collect()
}

fn ids(hooks: &[&Hook]) -> BTreeSet<String> {
    hooks.iter().map(|h| h.id().to_owned()).collect()
}

#[tokio::test]
async fn filtered_replay_dry_run_changes_nothing_then_replays_only_the_matching() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let dead = DeadLetters::make(&env, &ingest).await;
    let before = snapshot(&env).await;
    let filter = [
        "--event",
        "push",
        "--error-class",
        "permanent",
        "--since",
        "1h",
    ];
    let args = |extra: &[&'static str]| -> Vec<&str> {
        ["dlq", "replay"]
            .into_iter()
            .chain(filter)
            .chain(extra.iter().copied())
            .collect()
    };

    let (code, out) = worker_cli(&env, &args(&["--dry-run"]));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("would replay 1 dead letter(s)"), "{out}");
    for hook in dead.all() {
        assert_eq!(
            out.contains(hook.id()),
            hook.id() == dead.push.id(),
            "{out}"
        );
    }
    let (code, out) = worker_cli(&env, &args(&["--dry-run", "--json"]));
    assert_eq!(code, 0, "{out}");
    assert_eq!(would_replay(&out), ids(&[&dead.push]));
    assert_eq!(snapshot(&env).await, before, "a dry run changes no row");
    assert_eq!(env.dead_depth().await, 5, "nor the dead-letter queue");
    assert_eq!(env.work_depth().await, 0, "and starts no job");

    let (code, out) = worker_cli(&env, &args(&[]));
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out.trim(),
        "replayed 1, skipped 0 (no longer dead), failed 0"
    );
    let after = snapshot(&env).await;
    for hook in dead.all() {
        let changed = after[hook.id()] != before[hook.id()];
        assert_eq!(changed, hook.id() == dead.push.id(), "{}", after[hook.id()]);
    }
    assert!(
        after[dead.push.id()].starts_with("processing f 0 1 "),
        "{}",
        after[dead.push.id()]
    );
    assert_eq!(env.dead_depth().await, 4, "its copy left the queue");
    assert_eq!(env.work_depth().await, 1, "one job started");
    let (code, _) = worker_cli(&env, &args(&["--dry-run"]));
    assert_eq!(code, 1, "nothing matches any more");
    let outcomes = settle(&env, &env.store_worker().await).await;
    assert_eq!(outcomes, vec![JobOutcome::Completed]);
    env.cleanup().await;
}

#[tokio::test]
async fn repository_and_action_filters_select_what_replay_and_purge_act_on() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let dead = DeadLetters::make(&env, &ingest).await;
    let before = snapshot(&env).await;

    let (code, out) = worker_cli(
        &env,
        &["dlq", "list", "--repository", "acme/other", "--json"],
    );
    assert_eq!(code, 0, "{out}");
    let listed: BTreeSet<String> = serde_json::from_str::<Value>(&out)
        .expect("JSON")
        .as_array()
        .expect("array")
        .iter()
        .map(|d| d["delivery_id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!(
        listed,
        ids(&[&dead.issue_closed_other, &dead.pr_opened_other])
    );

    // Replay: the dry run names it and changes nothing; the replay starts
    // it alone.
    let filter = ["--repository", "acme/other", "--action", "closed"];
    let replay = |extra: &[&'static str]| -> Vec<&str> {
        ["dlq", "replay"]
            .into_iter()
            .chain(filter)
            .chain(extra.iter().copied())
            .collect()
    };
    let (code, out) = worker_cli(&env, &replay(&["--dry-run", "--json"]));
    assert_eq!(code, 0, "{out}");
    assert_eq!(would_replay(&out), ids(&[&dead.issue_closed_other]));
    assert_eq!(snapshot(&env).await, before);
    assert_eq!(env.dead_depth().await, 5);
    let (code, out) = worker_cli(&env, &replay(&["--json"]));
    assert_eq!(code, 0, "{out}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        v["replayed"],
        serde_json::json!([dead.issue_closed_other.id()])
    );
    let after = snapshot(&env).await;
    for hook in dead.all() {
        let changed = after[hook.id()] != before[hook.id()];
        assert_eq!(changed, hook.id() == dead.issue_closed_other.id());
    }
    assert_eq!(env.dead_depth().await, 4);
    assert_eq!(env.work_depth().await, 1);

    // Purge: only the old dead letters of that repository and event.
    env.db
        .execute(
            "update deliveries set failed_at = now() - interval '2 hours' where status = 'failed'",
            &[],
        )
        .await
        .expect("age them");
    let purge = |extra: &[&'static str]| -> Vec<&str> {
        [
            "dlq",
            "purge",
            "--older-than",
            "1h",
            "--repository",
            "acme/other",
        ]
        .into_iter()
        .chain(extra.iter().copied())
        .collect()
    };
    let (code, out) = worker_cli(&env, &purge(&["--action", "opened", "--dry-run"]));
    assert_eq!((code, out.trim()), (0, "would purge 1 dead letter(s)"));
    let (code, out) = worker_cli(&env, &purge(&["--action", "closed", "--dry-run"]));
    assert_eq!(
        (code, out.trim()),
        (1, "would purge 0 dead letter(s)"),
        "the closed one is replayed: not a dead letter"
    );
    assert_eq!(env.deliveries().await, 5, "dry runs purge nothing");
    let (code, out) = worker_cli(&env, &purge(&["--event", "pull_request", "--json"]));
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).expect("JSON"),
        serde_json::json!({"purged": 1, "dry_run": false})
    );
    let left: BTreeSet<String> = snapshot(&env).await.into_keys().collect();
    assert_eq!(
        left,
        ids(&[
            &dead.push,
            &dead.push_exhausted,
            &dead.issue_opened,
            &dead.issue_closed_other
        ])
    );
    assert_eq!(env.dead_depth().await, 3, "the purged copy left the queue");
    let (code, _) = worker_cli(&env, &purge(&[]));
    assert_eq!(code, 1, "no dead letter of acme/other is left");
    env.cleanup().await;
}

#[tokio::test]
async fn bad_filter_values_are_usage_errors_that_name_the_flag() {
    let env = TestEnv::new().await;
    for (args, flag) in [
        (
            vec!["deliveries", "list", "--repository", "acme"],
            "--repository",
        ),
        (
            vec!["deliveries", "list", "--repository", ""],
            "--repository",
        ),
        (vec!["dlq", "list", "--repository", "a/b/c"], "--repository"),
        (
            vec!["dlq", "list", "--repository", "acme /inbox"],
            "--repository",
        ),
        (
            vec!["dlq", "replay", "--repository", "/inbox", "--dry-run"],
            "--repository",
        ),
        (
            vec![
                "dlq",
                "purge",
                "--older-than",
                "14d",
                "--repository",
                "acme/",
            ],
            "--repository",
        ),
        (vec!["deliveries", "list", "--action", ""], "--action"),
        (vec!["dlq", "list", "--action", "two words"], "--action"),
        (
            vec!["dlq", "purge", "--older-than", "14d", "--action", " "],
            "--action",
        ),
        (vec!["deliveries", "list", "--source", ""], "--source"),
        (vec!["dlq", "list", "--event", ""], "--event"),
        (
            vec!["dlq", "list", "--error-class", "oops"],
            "--error-class",
        ),
        (vec!["deliveries", "list", "--status", "gone"], "--status"),
    ] {
        let output = worker_command(&env, &args, &[]).output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("invalid value") && stderr.contains(flag),
            "{args:?}: a bad value of {flag}: {stderr}"
        );
        assert!(output.stdout.is_empty(), "{args:?}");
    }
    let output = worker_command(&env, &["dlq", "list", "--repository", "acme"], &[])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("OWNER/NAME"), "{stderr}");
    // --help lists them, with an example.
    for args in [
        vec!["deliveries", "list", "--help"],
        vec!["dlq", "list", "--help"],
        vec!["dlq", "replay", "--help"],
        vec!["dlq", "purge", "--help"],
    ] {
        let (code, help) = worker_cli(&env, &args);
        assert_eq!(code, 0, "{args:?}");
        for text in [
            "--repository <OWNER/NAME>",
            "--action <ACTION>",
            "--repository octo-org/octo-repo",
        ] {
            assert!(help.contains(text), "{args:?} shows {text}:\n{help}");
        }
    }
    env.cleanup().await;
}

/// `deliveries show`'s `key: value` lines.
fn fields(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
        .collect()
}

#[tokio::test]
async fn deliveries_show_prints_one_delivery_and_exits_1_for_an_unknown_id() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let hook = Hook::fixture("issues");
    assert_eq!(ingest.send(&hook).await.status, 202);
    let broken = Scripted::new(vec![HandlerError::permanent("receiver said 422")]);
    settle(&env, &env.worker(broken).await).await;

    let (code, out) = worker_cli(&env, &["deliveries", "show", hook.id()]);
    assert_eq!(code, 0, "{out}");
    let shown = fields(&out);
    for (field, value) in [
        ("provider", "github"),
        ("source", "default"),
        ("hook_id", "123456"),
        ("delivery_id", hook.id()),
        ("event", "issues"),
        ("action", "opened"),
        ("repository", "acme/inbox"),
        ("status", "failed"),
        ("retryable", "false"),
        ("attempts", "1"),
        ("replays", "0"),
        ("dead_lettered", "true"),
        ("error_class", "permanent"),
        ("error", "receiver said 422"),
    ] {
        assert_eq!(
            shown.get(field).map(String::as_str),
            Some(value),
            "{field}:\n{out}"
        );
    }
    assert!(
        shown["created_at"]
            .parse::<chrono::DateTime<chrono::Utc>>()
            .is_ok(),
        "{out}"
    );

    let (code, out) = worker_cli(&env, &["deliveries", "show", hook.id(), "--json"]);
    assert_eq!(code, 0, "{out}");
    let rows: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    let row = &rows[0];
    for (field, value) in [
        ("delivery_id", serde_json::json!(hook.id())),
        ("source", serde_json::json!("default")),
        ("hook_id", serde_json::json!("123456")),
        ("event", serde_json::json!("issues")),
        ("action", serde_json::json!("opened")),
        ("repository", serde_json::json!("acme/inbox")),
        ("status", serde_json::json!("failed")),
        ("retryable", serde_json::json!(false)),
        ("attempts", serde_json::json!(1)),
        ("error_class", serde_json::json!("permanent")),
        ("error", serde_json::json!("receiver said 422")),
    ] {
        assert_eq!(row[field], value, "{field}: {row}");
    }
    assert!(
        row["failed_at"].is_string() && row["created_at"].is_string(),
        "{row}"
    );

    let (code, out) = worker_cli(&env, &["deliveries", "show", "no-such-delivery"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        out.trim(),
        "no delivery has the X-GitHub-Delivery id 'no-such-delivery'"
    );
    let (code, out) = worker_cli(&env, &["deliveries", "show", "no-such-delivery", "--json"]);
    assert_eq!((code, out.trim()), (1, "[]"));
    env.cleanup().await;
}

#[tokio::test]
async fn replaying_a_delivery_only_github_has_the_body_of_says_so_and_names_the_reconciler() {
    let (env, ingest) = TestEnv::with_ingest().await;
    // One real dead letter, with its body.
    let dead = Hook::fixture("push");
    assert_eq!(ingest.send(&dead).await.status, 202);
    let broken = Scripted::new(vec![HandlerError::permanent("no")]);
    settle(&env, &env.worker(broken).await).await;
    // Two claims whose ingest died before publishing: one reaped `lost`,
    // one not yet. Only GitHub has their bodies.
    let lost = Hook::fixture("push");
    env.claim_unpublished(&lost).await;
    assert_eq!(env.reap_now().await, 1);
    let unpublished = Hook::fixture("issues");
    env.claim_unpublished(&unpublished).await;
    let before = snapshot(&env).await;
    let (code, listed) = worker_cli(
        &env,
        &[
            "deliveries",
            "list",
            "--status",
            "awaiting_redelivery",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{listed}");
    assert_eq!(
        serde_json::from_str::<Value>(&listed)
            .expect("JSON")
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    let says_why = |out: &str| {
        out.contains("No body to replay")
            && out.contains("only GitHub has its body")
            && out.contains("hookinbox-worker reconcile")
            && out.contains("Redeliver")
    };

    // By id: nothing replayed (exit 1), and why, and what to do instead.
    let (code, out) = worker_cli(&env, &["dlq", "replay", lost.id()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.starts_with("replayed 0, skipped 0 (no longer dead), failed 0\n"),
        "{out}"
    );
    assert!(out.contains("not replayed, 1 delivery(ies):"), "{out}");
    assert!(
        out.contains(&format!(
            "  {}  source default  hook 123456  awaiting_redelivery (lost)",
            lost.id()
        )),
        "{out}"
    );
    assert!(says_why(&out), "{out}");
    let (code, out) = worker_cli(&env, &["dlq", "replay", lost.id(), "--dry-run"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("would replay 0 dead letter(s)"), "{out}");
    assert!(
        out.contains("would not replay, 1 delivery(ies):") && says_why(&out),
        "{out}"
    );
    let (code, out) = worker_cli(&env, &["dlq", "replay", lost.id(), "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["replayed"], serde_json::json!([]));
    assert_eq!(v["no_body"], serde_json::json!([lost.id()]));

    // By filter: the claims awaiting redelivery, or the lost ones.
    let (code, out) = worker_cli(&env, &["dlq", "replay", "--status", "awaiting_redelivery"]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("not replayed, 2 delivery(ies):") && says_why(&out),
        "{out}"
    );
    assert!(
        out.contains(lost.id()) && out.contains(unpublished.id()),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "  {}  source default  hook 123456  awaiting_redelivery",
            unpublished.id()
        )),
        "{out}"
    );
    let (code, out) = worker_cli(&env, &["dlq", "replay", "--error-class", "lost", "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["no_body"], serde_json::json!([lost.id()]));
    assert_eq!(snapshot(&env).await, before, "nothing changed");
    assert_eq!(env.work_depth().await, 0);

    // Named with a dead letter and an unknown id: the dead letter is
    // replayed (exit 0), each other id says why it was not.
    let (code, out) = worker_cli(
        &env,
        &[
            "dlq",
            "replay",
            dead.id(),
            lost.id(),
            unpublished.id(),
            "no-such-delivery",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("replayed 1, skipped 0 (no longer dead), failed 0\n"),
        "{out}"
    );
    assert!(
        out.contains("not replayed, 2 delivery(ies):") && says_why(&out),
        "{out}"
    );
    assert!(
        out.contains("not replayed no-such-delivery: no delivery has this id"),
        "{out}"
    );
    assert_eq!(env.work_depth().await, 1, "the dead letter's job alone");
    let (code, out) = worker_cli(&env, &["dlq", "replay", dead.id()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "not replayed {}: processing, not a dead letter",
            dead.id()
        )),
        "{out}"
    );

    // A dead letter without a body (a lost claim whose attempts ran out):
    // selected as a dead letter, refused by the replay itself, same words.
    env.db
        .execute(
            "update deliveries set retryable = false, last_error_class = 'max_attempts',
                 dead_lettered_at = now()
             where delivery_id = $1",
            &[&lost.id()],
        )
        .await
        .expect("exhaust it");
    let (code, out) = worker_cli(&env, &["dlq", "replay", lost.id()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("not replayed, 1 delivery(ies):") && says_why(&out),
        "{out}"
    );
    assert!(out.contains("dead (max_attempts)"), "{out}");
    env.cleanup().await;
}

#[tokio::test]
async fn the_replay_library_call_tells_a_delivery_without_a_body_from_one_not_failed() {
    use hookinbox::deliveries::{self, Replayed};

    let (env, ingest) = TestEnv::with_ingest().await;
    let dead = Hook::fixture("push");
    assert_eq!(ingest.send(&dead).await.status, 202);
    let broken = Scripted::new(vec![HandlerError::permanent("no")]);
    settle(&env, &env.worker(broken).await).await;
    let lost = Hook::fixture("push");
    env.claim_unpublished(&lost).await;
    env.reap_now().await;
    let unpublished = Hook::fixture("issues");
    env.claim_unpublished(&unpublished).await;
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    let policy = env.policy();
    let replay = async |hook: &Hook| {
        deliveries::replay(&client, &policy, &hook.leg(), deliveries::Scope::Failed)
            .await
            .expect("replay")
    };
    assert!(matches!(replay(&lost).await, Replayed::NoBody));
    assert!(matches!(replay(&unpublished).await, Replayed::NoBody));
    assert!(
        matches!(replay(&Hook::fixture("push")).await, Replayed::NotFailed),
        "unknown"
    );
    assert!(matches!(replay(&dead).await, Replayed::Started(_)));
    assert!(
        matches!(replay(&dead).await, Replayed::NotFailed),
        "replayed already"
    );
    assert_eq!(
        env.count("select count(*) from deliveries where replays > 0")
            .await,
        1,
        "only the dead letter changed"
    );
    env.cleanup().await;
}
