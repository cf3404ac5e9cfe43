//! Postgres is the record of every delivery, body included: a 202 survives
//! the broker losing its messages (a purged queue, a node whose data is
//! lost), each delivery's body is written once, by its claim, and any
//! delivery whose body is kept can be replayed, completed ones too.

use std::time::Duration;

use hookinbox::broker::Topology;
use hookinbox_tests::private_rabbit::PrivateRabbit;
use hookinbox_tests::receiver::Receiver;
use hookinbox_tests::{Hook, TestEnv, settle, wait_until, worker_cli};
use hookinbox_worker::JobOutcome;

/// Purges every work queue of the test's prefix, as an operator's mistake,
/// a queue deleted and declared again, or a broker bug would.
async fn purge_work_queues(env: &TestEnv) -> u32 {
    let (connection, channel) = hookinbox::broker::open_channel(
        &hookinbox_tests::amqp_url(),
        "the-record-test",
        Duration::from_secs(5),
        &Topology::new(&env.prefix),
    )
    .await
    .expect("channel");
    let mut purged = 0;
    for queue in env.work_queues().await {
        purged += channel
            .queue_purge(&queue, Default::default())
            .await
            .expect("purge");
    }
    let _ = connection.close(200, "purged").await;
    purged
}

/// Every delivery's leases run out long ago (backdated, not slept for):
/// what a lost message looks like to the reaper.
async fn leases_long_expired(env: &TestEnv) {
    env.db
        .execute(
            "update deliveries set lease_until = now() - interval '1 hour' \
             where status = 'processing'",
            &[],
        )
        .await
        .expect("backdate");
}

#[tokio::test]
async fn a_leg_published_again_from_postgres_carries_its_key_alone() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let worker = env.store_worker().await;
    assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    assert_eq!(purge_work_queues(&env).await, 1);
    leases_long_expired(&env).await;
    assert_eq!(worker.reap_once().await.expect("reap"), 1);
    // The scheduler's republish: no copy of the body (ingest's first
    // message of a store leg has one), so its run reads Postgres.
    let connection = lapin::Connection::connect(&hookinbox_tests::amqp_url(), Default::default())
        .await
        .expect("amqp");
    let channel = connection.create_channel().await.expect("channel");
    let queue = Topology::new(&env.prefix).leg_queue(
        &hookinbox::SourceName::default_source(),
        &hookinbox_tests::store_destination(),
    );
    assert_eq!(worker.schedule_once().await.expect("schedule"), 1);
    // Confirmed, so in the queue.
    let message = channel
        .basic_get(&queue, Default::default())
        .await
        .expect("get")
        .expect("the republished job");
    let job =
        hookinbox::broker::decode(&message.delivery.properties, message.delivery.data.clone())
            .expect("a job");
    assert!(job.copy.is_none() && job.carried.is_none());
    assert!(message.delivery.data.is_empty(), "the key alone");
    let _ = connection.close(200, "").await;
    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes, vec![JobOutcome::Completed]);
    assert_eq!(env.events().await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn deliveries_answered_202_whose_work_queue_was_purged_each_run_once() {
    let (env, ingest) = TestEnv::with_ingest().await;
    // The worker declares its queue and does not consume yet.
    let worker = env.store_worker().await;
    let hooks: Vec<Hook> = (0..20).map(|_| Hook::fixture("push")).collect();
    for hook in &hooks {
        assert_eq!(ingest.send(hook).await.status, 202);
    }
    // Past its installation's round, with no worker taking, a leg waits
    // in Postgres for its turn (fairness) rather than in the queue.
    let waiting = env
        .count("select count(*) from deliveries where last_error_class = 'fair'")
        .await;
    let purged = purge_work_queues(&env).await;
    assert_eq!(i64::from(purged) + waiting, 20, "every message gone");
    assert_eq!(env.work_depth().await, 0);

    // Their leases run out: the reaper marks each leg lost, and the
    // scheduler publishes it again from the body its claim wrote, whatever
    // GitHub's log says (it saw 202s).
    leases_long_expired(&env).await;
    assert_eq!(worker.reap_once().await.expect("reap"), u64::from(purged));
    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes, vec![JobOutcome::Completed; 20]);
    assert_eq!(env.events().await, 20, "each delivery's effect once");
    for hook in &hooks {
        let stored: serde_json::Value = env
            .db
            .query_one(
                "select payload from github_events where delivery_id = $1",
                &[&hook.id()],
            )
            .await
            .expect("its event")
            .get(0);
        let sent: serde_json::Value = serde_json::from_slice(&hook.body).expect("json");
        assert_eq!(stored, sent, "the body as GitHub sent it");
    }
    assert_eq!(
        env.count("select count(*) from deliveries where status <> 'completed'")
            .await,
        0,
        "none awaits a redelivery from GitHub"
    );
    // Again: nothing more runs.
    assert_eq!(worker.reap_once().await.expect("reap"), 0);
    assert!(settle(&env, &worker).await.is_empty());
    assert_eq!(env.events().await, 20);
    env.cleanup().await;
}

#[tokio::test]
async fn deliveries_waiting_in_a_broker_node_whose_data_is_wiped_each_run_once() {
    let root = std::env::temp_dir().join(format!(
        "hookinbox-wiped-broker-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let rabbit = PrivateRabbit::start_new(&root).expect("a private RabbitMQ node");
    let env = TestEnv::new().await;
    let url = rabbit.url(rabbit.port);
    let mut ingest_args = env.ingest_args();
    ingest_args.common.amqp_url = url.clone();
    let ingest = env
        .ingest_with(ingest_args.validate().expect("valid"))
        .await;
    let mut worker_args = env.worker_args();
    worker_args.common.amqp_url = url.clone();
    let config = worker_args.validate().expect("valid");
    let worker = env
        .worker_with(config.clone(), std::sync::Arc::new(hookinbox_worker::Store))
        .await;
    let hooks: Vec<Hook> = (0..10).map(|_| Hook::fixture("issues")).collect();
    for hook in &hooks {
        assert_eq!(ingest.send(hook).await.status, 202);
    }
    ingest.stop().await;
    drop(worker);

    // The node's disk is lost: its queues and their messages with it.
    rabbit.wipe_and_boot().expect("wiped and booted");

    // A worker starts against the empty node; it declares its queues.
    let worker = env
        .worker_with(config, std::sync::Arc::new(hookinbox_worker::Store))
        .await;
    assert!(worker.drain().await.expect("drain").outcomes.is_empty());
    leases_long_expired(&env).await;
    assert_eq!(worker.reap_once().await.expect("reap"), 10);
    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes, vec![JobOutcome::Completed; 10]);
    assert_eq!(env.events().await, 10, "each delivery's effect once");
    drop(worker);
    drop(rabbit);
    let _ = std::fs::remove_dir_all(&root);
    env.cleanup().await;
}

#[tokio::test]
async fn a_completed_delivery_replayed_from_the_cli_reaches_its_destination_again_with_its_key() {
    let env = TestEnv::new().await;
    let receiver = Receiver::ok().await;
    let config = env.forward_config(&receiver.url, "");
    let ingest = env.ingest_on(&config).await;
    let worker = env.worker_on(&config, Default::default()).await;
    let hook = Hook::fixture("pull_request");
    assert_eq!(ingest.send(&hook).await.status, 202);
    settle(&env, &worker).await;
    assert_eq!(receiver.received().len(), 1);

    // A dry run says what it would do and does nothing.
    let (code, out) = worker_cli(
        &env,
        &[
            "deliveries",
            "replay",
            hook.id(),
            "--dry-run",
            "--as",
            "alice",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("would replay {} to app", hook.id())),
        "{out}"
    );
    let (code, out) = worker_cli(&env, &["deliveries", "replay", hook.id(), "--as", "alice"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("replayed {} to app", hook.id())),
        "{out}"
    );
    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes, vec![JobOutcome::Completed]);

    let received = receiver.received();
    assert_eq!(received.len(), 2, "sent again");
    assert_eq!(received[1].body, hook.body, "the body as received");
    assert_eq!(
        received[1].header("idempotency-key"),
        received[0].header("idempotency-key"),
        "the same Idempotency-Key"
    );
    assert_eq!(received[0].header("x-hookinbox-replay"), None);
    assert_eq!(received[1].header("x-hookinbox-replay"), Some("1"));
    assert_eq!(
        received[1].header("x-github-delivery"),
        Some(hook.id()),
        "GitHub's headers as received"
    );
    // Audited, with who asked.
    assert_eq!(
        env.count(
            "select count(*) from admin_audit where actor = 'alice' and action = 'replay_any'"
        )
        .await,
        1
    );
    // A leg in flight is named, with why, and not replayed.
    env.db
        .execute(
            "update deliveries set status = 'processing', lease_until = now() + interval '1 hour'",
            &[],
        )
        .await
        .expect("in flight");
    let (code, out) = worker_cli(&env, &["deliveries", "replay", hook.id()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("not replayed {} to app: in flight", hook.id())),
        "{out}"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn deliveries_show_prints_the_headers_and_the_body_as_received() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);
    settle(&env, &env.store_worker().await).await;
    let (code, out) = worker_cli(&env, &["deliveries", "show", hook.id()]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("x-github-delivery: {}", hook.id())),
        "{out}"
    );
    assert!(out.contains("content-type: application/json"), "{out}");
    assert!(
        out.contains(std::str::from_utf8(&hook.body).expect("utf-8")),
        "the raw body"
    );
    assert!(!out.to_lowercase().contains("x-hub-signature"), "{out}");
    let (code, out) = worker_cli(&env, &["deliveries", "show", hook.id(), "--json"]);
    assert_eq!(code, 0, "{out}");
    let shown: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        shown[0]["received"]["body"].as_str().map(str::as_bytes),
        Some(&hook.body[..])
    );
    env.cleanup().await;
}

#[tokio::test]
async fn each_delivery_writes_its_body_once_however_many_legs_and_waits() {
    let env = TestEnv::new().await;
    let receiver = Receiver::ok().await;
    let config = env.forward_config(&receiver.url, hookinbox_tests::STORE_TOO);
    let ingest = env.ingest_on(&config).await;
    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);
    assert_eq!(env.count("select count(*) from deliveries").await, 2);
    assert_eq!(env.count("select count(*) from bodies").await, 1);
    // A redelivery, a copy racing it: nothing written again.
    assert_eq!(ingest.send(&hook).await.status, 202);
    assert_eq!(env.count("select count(*) from bodies").await, 1);
    let stored: (i32, String) = {
        let row = env
            .db
            .query_one("select size, encoding from bodies", &[])
            .await
            .expect("the body");
        (row.get(0), row.get(1))
    };
    assert_eq!(stored, (hook.body.len() as i32, "lz4".to_owned()));
    let worker = env.worker_on(&config, Default::default()).await;
    settle(&env, &worker).await;
    wait_until("both legs", Duration::from_secs(10), || async {
        env.count("select count(*) from deliveries where status = 'completed'")
            .await
            == 2
    })
    .await;
    assert_eq!(receiver.received()[0].body, hook.body);
    env.cleanup().await;
}

/// The partition `delivery_id`'s body is in, if it has one.
async fn body_partition(env: &TestEnv, delivery_id: &str) -> Option<String> {
    env.db
        .query_opt(
            "select tableoid::regclass::text from bodies where delivery_id = $1",
            &[&delivery_id],
        )
        .await
        .expect("body partition")
        .map(|r| r.get(0))
}

#[tokio::test]
async fn retention_drops_a_day_of_bodies_but_never_one_a_leg_not_yet_ended_needs() {
    use chrono::{Days, Utc};
    use hookinbox::deliveries::bodies::BODIES;

    let (env, ingest) = TestEnv::with_ingest().await;
    let pool = env.pool(1);
    let client = pool.get().await.expect("client");
    // Day partitions from ten days ago on: the days a body can age into.
    let old_day = Utc::now().date_naive() - Days::new(10);
    BODIES.ensure(&client, old_day).await.expect("days ahead");
    let [done, dead, waiting, fresh] =
        ["done", "dead", "waiting", "fresh"].map(|_| Hook::fixture("push"));
    for hook in [&done, &dead, &waiting, &fresh] {
        assert_eq!(ingest.send(hook).await.status, 202);
    }
    settle(&env, &env.store_worker().await).await;
    // `dead` is a dead letter an operator may replay; `waiting` waits for
    // its retry, due in a day: neither has ended. The first three came ten
    // days ago, a little before noon (by the database's clock: the day
    // boundary is UTC, as the partitions').
    env.db
        .execute(
            "update deliveries set status = 'failed', retryable = false, failed_at = now(),
                 completed_at = null, last_error_class = 'permanent', last_error = 'test'
             where delivery_id = $1",
            &[&dead.id()],
        )
        .await
        .expect("a dead letter");
    env.db
        .execute(
            "update deliveries set status = 'failed', retryable = true, failed_at = now(),
                 completed_at = null, next_attempt_at = now() + interval '1 day',
                 last_error_class = 'transient', last_error = 'test'
             where delivery_id = $1",
            &[&waiting.id()],
        )
        .await
        .expect("a retry");
    let aged = [done.id(), dead.id(), waiting.id()];
    env.db
        .batch_execute(&format!(
            "update deliveries set created_at = date_trunc('day', now()) - interval '10 days'
                 + interval '11 hours' where delivery_id in ('{0}');
             update bodies set received_at = date_trunc('day', now()) - interval '10 days'
                 + interval '11 hours' where delivery_id in ('{0}');",
            aged.join("','")
        ))
        .await
        .expect("ten days old");
    let day = BODIES.partition(old_day);
    for hook in [&done, &dead, &waiting] {
        assert_eq!(
            body_partition(&env, hook.id()).await.as_deref(),
            Some(day.as_str())
        );
    }

    // Bodies kept seven days: the day ten days ago goes whole, and first
    // the bodies its legs not yet ended need move out of it.
    let mut args = env.worker_args();
    args.retention_bodies = "7d".to_owned();
    let worker = env
        .worker_with(
            args.validate().expect("valid"),
            std::sync::Arc::new(hookinbox_worker::Store),
        )
        .await;
    let swept = worker
        .sweep_once()
        .await
        .expect("sweep")
        .expect("the leader");
    assert!(swept.bodies.days >= 1, "{swept:?}");
    assert!(!env.exists_table(&day).await, "{day} dropped whole");
    assert_eq!(
        body_partition(&env, done.id()).await,
        None,
        "an ended delivery's body went"
    );
    for hook in [&dead, &waiting] {
        assert_eq!(
            body_partition(&env, hook.id()).await.as_deref(),
            Some("bodies_default"),
            "a leg not yet ended keeps its body"
        );
    }
    assert!(
        body_partition(&env, fresh.id()).await.is_some(),
        "today's stays"
    );
    // What they kept still serves: the retry runs, the dead letter replays.
    let policy = env.policy();
    assert!(matches!(
        hookinbox::deliveries::replay(
            &client,
            &policy,
            &dead.leg(),
            hookinbox::deliveries::Scope::Failed
        )
        .await
        .expect("replay"),
        hookinbox::deliveries::Replayed::Started(_)
    ));
    env.db
        .execute(
            "update deliveries set next_attempt_at = now() where delivery_id = $1",
            &[&waiting.id()],
        )
        .await
        .expect("due");
    let publisher = hookinbox::broker::Publisher::new(
        &hookinbox_tests::amqp_url(),
        "the-record-test",
        Topology::new(&env.prefix),
        Duration::from_secs(5),
    );
    let replayed = hookinbox::deliveries::get(&client, &dead.leg())
        .await
        .expect("get")
        .expect("the leg");
    publisher
        .publish(&hookinbox::Envelope {
            key: dead.leg(),
            event: hookinbox::EventName::parse(b"push").expect("event"),
            action: None,
            token: replayed.claim_token,
            attempts: Some(0),
            trace: Default::default(),
            carried: None,
            copy: None,
        })
        .await
        .expect("published");
    publisher.close().await;
    let outcomes = settle(&env, &worker).await;
    assert_eq!(
        outcomes,
        vec![JobOutcome::Completed; 2],
        "both ran from the kept bodies"
    );

    // Once every leg has ended, the next sweep takes them from DEFAULT.
    let swept = worker
        .sweep_once()
        .await
        .expect("sweep")
        .expect("the leader");
    assert_eq!(swept.bodies.deleted, 2, "{swept:?}");
    assert_eq!(env.count("select count(*) from bodies_default").await, 0);
    assert_eq!(env.count("select count(*) from bodies").await, 1, "today's");
    env.cleanup().await;
}

#[tokio::test]
async fn the_api_replays_completed_deliveries_when_asked_and_a_purge_refuses_to() {
    use hookinbox_tests::admin::OPERATOR;
    use serde_json::json;
    let (env, ingest) = TestEnv::with_ingest().await;
    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);
    let worker = env.store_worker().await;
    settle(&env, &worker).await;
    let admin = env.admin().await;
    // Without `completed`, a replay selects failed deliveries only.
    let r = admin
        .post(
            "/api/v1/replays",
            Some(OPERATOR),
            &json!({"ids": [hook.id()], "dry_run": true}),
        )
        .await;
    assert_eq!(
        (r.status, r.body["count"].clone()),
        (200, json!(0)),
        "{}",
        r.text
    );
    let r = admin
        .post(
            "/api/v1/replays",
            Some(OPERATOR),
            &json!({"ids": [hook.id()], "completed": true, "per_second": 100}),
        )
        .await;
    assert_eq!(
        (r.status, r.body["count"].clone()),
        (202, json!(1)),
        "{}",
        r.text
    );
    let job = r.body["job"].as_i64().expect("job");
    wait_until("the job to end", Duration::from_secs(20), || async {
        admin
            .get(&format!("/api/v1/replays/{job}"), Some(OPERATOR))
            .await
            .body["status"]
            == "finished"
    })
    .await;
    let done = admin
        .get(&format!("/api/v1/replays/{job}"), Some(OPERATOR))
        .await;
    assert_eq!(done.body["kind"], "replay_any", "{}", done.text);
    assert_eq!(done.body["replayed"], 1, "{}", done.text);
    assert_eq!(settle(&env, &worker).await, vec![JobOutcome::Completed]);
    assert_eq!(
        env.count("select count(*) from deliveries where replays = 1")
            .await,
        1,
        "replayed once"
    );
    assert_eq!(env.events().await, 1, "store keeps one event a delivery");
    let r = admin
        .post(
            "/api/v1/purges",
            Some(OPERATOR),
            &json!({"ids": [hook.id()], "completed": true}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(r.text.contains("completed"), "{}", r.text);
    admin.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_message_from_before_bodies_lived_in_postgres_leaves_its_body_there_for_its_retry() {
    use hookinbox_tests::handlers::Scripted;
    use hookinbox_worker::HandlerError;
    use sha2::Digest;
    let env = TestEnv::new().await;
    // A leg the previous version claimed (no body written) and its
    // message, which carries the body.
    let hook = Hook::fixture("push");
    let token = uuid::Uuid::new_v4();
    env.db
        .execute(
            "insert into deliveries (provider, source, hook_id, delivery_id, destination, event,
                                     body_sha256, status, claim_token, lease_until)
             values ('github', 'default', $1, $2, 'store', 'push', $3, 'processing', $4,
                     now() + interval '1 minute')",
            &[
                &hook.hook_id.as_deref().unwrap_or(""),
                &hook.id(),
                &sha2::Sha256::digest(&hook.body).to_vec(),
                &token,
            ],
        )
        .await
        .expect("a row of the previous version");
    assert_eq!(env.count("select count(*) from bodies").await, 0);
    hookinbox_tests::old_messages::publish_with_body(
        &hookinbox_tests::amqp_url(),
        &Topology::new(&env.prefix),
        &hookinbox::Envelope {
            trace: Default::default(),
            key: hook.leg(),
            event: hookinbox::EventName::parse(b"push").expect("event"),
            action: None,
            token: hookinbox::ClaimToken(token),
            attempts: Some(0),
            carried: None,
            copy: None,
        },
        "application/json",
        &[("x-github-event", "push")],
        &hook.body,
    )
    .await;
    // Its first attempt fails: the message is acked, the leg due again; the
    // retry is published with its key only, and runs from the body kept.
    let worker = env
        .worker(Scripted::new(vec![HandlerError::transient("not yet")]))
        .await;
    let outcomes = settle(&env, &worker).await;
    assert_eq!(
        outcomes,
        vec![
            JobOutcome::Failed {
                class: hookinbox::deliveries::ErrorClass::Transient,
                retryable: true
            },
            JobOutcome::Completed
        ]
    );
    assert_eq!(env.count("select count(*) from bodies").await, 1, "kept");
    let stored: serde_json::Value = env
        .db
        .query_one("select payload from github_events", &[])
        .await
        .expect("its event")
        .get(0);
    assert_eq!(
        stored,
        serde_json::from_slice::<serde_json::Value>(&hook.body).expect("json")
    );
    env.cleanup().await;
}

#[tokio::test]
async fn a_replay_of_a_completed_leg_the_broker_refuses_is_due_and_a_delivery_without_a_body_is_named()
 {
    let env = TestEnv::new().await;
    let receiver = Receiver::ok().await;
    let config = env.forward_config(&receiver.url, "");
    let ingest = env.ingest_on(&config).await;
    let worker = env.worker_on(&config, Default::default()).await;
    let [sent, forgotten] = ["push", "issues"].map(Hook::fixture);
    for hook in [&sent, &forgotten] {
        assert_eq!(ingest.send(hook).await.status, 202);
    }
    settle(&env, &worker).await;
    assert_eq!(receiver.received().len(), 2);

    // The broker refuses the replay's publish: the leg is due in Postgres,
    // never a dead letter, and the scheduler sends it.
    let out = hookinbox_tests::worker_command(
        &env,
        &["deliveries", "replay", sent.id()],
        &[("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2f")],
    )
    .output()
    .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!("replayed {} to app: not published now", sent.id())),
        "{text}"
    );
    assert_eq!(
        env.count(
            "select count(*) from deliveries where status = 'failed' and retryable \
             and last_error_class = 'publish' and replays = 1"
        )
        .await,
        1
    );
    assert_eq!(settle(&env, &worker).await, vec![JobOutcome::Completed]);
    assert_eq!(receiver.received().len(), 3);
    assert_eq!(
        receiver.received()[2].header("x-hookinbox-replay"),
        Some("1")
    );

    // A delivery whose body is gone (past its retention) is named, with
    // why, and nothing is replayed.
    env.db
        .execute(
            "delete from bodies where delivery_id = $1",
            &[&forgotten.id()],
        )
        .await
        .expect("past retention");
    let (code, out) = worker_cli(&env, &["deliveries", "replay", forgotten.id()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "not replayed {} to app: No body to replay",
            forgotten.id()
        )),
        "{out}"
    );
    assert_eq!(
        env.count("select count(*) from deliveries where replays > 0")
            .await,
        1,
        "only the first was replayed"
    );
    env.cleanup().await;
}
