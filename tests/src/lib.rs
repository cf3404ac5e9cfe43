//! Support for hookinbox's integration tests.
//!
//! Every test gets its own database (created, migrated, dropped) and its own
//! queue prefix, so tests run in parallel against the one real Postgres and
//! the one real RabbitMQ without seeing each other's rows or messages.
//! Workers are driven with [`Worker::drain`] until the queue is empty, never
//! with sleeps.

pub mod admin;
pub mod browser;
pub mod fixtures;
pub mod github;
pub mod handlers;
pub mod octokit;
pub mod old_messages;
pub mod otlp;
pub mod private_pg;
pub mod private_rabbit;
pub mod proxy;
pub mod receiver;
pub mod tls_receiver;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use hookinbox::config::{CommonArgs, IngestArgs, IngestConfig, WorkerArgs, WorkerConfig};
use hookinbox::deliveries::Policy;
use hookinbox_ingest::IngestApp;
use hookinbox_worker::Handler;
use hookinbox_worker::Worker;
use sha2::Sha256;

/// Settings as an empty command line gives them: the binaries' own
/// defaults, none read from the environment (a developer's `DATABASE_URL`
/// must not leak into a test).
pub fn defaults<T: clap::Args + clap::FromArgMatches>() -> T {
    let command = T::augment_args(clap::Command::new("defaults"))
        .mut_args(|arg| arg.env(None::<&'static str>));
    let matches = command
        .try_get_matches_from(["defaults"])
        .expect("the defaults parse");
    T::from_arg_matches(&matches).expect("the defaults parse")
}

/// Postgres server for tests (a URL without a database name).
pub fn postgres_base() -> String {
    std::env::var("HOOKINBOX_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned())
}

/// RabbitMQ for tests.
pub fn amqp_url() -> String {
    std::env::var("HOOKINBOX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// The destination of the default settings: `store`, named after its kind.
pub fn store_destination() -> hookinbox::DestinationName {
    hookinbox::DestinationName::parse("store").expect("a name")
}

/// The one leg of a delivery of the default settings (to `store`).
pub fn store_leg() -> hookinbox::deliveries::LegRequest {
    hookinbox::deliveries::LegRequest {
        destination: store_destination(),
        filtered: None,
        order_key: None,
        fair: None,
        stale_clock: None,
    }
}

/// A `store` destination named `store`, as [`TestEnv::forward_config`]'s
/// `more`: a delivery then has a forward leg and a store leg.
pub const STORE_TOO: &str = r#"
[[sources.destinations]]
name = "store"
kind = "store"
"#;

/// Claims `request` (of a store leg) and completes it at once by the
/// `store` handler's one statement, as the worker's fused path does, the
/// stored event being `event` with `payload`: how long the claim and the
/// completion took.
pub async fn claim_and_store(
    client: &deadpool_postgres::Object,
    policy: &hookinbox::deliveries::Policy,
    request: &hookinbox::deliveries::ClaimRequest,
    event: &str,
    payload: bytes::Bytes,
) -> anyhow::Result<(std::time::Duration, std::time::Duration)> {
    use anyhow::Context as _;
    use hookinbox::deliveries::{self, Completing, StoredEvent};
    let started = std::time::Instant::now();
    let claim = deliveries::claim(client, policy, request).await?;
    let claimed = started.elapsed();
    let token = claimed_token(&claim).context("not claimed")?;
    let started = std::time::Instant::now();
    let done = deliveries::complete_batch(
        client,
        &[Completing {
            key: request.key.clone().leg(store_destination()),
            token,
            take: Some(0),
            max_attempts: policy.max_attempts,
            store: Some(StoredEvent {
                event: event.to_owned(),
                action: None,
                payload,
            }),
        }],
    )
    .await?;
    anyhow::ensure!(done.first().is_some_and(Option::is_some), "not completed");
    Ok((claimed, started.elapsed()))
}

/// A claim of `hook` (its key, event and body's hash; no action or
/// repository; the replay guard off) for `legs`.
pub fn claim_request(
    hook: &Hook,
    legs: Vec<hookinbox::deliveries::LegRequest>,
) -> hookinbox::deliveries::ClaimRequest {
    use sha2::Digest;
    hookinbox::deliveries::ClaimRequest {
        origin: Default::default(),
        key: hook.key(),
        event: hook.event.clone().expect("an event"),
        action: None,
        repository: None,
        body_sha256: Sha256::digest(&hook.body).into(),
        guarded: false,
        pinned: false,
        legs,
        body: json_body(&hook.body),
    }
}

/// A JSON body as a claim writes it.
pub fn json_body(body: &[u8]) -> hookinbox::deliveries::Encoded {
    hookinbox::deliveries::Encoded::of(&hookinbox::Body {
        content_type: "application/json".to_owned(),
        github_headers: Vec::new(),
        bytes: bytes::Bytes::copy_from_slice(body),
    })
}

/// The token of a claim that claimed its delivery's one leg.
pub fn claimed_token(claim: &hookinbox::deliveries::Claim) -> Option<hookinbox::ClaimToken> {
    use hookinbox::deliveries::{Claim, LegClaim};
    match claim {
        Claim::Legs(legs) => match legs[..] {
            [(_, LegClaim::Claimed { token, .. })] => Some(token),
            _ => None,
        },
        _ => None,
    }
}

/// A claim of a delivery with one leg, read as that leg's answer; the
/// delivery-wide answers as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OneLeg {
    /// The leg's answer.
    Leg(hookinbox::deliveries::LegClaim),
    /// Another body under the same key.
    Conflict,
    /// A replayed body.
    ReplayedBody,
}

/// Reads `claim` as [`OneLeg`]; panics when it has another number of legs.
pub fn one_leg(claim: &hookinbox::deliveries::Claim) -> OneLeg {
    use hookinbox::deliveries::Claim;
    match claim {
        Claim::Legs(legs) if legs.len() == 1 => OneLeg::Leg(legs[0].1),
        Claim::Conflict => OneLeg::Conflict,
        Claim::ReplayedBody => OneLeg::ReplayedBody,
        other => panic!("a claim of one leg: {other:?}"),
    }
}

/// The networks the tests' `forward` destinations may reach
/// (`HOOKINBOX_FORWARD_ALLOW_NETWORKS`): their receivers listen on
/// loopback, which the egress policy refuses by default.
pub const LOOPBACK_NETWORKS: &str = "127.0.0.0/8";

/// The secret most tests sign with.
pub const SECRET: &str = "It's a Secret to Everybody";

/// `sha256=<hex>` of `body` under `secret`, computed independently of the
/// library under test.
pub fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Waits for `check` to hold, polling; panics after `limit`. For conditions
/// the test cannot be told about directly (a broker noticing a dead
/// connection), never as a stand-in for driving the worker.
pub async fn wait_until<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A counter's value in a scrape: the series of `name` whose labels
/// include every one of `labels`.
pub fn counter(scrape: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
}

/// Creates a database named `<prefix>_<uuid>` and migrates it; returns its
/// name and URL. Drop it with [`drop_database`].
pub async fn create_database(prefix: &str) -> (String, String) {
    let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
    let admin = connect(&format!("{}/postgres", postgres_base())).await;
    admin
        .batch_execute(&format!("create database {name}"))
        .await
        .expect("create test database");
    let url = format!("{}/{name}", postgres_base());
    let pool = hookinbox::postgres::pool(&url, 1, hookinbox::postgres::DEFAULT_REQUEST_TIMEOUT)
        .expect("pool");
    hookinbox::postgres::migrate(&pool).await.expect("migrate");
    (name, url)
}

/// Drops a database made by [`create_database`], closing its sessions.
pub async fn drop_database(name: &str) {
    let admin = connect(&format!("{}/postgres", postgres_base())).await;
    let _ = admin
        .batch_execute(&format!("drop database if exists {name} with (force)"))
        .await;
}

/// The PgBouncer the suite runs through (`HOOKINBOX_TEST_PGBOUNCER`,
/// `host:port`), if any.
pub fn pgbouncer() -> Option<String> {
    std::env::var("HOOKINBOX_TEST_PGBOUNCER")
        .ok()
        .filter(|v| !v.is_empty())
}

/// One test's private database and queue prefix.
pub struct TestEnv {
    /// The database's name.
    pub db_name: String,
    /// Its URL.
    pub database_url: String,
    /// The queue prefix.
    pub prefix: String,
    /// A direct connection for assertions.
    pub db: tokio_postgres::Client,
    /// Processes [`TestEnv::spawn`] started: stopped before the queues are
    /// deleted, or one of them could declare them again.
    children: std::sync::Mutex<Vec<(u32, PathBuf)>>,
}

impl TestEnv {
    /// Creates a fresh database and a random queue prefix.
    pub async fn new() -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let (db_name, database_url) = create_database("hookinbox_test").await;
        let db = connect(&database_url).await;
        Self {
            db_name,
            database_url,
            prefix: format!("test-{id}"),
            db,
            children: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// This test's database URL, through a proxy listening on `port`.
    pub fn database_url_via(&self, port: u16) -> String {
        // A URL without the default address would bypass the proxy and make
        // every fault through it a no-op; refuse it instead.
        assert!(
            self.database_url.contains("@127.0.0.1:5432/"),
            "proxied tests need HOOKINBOX_TEST_POSTGRES at 127.0.0.1:5432"
        );
        self.database_url
            .replace("127.0.0.1:5432", &format!("127.0.0.1:{port}"))
    }

    /// The URL hookinbox's processes use: this test's database, through
    /// the PgBouncer named by `HOOKINBOX_TEST_PGBOUNCER` (`host:port`) when
    /// set, so that the suite's core paths can be run through a
    /// transaction pooler (`scripts/test.sh --through-pgbouncer`).
    pub fn app_database_url(&self) -> String {
        match pgbouncer() {
            Some(at) => self.database_url.replace("127.0.0.1:5432", &at),
            None => self.database_url.clone(),
        }
    }

    /// The environment that points a spawned binary at this test's
    /// database: through the pooler when there is one.
    pub fn database_env(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![("DATABASE_URL", self.app_database_url())];
        if pgbouncer().is_some() {
            vars.push(("HOOKINBOX_DB_POOLER", "transaction".to_owned()));
            vars.push(("HOOKINBOX_DIRECT_DATABASE_URL", self.database_url.clone()));
        }
        vars
    }

    /// Shared settings pointing at this test's database and queues.
    pub fn common(&self) -> CommonArgs {
        let mut common: CommonArgs = defaults();
        common.database_url = self.app_database_url();
        if pgbouncer().is_some() {
            common.db_pooler = hookinbox::postgres::Pooler::Transaction;
            common.direct_database_url = Some(self.database_url.clone());
        }
        common.amqp_url = amqp_url();
        common.queue_prefix = self.prefix.clone();
        common.auto_migrate = false;
        common.lease_secs = 30;
        common.max_attempts = Some(5);
        common.publish_timeout_ms = 3000;
        common.db_pool_size = 8;
        common
    }

    /// The state machine's knobs of [`TestEnv::common`].
    pub fn policy(&self) -> Policy {
        self.common().validate().expect("valid settings").policy()
    }

    /// Ingest settings: the default source with [`SECRET`].
    pub fn ingest_args(&self) -> IngestArgs {
        let mut args: IngestArgs = defaults();
        args.common = self.common();
        args.listen = "127.0.0.1:0".parse().expect("address");
        args.metrics_listen = "127.0.0.1:0".parse().expect("address");
        args.sources.github_secret = Some(SECRET.to_owned());
        args
    }

    /// Worker settings.
    pub fn worker_args(&self) -> WorkerArgs {
        let mut args: WorkerArgs = defaults();
        args.common = self.common();
        args.concurrency = 4;
        args.metrics_listen = "127.0.0.1:0".parse().expect("address");
        args.handler_timeout_ms = 10_000;
        args.forward_timeout_ms = 2000;
        args.shutdown_grace_secs = 5;
        args.retry_base_ms = Some(100);
        args.retry_max_ms = Some(2000);
        args.scheduler_interval_ms = 50;
        // The tests' receivers listen on loopback, which the egress policy
        // refuses by default: named here, as local development names it.
        args.forward_allow_networks = Some(LOOPBACK_NETWORKS.to_owned());
        args
    }

    /// A new environment and an ingest with the default settings: how most
    /// tests begin.
    pub async fn with_ingest() -> (Self, TestIngest) {
        let env = Self::new().await;
        let ingest = env.ingest().await;
        (env, ingest)
    }

    /// A new environment and an ingest whose default source's destination
    /// is `forward` (`HOOKINBOX_HANDLER=forward`, as the workers it feeds
    /// are set).
    pub async fn with_forward_ingest() -> (Self, TestIngest) {
        let env = Self::new().await;
        let mut args = env.ingest_args();
        args.sources.handler = hookinbox::config::HandlerKind::Forward;
        let ingest = env
            .ingest_with(args.validate().expect("valid settings"))
            .await;
        (env, ingest)
    }

    /// A pool of `size` connections to this test's database.
    pub fn pool(&self, size: usize) -> deadpool_postgres::Pool {
        hookinbox::postgres::pool(
            &self.database_url,
            size,
            hookinbox::postgres::DEFAULT_REQUEST_TIMEOUT,
        )
        .expect("pool")
    }

    /// Writes `toml` as this test's `HOOKINBOX_CONFIG` file; returns its
    /// path (removed by [`TestEnv::cleanup`]).
    pub fn config_file(&self, toml: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("{}.toml", self.prefix));
        std::fs::write(&path, toml).expect("write the config file");
        path
    }

    /// A config file of one source, `default` (the suite's secret), with a
    /// `forward` destination `app` to `url` on loopback, then the TOML of
    /// any other destinations, `more` (e.g. [`STORE_TOO`]).
    pub fn forward_config(&self, url: &str, more: &str) -> PathBuf {
        self.config_file(&format!(
            r#"
[[sources]]
name = "default"
secrets = ["{secret}"]

[[sources.destinations]]
name = "app"
kind = "forward"
url = "{url}"
allow_networks = ["127.0.0.0/8"]
{more}"#,
            secret = SECRET,
        ))
    }

    /// Starts ingest on the sources of a config file.
    pub async fn ingest_on(&self, config: &std::path::Path) -> TestIngest {
        let mut args = self.ingest_args();
        args.sources.github_secret = None;
        args.sources.config = Some(config.to_owned());
        self.ingest_with(args.validate().expect("valid settings"))
            .await
    }

    /// Worker settings on the sources of a config file.
    pub fn worker_config_on(&self, config: &std::path::Path) -> WorkerConfig {
        let mut args = self.worker_args();
        args.sources.config = Some(config.to_owned());
        args.validate().expect("valid settings")
    }

    /// A worker on the sources of a config file, running the built-in
    /// handlers and those of `registry`.
    pub async fn worker_on(
        &self,
        config: &std::path::Path,
        registry: hookinbox_worker::Registry,
    ) -> Worker {
        let config = self.worker_config_on(config);
        let handler =
            hookinbox_worker::from_config(&config.routes, &registry).expect("the handlers");
        self.worker_with(config, handler).await
    }

    /// Runs a worker on the sources of a config file until no leg is left
    /// uncompleted (failing after `limit`), then stops it cleanly.
    pub async fn run_worker_until_completed(&self, config: &std::path::Path, limit: Duration) {
        let worker = self.worker_on(config, Default::default()).await;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let running = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { worker.run(shutdown).await }
        });
        wait_until("every leg to complete", limit, || async {
            self.count("select count(*) from deliveries where status <> 'completed'")
                .await
                == 0
        })
        .await;
        shutdown.cancel();
        running.await.expect("joins").expect("stops cleanly");
    }

    /// Starts ingest with the default settings.
    pub async fn ingest(&self) -> TestIngest {
        self.ingest_with(self.ingest_args().validate().expect("valid settings"))
            .await
    }

    /// Starts ingest with `config`, on a free port.
    pub async fn ingest_with(&self, config: IngestConfig) -> TestIngest {
        let app = IngestApp::build(config).await.expect("ingest starts");
        let port = app.port();
        let handle = app.handle();
        tokio::spawn(app.run_until_stopped());
        TestIngest {
            base: format!("http://127.0.0.1:{port}"),
            port,
            http: reqwest::Client::new(),
            handle,
        }
    }

    /// A worker running `handler`.
    pub async fn worker(&self, handler: Arc<dyn Handler>) -> Worker {
        self.worker_with(self.worker_args().validate().expect("valid"), handler)
            .await
    }

    /// A worker with `config`.
    pub async fn worker_with(&self, config: WorkerConfig, handler: Arc<dyn Handler>) -> Worker {
        Worker::build(config, handler).await.expect("worker builds")
    }

    /// A worker running the `store` handler.
    pub async fn store_worker(&self) -> Worker {
        self.worker(Arc::new(hookinbox_worker::Store)).await
    }

    /// Runs `sql`, which must return one bigint.
    pub async fn count(&self, sql: &str) -> i64 {
        self.db.query_one(sql, &[]).await.expect(sql).get(0)
    }

    /// Rows in `deliveries`.
    pub async fn deliveries(&self) -> i64 {
        self.count("select count(*) from deliveries").await
    }

    /// Rows in `github_events`.
    pub async fn events(&self) -> i64 {
        self.count("select count(*) from github_events").await
    }

    /// Messages ready in a queue of this test.
    pub async fn queue_depth(&self, queue: &str) -> u32 {
        self.queue_depth_if_any(queue)
            .await
            .unwrap_or_else(|| panic!("queue {queue} exists"))
    }

    /// Ready messages in `queue`, or `None` when there is no such queue.
    pub async fn queue_depth_if_any(&self, queue: &str) -> Option<u32> {
        let connection =
            lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default())
                .await
                .expect("amqp");
        let channel = connection.create_channel().await.expect("channel");
        let q = channel
            .queue_declare(
                queue,
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await;
        let _ = connection.close(200, "").await;
        q.ok().map(|q| q.message_count())
    }

    /// The work queues this test's legs can be in: the legacy shared one,
    /// and the queue of every destination its database knows (registered
    /// by a worker, or named by a leg).
    pub async fn work_queues(&self) -> Vec<String> {
        let mut queues = vec![format!("{}.work", self.prefix)];
        let rows = self
            .db
            .query(
                "select source, name from destinations \
                 union select source, destination from deliveries where destination <> ''",
                &[],
            )
            .await
            .unwrap_or_default();
        for row in rows {
            let (source, name): (String, String) = (row.get(0), row.get(1));
            queues.push(format!("{}.work.{source}.{name}", self.prefix));
        }
        queues.sort();
        queues.dedup();
        queues
    }

    /// Ready messages in every work queue (see [`TestEnv::work_queues`]).
    pub async fn work_depth(&self) -> u32 {
        let mut depth = 0;
        for queue in self.work_queues().await {
            depth += self.queue_depth_if_any(&queue).await.unwrap_or(0);
        }
        depth
    }

    /// Ready messages in the dead-letter queue.
    pub async fn dead_depth(&self) -> u32 {
        self.queue_depth(&format!("{}.dlq", self.prefix)).await
    }

    /// Asserts what a job that failed on every run leaves: its outcomes
    /// (`max_attempts` requeues, then poisoned), its one row failed as
    /// poison, not retryable, after exactly `max_attempts` takes, and its
    /// copy in the dead-letter queue with nothing left to work.
    pub async fn assert_poisoned(
        &self,
        outcomes: &[hookinbox_worker::JobOutcome],
        max_attempts: i32,
    ) {
        let mut expected = vec![hookinbox_worker::JobOutcome::Requeued; max_attempts as usize];
        expected.push(hookinbox_worker::JobOutcome::Poisoned);
        assert_eq!(outcomes, expected.as_slice());
        let row = self
            .db
            .query_one(
                "select status, retryable, attempts, last_error_class from deliveries",
                &[],
            )
            .await
            .expect("row");
        assert_eq!(row.get::<_, String>(0), "failed");
        assert!(!row.get::<_, bool>(1));
        assert_eq!(
            row.get::<_, i32>(2),
            max_attempts,
            "no take past the maximum"
        );
        assert_eq!(row.get::<_, String>(3), "poison");
        assert_eq!(self.dead_depth().await, 1);
        assert_eq!(self.work_depth().await, 0);
    }

    /// Claims `hook` as an ingest of the version before the claim wrote
    /// bodies left it when it died between the claim and the publish: a
    /// processing claim whose lease is already over, no job, and no body
    /// anywhere but at GitHub (awaiting redelivery). A claim now writes its
    /// body ([`TestEnv::claim_expired`] leaves one so).
    pub async fn claim_unpublished(&self, hook: &Hook) {
        let pool = self.pool(1);
        let client = pool.get().await.expect("client");
        self.claim_expired(&client, hook, store_leg()).await;
        client
            .execute("delete from bodies where delivery_id = $1", &[&hook.id()])
            .await
            .expect("forget the body");
    }

    /// Claims `hook`'s one leg `leg` with a lease that is already over
    /// (nothing published), and returns the claim's token.
    pub async fn claim_expired(
        &self,
        client: &deadpool_postgres::Object,
        hook: &Hook,
        leg: hookinbox::deliveries::LegRequest,
    ) -> hookinbox::ClaimToken {
        let mut policy = self.policy();
        policy.lease = Duration::ZERO;
        let claim = hookinbox::deliveries::claim(client, &policy, &claim_request(hook, vec![leg]))
            .await
            .expect("claim");
        claimed_token(&claim).unwrap_or_else(|| panic!("{claim:?}"))
    }

    /// Whether the table (or partition) `name` exists.
    pub async fn exists_table(&self, name: &str) -> bool {
        self.db
            .query_one("select to_regclass($1) is not null", &[&name])
            .await
            .expect("to_regclass")
            .get(0)
    }

    /// Runs the reaper with no grace: every claim whose lease is over
    /// becomes failed, retryable, class `lost`. Returns how many.
    pub async fn reap_now(&self) -> u64 {
        let pool = self.pool(1);
        let client = pool.get().await.expect("client");
        hookinbox::deliveries::reap(&client, Duration::ZERO, 1000)
            .await
            .expect("reap")
    }

    /// Drops the database and the queues. Call at the end of a test; a
    /// failed test leaves them behind for inspection.
    pub async fn cleanup(self) {
        let children = std::mem::take(&mut *self.children.lock().expect("lock"));
        for (pid, binary) in children {
            // Only a process still running that binary: the test may have
            // reaped it already, and its pid may belong to another now.
            let running =
                std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == binary);
            if running {
                let _ = std::process::Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .status();
            }
        }
        let mut queues = self.work_queues().await;
        queues.push(format!("{}.dlq", self.prefix));
        if let Ok(connection) =
            lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default()).await
        {
            if let Ok(channel) = connection.create_channel().await {
                for q in &queues {
                    let _ = channel.queue_delete(q, Default::default()).await;
                }
                for x in ["work", "dlx"] {
                    let _ = channel
                        .exchange_delete(&format!("{}.{x}", self.prefix), Default::default())
                        .await;
                }
            }
            let _ = connection.close(200, "").await;
        }
        drop(self.db);
        drop_database(&self.db_name).await;
        let _ = std::fs::remove_file(std::env::temp_dir().join(format!("{}.toml", self.prefix)));
    }
}

/// Sends one `push` per age through `ingest`, lets `worker` store them,
/// then ages their stored events, in delivery id order: the first
/// `ages_days[0]` days old, and so on.
pub async fn stored_events_aged(
    env: &TestEnv,
    ingest: &TestIngest,
    worker: &Worker,
    ages_days: &[i32],
) {
    for _ in ages_days {
        assert_eq!(ingest.send(&Hook::fixture("push")).await.status, 202);
    }
    settle(env, worker).await;
    assert_eq!(env.events().await, ages_days.len() as i64);
    env.db
        .execute(
            "with aged as (
                 select delivery_id, row_number() over (order by delivery_id) as n
                 from github_events
             )
             update github_events e
             set received_at = now() - make_interval(days => ($1::int4[])[a.n])
             from aged a where a.delivery_id = e.delivery_id",
            &[&ages_days],
        )
        .await
        .expect("age events");
}

/// Drives `worker` until nothing is left: drains the queue, runs the retry
/// scheduler, and when retries are pending waits until the earliest is due
/// by the database's own `next_attempt_at` (a condition, not a guess).
/// Returns every job outcome in order.
pub async fn settle(env: &TestEnv, worker: &Worker) -> Vec<hookinbox_worker::JobOutcome> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut outcomes = Vec::new();
    loop {
        assert!(tokio::time::Instant::now() < deadline, "did not settle");
        outcomes.extend(worker.drain().await.expect("drain").outcomes);
        if worker.schedule_once().await.expect("scheduler") > 0 {
            continue;
        }
        let next: Option<f64> = env
            .db
            .query_one(
                "select extract(epoch from min(next_attempt_at) - now())::float8 from deliveries \
                 where status = 'failed' and retryable",
                &[],
            )
            .await
            .expect("next due")
            .get(0);
        match next {
            // Legs held for fairness have no due time: the scheduler's
            // wake makes them due once their installation's turn comes.
            None if env
                .count("select count(*) from deliveries where status = 'failed' and last_error_class = 'fair'")
                .await
                > 0 =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            None => return outcomes,
            Some(wait) => {
                tokio::time::sleep(
                    Duration::from_secs_f64(wait.max(0.0)) + Duration::from_millis(5),
                )
                .await
            }
        }
    }
}

/// Runs a `hookinbox-worker` subcommand against this test's database and
/// queues; returns the exit code and standard output.
pub fn worker_cli(env: &TestEnv, args: &[&str]) -> (i32, String) {
    let out = worker_command(env, args, &[]).output().expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The command of a `hookinbox-worker` subcommand against this test's
/// database and queues, with `extra` variables, and nothing else from the
/// test's own environment.
pub fn worker_command(
    env: &TestEnv,
    args: &[&str],
    extra: &[(&str, &str)],
) -> std::process::Command {
    let mut cmd = std::process::Command::new(bin("hookinbox-worker"));
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.database_env())
        .env("AMQP_URL", amqp_url())
        .env("HOOKINBOX_QUEUE_PREFIX", &env.prefix)
        .env("HOOKINBOX_AUTO_MIGRATE", "false")
        .env("RUST_LOG", "warn");
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd
}

/// Connects a plain client, driving its connection in the background.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("Postgres reachable");
    tokio::spawn(connection);
    client
}

/// A running ingest.
pub struct TestIngest {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// Its port.
    pub port: u16,
    /// An HTTP client.
    pub http: reqwest::Client,
    /// Stops the server.
    pub handle: actix_web_handle::ServerHandle,
}

/// Re-export so tests need not depend on actix-web.
pub mod actix_web_handle {
    pub use hookinbox_ingest::ServerHandle;
}

/// One webhook request, signed or not.
#[derive(Clone, Debug)]
pub struct Hook {
    /// Route path, `/webhooks/github` by default.
    pub path: String,
    /// `X-GitHub-Event`, if sent.
    pub event: Option<String>,
    /// `X-GitHub-Delivery`, if sent.
    pub delivery: Option<String>,
    /// `X-GitHub-Hook-ID`, if sent.
    pub hook_id: Option<String>,
    /// `Content-Type`.
    pub content_type: String,
    /// `X-Hub-Signature-256`, if sent.
    pub signature: Option<String>,
    /// Extra headers.
    pub extra: Vec<(String, String)>,
    /// The raw body.
    pub body: Vec<u8>,
}

impl Hook {
    /// A JSON delivery of `event`, signed with [`SECRET`], with a fresh id.
    pub fn new(event: &str, body: impl Into<Vec<u8>>) -> Self {
        let body = body.into();
        Self {
            path: "/webhooks/github".to_owned(),
            event: Some(event.to_owned()),
            delivery: Some(uuid::Uuid::new_v4().to_string()),
            hook_id: Some("123456".to_owned()),
            content_type: "application/json".to_owned(),
            signature: Some(sign(SECRET, &body)),
            extra: Vec::new(),
            body,
        }
    }

    /// A delivery of `event` with the repo's own payload for it
    /// (`tests/fixtures/<event>/`), made unique ([`fixtures::unique`]) so
    /// that the replay guard takes each one.
    pub fn fixture(event: &str) -> Self {
        Self::new(event, fixtures::unique(&fixtures::own(event)))
    }

    /// Re-signs the body with `secret`.
    pub fn signed_with(mut self, secret: &str) -> Self {
        self.signature = Some(sign(secret, &self.body));
        self
    }

    /// The delivery key ingest derives from this request (default source).
    pub fn key(&self) -> hookinbox::key::DeliveryKey {
        use hookinbox::key::{DeliveryId, DeliveryKey, HookId, SourceName};
        DeliveryKey::github(
            SourceName::default_source(),
            HookId::parse(self.hook_id.as_deref().map(str::as_bytes)).expect("hook id"),
            DeliveryId::parse(self.id().as_bytes()).expect("id"),
        )
    }

    /// Its leg to the default settings' destination (`store`).
    pub fn leg(&self) -> hookinbox::key::LegKey {
        self.key().leg(store_destination())
    }

    /// The delivery id (panics if none).
    pub fn id(&self) -> &str {
        self.delivery.as_deref().expect("delivery id")
    }

    /// Sends this request to the ingest at `base` and returns the answer;
    /// panics if none comes.
    pub async fn post(&self, http: &reqwest::Client, base: &str) -> Answer {
        self.try_post(http, base).await.expect("ingest answers")
    }

    /// Sends this request to the ingest at `base`: its answer, or the
    /// transport's error (a load generator counts it rather than stop).
    pub async fn try_post(
        &self,
        http: &reqwest::Client,
        base: &str,
    ) -> Result<Answer, reqwest::Error> {
        let hook = self;
        let mut req = http
            .post(format!("{base}{}", hook.path))
            .header("content-type", &hook.content_type)
            .header("user-agent", "GitHub-Hookshot/test")
            .body(hook.body.clone());
        if let Some(v) = &hook.event {
            req = req.header("x-github-event", v);
        }
        if let Some(v) = &hook.delivery {
            req = req.header("x-github-delivery", v);
        }
        if let Some(v) = &hook.hook_id {
            req = req.header("x-github-hook-id", v);
        }
        if let Some(v) = &hook.signature {
            req = req.header("x-hub-signature-256", v);
        }
        for (k, v) in &hook.extra {
            req = req.header(k, v);
        }
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let text = resp.text().await.unwrap_or_default();
        Ok(Answer {
            status,
            body: serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
            retry_after,
        })
    }
}

/// An answer: status and JSON body.
#[derive(Debug)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The JSON body (`Null` if not JSON).
    pub body: serde_json::Value,
    /// `Retry-After`, if sent.
    pub retry_after: Option<String>,
}

impl Answer {
    /// `body.status`.
    pub fn kind(&self) -> &str {
        self.body["status"].as_str().unwrap_or("")
    }
}

impl TestIngest {
    /// Sends `hook` and returns the answer.
    pub async fn send(&self, hook: &Hook) -> Answer {
        hook.post(&self.http, &self.base).await
    }

    /// Sends `hook`, expects it accepted (202), and returns whether its
    /// body was parked for the scheduler (the broker out of reach).
    pub async fn send_accepted(&self, hook: &Hook) -> bool {
        let answer = self.send(hook).await;
        assert_eq!(
            (answer.status, answer.kind()),
            (202, "accepted"),
            "{:?}",
            answer.body
        );
        answer.body["parked"] == true
    }

    /// GETs a path and returns the status.
    pub async fn get(&self, path: &str) -> u16 {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    }

    /// Stops the server.
    pub async fn stop(&self) {
        self.handle.stop(false).await;
    }
}

/// A free local port (bound, then released for a child process to take).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A binary of this workspace running as a child process.
pub struct Spawned {
    /// The process; killed on drop.
    pub child: tokio::process::Child,
    /// Its log file (standard error).
    pub log: PathBuf,
    /// Its metrics port.
    pub metrics_port: u16,
    /// Its main port (ingest) or 0.
    pub port: u16,
}

impl Spawned {
    /// Everything it logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until an ingest answers `/readyz` with 200 on its main port.
    pub async fn wait_ready(&self) {
        let url = format!("http://127.0.0.1:{}/readyz", self.port);
        wait_until("ingest to be ready", Duration::from_secs(20), || async {
            reqwest::get(&url)
                .await
                .map(|r| r.status() == 200)
                .unwrap_or(false)
        })
        .await;
    }

    /// GETs `path` on its metrics listener.
    pub async fn scrape(&self, path: &str) -> (u16, String) {
        match reqwest::get(format!("http://127.0.0.1:{}{path}", self.metrics_port)).await {
            Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }
}

impl TestEnv {
    /// Runs `hookinbox-ingest` or `hookinbox-worker` against this test's
    /// database and queues, with `extra` environment variables, logging to
    /// a file.
    pub fn spawn(&self, binary: &str, extra: &[(&str, &str)]) -> Spawned {
        self.spawn_with_args(binary, &[], extra)
    }

    /// [`TestEnv::spawn`] with arguments (a subcommand and its flags).
    pub fn spawn_with_args(&self, binary: &str, args: &[&str], extra: &[(&str, &str)]) -> Spawned {
        let port = free_port();
        let metrics_port = free_port();
        let log = std::env::temp_dir().join(format!("{}-{binary}-{port}.log", self.prefix));
        let file = std::fs::File::create(&log).expect("log file");
        let mut cmd = tokio::process::Command::new(bin(binary));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.database_env())
            .env("AMQP_URL", amqp_url())
            .env("HOOKINBOX_QUEUE_PREFIX", &self.prefix)
            .env("HOOKINBOX_AUTO_MIGRATE", "false")
            .env("HOOKINBOX_LISTEN", format!("127.0.0.1:{port}"))
            .env(
                "HOOKINBOX_METRICS_LISTEN",
                format!("127.0.0.1:{metrics_port}"),
            )
            .env("HOOKINBOX_LOG_FORMAT", "json")
            // The receivers are local (see [`LOOPBACK_NETWORKS`]); `extra`
            // may say otherwise.
            .env("HOOKINBOX_FORWARD_ALLOW_NETWORKS", LOOPBACK_NETWORKS);
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("binary starts");
        if let Some(pid) = child.id() {
            self.children.lock().expect("lock").push((pid, bin(binary)));
        }
        Spawned {
            child,
            log,
            metrics_port,
            port,
        }
    }
}

/// Path of a workspace binary (`cargo nextest run --workspace` builds them
/// next to the test binaries).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // A test runs from `target/<profile>/deps/`, a tool of this crate from
    // `target/<profile>/`: the binaries are in the profile's folder.
    let mut dir = exe.parent().expect("the executable's folder");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("target dir");
    }
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built; run the tests with `cargo nextest run --workspace`",
        path.display()
    );
    path
}

/// What a model-based test's cases share: a runtime, and a database of its
/// own with a pool on it (each case works on keys of its own).
pub struct ModelDb {
    /// Runs each step's statements.
    pub runtime: tokio::runtime::Runtime,
    /// On the database.
    pub pool: deadpool_postgres::Pool,
    /// The database's name, to drop it once every case passed (a failing
    /// case leaves it for inspection).
    pub db_name: String,
}

impl ModelDb {
    /// A runtime and a new database named from `prefix`, migrated, with
    /// `setup` run on it.
    pub fn new(prefix: &str, setup: &str) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let (db_name, pool) = runtime.block_on(async {
            let (name, url) = create_database(prefix).await;
            let pool =
                hookinbox::postgres::pool(&url, 4, hookinbox::postgres::DEFAULT_REQUEST_TIMEOUT)
                    .expect("pool");
            if !setup.is_empty() {
                pool.get()
                    .await
                    .expect("client")
                    .batch_execute(setup)
                    .await
                    .expect("setup");
            }
            (name, pool)
        });
        Self {
            runtime,
            pool,
            db_name,
        }
    }

    /// Drops the database (once every case passed).
    pub fn drop_database(&self) {
        self.runtime.block_on(drop_database(&self.db_name));
    }
}

/// Asserts that a model-based test's cases reached every path it counts
/// (`reached[i]` counts the path named `paths[i]`), and prints the counts.
pub fn assert_reached(reached: &[std::sync::atomic::AtomicUsize], paths: &[&str]) {
    let counts: Vec<usize> = reached
        .iter()
        .map(|n| n.load(std::sync::atomic::Ordering::Relaxed))
        .collect();
    let named: Vec<String> = paths
        .iter()
        .zip(&counts)
        .map(|(path, n)| format!("{path} {n}"))
        .collect();
    eprintln!("paths reached: {}", named.join(", "));
    assert!(
        counts.iter().all(|n| *n > 0),
        "the cases missed a path: {}",
        named.join(", ")
    );
}

/// A model-based test's claim of `leg`'s delivery: a `push` whose body's
/// digest is `[n; 32]`, with one leg to the leg's destination, of the
/// ordered key `order_key` or fair as `fair` (installation, share, hard).
pub fn model_claim(
    leg: &hookinbox::key::LegKey,
    n: u8,
    order_key: Option<String>,
    fair: Option<(String, i32, bool)>,
) -> hookinbox::deliveries::ClaimRequest {
    hookinbox::deliveries::ClaimRequest {
        origin: Default::default(),
        key: hookinbox::key::DeliveryKey::github(
            leg.source.clone(),
            leg.hook_id.clone(),
            leg.delivery_id.clone(),
        ),
        event: "push".into(),
        action: None,
        repository: None,
        body_sha256: [n; 32],
        guarded: false,
        pinned: false,
        legs: vec![hookinbox::deliveries::LegRequest {
            destination: leg.destination.clone(),
            filtered: None,
            order_key,
            fair,
            stale_clock: None,
        }],
        body: json_body(b"{}"),
    }
}

/// A model-based test's number of cases: `PROPTEST_CASES`, else `default`.
pub fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs a model-based test's cases (`run`) with its planted bug switched
/// on (`plant(true)`) and expects its checks to fail; switches the bug off
/// again either way. `what` names the bug in the failure.
pub fn expect_planted_bug_caught(plant: impl Fn(bool), run: fn(), what: &str) {
    plant(true);
    let caught = std::panic::catch_unwind(run);
    plant(false);
    assert!(caught.is_err(), "the checks let {what} through");
}
