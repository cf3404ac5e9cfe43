//! The fault-injection suite: the real `hookinbox-ingest` and several
//! `hookinbox-worker` processes (built with the `failpoints` feature) under
//! a steady stream of signed deliveries with redeliveries, while faults hit
//! them at the worst moments. Postgres and RabbitMQ are private instances
//! the suite starts itself, so restarting them disturbs nothing else.
//!
//! Run it with `scripts/faults.sh [CYCLES] [KILLS_PER_CYCLE]`. At the end it
//! checks the ledger: every delivery answered 2xx has exactly one `store`
//! effect or is a dead letter; no effect is duplicated; no effect exists for
//! a delivery never sent. Deliveries go to two sources: `store` (the effect
//! is a row written in the completing transaction) and `relay` (`forward`
//! to a local receiver): every relayed key must arrive, and a key may
//! arrive twice only around a fault, always with the same key and body.
//!
//! GitHub is the local fake of `hookinbox_tests::github`: it sends every
//! delivery and logs each attempt, as GitHub does, and never retries. The
//! workers reconcile against it while the faults hit, and at the end the
//! reconciler (`hookinbox-worker reconcile`) must have brought back every
//! delivery that never got a 2xx: none is left unanswered.
//!
//! Its working folder (the processes' logs, the instances' data) is removed
//! after a passing run; a failing run, or `HOOKINBOX_FAULT_KEEP=1`, keeps it.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hookinbox_tests::github::{self, FakeGithub, HookPath};
use hookinbox_tests::proxy::Proxy;
use hookinbox_tests::receiver::Receiver;
use hookinbox_tests::{SECRET, fixtures, free_port};
use tokio::process::{Child, Command};

/// A private Postgres: its own data directory and port.
struct PrivatePg {
    dir: PathBuf,
    port: u16,
}

fn as_postgres(args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new("runuser");
    cmd.args(["-u", "postgres", "--"]).args(args);
    cmd
}

impl PrivatePg {
    fn bin(name: &str) -> String {
        format!("/usr/lib/postgresql/15/bin/{name}")
    }

    fn start_new(root: &Path) -> anyhow::Result<Self> {
        let dir = root.join("pg");
        std::fs::create_dir_all(&dir)?;
        std::process::Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(root)
            .status()?;
        let port = free_port();
        let ok = as_postgres(&[
            &Self::bin("initdb"),
            "-D",
            dir.to_str().unwrap_or(""),
            "--auth=trust",
            "-U",
            "postgres",
        ])
        .stdout(Stdio::null())
        .status()?
        .success();
        if !ok {
            bail!("initdb failed");
        }
        let pg = Self { dir, port };
        pg.start()?;
        Ok(pg)
    }

    fn ctl(&self, args: &[&str]) -> anyhow::Result<()> {
        let dir = self.dir.to_string_lossy().into_owned();
        let options = format!("-p {} -k {dir} -c listen_addresses=127.0.0.1", self.port);
        let mut all = vec![
            Self::bin("pg_ctl"),
            "-D".into(),
            dir.clone(),
            "-o".into(),
            options,
            "-l".into(),
            format!("{dir}/log"),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        let ok = as_postgres(&refs)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?
            .success();
        if !ok {
            bail!("pg_ctl {args:?} failed");
        }
        Ok(())
    }

    fn start(&self) -> anyhow::Result<()> {
        self.ctl(&["start", "-w"])
    }

    fn stop_immediate(&self) -> anyhow::Result<()> {
        self.ctl(&["stop", "-m", "immediate", "-w"])
    }

    fn url(&self, port: u16, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/{db}")
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let _ = self.ctl(&["stop", "-m", "fast", "-w"]);
    }
}

/// A private RabbitMQ node: its own name, ports and data directory.
struct PrivateRabbit {
    dir: PathBuf,
    node: String,
    port: u16,
}

impl PrivateRabbit {
    fn start_new(root: &Path) -> anyhow::Result<Self> {
        let dir = root.join("rabbit");
        std::fs::create_dir_all(dir.join("mnesia"))?;
        std::fs::create_dir_all(dir.join("log"))?;
        std::fs::write(dir.join("enabled_plugins"), "[].\n")?;
        let port = free_port();
        std::fs::write(
            dir.join("rabbitmq.conf"),
            format!("listeners.tcp.local = 127.0.0.1:{port}\nloopback_users = none\n"),
        )?;
        std::process::Command::new("chown")
            .args(["-R", "rabbitmq:rabbitmq"])
            .arg(&dir)
            .status()?;
        let rabbit = Self {
            dir,
            node: format!("hookinbox-faults-{}@localhost", std::process::id()),
            port,
        };
        rabbit.boot()?;
        Ok(rabbit)
    }

    fn boot(&self) -> anyhow::Result<()> {
        let d = self.dir.to_string_lossy();
        let status = std::process::Command::new("rabbitmq-server")
            .arg("-detached")
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", free_port().to_string())
            .env("RABBITMQ_MNESIA_BASE", format!("{d}/mnesia"))
            .env("RABBITMQ_LOG_BASE", format!("{d}/log"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                format!("{d}/enabled_plugins"),
            )
            .env("RABBITMQ_CONFIG_FILE", format!("{d}/rabbitmq.conf"))
            .env("RABBITMQ_PID_FILE", format!("{d}/pid"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if !status.success() {
            bail!("rabbitmq-server failed");
        }
        self.await_up()
    }

    fn ctl(&self, args: &[&str]) -> bool {
        std::process::Command::new("rabbitmqctl")
            .args(["-q", "-n", &self.node])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    fn await_up(&self) -> anyhow::Result<()> {
        for _ in 0..120 {
            if self.ctl(&["await_startup", "--timeout", "5"]) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        bail!("private RabbitMQ did not start")
    }

    fn restart_app(&self) -> anyhow::Result<()> {
        if !self.ctl(&["stop_app"]) || !self.ctl(&["start_app"]) {
            bail!("stop_app/start_app failed");
        }
        self.await_up()
    }

    fn kill9_and_boot(&self) -> anyhow::Result<()> {
        let pid = std::fs::read_to_string(self.dir.join("pid"))?
            .trim()
            .to_owned();
        std::process::Command::new("kill")
            .args(["-9", &pid])
            .status()?;
        for _ in 0..100 {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.boot()
    }

    fn url(&self, port: u16) -> String {
        format!("amqp://guest:guest@127.0.0.1:{port}/%2f?heartbeat=2")
    }
}

impl Drop for PrivateRabbit {
    /// Stops the node and waits until its process has exited.
    fn drop(&mut self) {
        let pid_file = self.dir.join("pid");
        let _ = self.ctl(&["stop", &pid_file.to_string_lossy()]);
    }
}

/// What the suite sent and what it was told.
#[derive(Clone)]
struct Sent {
    source: &'static str,
    event: String,
    body: Vec<u8>,
    ok: bool,
    answers: u32,
    /// Requests for it that got no 2xx (connection cut, ingest killed,
    /// 503): its effect may still have happened, which is allowed.
    failures: u32,
}

#[derive(Default)]
struct Ledger {
    sent: HashMap<String, Sent>,
    order: Vec<String>,
    redeliveries: u64,
    failed_requests: u64,
}

struct Suite {
    root: PathBuf,
    bins: PathBuf,
    pg: PrivatePg,
    rabbit: PrivateRabbit,
    db: String,
    pg_proxy: Proxy,
    amqp_proxy: Proxy,
    ingest_port: u16,
    ingest: Option<Child>,
    workers: Vec<Option<Child>>,
    counts: HashMap<&'static str, u32>,
    /// When each fault began and ended.
    windows: Vec<(Instant, Instant)>,
    config: PathBuf,
    /// The fake GitHub that sends every delivery.
    github: Github,
    /// The PgBouncer (transaction mode) ingest and the workers go through,
    /// when `HOOKINBOX_FAULT_PGBOUNCER` is set.
    pgbouncer: Option<PrivatePgbouncer>,
}

/// A private PgBouncer in front of the private Postgres
/// (`scripts/pgbouncer.sh`).
struct PrivatePgbouncer {
    port: u16,
}

impl PrivatePgbouncer {
    /// Starts it, its port written to `root/pgbouncer.port` (where
    /// `scripts/faults.sh` finds it if the suite is interrupted).
    fn start(root: &Path, pg_port: u16) -> anyhow::Result<Self> {
        let port = free_port();
        std::fs::write(root.join("pgbouncer.port"), port.to_string())?;
        let ok = std::process::Command::new("bash")
            .args(["scripts/pgbouncer.sh", "start"])
            .arg(port.to_string())
            .arg(pg_port.to_string())
            .stdout(Stdio::null())
            .status()?
            .success();
        if !ok {
            bail!("PgBouncer did not start");
        }
        Ok(Self { port })
    }
}

impl Drop for PrivatePgbouncer {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .args(["scripts/pgbouncer.sh", "stop"])
            .arg(self.port.to_string())
            .status();
    }
}

/// The fake GitHub and its two hooks.
#[derive(Clone)]
struct Github {
    fake: FakeGithub,
    store: usize,
    relay: usize,
}

impl Github {
    fn hook(&self, source: &str) -> usize {
        if source == "relay" {
            self.relay
        } else {
            self.store
        }
    }
}

/// How long after a fault ends a relayed key may still arrive again: a
/// lease, the reaper's delay, a retry.
const REPEAT_GRACE: Duration = Duration::from_secs(10);

/// Half-open and delayed connections last this long.
const STALL: Duration = Duration::from_secs(5);

const LEASE_SECS: &str = "3";

/// The token the fake GitHub takes.
/// The relay source's one destination is its old `handler`, named after
/// its kind; the Idempotency-Key ends with that name.
const RELAY_KEY_SUFFIX: &str = ":forward";
const GITHUB_TOKEN: &str = "ghp_fault_suite";

impl Suite {
    /// Where a process finds Postgres: directly, or through the proxy that
    /// degrades the workers' connections (`via_proxy`). With a PgBouncer,
    /// that path leads to it (the proxy stands in front of it), and the
    /// direct URL the leader locks and migrations need goes to Postgres.
    fn database_env(&self, via_proxy: bool) -> Vec<(&'static str, String)> {
        let front = match (&self.pgbouncer, via_proxy) {
            (_, true) => self.pg_proxy.port(),
            (Some(pgbouncer), false) => pgbouncer.port,
            (None, false) => self.pg.port,
        };
        let mut env = vec![("DATABASE_URL", self.pg.url(front, &self.db))];
        if self.pgbouncer.is_some() {
            env.push(("HOOKINBOX_DB_POOLER", "transaction".to_owned()));
            env.push((
                "HOOKINBOX_DIRECT_DATABASE_URL",
                self.pg.url(self.pg.port, &self.db),
            ));
        }
        env
    }

    fn log(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join(format!("{name}.log")))
            .expect("log file")
    }

    fn spawn_ingest(&mut self, failpoint: Option<&str>) -> anyhow::Result<()> {
        let mut cmd = Command::new(self.bins.join("hookinbox-ingest"));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.database_env(false))
            .env("AMQP_URL", self.rabbit.url(self.amqp_proxy.port()))
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

    fn spawn_worker(&mut self, i: usize, failpoint: Option<&str>) -> anyhow::Result<()> {
        let mut cmd = Command::new(self.bins.join("hookinbox-worker"));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.database_env(true))
            .env("AMQP_URL", self.rabbit.url(self.rabbit.port))
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
            .env("HOOKINBOX_QUEUE_PREFIX", "faults");
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

    fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }

    /// Records a fault that began at `since` and ends now.
    fn window(&mut self, since: Instant) {
        self.windows.push((since, Instant::now()));
    }

    /// Leaves `proxy` half-open or slow for [`STALL`], then opens it.
    async fn degrade(&mut self, proxy: Which, stall: bool, what: &'static str) {
        let since = Instant::now();
        let proxy = match proxy {
            Which::Postgres => &self.pg_proxy,
            Which::Broker => &self.amqp_proxy,
        };
        if stall {
            proxy.stall();
        } else {
            proxy.delay(Duration::from_millis(200));
        }
        tokio::time::sleep(STALL).await;
        proxy.open();
        self.count(what);
        self.window(since);
    }

    /// Restarts worker `i` armed at `point`, waits for it to kill itself
    /// there, and starts it again unarmed.
    async fn worker_kill(&mut self, i: usize, point: &'static str) -> anyhow::Result<()> {
        if let Some(mut old) = self.workers[i].take() {
            let _ = old.kill().await;
        }
        self.spawn_worker(i, Some(&format!("{point}=1*return")))?;
        let child = self.workers[i].as_mut().context("worker")?;
        match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
            Ok(_) => self.count(point),
            Err(_) => {
                let _ = child.kill().await;
                self.count("worker kill -9 from outside (point not reached)");
            }
        }
        self.spawn_worker(i, None)
    }

    async fn ingest_kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut old) = self.ingest.take() {
            let _ = old.kill().await;
        }
        self.spawn_ingest(Some("ingest.after_claim=1*return"))?;
        let child = self.ingest.as_mut().context("ingest")?;
        match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
            Ok(_) => self.count("ingest.after_claim"),
            Err(_) => {
                let _ = child.kill().await;
                self.count("ingest kill -9 from outside (point not reached)");
            }
        }
        self.spawn_ingest(None)
    }

    /// Worker `i` stops (SIGSTOP) in the middle of a job, stays stopped past
    /// its lease and the AMQP heartbeat timeout, so the broker requeues its
    /// messages and another worker takes the delivery over; then it wakes
    /// (SIGCONT) and its completion must be fenced.
    async fn lease_steal(&mut self, i: usize) -> anyhow::Result<()> {
        if let Some(mut old) = self.workers[i].take() {
            let _ = old.kill().await;
        }
        let marker = format!("hookinbox-steal-{}", uuid::Uuid::new_v4().simple());
        // The first take prints the marker; the first effect after it (of
        // that job or another) stalls 3 s, so the stop falls mid-job.
        self.spawn_worker(
            i,
            Some(&format!(
                "worker.after_take=1*print({marker});worker.mid_effect=1*sleep(3000)"
            )),
        )?;
        let log = self.root.join(format!("worker-{i}.log"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(&marker)
        {
            if Instant::now() > deadline {
                self.count("lease steal skipped (no job reached the worker)");
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let pid = self.workers[i]
            .as_ref()
            .and_then(Child::id)
            .context("worker pid")?
            .to_string();
        signal("-STOP", &pid)?;
        tokio::time::sleep(Duration::from_secs(9)).await;
        signal("-CONT", &pid)?;
        // Awake, its jobs find their leases taken and are fenced (on the
        // one-statement path, their completions find the claims taken).
        // The worker is restarted unarmed once they are done: the fault
        // ends here.
        tokio::time::sleep(Duration::from_secs(4)).await;
        if let Some(mut woken) = self.workers[i].take() {
            let _ = woken.kill().await;
        }
        self.spawn_worker(i, None)?;
        self.count("lease steal (SIGSTOP mid-job past the lease, SIGCONT)");
        Ok(())
    }
}

/// Which proxied path a fault hits.
enum Which {
    /// Workers to Postgres.
    Postgres,
    /// Ingest to RabbitMQ.
    Broker,
}

fn signal(sig: &str, pid: &str) -> anyhow::Result<()> {
    if !std::process::Command::new("kill")
        .args([sig, pid])
        .status()?
        .success()
    {
        bail!("kill {sig} {pid} failed");
    }
    Ok(())
}

/// The delivery ids hookinbox completed.
async fn completed_ids(db: &tokio_postgres::Client) -> anyhow::Result<HashSet<String>> {
    Ok(db
        .query(
            "select delivery_id from deliveries where status = 'completed'",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// GitHub sends one delivery (or redelivers it) and logs the attempt; the
/// suite records the answer.
#[allow(clippy::too_many_arguments)]
async fn deliver(
    github: &Github,
    ledger: &Mutex<Ledger>,
    source: &'static str,
    id: &str,
    event: &str,
    body: &[u8],
    redelivery: bool,
) {
    let status = github
        .fake
        .send(github.hook(source), id, event, body, redelivery)
        .await;
    let ok = (200..300).contains(&status);
    let mut ledger = ledger.lock().expect("ledger");
    if !ok {
        ledger.failed_requests += 1;
    }
    let entry = ledger.sent.entry(id.to_owned()).or_insert_with(|| Sent {
        source,
        event: event.to_owned(),
        body: body.to_vec(),
        ok: false,
        answers: 0,
        failures: 0,
    });
    entry.ok |= ok;
    entry.answers += 1;
    if !ok {
        entry.failures += 1;
    }
}

/// The steady stream: new deliveries at `rate` per second, one in ten a
/// redelivery of an earlier one, one in three to the `relay` source.
async fn traffic(
    github: Github,
    ledger: Arc<Mutex<Ledger>>,
    stop: tokio_util::sync::CancellationToken,
    rate: u32,
) {
    let payloads: Vec<_> = fixtures::all()
        .into_iter()
        .filter(|f| f.event != "ping")
        .collect();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
    let mut n: u64 = 0;
    while !stop.is_cancelled() {
        tick.tick().await;
        n += 1;
        let again = if n.is_multiple_of(10) {
            let l = ledger.lock().expect("ledger");
            l.order
                .get((n as usize * 7919) % l.order.len().max(1))
                .cloned()
        } else {
            None
        };
        let redelivery = again.and_then(|id| {
            let mut l = ledger.lock().expect("ledger");
            let s = l.sent.get(&id).cloned()?;
            l.redeliveries += 1;
            Some((id, s.source, s.event, s.body))
        });
        let again = redelivery.is_some();
        let (id, source, event, body) = match redelivery {
            Some(found) => found,
            None => {
                let f = &payloads[n as usize % payloads.len()];
                let id = format!("fault-{n}-{}", uuid::Uuid::new_v4().simple());
                let source = if n.is_multiple_of(3) {
                    "relay"
                } else {
                    "store"
                };
                // Each delivery its own body, as GitHub's are: ingest's
                // replay guard refuses a body seen under another id.
                let body = fixtures::unique(&f.body);
                let mut l = ledger.lock().expect("ledger");
                l.order.push(id.clone());
                l.sent.insert(
                    id.clone(),
                    Sent {
                        source,
                        event: f.event.clone(),
                        body: body.clone(),
                        ok: false,
                        answers: 0,
                        failures: 0,
                    },
                );
                (id, source, f.event.clone(), body)
            }
        };
        let (github, ledger) = (github.clone(), ledger.clone());
        tokio::spawn(
            async move { deliver(&github, &ledger, source, &id, &event, &body, again).await },
        );
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let cycles: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let kills_per_cycle: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let bins = PathBuf::from(
        std::env::var("HOOKINBOX_FAULT_BINS")
            .context("HOOKINBOX_FAULT_BINS names the failpoint build")?,
    );
    let report_path = std::env::var_os("HOOKINBOX_FAULT_REPORT").map(PathBuf::from);
    let root = std::env::temp_dir().join(format!("hookinbox-faults-{}", std::process::id()));
    std::fs::create_dir_all(&root)?;
    eprintln!("faults: working in {}", root.display());

    let pg = PrivatePg::start_new(&root)?;
    let rabbit = PrivateRabbit::start_new(&root)?;
    let db = "faults".to_owned();
    let admin = hookinbox_tests::connect(&pg.url(pg.port, "postgres")).await;
    admin
        .batch_execute(&format!("create database {db}"))
        .await?;
    let pool = hookinbox::postgres::pool(
        &pg.url(pg.port, &db),
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
    let receiver = Receiver::ok().await;
    let ingest_port = free_port();
    // GitHub: one repository hook per source, both pointed at ingest.
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
    let github = Github {
        store: fake.add_hook(hook("store")),
        relay: fake.add_hook(hook("relay")),
        fake,
    };
    let token_file = root.join("github-token");
    std::fs::write(&token_file, GITHUB_TOKEN)?;
    // Each source names its hook: the workers reconcile every 15 s while
    // the faults hit, and the suite's end runs a pass of its own.
    let reconcile = |repo: &str| {
        format!(
            "[sources.github]\nreconcile_hook = \"repo:acme/{repo}/4242\"\napi_url = \"{}\"\n\
             token_file = \"{}\"\ninterval_secs = 15\nmin_age_secs = 3\nper_second = 100\n\
             max_redeliveries = 20\n",
            github.fake.base,
            token_file.display()
        )
    };
    let config = root.join("sources.toml");
    std::fs::write(
        &config,
        format!(
            "[[sources]]\nname = \"store\"\nsecrets = [\"{SECRET}\"]\nhandler = {{ kind = \"store\" }}\n{}\n\
             [[sources]]\nname = \"relay\"\nsecrets = [\"{SECRET}\"]\n\
             handler = {{ kind = \"forward\", url = \"{}\", timeout_ms = 2000 }}\n{}",
            reconcile("store"),
            receiver.url,
            reconcile("relay"),
        ),
    )?;
    let pgbouncer = match std::env::var_os("HOOKINBOX_FAULT_PGBOUNCER") {
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
    let amqp_proxy = Proxy::start(&format!("127.0.0.1:{}", rabbit.port)).await;
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let mut suite = Suite {
        root: root.clone(),
        bins,
        pg,
        rabbit,
        db,
        pg_proxy,
        amqp_proxy,
        ingest_port,
        ingest: None,
        workers: vec![None, None, None],
        counts: HashMap::new(),
        windows: Vec::new(),
        config,
        github,
        pgbouncer,
    };
    suite.spawn_ingest(None)?;
    for i in 0..3 {
        suite.spawn_worker(i, None)?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let stream = tokio::spawn(traffic(
        suite.github.clone(),
        ledger.clone(),
        stop.clone(),
        40,
    ));
    let started = Instant::now();

    let points = [
        "worker.after_take",
        "worker.mid_effect",
        "worker.after_commit",
    ];
    for cycle in 0..cycles {
        eprintln!("faults: cycle {}/{cycles}", cycle + 1);
        for k in 0..kills_per_cycle {
            let point = points[(k as usize) % points.len()];
            let since = Instant::now();
            suite.worker_kill((k as usize) % 3, point).await?;
            suite.window(since);
        }
        let since = Instant::now();
        suite.ingest_kill().await?;
        suite.window(since);
        let since = Instant::now();
        suite.lease_steal(cycle as usize % 3).await?;
        suite.window(since);
        let since = Instant::now();
        if cycle % 2 == 0 {
            suite.rabbit.restart_app()?;
            suite.count("broker stop_app/start_app");
        } else {
            suite.rabbit.kill9_and_boot()?;
            suite.count("broker kill -9");
        }
        suite.window(since);
        let since = Instant::now();
        suite.pg.stop_immediate()?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        suite.pg.start()?;
        suite.count("postgres stop -m immediate");
        suite.window(since);
        let since = Instant::now();
        suite.pg_proxy.close();
        tokio::time::sleep(Duration::from_secs(2)).await;
        suite.pg_proxy.reopen();
        suite.count("worker-postgres connections cut");
        suite.window(since);
        let since = Instant::now();
        suite.amqp_proxy.close();
        tokio::time::sleep(Duration::from_secs(2)).await;
        suite.amqp_proxy.reopen();
        suite.count("ingest-broker connections cut");
        suite.window(since);
        suite
            .degrade(
                Which::Postgres,
                true,
                "worker-postgres connections half-open 5 s",
            )
            .await;
        suite
            .degrade(
                Which::Postgres,
                false,
                "worker-postgres connections delayed 200 ms for 5 s",
            )
            .await;
        suite
            .degrade(
                Which::Broker,
                true,
                "ingest-broker connections half-open 5 s",
            )
            .await;
        suite
            .degrade(
                Which::Broker,
                false,
                "ingest-broker connections delayed 200 ms for 5 s",
            )
            .await;
        // A quiet stretch under traffic: any repeat here is a bug.
        tokio::time::sleep(REPEAT_GRACE + STALL).await;
    }
    stop.cancel();
    let _ = stream.await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // GitHub never retries: what never got a 2xx is brought back by the
    // reconciler alone, the workers' own passes and then passes run here as
    // an operator's cron would.
    let check = hookinbox_tests::connect(&suite.pg.url(suite.pg.port, &suite.db)).await;
    let failed_at_github: HashSet<String> = ledger
        .lock()
        .expect("ledger")
        .sent
        .iter()
        .filter(|(_, s)| !s.ok)
        .map(|(id, _)| id.clone())
        .collect();
    let asked_during_the_run = suite.github.fake.redeliveries_total();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let pass = Command::new(suite.bins.join("hookinbox-worker"))
            .args(["reconcile", "--json", "--max-wait", "30s"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(suite.database_env(false))
            .env("AMQP_URL", suite.rabbit.url(suite.rabbit.port))
            .env("HOOKINBOX_CONFIG", &suite.config)
            .env("HOOKINBOX_AUTO_MIGRATE", "false")
            .env("HOOKINBOX_QUEUE_PREFIX", "faults")
            .env("RUST_LOG", "warn")
            .output()
            .await?;
        if !pass.status.success() {
            eprintln!(
                "faults: reconcile pass did not complete: {}",
                String::from_utf8_lossy(&pass.stderr).trim()
            );
        }
        let open: i64 = check
            .query_one(
                "select count(*) from deliveries where status = 'processing' or (status = 'failed' and retryable)",
                &[],
            )
            .await?
            .get(0);
        // Left over: GitHub saw no 2xx and hookinbox did not complete it.
        // One GitHub saw fail but hookinbox completed (it answered too late)
        // needs nothing, and the reconciler rightly leaves it alone.
        let completed = completed_ids(&check).await?;
        let unanswered = suite
            .github
            .fake
            .guids()
            .iter()
            .filter(|(id, ok)| !**ok && !completed.contains(*id))
            .count();
        if open == 0 && unanswered == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "did not settle: {open} open deliveries, {unanswered} never answered 2xx at GitHub"
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // A delivery is answered once any attempt at it got a 2xx: the
    // suite's own, or a redelivery the reconciler asked for.
    let answered = suite.github.fake.guids();
    for (id, sent) in ledger.lock().expect("ledger").sent.iter_mut() {
        sent.ok = answered.get(id).copied().unwrap_or(false);
    }
    let completed = completed_ids(&check).await?;
    let brought_back = failed_at_github
        .iter()
        .filter(|id| answered.get(*id).copied().unwrap_or(false))
        .count();
    let late_answers = failed_at_github
        .iter()
        .filter(|id| !answered.get(*id).copied().unwrap_or(false) && completed.contains(*id))
        .count();
    let never_brought_back = failed_at_github.len() - brought_back - late_answers;
    let reconciler_asked = suite.github.fake.redeliveries_total();

    // The ledger against the effects.
    let effects: HashMap<String, i64> = check
        .query(
            "select delivery_id, count(*) from hookinbox_effect_log group by delivery_id",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let dead: HashSet<String> = check
        .query(
            "select delivery_id from deliveries where status = 'failed' and not retryable",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let (report, failed, summary) = {
        let l = ledger.lock().expect("ledger");
        let accepted: Vec<&String> = l
            .sent
            .iter()
            .filter(|(_, s)| s.ok)
            .map(|(id, _)| id)
            .collect();
        // Relayed deliveries, by the idempotency key they arrived with.
        let arrivals = receiver.received();
        let mut by_key: HashMap<&str, Vec<&hookinbox_tests::receiver::Received>> = HashMap::new();
        for r in &arrivals {
            by_key
                .entry(r.header("idempotency-key").unwrap_or(""))
                .or_default()
                .push(r);
        }
        // Arrivals whose key names no relayed delivery, or whose delivery
        // header or body is not that delivery's.
        let mut wrong = 0usize;
        for (key, rs) in &by_key {
            let sent = key
                .strip_prefix("github:relay:4242:")
                .and_then(|rest| rest.strip_suffix(RELAY_KEY_SUFFIX))
                .and_then(|id| Some((id, l.sent.get(id)?)))
                .filter(|(_, s)| s.source == "relay");
            wrong += match sent {
                Some((id, s)) => rs
                    .iter()
                    .filter(|r| r.header("x-github-delivery") != Some(id) || r.body != s.body)
                    .count(),
                None => rs.len(),
            };
        }
        let (mut repeats, mut stray) = (0usize, Vec::new());
        for (key, rs) in by_key.iter_mut() {
            rs.sort_by_key(|r| r.at);
            let first = rs[0].at;
            for r in &rs[1..] {
                repeats += 1;
                let around_a_fault = suite
                    .windows
                    .iter()
                    .any(|(begin, end)| *begin <= r.at && *end + REPEAT_GRACE >= first);
                if !around_a_fault {
                    let at =
                        |t: std::time::Instant| t.saturating_duration_since(started).as_secs_f64();
                    stray.push(format!(
                        "{key} (first at {:.1} s, again at {:.1} s)",
                        at(first),
                        at(r.at)
                    ));
                }
            }
        }
        let lost: Vec<&&String> = accepted
            .iter()
            .filter(|id| {
                let done = match l.sent[id.as_str()].source {
                    "relay" => by_key
                        .contains_key(format!("github:relay:4242:{id}{RELAY_KEY_SUFFIX}").as_str()),
                    _ => effects.get(id.as_str()).copied().unwrap_or(0) == 1,
                };
                !done && !dead.contains(id.as_str())
            })
            .collect();
        let duplicates: Vec<(&String, &i64)> = effects.iter().filter(|(_, n)| **n > 1).collect();
        let unknown: Vec<&String> = effects
            .keys()
            .filter(|id| !l.sent.contains_key(*id))
            .collect();
        let in_worker_logs = |needle: &str| -> anyhow::Result<usize> {
            Ok(std::fs::read_dir(&root)?
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("worker-"))
                .map(|e| {
                    std::fs::read_to_string(e.path())
                        .unwrap_or_default()
                        .matches(needle)
                        .count()
                })
                .sum())
        };
        let fenced = in_worker_logs("\"message\":\"job done\",\"outcome\":\"fenced\"")?;
        let fused_fenced = in_worker_logs("\"one-statement completion fenced")?;

        eprintln!(
            "faults: fault windows (s since start): {:?}",
            suite
                .windows
                .iter()
                .map(|(b, e)| (
                    format!("{:.1}", b.saturating_duration_since(started).as_secs_f64()),
                    format!("{:.1}", e.saturating_duration_since(started).as_secs_f64())
                ))
                .collect::<Vec<_>>()
        );
        let mut report = String::new();
        report.push_str(&format!(
        "Fault-injection run: {cycles} cycle(s), {kills_per_cycle} worker kill(s) per cycle, {:.0} s, 3 workers, 40 deliveries/s (two thirds to a `store` source, one third to a `forward` source){}.\n\n| fault | injected |\n|---|---|\n",
        started.elapsed().as_secs_f64(),
        if suite.pgbouncer.is_some() {
            "; ingest and workers reach Postgres through PgBouncer in transaction mode"
        } else {
            ""
        }
    ));
        let mut counts: Vec<_> = suite.counts.iter().collect();
        counts.sort();
        for (fault, n) in counts {
            report.push_str(&format!("| {fault} | {n} |\n"));
        }
        report.push_str(&format!(
        "\n| ledger | count |\n|---|---|\n| deliveries sent | {} |\n| redeliveries sent | {} |\n| requests that failed (no 2xx) | {} |\n| answered 2xx | {} |\n| effects | {} |\n| dead letters | {} |\n| **lost** (2xx, no effect, not dead-lettered) | **{}** |\n| **duplicate effects** | **{}** |\n| effects for never-sent ids | {} |\n| effects of deliveries that had a failed request (allowed) | {} |\n| fenced jobs logged | {fenced} |\n| one-statement completions fenced (then taken the full way) | {fused_fenced} |\n\
        | relayed (`forward`) deliveries answered 2xx | {} |\n| relayed keys that arrived | {} |\n\
        | repeated arrivals (same key, same body) | {repeats} |\n\
        | **repeats outside a fault window** (+{}s grace) | **{}** |\n| arrivals with a wrong key, delivery id or body | {wrong} |\n\
        | deliveries that got no 2xx when sent (failed at GitHub) | {} |\n\
        | redeliveries the reconciler asked GitHub for (during the run / in all) | {asked_during_the_run} / {reconciler_asked} |\n\
        | failed at GitHub, brought back by the reconciler | {brought_back} |\n\
        | failed at GitHub, completed here all the same (answered too late) | {late_answers} |\n\
        | **failed at GitHub and never brought back** | **{never_brought_back}** |\n",
        l.sent.len(),
        l.redeliveries,
        l.failed_requests,
        accepted.len(),
        effects.len(),
        dead.len(),
        lost.len(),
        duplicates.len(),
        unknown.len(),
        l.sent
            .iter()
            .filter(|(id, s)| s.failures > 0 && effects.contains_key(id.as_str()))
            .count(),
        accepted
            .iter()
            .filter(|id| l.sent[id.as_str()].source == "relay")
            .count(),
        by_key.len(),
        REPEAT_GRACE.as_secs(),
        stray.len(),
        failed_at_github.len(),
    ));
        let failed = !lost.is_empty()
            || never_brought_back > 0
            || !duplicates.is_empty()
            || !unknown.is_empty()
            || !stray.is_empty()
            || wrong > 0;
        let summary = format!(
            "lost {lost:?}, never brought back {never_brought_back}, duplicated {duplicates:?}, unknown {unknown:?}, stray repeats {stray:?}, wrong arrivals {wrong}"
        );
        (report, failed, summary)
    };
    println!("{report}");
    if let Some(path) = report_path {
        std::fs::write(path, &report)?;
    }
    for w in suite.workers.iter_mut().flatten() {
        let _ = w.kill().await;
    }
    if let Some(i) = suite.ingest.as_mut() {
        let _ = i.kill().await;
    }
    // Its Postgres, RabbitMQ node and PgBouncer stop while their folders
    // still exist (`pg_ctl stop` needs the data directory).
    drop(suite);
    if failed {
        bail!("{summary}");
    }
    if std::env::var_os("HOOKINBOX_FAULT_KEEP").is_some() {
        eprintln!("faults: kept {}", root.display());
    } else {
        let _ = std::fs::remove_dir_all(&root);
    }
    Ok(())
}
