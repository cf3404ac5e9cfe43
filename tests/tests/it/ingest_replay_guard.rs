//! The replay guard: GitHub signs only the body, so a captured request
//! resent under a fresh `X-GitHub-Delivery` or another `X-GitHub-Hook-ID`
//! verifies. Ingest refuses a body its source received before under another
//! delivery id, unless the source turns the guard off. The same delivery id
//! and body under another hook id is one event sent to two hooks: a source
//! that pins both takes it once per hook; one that does not answers the
//! second as a duplicate, a copy of the first, without a claim.

use std::path::PathBuf;

use futures::future::join_all;
use hookinbox::deliveries::{self, Claim, ClaimRequest, LegClaim, Status};
use hookinbox_tests::{Hook, SECRET, TestEnv, fixtures, worker_cli};
use sha2::{Digest, Sha256};

fn write_config(env: &TestEnv, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("{}.toml", env.prefix));
    std::fs::write(&path, text).expect("write config");
    path
}

/// `hook` with a fresh delivery id: the same signed bytes, a new key.
fn under_new_guid(hook: &Hook) -> Hook {
    let mut replay = hook.clone();
    replay.delivery = Some(uuid::Uuid::new_v4().to_string());
    replay
}

#[tokio::test]
async fn a_body_resent_under_a_new_guid_is_refused_409_counted_and_claims_nothing() {
    let env = TestEnv::new().await;
    let ingest = env.spawn("hookinbox-ingest", &[("HOOKINBOX_GITHUB_SECRET", SECRET)]);
    ingest.wait_ready().await;
    let base = format!("http://127.0.0.1:{}", ingest.port);
    let http = reqwest::Client::new();

    let original = Hook::fixture("push");
    let first = original.post(&http, &base).await;
    assert_eq!((first.status, first.kind()), (202, "accepted"));

    let new_guid = under_new_guid(&original);
    // Under a new delivery id, and under a new one and another hook id.
    let mut other_hook = under_new_guid(&original);
    other_hook.hook_id = Some("654321".to_owned());
    for replay in [&new_guid, &other_hook] {
        let answer = replay.post(&http, &base).await;
        assert_eq!(answer.status, 409, "{:?}", answer.body);
        assert_eq!(
            answer.body["error"],
            "this body was received before under another delivery id"
        );
    }
    // GitHub's own redelivery keeps its delivery id: still a duplicate.
    let again = original.post(&http, &base).await;
    assert_eq!((again.status, again.kind()), (202, "duplicate"));

    assert_eq!(env.deliveries().await, 1, "a refused replay claims nothing");
    assert_eq!(env.count("select count(*) from seen_bodies").await, 1);
    let (_, metrics) = ingest.scrape("/metrics").await;
    let replayed = metrics
        .lines()
        .find(|l| l.contains("outcome=\"replayed_body\""))
        .unwrap_or_else(|| panic!("no replayed_body series in:\n{metrics}"));
    assert!(replayed.ends_with(" 2"), "{replayed}");
    let logs = ingest.logs();
    assert_eq!(logs.matches("\"outcome\":\"replayed_body\"").count(), 2);
    env.cleanup().await;
}

/// GitHub sends one event to every hook that subscribes to it with the
/// same delivery id: two hooks of a source that does not pin them (a
/// repository's and an organization's, say) bring it twice. The second is
/// a copy, not a replay: `200 duplicate`, no claim, no effect, counted as
/// `copy`. Answered 409, GitHub would show it failed and the reconciler
/// would redeliver it until capped.
#[tokio::test]
async fn one_event_sent_to_two_hooks_of_an_unpinned_source_is_a_copy_answered_200_without_a_claim()
{
    let env = TestEnv::new().await;
    let ingest = env.spawn("hookinbox-ingest", &[("HOOKINBOX_GITHUB_SECRET", SECRET)]);
    ingest.wait_ready().await;
    let base = format!("http://127.0.0.1:{}", ingest.port);
    let http = reqwest::Client::new();

    let to_repo_hook = Hook::fixture("push");
    let first = to_repo_hook.post(&http, &base).await;
    assert_eq!((first.status, first.kind()), (202, "accepted"));
    let mut to_org_hook = to_repo_hook.clone();
    to_org_hook.hook_id = Some("654321".to_owned());
    // Nobody took the first claim yet: the copy is answered, and writes
    // nothing (the first claim wrote the body, in case its ingest died
    // before publishing).
    for _ in 0..2 {
        let copy = to_org_hook.post(&http, &base).await;
        assert_eq!(
            (copy.status, copy.kind()),
            (200, "duplicate"),
            "{:?}",
            copy.body
        );
        assert_eq!(copy.body["copy_of_hook_id"], "123456");
        assert_eq!(copy.body["state"], "processing");
    }
    assert_eq!(env.deliveries().await, 1, "a copy claims nothing");
    assert_eq!(
        env.count("select count(*) from deliveries where hook_id = '654321'")
            .await,
        0
    );
    assert_eq!(
        env.count("select count(*) from bodies").await,
        1,
        "one body, the first claim's"
    );
    assert_eq!(env.count("select count(*) from seen_bodies").await, 1);

    let worker = env.store_worker().await;
    worker.drain().await.expect("drain");
    assert_eq!(env.events().await, 1, "one event, one effect");
    // Once the first is completed, a copy (GitHub redelivering to the
    // second hook, say) says so.
    let copy = to_org_hook.post(&http, &base).await;
    assert_eq!(
        (copy.status, copy.body["state"].as_str()),
        (200, Some("completed"))
    );
    assert_eq!(env.deliveries().await, 1);
    worker.drain().await.expect("drain");
    assert_eq!(env.events().await, 1);

    let (_, metrics) = ingest.scrape("/metrics").await;
    let copies = metrics
        .lines()
        .find(|l| l.contains("outcome=\"copy\""))
        .unwrap_or_else(|| panic!("no copy series in:\n{metrics}"));
    assert!(copies.ends_with(" 3"), "{copies}");
    assert!(!metrics.contains("outcome=\"replayed_body\""), "{metrics}");
    assert_eq!(ingest.logs().matches("\"outcome\":\"copy\"").count(), 3);
    env.cleanup().await;
}

/// The claim batch agrees with the single claim on the guard's answers:
/// the first copy of an event claims it, another hook's copy is a copy of
/// it, and the body under a new delivery id is a replay; the neighbours in
/// the batch are claimed all the same.
#[tokio::test]
async fn a_claim_batch_answers_copies_and_replays_as_single_claims_do() {
    let env = TestEnv::new().await;
    let policy = env.policy();
    let event = Hook::fixture("push");
    let mut copy = event.clone();
    copy.hook_id = Some("654321".to_owned());
    let replay = under_new_guid(&event);
    let neighbour = Hook::fixture("issues");
    let request = |hook: &Hook| ClaimRequest {
        origin: Default::default(),
        key: hook.key(),
        event: "push".to_owned(),
        action: None,
        repository: None,
        body_sha256: Sha256::digest(&hook.body).into(),
        guarded: true,
        pinned: false,
        legs: vec![hookinbox_tests::store_leg()],
        body: hookinbox_tests::json_body(&hook.body),
    };
    let requests: Vec<ClaimRequest> = [&event, &copy, &replay, &neighbour]
        .into_iter()
        .map(request)
        .collect();
    let client = env.pool(1).get().await.expect("client");
    let batch = deliveries::claim_batch(&client, &policy, &requests)
        .await
        .expect("the batch answers each request");
    assert!(
        hookinbox_tests::claimed_token(&batch[0]).is_some(),
        "{batch:?}"
    );
    assert_eq!(
        batch[1],
        Claim::Copy {
            of: event.key(),
            legs: vec![(hookinbox_tests::store_destination(), Status::Processing)]
        }
    );
    assert_eq!(batch[2], Claim::ReplayedBody);
    assert!(
        hookinbox_tests::claimed_token(&batch[3]).is_some(),
        "{batch:?}"
    );
    assert_eq!(env.deliveries().await, 2);

    // Alone, each is answered the same (now as duplicates of the batch's).
    let processing = Claim::Legs(vec![(
        hookinbox_tests::store_destination(),
        LegClaim::Duplicate(Status::Processing),
    )]);
    for (i, expected) in [
        processing.clone(),
        batch[1].clone(),
        Claim::ReplayedBody,
        processing,
    ]
    .into_iter()
    .enumerate()
    {
        let alone = deliveries::claim(&client, &policy, &requests[i])
            .await
            .expect("claim");
        assert_eq!(alone, expected, "request {i}");
    }
    assert_eq!(env.deliveries().await, 2);
    drop(client);
    env.cleanup().await;
}

/// GitHub sends both hooks' copies at once: racing through ingest's claim
/// batches, one of them claims the event and every other is its copy.
#[tokio::test]
async fn copies_of_one_event_racing_to_many_hooks_get_one_claim_and_one_effect() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let event = Hook::fixture("push");
    let copies: Vec<Hook> = (1..=30)
        .map(|i| {
            let mut copy = event.clone();
            copy.hook_id = Some(format!("{}", 1000 + i));
            copy
        })
        .collect();
    let good: Vec<Hook> = (0..30).map(|_| Hook::fixture("issues")).collect();
    let sends = copies
        .iter()
        .zip(&good)
        .flat_map(|(c, g)| [ingest.send(c), ingest.send(g)]);
    let answers = join_all(sends).await;
    let (copy_answers, good_answers): (Vec<_>, Vec<_>) = answers
        .into_iter()
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    let accepted = copy_answers.iter().filter(|(_, a)| a.status == 202).count();
    let copied = copy_answers
        .iter()
        .filter(|(_, a)| a.status == 200 && a.kind() == "duplicate")
        .count();
    assert_eq!((accepted, copied), (1, 29), "{copy_answers:?}");
    assert!(good_answers.iter().all(|(_, a)| a.status == 202));
    assert_eq!(env.deliveries().await, 31);
    let worker = env.store_worker().await;
    worker.drain().await.expect("drain");
    assert_eq!(
        env.count("select count(*) from github_events where event = 'push'")
            .await,
        1
    );
    env.cleanup().await;
}

#[tokio::test]
async fn a_source_that_pins_its_hooks_takes_one_event_sent_to_two_of_them() {
    let env = TestEnv::new().await;
    let path = write_config(
        &env,
        &format!(
            "[[sources]]\nname = \"pinned\"\nsecrets = [\"{SECRET}\"]\nhook_ids = [111, 222]\n"
        ),
    );
    let mut args = env.ingest_args();
    args.sources.github_secret = None;
    args.sources.config = Some(path.clone());
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let mut wargs = env.worker_args();
    wargs.sources.config = Some(path.clone());
    let worker = env
        .worker_with(
            wargs.validate().expect("valid"),
            std::sync::Arc::new(hookinbox_worker::Store),
        )
        .await;

    let mut to_111 = Hook::fixture("push");
    to_111.path = "/webhooks/github/pinned".to_owned();
    to_111.hook_id = Some("111".to_owned());
    let mut to_222 = to_111.clone();
    to_222.hook_id = Some("222".to_owned());
    for hook in [&to_111, &to_222] {
        let answer = ingest.send(hook).await;
        assert_eq!((answer.status, answer.kind()), (202, "accepted"));
    }
    // The same bytes under a new delivery id are still a replay.
    let replay = ingest.send(&under_new_guid(&to_222)).await;
    assert_eq!(replay.status, 409, "{:?}", replay.body);

    worker.drain().await.expect("drain");
    assert_eq!(env.events().await, 2, "one event, one effect per hook");
    assert_eq!(
        env.count("select count(distinct hook_id) from github_events")
            .await,
        2
    );
    let _ = std::fs::remove_file(path);
    env.cleanup().await;
}

#[tokio::test]
async fn with_the_guard_off_a_repeated_body_is_taken_and_only_that_source_is_affected() {
    // The default source, by environment.
    let env = TestEnv::new().await;
    let mut args = env.ingest_args();
    args.sources.replay_guard = Some(false);
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let hook = Hook::fixture("push");
    for h in [hook.clone(), under_new_guid(&hook)] {
        assert_eq!(ingest.send(&h).await.status, 202);
    }
    assert_eq!(env.deliveries().await, 2);
    assert_eq!(env.count("select count(*) from seen_bodies").await, 0);
    env.cleanup().await;

    // Two sources in a file: one turns it off, the other keeps it.
    let env = TestEnv::new().await;
    let path = write_config(
        &env,
        &format!(
            "[[sources]]\nname = \"repeats\"\nsecrets = [\"{SECRET}\"]\nreplay_guard = false\n\n\
             [[sources]]\nname = \"guarded\"\nsecrets = [\"{SECRET}\"]\n"
        ),
    );
    let mut args = env.ingest_args();
    args.sources.github_secret = None;
    args.sources.config = Some(path.clone());
    let ingest = env.ingest_with(args.validate().expect("valid")).await;
    let body = fixtures::unique(&fixtures::own("push"));
    for (source, second) in [("repeats", 202), ("guarded", 409)] {
        let mut hook = Hook::new("push", body.clone());
        hook.path = format!("/webhooks/github/{source}");
        assert_eq!(ingest.send(&hook).await.status, 202, "{source}");
        assert_eq!(
            ingest.send(&under_new_guid(&hook)).await.status,
            second,
            "{source}"
        );
    }
    let _ = std::fs::remove_file(path);
    env.cleanup().await;
}

#[tokio::test]
async fn replays_racing_in_one_claim_batch_get_one_claim_and_their_neighbours_are_unharmed() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let captured = Hook::fixture("issues");
    let replays: Vec<Hook> = (0..40).map(|_| under_new_guid(&captured)).collect();
    let good: Vec<Hook> = (0..40).map(|_| Hook::fixture("push")).collect();
    let sends = replays
        .iter()
        .zip(&good)
        .flat_map(|(r, g)| [ingest.send(r), ingest.send(g)]);
    let answers = join_all(sends).await;
    let (replay_answers, good_answers): (Vec<_>, Vec<_>) = answers
        .into_iter()
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    let accepted = replay_answers
        .iter()
        .filter(|(_, a)| a.status == 202)
        .count();
    let refused = replay_answers
        .iter()
        .filter(|(_, a)| a.status == 409)
        .count();
    assert_eq!((accepted, refused), (1, 39), "one copy wins the race");
    assert!(
        good_answers.iter().all(|(_, a)| a.status == 202),
        "a replay in a batch does not fail its neighbours"
    );
    assert_eq!(env.deliveries().await, 41);
    env.cleanup().await;
}

#[tokio::test]
async fn the_guard_remembers_a_body_for_the_completed_retention_then_forgets_it() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);
    // Within the retention, the sweep keeps the body (nothing swept, exit
    // 1): still refused.
    let (code, out) = worker_cli(&env, &["sweep"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(ingest.send(&under_new_guid(&hook)).await.status, 409);
    // Past it (30 days by default), the sweep forgets it.
    env.db
        .batch_execute("update seen_bodies set seen_at = now() - interval '31 days'")
        .await
        .expect("age");
    let (code, out) = worker_cli(&env, &["sweep"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("1 remembered bodies"), "{out}");
    assert_eq!(env.count("select count(*) from seen_bodies").await, 0);
    assert_eq!(ingest.send(&under_new_guid(&hook)).await.status, 202);
    env.cleanup().await;
}
