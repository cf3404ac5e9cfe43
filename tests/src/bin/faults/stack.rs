//! The stack under test and its start and stop: the private services
//! (`services.rs`), the database with the effect log, the fake GitHub and
//! the receivers (the relay's, and the `fanout` source's `steady` and
//! `flaky`), the sources' configuration, the proxies the faults cut, then
//! ingest and three workers (built with their kill points).
//!
//! With `HOOKINBOX_FAULT_CLUSTER` (`scripts/faults.sh --cluster`) the broker
//! is three clustered nodes, every process's `AMQP_URL` lists them, and
//! Postgres has a synchronous streaming standby that every
//! `DATABASE_URL` lists after the primary (`target_session_attrs=read-write`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::bail;
use hookinbox_tests::github::{self, FakeGithub, HookPath};
use hookinbox_tests::proxy::Proxy;
use hookinbox_tests::receiver::Receiver;
use hookinbox_tests::{SECRET, free_port};
use tokio::process::{Child, Command};

use crate::Settings;
use crate::destinations::{LEGS, POLICY, Receivers, SOURCE};
use crate::load::Github;
use crate::services::{PrivatePg, PrivatePgbouncer, PrivateRabbit};

/// Every worker's and ingest's lease, in seconds.
pub const LEASE_SECS: &str = "3";

/// The token the fake GitHub takes.
const GITHUB_TOKEN: &str = "ghp_fault_suite";

/// Everything the suite started, and what it counted while faults hit.
pub struct Suite {
    /// The working folder: logs, the instances' data.
    pub root: PathBuf,
    /// Where the failpoint build of the binaries is.
    pub bins: PathBuf,
    /// The private Postgres.
    pub pg: PrivatePg,
    /// The private RabbitMQ node, or the cluster's nodes (the first is
    /// the one the single-node faults restart).
    pub rabbits: Vec<PrivateRabbit>,
    /// The synchronous standby of `pg`, in cluster mode; promoted by the
    /// failover, after which it is the primary.
    pub standby: Option<PrivatePg>,
    /// The database's name.
    pub db: String,
    /// Workers to Postgres (or PgBouncer) go through it.
    pub pg_proxy: Proxy,
    /// Ingest to RabbitMQ goes through it.
    pub amqp_proxy: Proxy,
    /// Where ingest listens.
    pub ingest_port: u16,
    /// The running ingest.
    pub ingest: Option<Child>,
    /// The running workers, by index.
    pub workers: Vec<Option<Child>>,
    /// Faults injected, by name.
    pub counts: HashMap<&'static str, u32>,
    /// When each fault began and ended.
    pub windows: Vec<(Instant, Instant)>,
    /// The cluster's faults by name, with their windows (also in
    /// `windows`), for the recovery report.
    pub named: Vec<(&'static str, Instant, Instant)>,
    /// The sources' configuration file both binaries read.
    pub config: PathBuf,
    /// The fake GitHub that sends every delivery.
    pub github: Github,
    /// The PgBouncer (transaction mode) ingest and the workers go through,
    /// when `HOOKINBOX_FAULT_PGBOUNCER` is set.
    pub pgbouncer: Option<PrivatePgbouncer>,
    /// The relay source's receiver: it records every request.
    pub receiver: Receiver,
    /// The `fanout` source's receivers, and the faults injected into
    /// `flaky`.
    pub receivers: Receivers,
}

impl Suite {
    /// Starts the private services, lays out the database and the
    /// configuration, and starts ingest and three workers.
    pub async fn start(settings: &Settings) -> anyhow::Result<Self> {
        let root = settings.root.clone();
        std::fs::create_dir_all(&root)?;
        eprintln!("faults: working in {}", root.display());

        let pg = PrivatePg::start_new(&root)?;
        let rabbits = if settings.cluster {
            let nodes = PrivateRabbit::start_cluster(&root, 3)?;
            eprintln!(
                "faults: RabbitMQ cluster of {}",
                nodes
                    .iter()
                    .map(|n| n.node.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            nodes
        } else {
            vec![PrivateRabbit::start_new(&root)?]
        };
        let db = "faults".to_owned();
        create_database(&pg, &db).await?;
        let standby = if settings.cluster {
            let standby = PrivatePg::standby_of(&pg, &root)?;
            synchronous_standby(&pg).await?;
            eprintln!(
                "faults: Postgres {} with a synchronous standby on {}",
                pg.port, standby.port
            );
            Some(standby)
        } else {
            None
        };
        let receiver = Receiver::ok().await;
        let receivers = Receivers::start().await?;
        let ingest_port = free_port();
        let github = fake_github(ingest_port);
        let token_file = root.join("github-token");
        std::fs::write(&token_file, GITHUB_TOKEN)?;
        let config = root.join("sources.toml");
        std::fs::write(
            &config,
            sources_toml(&github.fake.base, &token_file, &receiver.url, &receivers),
        )?;
        let pgbouncer = match std::env::var_os("HOOKINBOX_FAULT_PGBOUNCER") {
            Some(v) if !v.is_empty() && settings.cluster => {
                bail!("HOOKINBOX_FAULT_PGBOUNCER and the cluster run do not go together")
            }
            Some(v) if !v.is_empty() => {
                let pgbouncer = PrivatePgbouncer::start(&root, pg.port)?;
                eprintln!(
                    "faults: ingest and workers go through PgBouncer on port {}",
                    pgbouncer.port
                );
                Some(pgbouncer)
            }
            _ => None,
        };
        let front = pgbouncer.as_ref().map_or(pg.port, |p| p.port);
        let pg_proxy = Proxy::start(&format!("127.0.0.1:{front}")).await;
        let amqp_proxy = Proxy::start(&format!("127.0.0.1:{}", rabbits[0].port)).await;
        let mut suite = Suite {
            root,
            bins: settings.bins.clone(),
            pg,
            rabbits,
            standby,
            db,
            pg_proxy,
            amqp_proxy,
            ingest_port,
            ingest: None,
            workers: vec![None, None, None],
            counts: HashMap::new(),
            windows: Vec::new(),
            named: Vec::new(),
            config,
            github,
            pgbouncer,
            receiver,
            receivers,
        };
        suite.spawn_ingest(None)?;
        for i in 0..3 {
            suite.spawn_worker(i, None)?;
        }
        suite.wait_ready().await?;
        Ok(suite)
    }

    /// Polls (at most a minute) until ingest accepts connections and the
    /// workers have registered the `fanout` source's destinations.
    async fn wait_ready(&self) -> anyhow::Result<()> {
        let db = hookinbox_tests::connect(&self.database_url()).await;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let listening = tokio::net::TcpStream::connect(("127.0.0.1", self.ingest_port))
                .await
                .is_ok();
            let registered: i64 = db
                .query_one(
                    "select count(*) from destinations where source = $1",
                    &[&SOURCE],
                )
                .await?
                .get(0);
            if listening && registered == LEGS.len() as i64 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "not ready after a minute: ingest listening {listening}, {registered} destinations registered"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the binaries and the private services; fails with `failure`
    /// if the checks failed. The working folder is kept on failure (or
    /// with `HOOKINBOX_FAULT_KEEP`), removed otherwise.
    pub async fn stop(mut self, failure: Option<String>) -> anyhow::Result<()> {
        for w in self.workers.iter_mut().flatten() {
            let _ = w.kill().await;
        }
        if let Some(i) = self.ingest.as_mut() {
            let _ = i.kill().await;
        }
        let root = self.root.clone();
        // Its Postgres, RabbitMQ node and PgBouncer stop while their folders
        // still exist (`pg_ctl stop` needs the data directory).
        drop(self);
        if let Some(summary) = failure {
            bail!("{summary}");
        }
        if std::env::var_os("HOOKINBOX_FAULT_KEEP").is_some_and(|v| !v.is_empty()) {
            eprintln!("faults: kept {}", root.display());
        } else {
            let _ = std::fs::remove_dir_all(&root);
        }
        Ok(())
    }

    /// Where a process finds Postgres: directly, or through the proxy that
    /// degrades the workers' connections (`via_proxy`). With a PgBouncer,
    /// that path leads to it (the proxy stands in front of it), and the
    /// direct URL the leader locks and migrations need goes to Postgres.
    pub fn database_env(&self, via_proxy: bool) -> Vec<(&'static str, String)> {
        let front = match (&self.pgbouncer, via_proxy) {
            (_, true) => self.pg_proxy.port(),
            (Some(pgbouncer), false) => pgbouncer.port,
            (None, false) => self.pg.port,
        };
        let mut env = vec![("DATABASE_URL", self.with_standby(front))];
        if self.pgbouncer.is_some() {
            env.push(("HOOKINBOX_DB_POOLER", "transaction".to_owned()));
            env.push((
                "HOOKINBOX_DIRECT_DATABASE_URL",
                self.pg.url(self.pg.port, &self.db),
            ));
        }
        env
    }

    /// The direct URL of the suite's database, for the checks: in cluster
    /// mode, whichever of the primary and the standby takes writes.
    pub fn database_url(&self) -> String {
        self.with_standby(self.pg.port)
    }

    /// The URL of the database through `port` and, in cluster mode, the
    /// standby after it: connections go to the one that takes writes, so
    /// after the failover to the promoted standby.
    fn with_standby(&self, port: u16) -> String {
        match &self.standby {
            Some(standby) => format!(
                "postgres://postgres@127.0.0.1:{port},127.0.0.1:{}/{}?target_session_attrs=read-write&connect_timeout=2",
                standby.port, self.db
            ),
            None => self.pg.url(port, &self.db),
        }
    }

    /// The `AMQP_URL` of every node, the first through `first_port` (the
    /// first node's own, or the proxy's in front of it).
    pub fn amqp_url(&self, first_port: u16) -> String {
        self.rabbits
            .iter()
            .enumerate()
            .map(|(i, r)| r.url(if i == 0 { first_port } else { r.port }))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn log(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join(format!("{name}.log")))
            .expect("log file")
    }

    /// Starts ingest, armed at `failpoint` if given.
    pub fn spawn_ingest(&mut self, failpoint: Option<&str>) -> anyhow::Result<()> {
        let mut cmd = Command::new(self.bins.join("hookinbox-ingest"));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.database_env(false))
            .env("AMQP_URL", self.amqp_url(self.amqp_proxy.port()))
            .env("HOOKINBOX_CONFIG", &self.config)
            .env("HOOKINBOX_AUTO_MIGRATE", "false")
            .env("HOOKINBOX_LEASE_SECS", LEASE_SECS)
            .env("HOOKINBOX_PUBLISH_TIMEOUT_MS", "2000")
            .env(
                "HOOKINBOX_LISTEN",
                format!("127.0.0.1:{}", self.ingest_port),
            )
            .env("HOOKINBOX_METRICS_LISTEN", "127.0.0.1:0")
            .env("HOOKINBOX_LOG_FORMAT", "json")
            .env("HOOKINBOX_QUEUE_PREFIX", "faults");
        if let Some(fp) = failpoint {
            cmd.env("FAILPOINTS", fp);
        }
        self.ingest = Some(
            cmd.stdout(Stdio::null())
                .stderr(self.log("ingest"))
                .kill_on_drop(true)
                .spawn()?,
        );
        Ok(())
    }

    /// Starts worker `i`, armed at `failpoint` if given.
    pub fn spawn_worker(&mut self, i: usize, failpoint: Option<&str>) -> anyhow::Result<()> {
        let mut cmd = Command::new(self.bins.join("hookinbox-worker"));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.database_env(true))
            .env("AMQP_URL", self.amqp_url(self.rabbits[0].port))
            .env("HOOKINBOX_CONFIG", &self.config)
            .env("HOOKINBOX_DB_TIMEOUT_MS", "2000")
            .env("HOOKINBOX_AUTO_MIGRATE", "false")
            .env("HOOKINBOX_LEASE_SECS", LEASE_SECS)
            .env("HOOKINBOX_REAP_AFTER_SECS", "3")
            .env("HOOKINBOX_RETRY_BASE_MS", "200")
            .env("HOOKINBOX_RETRY_MAX_MS", "2000")
            .env("HOOKINBOX_MAX_ATTEMPTS", "50")
            .env("HOOKINBOX_PUBLISH_TIMEOUT_MS", "2000")
            .env("HOOKINBOX_CONCURRENCY", "4")
            // The relay's receiver is local: let forward reach loopback.
            .env("HOOKINBOX_FORWARD_ALLOW_NETWORKS", "127.0.0.0/8")
            .env("HOOKINBOX_METRICS_LISTEN", "127.0.0.1:0")
            .env("HOOKINBOX_LOG_FORMAT", "json")
            .env("HOOKINBOX_QUEUE_PREFIX", "faults")
            // `HOOKINBOX_FAULT_WORKER_LOG=debug` logs each message a worker
            // receives ("message received"), for a search after a loss.
            .env(
                "RUST_LOG",
                std::env::var("HOOKINBOX_FAULT_WORKER_LOG").unwrap_or_else(|_| "info".to_owned()),
            );
        if let Some(fp) = failpoint {
            cmd.env("FAILPOINTS", fp);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(self.log(&format!("worker-{i}")))
            .kill_on_drop(true)
            .spawn()?;
        self.workers[i] = Some(child);
        Ok(())
    }

    /// Counts one injected fault.
    pub fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }

    /// Records a fault that began at `since` and ends now.
    pub fn window(&mut self, since: Instant) {
        self.windows.push((since, Instant::now()));
    }

    /// Records a cluster fault `name` that began at `since` and ends now.
    pub fn named_window(&mut self, name: &'static str, since: Instant) {
        let now = Instant::now();
        self.windows.push((since, now));
        self.named.push((name, since, now));
    }
}

/// Creates the database, migrates it, and adds the log the `failpoints`
/// build writes every `store` effect to (no unique key, so a second effect
/// would show).
async fn create_database(pg: &PrivatePg, db: &str) -> anyhow::Result<()> {
    let admin = hookinbox_tests::connect(&pg.url(pg.port, "postgres")).await;
    admin
        .batch_execute(&format!("create database {db}"))
        .await?;
    let pool = hookinbox::postgres::pool(
        &pg.url(pg.port, db),
        2,
        hookinbox::postgres::DEFAULT_REQUEST_TIMEOUT,
    )?;
    hookinbox::postgres::migrate(&pool).await?;
    pool.get()
        .await?
        .batch_execute(
            "create table hookinbox_effect_log (provider text, source text, hook_id text, delivery_id text, destination text, at timestamptz default now())",
        )
        .await?;
    Ok(())
}

/// Makes every standby of `pg` synchronous (`synchronous_standby_names =
/// '*'`) and waits (at most 30 s) until one is.
///
/// Why: a commit then returns only once the standby has it, so a claim
/// answered 202 survives the primary's loss. Set after the standby's base
/// backup, so the standby, once promoted, does not wait for a standby of
/// its own.
async fn synchronous_standby(pg: &PrivatePg) -> anyhow::Result<()> {
    let admin = hookinbox_tests::connect(&pg.url(pg.port, "postgres")).await;
    // One statement at a time: `alter system` cannot run in a transaction
    // block, which a multi-statement batch is.
    admin
        .batch_execute("alter system set synchronous_standby_names = '*'")
        .await?;
    admin.batch_execute("select pg_reload_conf()").await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while admin
        .query_opt(
            "select 1 from pg_stat_replication where sync_state = 'sync'",
            &[],
        )
        .await?
        .is_none()
    {
        if Instant::now() > deadline {
            bail!("the standby did not become synchronous within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// GitHub: one repository hook per source, each pointed at ingest.
fn fake_github(ingest_port: u16) -> Github {
    let fake = FakeGithub::start(GITHUB_TOKEN);
    let hook = |repo: &str| github::Hook {
        path: HookPath::Repo {
            owner: "acme".into(),
            repo: repo.into(),
            id: 4242,
        },
        hook_id: "4242".into(),
        target: format!("http://127.0.0.1:{ingest_port}/webhooks/github/{repo}"),
        secret: SECRET.into(),
    };
    Github {
        store: fake.add_hook(hook("store")),
        relay: fake.add_hook(hook("relay")),
        fanout: fake.add_hook(hook(SOURCE)),
        fake,
    }
}

/// The sources: `store`; `relay` forwarding to `relay_url`; and `fanout`
/// with three destinations, `store` (ordered by repository) and two
/// `forward`s to the receivers (`steady`, fair, and `flaky`) on the short
/// [`POLICY`]. Each names its hook: the
/// workers reconcile every 15 s while the faults hit, and the suite's end
/// runs a pass of its own.
fn sources_toml(
    github_api: &str,
    token_file: &std::path::Path,
    relay_url: &str,
    receivers: &Receivers,
) -> String {
    let reconcile = |repo: &str| {
        format!(
            "[sources.github]\nreconcile_hook = \"repo:acme/{repo}/4242\"\napi_url = \"{}\"\n\
             token_file = \"{}\"\ninterval_secs = 15\nmin_age_secs = 3\nper_second = 100\n\
             max_redeliveries = 20\n",
            github_api,
            token_file.display()
        )
    };
    format!(
        "[[sources]]\nname = \"store\"\nsecrets = [\"{SECRET}\"]\nhandler = {{ kind = \"store\" }}\n{}\n\
         [[sources]]\nname = \"relay\"\nsecrets = [\"{SECRET}\"]\n\
         handler = {{ kind = \"forward\", url = \"{}\", timeout_ms = 2000 }}\n{}\n\
         [[sources]]\nname = \"{SOURCE}\"\nsecrets = [\"{SECRET}\"]\n\
         [[sources.destinations]]\nname = \"store\"\nkind = \"store\"\nordering = \"repository\"\n\
         [[sources.destinations]]\nname = \"steady\"\nkind = \"forward\"\nurl = \"{}\"\nfairness = true\nconcurrency = 2\n{POLICY}\
         [[sources.destinations]]\nname = \"flaky\"\nkind = \"forward\"\nurl = \"{}\"\n{POLICY}{}",
        reconcile("store"),
        relay_url,
        reconcile("relay"),
        receivers.steady.url(),
        receivers.flaky.url(),
        reconcile(SOURCE),
    )
}
