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

/// The events that succeeded more than once though their first success
/// was not around the receiver's outage: answered among the last few before
/// the cut (`cut.0`, the answers given when it came) or while it lasted
/// (up to `cut.1`), with each success's position among the answers.
fn twice_outside_the_cut(answers: &[Answer], cut: (usize, usize)) -> Vec<((u64, u64), Vec<usize>)> {
    let mut at: BTreeMap<(u64, u64), Vec<usize>> = BTreeMap::new();
    for (i, &(repository, n, status)) in answers.iter().enumerate() {
        if status == 200 {
            at.entry((repository, n)).or_default().push(i);
        }
    }
    let from = cut.0.saturating_sub(2 * REPOSITORIES as usize);
    at.into_iter()
        .filter(|(_, at)| at.len() > 1 && !(from..=cut.1).contains(&at[0]))
        .collect()
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
    // The receiver goes away once, in the middle of the run; the answers
    // it had given when the cut came and when it was back bound the
    // requests the cut can have caught.
    let outage = async {
        wait_until("a third of the events", Duration::from_secs(60), || async {
            answers.lock().expect("lock").len() >= 300
        })
        .await;
        let cut_at = answers.lock().expect("lock").len();
        proxy.close();
        tokio::time::sleep(Duration::from_secs(1)).await;
        proxy.reopen();
        (cut_at, answers.lock().expect("lock").len())
    };
    let (sent, cut) = tokio::join!(sending, outage);
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
    // A second success is the price of an effect outside Postgres only
    // where the cut caught a request the receiver had answered: at most one
    // per repository (one of a key's legs is in flight at a time), and only
    // for an event that first succeeded around the cut.
    let twice = twice_outside_the_cut(&answers, cut);
    assert!(
        twice.is_empty(),
        "events succeeded twice at the receiver away from the cut: {twice:?} (cut at answer {}, back at {})",
        cut.0,
        cut.1
    );
    let around_the_cut = count.values().filter(|c| **c > 1).count();
    assert!(
        around_the_cut <= REPOSITORIES as usize,
        "{around_the_cut} events succeeded twice around the cut"
    );
    assert!(
        count.values().all(|c| *c <= 2),
        "an event succeeded three times"
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

/// A claim request for delivery `id` of the `default` source, with one leg
/// to `ci` keyed `key`.
fn ordered_request(id: &str, key: &str) -> hookinbox::deliveries::ClaimRequest {
    use hookinbox::key::{DeliveryId, DeliveryKey, DestinationName, HookId, SourceName};
    hookinbox::deliveries::ClaimRequest {
        origin: Default::default(),
        key: DeliveryKey::github(
            SourceName::default_source(),
            HookId::parse(Some(b"1")).expect("hook"),
            DeliveryId::parse(id.as_bytes()).expect("id"),
        ),
        event: "pull_request".into(),
        action: None,
        repository: None,
        body_sha256: sha2::Digest::finalize(sha2::Digest::chain_update(
            <sha2::Sha256 as sha2::Digest>::new(),
            id,
        ))
        .into(),
        guarded: false,
        pinned: false,
        legs: vec![hookinbox::deliveries::LegRequest {
            destination: DestinationName::parse("ci").expect("name"),
            filtered: None,
            order_key: Some(key.to_owned()),
            fair: None,
            stale_clock: None,
        }],
        body: hookinbox_tests::json_body(b"{}"),
    }
}

/// The holder of `leg` fails it for good (it halts its key).
async fn fail_for_good(
    client: &deadpool_postgres::Client,
    leg: &hookinbox::key::LegKey,
    token: hookinbox::key::ClaimToken,
) {
    use hookinbox::deliveries;
    deliveries::fail(
        client,
        leg,
        token,
        &deliveries::Failure {
            class: deliveries::ErrorClass::Permanent,
            message: "no".into(),
            retry_in: None,
        },
    )
    .await
    .expect("fail");
}

async fn place(env: &TestEnv, id: &str) -> i64 {
    env.db
        .query_one(
            "select order_seq from deliveries where delivery_id = $1",
            &[&id],
        )
        .await
        .expect("leg")
        .get(0)
}

#[tokio::test]
async fn a_batch_of_claims_gives_a_key_its_places_in_arrival_order_not_key_order() {
    let env = TestEnv::new().await;
    // One statement, the later-sorting id first: its place comes first.
    let batch = [
        ordered_request("zz-opened", "9#1"),
        ordered_request("aa-labeled", "9#1"),
        ordered_request("mm-closed", "9#1"),
    ];
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    hookinbox::deliveries::claim_batch(&client, &env.policy(), &batch)
        .await
        .expect("claims");
    drop(client);
    let (opened, labeled, closed) = (
        place(&env, "zz-opened").await,
        place(&env, "aa-labeled").await,
        place(&env, "mm-closed").await,
    );
    assert!(
        opened < labeled && labeled < closed,
        "{opened} {labeled} {closed}"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn a_waiting_leg_outlives_the_retention_of_failed_legs_and_a_skipped_leg_stays_skipped_when_its_replay_does_not_go_out()
 {
    use hookinbox::deliveries::{self, Replayed, Retention, Take};
    let env = TestEnv::new().await;
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    let policy = env.policy();
    let batch = [
        ordered_request("first", "5"),
        ordered_request("second", "5"),
    ];
    let claims = deliveries::claim_batch(&client, &policy, &batch)
        .await
        .expect("claims");
    let tokens: Vec<_> = claims
        .iter()
        .map(|c| hookinbox_tests::claimed_token(c).expect("claimed"))
        .collect();
    let legs: Vec<_> = batch
        .iter()
        .map(|r| r.key.clone().leg(r.legs[0].destination.clone()))
        .collect();
    let first = deliveries::take(&client, &policy, &legs[0], tokens[0], 3)
        .await
        .expect("take");
    let Take::Taken { token, .. } = first else {
        panic!("the first leg is taken: {first:?}");
    };
    let second = deliveries::take(&client, &policy, &legs[1], tokens[1], 3)
        .await
        .expect("take");
    assert_eq!(second, Take::Waiting);
    fail_for_good(&client, &legs[0], token).await;
    // Both failed long ago: the dead leg goes, the waiting one stays.
    env.db
        .execute(
            "update deliveries set failed_at = now() - interval '100 days'",
            &[],
        )
        .await
        .expect("age");
    let retention = Retention {
        completed: Duration::from_secs(86_400),
        failed: Duration::from_secs(86_400),
        events: None,
        bodies: Duration::from_secs(7 * 86_400),
    };
    deliveries::sweep(&client, &retention, 100)
        .await
        .expect("sweep");
    assert_eq!(
        env.count("select count(*) from deliveries where last_error_class = 'ordered'")
            .await,
        1,
        "the waiting leg is kept"
    );
    assert_eq!(env.count("select count(*) from deliveries").await, 1);

    // A skipped leg whose replay is not published is skipped again.
    let third = ordered_request("third", "6");
    let fourth = ordered_request("fourth", "6");
    let claims = deliveries::claim_batch(&client, &policy, &[third.clone(), fourth.clone()])
        .await
        .expect("claims");
    let leg = third.key.clone().leg(third.legs[0].destination.clone());
    let presented = hookinbox_tests::claimed_token(&claims[0]).expect("claimed");
    let Take::Taken { token, .. } = deliveries::take(&client, &policy, &leg, presented, 3)
        .await
        .expect("take")
    else {
        panic!("taken");
    };
    fail_for_good(&client, &leg, token).await;
    let source = hookinbox::key::SourceName::default_source();
    let ci = hookinbox::key::DestinationName::parse("ci").expect("name");
    assert!(
        deliveries::skip(&client, &source, &ci, "6", "alice")
            .await
            .expect("skip")
            .is_some()
    );
    let before = place(&env, "third").await;
    let Replayed::Started(job) =
        deliveries::replay(&client, &policy, &leg, deliveries::Scope::Failed)
            .await
            .expect("replay")
    else {
        panic!("replayed");
    };
    assert!(
        place(&env, "third").await > place(&env, "fourth").await
            && before < place(&env, "fourth").await,
        "a skipped leg replayed goes to the back of its key"
    );
    assert!(
        deliveries::unreplay(&client, &leg, job.envelope.token, "publish failed")
            .await
            .expect("unreplay")
    );
    assert_eq!(
        env.count(
            "select count(*) from deliveries where delivery_id = 'third' \
             and status = 'failed' and order_skipped_at is not null and order_skipped_by = 'alice'"
        )
        .await,
        1,
        "skipped again, not a halt of its key"
    );
    assert!(
        deliveries::halted(&client, &source, &ci, Some("6"), 10)
            .await
            .expect("halted")
            .is_empty()
    );
    drop(client);
    env.cleanup().await;
}
