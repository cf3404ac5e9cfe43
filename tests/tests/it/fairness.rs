//! Fairness: while one installation floods a slow destination, another
//! installation's legs do not wait behind the flood; the flood's legs that
//! the claim holds in Postgres, or that yield their turn, spend no attempt
//! and are not lost. With fairness off,
//! the same run leaves the second installation behind the whole flood.

use std::time::Duration;

use futures::StreamExt;
use hookinbox_tests::receiver::{Receiver, Reply};
use hookinbox_tests::{Hook, SECRET, TestEnv};

/// The flooding installation's legs, and the other's.
const FLOOD: usize = 150;
const OTHER: usize = 5;

fn event(installation: u64, n: usize) -> Hook {
    Hook::new(
        "issues",
        format!(
            r#"{{"action":"edited","installation":{{"id":{installation}}},"repository":{{"id":{installation},"full_name":"acme/i{installation}"}},"n":{n}}}"#
        ),
    )
}

/// Queues a flood of the first installation's legs for a destination (two
/// legs at once, 100 ms each), then the second's behind it, then starts a
/// worker; returns how many of the flood's legs had completed when the
/// second installation's last did.
async fn flood_then_other(fairness: bool) -> usize {
    let env = TestEnv::new().await;
    let receiver = Receiver::start(|_, _| Reply {
        delay: Duration::from_millis(100),
        ..Reply::status(200)
    })
    .await;
    let config = env.config_file(&format!(
        r#"[[sources]]
name = "default"
secrets = ["{SECRET}"]
[[sources.destinations]]
name = "slow"
kind = "forward"
url = "{}"
timeout_ms = 10000
concurrency = 2
breaker = false
fairness = {fairness}
"#,
        receiver.url
    ));
    let ingest = env.ingest_on(&config).await;

    let flood: Vec<Hook> = (0..FLOOD).map(|n| event(1, n)).collect();
    let answers = futures::stream::iter(flood.iter())
        .map(|hook| ingest.send(hook))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    assert!(answers.iter().all(|a| a.status == 202), "the flood taken");
    for n in 0..OTHER {
        assert_eq!(ingest.send(&event(2, n)).await.status, 202);
    }
    // With fairness on, the claim holds the flood in Postgres once its
    // installation has a share queued (1 here: half of `concurrency`, no
    // worker counted on the queue yet): only a few of its
    // legs (those whose claims ran beside each other, 16 sends at once)
    // reach the queue ahead of the other installation's.
    let queued = env
        .count(
            "select count(*) from deliveries where repository = 'acme/i1' and status = 'processing'",
        )
        .await;
    let held = env
        .count(
            "select count(*) from deliveries where repository = 'acme/i1' \
             and status = 'failed' and last_error_class = 'fair'",
        )
        .await;
    eprintln!("fairness {fairness}: the flood's legs queued {queued}, held at the claim {held}");
    if fairness {
        assert_eq!(
            queued + held,
            FLOOD as i64,
            "every flood leg queued or held"
        );
        assert!(queued <= 32, "{queued} of the flood's legs were queued");
    } else {
        assert_eq!(
            queued, FLOOD as i64,
            "with fairness off the whole flood is queued"
        );
    }
    // The worker starts on the whole backlog: the flood first in the
    // queue, the other installation's legs behind it.
    env.run_worker_until_completed(&config, Duration::from_secs(120))
        .await;

    assert_eq!(
        env.count("select count(*) from deliveries").await,
        (FLOOD + OTHER) as i64,
        "every leg claimed"
    );
    assert_eq!(
        env.count("select count(*) from deliveries where attempts <> 1")
            .await,
        0,
        "a leg that yielded its turn spent no attempt"
    );
    let requests = receiver.received();
    assert_eq!(requests.len(), FLOOD + OTHER, "each leg sent once");
    assert_eq!(
        env.count("select count(*) from bodies").await,
        (FLOOD + OTHER) as i64,
        "one body a delivery, written once by its claim: a leg that waited wrote none"
    );
    let before = env
        .count(
            "select count(*) from deliveries \
             where repository = 'acme/i1' and completed_at < \
                   (select max(completed_at) from deliveries where repository = 'acme/i2')",
        )
        .await as usize;
    env.cleanup().await;
    before
}

#[tokio::test]
async fn a_flooding_installation_does_not_hold_back_another_and_its_held_legs_all_complete() {
    let before = flood_then_other(true).await;
    eprintln!("fairness on: the other installation finished behind {before} of {FLOOD}");
    assert!(
        before <= 40,
        "the other installation finished behind {before} of the flood's {FLOOD} legs"
    );
}

#[tokio::test]
async fn with_fairness_off_another_installation_waits_behind_the_flood() {
    let before = flood_then_other(false).await;
    eprintln!("fairness off: the other installation finished behind {before} of {FLOOD}");
    assert!(
        before > FLOOD * 3 / 4,
        "with fairness off the other installation finished behind only {before} of {FLOOD}"
    );
}

/// A hold that comes only after the claim's lease and the reaper's grace
/// ran out (ingest stalled between its claim and its hold): the reaper has
/// marked the claim `lost`, keeping its token, and ingest answers 202, so
/// the hold must still park the body, or nothing could finish the leg. A
/// claim taken since (another token) is never held over.
#[tokio::test]
async fn a_hold_after_the_reaper_marked_the_claim_lost_still_parks_the_body() {
    use hookinbox::deliveries;

    let env = TestEnv::new().await;
    let hook = Hook::fixture("push");
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    let fair = deliveries::LegRequest {
        fair: Some((String::new(), 1, false)),
        ..hookinbox_tests::store_leg()
    };
    let token = env.claim_expired(&client, &hook, fair).await;
    assert_eq!(env.reap_now().await, 1, "the reaper marks the claim lost");

    let other = hookinbox::ClaimToken(uuid::Uuid::new_v4());
    assert!(
        !deliveries::hold_fair(&client, &hook.leg(), other, 0)
            .await
            .expect("hold"),
        "a claim under another token is not held over"
    );
    assert!(
        deliveries::hold_fair(&client, &hook.leg(), token, 0)
            .await
            .expect("hold"),
        "the lost claim's own hold holds it"
    );
    assert_eq!(
        env.count(
            "select count(*) from deliveries d join bodies b \
             on b.provider = d.provider and b.source = d.source and b.hook_id = d.hook_id \
              and b.delivery_id = d.delivery_id and b.received_at = d.created_at \
             where d.status = 'failed' and d.retryable and d.next_attempt_at is null \
               and d.last_error_class = 'fair' and d.attempts = 0"
        )
        .await,
        1,
        "waiting for its installation's turn, with its body, no attempt spent"
    );
    env.cleanup().await;
}

/// The legs held for their installation's turn.
const HELD: &str =
    "select count(*) from deliveries where status = 'failed' and last_error_class = 'fair'";

/// A `store` destination with `concurrency = 4`: a share of 2, a hold of 2
/// legs queued with one worker or none, a round of 4 queued and running.
fn store_of_four(env: &TestEnv) -> std::path::PathBuf {
    env.config_file(&format!(
        "[[sources]]\nname = \"default\"\nsecrets = [\"{SECRET}\"]\n\
         [[sources.destinations]]\nname = \"store\"\nkind = \"store\"\nconcurrency = 4\n"
    ))
}

/// Marks the legs `filter` selects completed now, as if they ended with
/// no worker to release what waits behind them.
async fn end_legs(env: &TestEnv, filter: &str) {
    env.db
        .execute(
            &format!(
                "update deliveries set status = 'completed', completed_at = now(), \
                 lease_until = null, retryable = false {filter}"
            ),
            &[],
        )
        .await
        .expect("ended");
}

/// Releases that never came (the legs ended with a worker that died after
/// completing them, or that did not yet know legs waited): one scheduler
/// pass makes up the installation's whole room under its hold, not one
/// leg, and every held leg then completes once.
#[tokio::test]
async fn one_scheduler_pass_makes_up_every_release_that_never_came() {
    let env = TestEnv::new().await;
    let config = store_of_four(&env);
    let ingest = env.ingest_on(&config).await;
    for n in 0..12 {
        assert_eq!(ingest.send(&event(1, n)).await.status, 202);
    }
    assert_eq!(
        env.count(HELD).await,
        8,
        "past a round of 4 queued and running (none running), held"
    );
    // The four queued legs end, and no release follows.
    end_legs(&env, "where status = 'processing'").await;
    let worker = env.worker_on(&config, Default::default()).await;
    assert_eq!(
        worker.schedule_once().await.expect("a pass"),
        2,
        "the pass published the installation's whole room under its hold"
    );
    assert_eq!(env.count(HELD).await, 6);
    env.run_worker_until_completed(&config, Duration::from_secs(60))
        .await;
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'completed'")
            .await,
        12
    );
    assert_eq!(env.events().await, 8, "each held leg's effect once");
    env.cleanup().await;
}

/// A fast destination's hold grows with its pace: at 200 legs completed a
/// second (as the sampler measured it), an installation may have what the
/// destination completes in 50 ms queued (10 legs) before its new legs
/// are held, not only a share (2 with `concurrency = 4`), while it serves
/// several installations; while it served one alone, what it completes in
/// a second (200). The sampler's statement measures the pace and counts
/// the installations from the legs completed over the last ten seconds.
#[tokio::test]
async fn a_fast_destinations_hold_grows_with_its_pace() {
    let env = TestEnv::new().await;
    let config = store_of_four(&env);
    env.db
        .execute(
            "insert into destinations (source, name, kind, consumers, fair_rate, fair_keys) \
             values ('default', 'store', 'store', 1, 200, 2)",
            &[],
        )
        .await
        .expect("a destination measured at 200 legs a second, for two installations");
    let ingest = env.ingest_on(&config).await;
    // Its share (2) running: the destination is busy with it.
    let taken = "update deliveries set attempts = 1 where status = 'processing'";
    for n in 0..2 {
        assert_eq!(ingest.send(&event(1, n)).await.status, 202);
    }
    env.db.execute(taken, &[]).await.expect("taken");
    for n in 2..14 {
        assert_eq!(ingest.send(&event(1, n)).await.status, 202);
    }
    assert_eq!(env.count(HELD).await, 2, "past the hold of 10, held");
    end_legs(&env, "where status = 'processing'").await;
    env.db
        .execute("update destinations set fair_keys = 1", &[])
        .await
        .expect("one installation served");
    for n in 14..16 {
        assert_eq!(ingest.send(&event(3, n)).await.status, 202);
    }
    env.db.execute(taken, &[]).await.expect("taken");
    for n in 16..28 {
        assert_eq!(ingest.send(&event(3, n)).await.status, 202);
    }
    assert_eq!(
        env.count(HELD).await,
        2,
        "alone, an installation's hold is a second of the pace: none held"
    );

    // The pace as the sampler records it: 30 legs completed within the
    // last ten seconds are 3 a second.
    end_legs(&env, "").await;
    for n in 28..30 {
        assert_eq!(ingest.send(&event(2, n)).await.status, 202);
    }
    end_legs(&env, "").await;
    let pool = env.pool(1);
    let client = pool.get().await.expect("a connection");
    hookinbox::deliveries::set_consumers(
        &client,
        &hookinbox::SourceName::default_source(),
        &hookinbox_tests::store_destination(),
        1,
    )
    .await
    .expect("recorded");
    assert_eq!(
        env.count("select fair_rate::int8 from destinations").await,
        3
    );
    assert_eq!(
        env.count("select fair_keys::int8 from destinations").await,
        3,
        "three installations served"
    );
    drop(client);
    drop(pool);
    env.cleanup().await;
}
