//! The real GitHub corpus through the whole pipeline.

use hookinbox_tests::{Hook, TestEnv, fixtures};

#[tokio::test]
async fn every_fixture_is_accepted_by_the_replay_guard_stored_once_and_redelivery_adds_nothing() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let worker = env.store_worker().await;
    let fixtures = fixtures::all();
    let mut sent = Vec::new();
    let mut pings = 0;
    for fixture in &fixtures {
        let hook = Hook::new(&fixture.event, fixture.body.clone());
        let answer = ingest.send(&hook).await;
        if fixture.event == "ping" {
            assert_eq!(
                (answer.status, answer.kind()),
                (200, "pong"),
                "{}",
                fixture.path.display()
            );
            pings += 1;
            continue;
        }
        assert_eq!(
            (answer.status, answer.kind()),
            (202, "accepted"),
            "{}: {:?}",
            fixture.path.display(),
            answer.body
        );
        sent.push(hook);
    }
    let report = worker.drain().await.expect("drain");
    assert_eq!(report.outcomes.len(), sent.len());
    assert_eq!(
        report.count(hookinbox_worker::JobOutcome::Completed),
        sent.len()
    );
    assert_eq!(env.events().await, sent.len() as i64);
    // Each payload under its own delivery id, with the replay guard on: no
    // two of them collide.
    assert_eq!(
        env.count("select count(*) from seen_bodies").await,
        sent.len() as i64
    );
    assert_eq!(
        env.count("select count(*) from deliveries where status = 'completed' and attempts = 1")
            .await,
        sent.len() as i64
    );
    // Stored byte-for-byte as JSON: compare each payload with the original.
    for hook in &sent {
        let row = env
            .db
            .query_one(
                "select payload::text, event from github_events where delivery_id = $1",
                &[&hook.id()],
            )
            .await
            .expect("stored");
        let stored: serde_json::Value = serde_json::from_str(row.get(0)).expect("json");
        let original: serde_json::Value = serde_json::from_slice(&hook.body).expect("json");
        assert_eq!(stored, original);
        assert_eq!(
            row.get::<_, String>(1),
            hook.event.clone().unwrap_or_default()
        );
    }

    // GitHub's "Redeliver" sends the same id and body again.
    for hook in &sent {
        let answer = ingest.send(hook).await;
        assert_eq!((answer.status, answer.kind()), (200, "duplicate"));
        assert_eq!(answer.body["state"], "completed");
    }
    assert_eq!(env.work_depth().await, 0, "a duplicate published nothing");
    assert_eq!(env.events().await, sent.len() as i64);
    assert!(pings >= 1);
    if fixtures::corpus_dir().is_some() {
        eprintln!("real corpus: {} stored, {pings} pings", sent.len());
    }
    env.cleanup().await;
}

#[tokio::test]
async fn form_encoded_delivery_is_verified_and_stored() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let worker = env.store_worker().await;
    let json = fixtures::own("pull_request");
    let form: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", std::str::from_utf8(&json).expect("utf8"))
        .finish();
    let mut hook = Hook::new("pull_request", form.into_bytes());
    hook.content_type = "application/x-www-form-urlencoded".to_owned();
    let answer = ingest.send(&hook).await;
    assert_eq!((answer.status, answer.kind()), (202, "accepted"));
    worker.drain().await.expect("drain");
    let row = env
        .db
        .query_one("select payload::text, action from github_events", &[])
        .await
        .expect("stored");
    let stored: serde_json::Value = serde_json::from_str(row.get(0)).expect("json");
    let original: serde_json::Value = serde_json::from_slice(&json).expect("json");
    assert_eq!(stored, original);
    assert_eq!(row.get::<_, Option<String>>(1).as_deref(), Some("opened"));
    env.cleanup().await;
}
