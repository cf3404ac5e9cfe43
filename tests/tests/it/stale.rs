//! `skip_stale`: a destination ordered by pull request skips a leg whose
//! payload's `updated_at` is older than that of a completed leg of its key
//! (GitHub's arrival order is not its event order), and completes it
//! without the effect, class `stale`; the same events through a destination
//! without it all arrive.

use std::time::Duration;

use hookinbox_tests::receiver::{Receiver, Reply};
use hookinbox_tests::{Hook, SECRET, TestEnv};

/// A `pull_request` event of pull request `number` of one repository,
/// numbered `n`, updated at `updated_at` (none when `None`).
fn event(number: u64, n: u64, updated_at: Option<&str>) -> Hook {
    let updated = updated_at
        .map(|t| format!(r#","updated_at":"{t}""#))
        .unwrap_or_default();
    Hook::new(
        "pull_request",
        format!(
            r#"{{"action":"synchronize","number":{number},"pull_request":{{"number":{number}{updated}}},"repository":{{"id":9,"full_name":"acme/stale"}},"n":{n}}}"#
        ),
    )
}

/// The `n` of each request a receiver got, in arrival order.
fn numbers(receiver: &Receiver) -> Vec<u64> {
    receiver
        .received()
        .iter()
        .map(|r| {
            let body: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
            body["n"].as_u64().expect("n")
        })
        .collect()
}

#[tokio::test]
async fn a_leg_older_than_a_completed_one_of_its_pull_request_is_skipped_and_counted_stale() {
    let env = TestEnv::new().await;
    let skip = Receiver::start(|_, _| Reply::status(200)).await;
    let all = Receiver::start(|_, _| Reply::status(200)).await;
    let config = env.config_file(&format!(
        r#"[[sources]]
name = "default"
secrets = ["{SECRET}"]
[[sources.destinations]]
name = "skip"
kind = "forward"
url = "{}"
breaker = false
ordering = "pull_request"
skip_stale = true
[[sources.destinations]]
name = "all"
kind = "forward"
url = "{}"
breaker = false
ordering = "pull_request"
"#,
        skip.url, all.url
    ));
    let ingest = env.ingest_on(&config).await;
    // In claim order: 2 is older than 1 (it arrived late), 4 is as old as
    // 3 (not older), 5 is another pull request's, 6 has no time.
    let events = [
        event(1, 1, Some("2026-01-01T10:00:02Z")),
        event(1, 2, Some("2026-01-01T10:00:01Z")),
        event(1, 3, Some("2026-01-01T10:00:03Z")),
        event(1, 4, Some("2026-01-01T10:00:03Z")),
        event(2, 5, Some("2026-01-01T09:00:00Z")),
        event(1, 6, None),
    ];
    for hook in &events {
        assert_eq!(ingest.send(hook).await.status, 202);
    }
    env.run_worker_until_completed(&config, Duration::from_secs(60))
        .await;

    let mut got = numbers(&skip);
    got.sort_unstable();
    assert_eq!(
        got,
        vec![1, 3, 4, 5, 6],
        "the stale leg (2) skipped, once each"
    );
    let mut got = numbers(&all);
    got.sort_unstable();
    assert_eq!(
        got,
        vec![1, 2, 3, 4, 5, 6],
        "without skip_stale every leg arrives"
    );
    let stale = env
        .db
        .query(
            "select destination, last_error_class, attempts, stale_clock is not null \
             from deliveries where last_error_class = 'stale'",
            &[],
        )
        .await
        .expect("stale legs");
    assert_eq!(stale.len(), 1, "one leg completed as stale");
    assert_eq!(stale[0].get::<_, String>(0), "skip");
    assert_eq!(stale[0].get::<_, i32>(2), 1, "its take counted one attempt");
    assert_eq!(
        env.count(
            "select count(*) from deliveries where destination = 'all' and stale_clock is not null"
        )
        .await,
        0,
        "only a skip_stale destination's legs carry the time"
    );
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'failed'")
            .await,
        0,
        "no leg left waiting"
    );
    env.cleanup().await;
}
