//! The one-statement path: a database-only job is taken by its
//! completion, a redelivered message goes the full way, a job that
//! crashes every time still ends as poison, and copies complete once.

use std::sync::{Arc, Mutex};

use hookinbox::Job;
use hookinbox::broker::Topology;
use hookinbox::deliveries;
use hookinbox_tests::{Hook, TestEnv, amqp_url};
use hookinbox_worker::{Effect, Handler, HandlerError, JobOutcome, Store};
use lapin::options::{BasicGetOptions, BasicNackOptions};

/// `store`, recording the delivery's attempts as the handler saw them in
/// Postgres: 0 on the one-statement path (nothing taken yet), the take's
/// count on the full path.
struct SeesAttempts {
    pool: deadpool_postgres::Pool,
    seen: Mutex<Vec<i32>>,
}

impl SeesAttempts {
    fn new(env: &TestEnv) -> Arc<Self> {
        Arc::new(Self {
            pool: env.pool(2),
            seen: Mutex::new(Vec::new()),
        })
    }

    fn seen(&self) -> Vec<i32> {
        self.seen.lock().expect("lock").clone()
    }
}

#[async_trait::async_trait]
impl Handler for SeesAttempts {
    async fn handle(&self, job: &Job, effect: &mut Effect) -> Result<(), HandlerError> {
        let client = self.pool.get().await.expect("client");
        let row = deliveries::get(&client, &job.key)
            .await
            .expect("get")
            .expect("row");
        self.seen.lock().expect("lock").push(row.attempts);
        Store.handle(job, effect).await
    }

    fn database_only(&self, job: &Job) -> bool {
        Store.database_only(job)
    }
}

/// Database-only, and panics every time (a job that crashes its worker).
struct PanicsInDatabase;

#[async_trait::async_trait]
impl Handler for PanicsInDatabase {
    async fn handle(&self, _job: &Job, _effect: &mut Effect) -> Result<(), HandlerError> {
        panic!("handler bug")
    }

    fn database_only(&self, _job: &Job) -> bool {
        true
    }
}

async fn attempts(env: &TestEnv) -> i64 {
    env.count("select attempts::bigint from deliveries").await
}

#[tokio::test]
async fn a_database_only_job_is_taken_and_completed_by_one_statement() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let handler = SeesAttempts::new(&env);
    let worker = env.worker(handler.clone()).await;
    assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    let report = worker.drain().await.expect("drain");
    assert_eq!(report.outcomes, vec![JobOutcome::Completed]);
    assert_eq!(handler.seen(), vec![0], "nothing took the delivery first");
    assert_eq!(
        attempts(&env).await,
        1,
        "the completion counted the attempt"
    );
    assert_eq!(env.events().await, 1);
    assert_eq!(
        env.count(
            "select count(*) from github_events e join deliveries d using (provider, source, hook_id, delivery_id) where e.received_at = d.created_at"
        )
        .await,
        1,
        "the event is stamped with the first claim"
    );
    env.cleanup().await;
}

#[tokio::test]
async fn with_the_setting_off_every_job_is_taken_first() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let mut args = env.worker_args();
    args.fused_take = false;
    let handler = SeesAttempts::new(&env);
    let worker = env
        .worker_with(args.validate().expect("valid"), handler.clone())
        .await;
    assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    let report = worker.drain().await.expect("drain");
    assert_eq!(report.outcomes, vec![JobOutcome::Completed]);
    assert_eq!(handler.seen(), vec![1], "taken before the handler ran");
    assert_eq!(attempts(&env).await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn a_redelivered_message_is_taken_before_its_handler_runs() {
    let (env, ingest) = TestEnv::with_ingest().await;
    assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    // A worker that got the message and gave it back without acking it (as
    // the broker does for one that died): the broker marks it redelivered.
    let (connection, _channel, message) = get_the_job(&env).await;
    assert!(!message.delivery.redelivered);
    message
        .delivery
        .acker
        .nack(BasicNackOptions {
            requeue: true,
            ..Default::default()
        })
        .await
        .expect("requeue");
    let _ = connection.close(200, "").await;

    let handler = SeesAttempts::new(&env);
    let worker = env.worker(handler.clone()).await;
    let report = worker.drain().await.expect("drain");
    assert_eq!(report.outcomes, vec![JobOutcome::Completed]);
    assert_eq!(
        handler.seen(),
        vec![1],
        "a message that may have crashed a worker counts its attempt before the handler runs"
    );
    assert_eq!(attempts(&env).await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn a_database_only_job_that_crashes_every_time_is_dead_lettered_as_poison() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let mut args = env.worker_args();
    args.common.max_attempts = Some(3);
    let worker = env
        .worker_with(args.validate().expect("valid"), Arc::new(PanicsInDatabase))
        .await;
    assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    let report = worker.drain().await.expect("drain");
    // The first run, on the one-statement path, counts nothing; its
    // failure sends the job the full way at once, whose takes count.
    env.assert_poisoned(&report.outcomes, 3).await;
    env.cleanup().await;
}

#[tokio::test]
async fn two_copies_of_one_job_complete_it_once() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);
    // A second copy of the same message (a republish, say): same token,
    // same attempts.
    let (connection, _channel, message) = get_the_job(&env).await;
    let delivery = message.delivery;
    let job =
        hookinbox::broker::decode(&delivery.properties, delivery.data.clone()).expect("a job");
    assert_eq!(job.attempts, Some(0), "ingest says how many takes it had");
    publish_again_and_ack(&env, &job, 2, delivery, connection).await;

    let worker = env.store_worker().await;
    let report = worker.drain().await.expect("drain");
    assert_eq!(
        report.outcomes,
        vec![JobOutcome::Completed, JobOutcome::Duplicate]
    );
    assert_eq!(env.events().await, 1, "one effect");
    assert_eq!(attempts(&env).await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn a_new_store_legs_message_carries_a_copy_of_its_body_that_saves_its_read() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);
    let (connection, _channel, message) = get_the_job(&env).await;
    let delivery = message.delivery;
    let job =
        hookinbox::broker::decode(&delivery.properties, delivery.data.clone()).expect("a job");
    let copy = job
        .copy
        .clone()
        .expect("a new store leg's message carries a copy");
    assert!(job.carried.is_none(), "a copy is not an old message's body");
    let body = deliveries::Stored::from_copy(copy)
        .expect("readable headers")
        .decode()
        .expect("unpacks");
    assert_eq!(body.bytes, hook.body, "the body as received");
    assert_eq!(body.content_type, "application/json");
    assert!(
        body.github_headers
            .iter()
            .any(|(name, value)| name == "x-github-delivery" && *value == hook.id()),
        "with the carried headers: {:?}",
        body.github_headers
    );
    // Published again as it was read (given back, it would come back
    // marked redelivered, and go the full way).
    publish_again_and_ack(&env, &job, 1, delivery, connection).await;
    // With the body gone from Postgres, the first run still completes on
    // one statement: it read nothing but its message.
    env.db
        .execute("delete from bodies", &[])
        .await
        .expect("delete the body");
    let handler = SeesAttempts::new(&env);
    let worker = env.worker(handler.clone()).await;
    let report = worker.drain().await.expect("drain");
    assert_eq!(report.outcomes, vec![JobOutcome::Completed]);
    assert_eq!(handler.seen(), vec![0], "on the one-statement path");
    assert_eq!(env.events().await, 1);
    env.cleanup().await;
}

/// Publishes `job` `copies` times as it was read (a republish, say), then
/// acks the original `delivery` and closes the `connection` it came on.
async fn publish_again_and_ack(
    env: &TestEnv,
    job: &hookinbox::Envelope,
    copies: usize,
    delivery: lapin::message::Delivery,
    connection: lapin::Connection,
) {
    let publisher = hookinbox::broker::Publisher::new(
        &amqp_url(),
        "test-copies",
        Topology::new(&env.prefix),
        std::time::Duration::from_secs(5),
    );
    for _ in 0..copies {
        publisher.publish(job).await.expect("publish a copy");
    }
    publisher.close().await;
    delivery
        .acker
        .ack(Default::default())
        .await
        .expect("ack the original");
    let _ = connection.close(200, "").await;
}

/// Gets the job from the work queue without acking it, on a connection and
/// channel the caller keeps open until it settles the message (dropping the
/// channel closes it, which gives the message back).
async fn get_the_job(
    env: &TestEnv,
) -> (
    lapin::Connection,
    lapin::Channel,
    lapin::message::BasicGetMessage,
) {
    let connection = lapin::Connection::connect(&amqp_url(), Default::default())
        .await
        .expect("amqp");
    let channel = connection.create_channel().await.expect("channel");
    let queue = Topology::new(&env.prefix).leg_queue(
        &hookinbox::SourceName::default_source(),
        &hookinbox_tests::store_destination(),
    );
    let message = channel
        .basic_get(&queue, BasicGetOptions::default())
        .await
        .expect("get")
        .expect("the job");
    (connection, channel, message)
}
