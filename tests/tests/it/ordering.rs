//! Ordered destinations: per key one leg in flight, in claim order, through
//! a receiver that fails at random and goes away once; a leg that fails for
//! good halts its key alone, and an operator's skip resumes it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use hookinbox_tests::proxy::Proxy;
use hookinbox_tests::receiver::{Receiver, Reply};
use hookinbox_tests::{Hook, SECRET, TestEnv, wait_until, worker_command};

const REPOSITORIES: u64 = 5;
const EVENTS: u64 = 200;
/// The repository, and its event, that the receiver refuses for good.
const POISON: (u64, u64) = (3, 100);

/// One answer the receiver gave: the repository, the event's number, and
/// the status.
type Answer = (u64, u64, u16);

/// A receiver answering `503` to about one request in five (at random, by
/// a hash of the request and how often it came before), `422` for good to
/// the poisoned event, and `200` to the rest; it notes every answer in
/// the order it gave them.
async fn flaky_receiver(answers: Arc<Mutex<Vec<Answer>>>) -> Receiver {
    Receiver::start(move |request, earlier| {
        let body: serde_json::Value = serde_json::from_slice(&request.body).expect("json");
        let repository = body["repository"]["id"].as_u64().expect("id");
        let n = body["n"].as_u64().expect("n");
        let status = if (repository, n) == POISON {
            422
        } else if mix(repository * 1_000 + n, earlier as u64).is_multiple_of(5) {
            503
        } else {
            200
        };
        answers.lock().expect("lock").push((repository, n, status));
        Reply::status(status)
    })
    .await
}

/// A small deterministic hash (SplitMix64's finaliser).
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_add(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn event(repository: u64, n: u64) -> Hook {
    Hook::new(
        "issues",
        format!(
            r#"{{"action":"edited","repository":{{"id":{repository},"full_name":"acme/r{repository}"}},"issue":{{"number":1}},"n":{n}}}"#
        ),
    )
}

/// Each repository's events by claim order: the event numbers of the legs
/// of `ci`, in `order_seq` order.
async fn claim_order(
    env: &TestEnv,
    by_id: &HashMap<String, (u64, u64)>,
) -> BTreeMap<u64, Vec<u64>> {
    let rows = env
        .db
        .query(
            "select delivery_id, order_key from deliveries where destination = 'ci' \
             order by order_seq",
            &[],
        )
        .await
        .expect("legs");
    let mut order: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for row in rows {
        let id: String = row.get(0);
        let key: String = row.get(1);
        let (repository, n) = by_id[&id];
        assert_eq!(key, repository.to_string(), "keyed by the repository's id");
        order.entry(repository).or_default().push(n);
    }
    order
}

/// Each repository's events, in some order.
type ByRepository = BTreeMap<u64, Vec<u64>>;

/// Each repository's events as they first succeeded at the receiver, and
/// how many successes each event had.
fn successes(answers: &[Answer]) -> (ByRepository, HashMap<(u64, u64), usize>) {
    let mut order: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut count: HashMap<(u64, u64), usize> = HashMap::new();
    for &(repository, n, status) in answers {
        if status != 200 {
            continue;
        }
        let seen = count.entry((repository, n)).or_default();
        if *seen == 0 {
            order.entry(repository).or_default().push(n);
        }
        *seen += 1;
    }
    (order, count)
}

#[tokio::test]
async fn each_repository_s_events_reach_the_receiver_in_claim_order_and_a_halted_key_resumes_on_skip()
 {
    let env = TestEnv::new().await;
    let answers = Arc::new(Mutex::new(Vec::new()));
    let receiver = flaky_receiver(answers.clone()).await;
    let target = receiver
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/hook")
        .to_owned();
    let proxy = Proxy::start(&target).await;
    let config = env.config_file(&format!(
        r#"[[sources]]
name = "default"
secrets = ["{SECRET}"]
[[sources.destinations]]
name = "ci"
kind = "forward"
url = "http://127.0.0.1:{}/hook"
timeout_ms = 2000
ordering = "repository"
concurrency = 8
breaker = false
retry = ["50ms", "100ms", "200ms", "400ms", "800ms", "1s", "1s", "1s", "1s", "1s", "1s", "1s"]
"#,
        proxy.port()
    ));
    let ingest = env.ingest_on(&config).await;
    // Two workers, eight legs at once each: every key's legs race for the
    // same slots.
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut running = Vec::new();
    for _ in 0..2 {
        let worker = env.worker_on(&config, Default::default()).await;
        let shutdown = shutdown.clone();
        running.push(tokio::spawn(async move { worker.run(shutdown).await }));
    }

    // Interleaved across the repositories, sixteen requests at once: the
    // claim order of a repository's events is whatever ingest made of it.
    let hooks: Vec<(u64, u64, Hook)> = (0..EVENTS)
        .flat_map(|n| (0..REPOSITORIES).map(move |r| (r, n, event(r, n))))
        .collect();
    let by_id: HashMap<String, (u64, u64)> = hooks
        .iter()
        .map(|(r, n, hook)| (hook.id().to_owned(), (*r, *n)))
        .collect();
    let sending = futures::stream::iter(hooks.iter())
        .map(|(_, _, hook)| ingest.send(hook))
        .buffer_unordered(16)
        .collect::<Vec<_>>();
    // The receiver goes away once, in the middle of the run.
    let outage = async {
        wait_until("a third of the events", Duration::from_secs(60), || async {
            answers.lock().expect("lock").len() >= 300
        })
        .await;
        proxy.close();
        tokio::time::sleep(Duration::from_secs(1)).await;
        proxy.reopen();
    };
    let (sent, ()) = tokio::join!(sending, outage);
    assert!(sent.iter().all(|a| a.status == 202), "every event taken");

    // Everything but the poisoned key settles: its leg fails for good and
    // the key's later legs wait behind it.
    let poisoned_key = POISON.0.to_string();
    wait_until(
        "the other keys to finish",
        Duration::from_secs(180),
        || async {
            env.count(&format!(
                "select count(*) from deliveries where destination = 'ci' \
             and order_key <> '{poisoned_key}' and status <> 'completed'"
            ))
            .await
                == 0
                && env
                    .count(&format!(
                        "select count(*) from deliveries where destination = 'ci' \
                     and order_key = '{poisoned_key}' and status = 'failed' and not retryable"
                    ))
                    .await
                    == 1
        },
    )
    .await;
    let order = claim_order(&env, &by_id).await;
    let poisoned_at = order[&POISON.0]
        .iter()
        .position(|n| *n == POISON.1)
        .expect("the poisoned event");
    let behind = (EVENTS as usize - 1 - poisoned_at) as i64;
    wait_until(
        "the halted key's legs to wait",
        Duration::from_secs(30),
        || async {
            env.count(&format!(
                "select count(*) from deliveries where destination = 'ci' \
             and order_key = '{poisoned_key}' and last_error_class = 'ordered' \
             and status = 'failed'"
            ))
            .await
                == behind
        },
    )
    .await;

    // The halted key, as an operator sees it.
    let config_path = config.to_string_lossy().into_owned();
    let cli = |args: &[&str]| {
        let out = worker_command(&env, args, &[("HOOKINBOX_CONFIG", &config_path)])
            .output()
            .expect("runs");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = cli(&["destinations", "halted", "default/ci", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let halted: serde_json::Value = serde_json::from_str(&out).expect("json");
    let halted = halted.as_array().expect("a list");
    assert_eq!(halted.len(), 1, "{halted:?}");
    assert_eq!(halted[0]["key"], poisoned_key.as_str());
    assert_eq!(halted[0]["waiting"], behind);
    assert_eq!(halted[0]["error_class"], "permanent");
    let (code, _, err) = cli(&[
        "destinations",
        "skip",
        "default/ci",
        "99999",
        "--as",
        "alice",
    ]);
    assert_eq!(code, 2, "a key that is not halted is refused: {err}");
    assert!(err.contains("is not halted"), "{err}");

    let (code, out, err) = cli(&[
        "destinations",
        "skip",
        "default/ci",
        &poisoned_key,
        "--as",
        "alice",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("skipped"), "{out}");
    wait_until(
        "the halted key to finish",
        Duration::from_secs(120),
        || async {
            env.count(
            "select count(*) from deliveries where destination = 'ci' and status <> 'completed'",
        )
        .await
            == 1
        },
    )
    .await;
    shutdown.cancel();
    for worker in running {
        worker.await.expect("joins").expect("stops cleanly");
    }

    // Each repository's events first succeeded in claim order, each once;
    // the poisoned one never.
    let answers = answers.lock().expect("lock").clone();
    let (first_successes, count) = successes(&answers);
    for (repository, claimed) in &order {
        let expected: Vec<u64> = claimed
            .iter()
            .copied()
            .filter(|n| (*repository, *n) != POISON)
            .collect();
        assert_eq!(
            first_successes.get(repository),
            Some(&expected),
            "repository {repository}: first successes out of claim order"
        );
    }
    assert!(
        count.values().all(|c| *c == 1),
        "an event succeeded twice at the receiver"
    );
    assert_eq!(count.len(), (REPOSITORIES * EVENTS - 1) as usize);
    assert!(
        answers.iter().any(|a| a.2 == 503),
        "the receiver failed some requests"
    );
    let audit = env
        .count(
            "select count(*) from admin_audit where action = 'skip_halted_key' and actor = 'alice'",
        )
        .await;
    assert_eq!(audit, 1, "the skip is audited");
    assert_eq!(
        env.count(
            "select count(*) from deliveries where order_skipped_by = 'alice' and status = 'failed'"
        )
        .await,
        1,
        "the halting leg stays dead"
    );
    env.cleanup().await;
}
