//! Destination scenarios, measured against real binaries: a fresh
//! database and queue prefix, `hookinbox-ingest` and `hookinbox-worker`
//! (the build this tool sits beside: build it with `--release` to measure
//! release binaries), and local receivers in this process that count every
//! request by its `Idempotency-Key` and can be slowed, broken, stopped and
//! started again. Every scenario prints a Markdown table of what it saw.
//!
//! - `isolation`: a slow destination with a backlog beside a fast one.
//! - `misconfigured`: a destination answering 404, fixed, then resumed.
//! - `outage`: a destination down for a while at a steady rate.
//! - `mixed`: destinations A (healthy), B (down, then back) and C
//!   (filtered) under one stream of mixed deliveries; A's latency is
//!   compared with a run of A alone.
//! - `defer`: a destination rate-limited until a reset ahead (`429` with
//!   `Retry-After`): deferrals spend no attempt.
//! - `fairness`: installation A floods a slow destination while B sends a
//!   few deliveries a second: B's latency alone, beside the flood with
//!   fairness on, with it off, and beside the flood sent to a destination
//!   of its own (a reference: only the processes and the machine shared).
//! - `fanout`: one source forwarding to 1, 3 and 10 destinations: CPU µs
//!   per leg of each process at a fixed rate, and the highest rate whose
//!   legs all keep up (S).
//!
//! Each stack's processes take the manifests' pools (ingest 4, a worker
//! 11) unless `INGEST_POOL` or `WORKER_POOL` say otherwise (runs before
//! that took the default, 16 each); the fairness report names them.
//!
//! Traffic only ever goes to 127.0.0.1.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use hookinbox_tests::{Hook, SECRET, Spawned, TestEnv};

mod fairness;
mod fanout;

#[derive(Parser)]
#[command(about = "Destination scenarios against real binaries")]
struct Args {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// A slow destination with a backlog, and a fast one beside it.
    Isolation {
        /// Legs sent to the slow destination first.
        #[arg(long, default_value_t = 1000)]
        backlog: usize,
        /// Deliveries sent to the fast one after.
        #[arg(long, default_value_t = 20)]
        fast: usize,
        /// How long the slow destination takes to answer.
        #[arg(long, default_value_t = 5000)]
        slow_ms: u64,
    },
    /// A destination answering 404 (a route renamed downstream), fixed,
    /// then resumed by an operator.
    Misconfigured {
        /// Deliveries sent while it answers 404.
        #[arg(long, default_value_t = 50)]
        deliveries: usize,
    },
    /// A destination down (connections refused) for a while, at a
    /// steady rate.
    Outage {
        /// Deliveries per second.
        #[arg(long, default_value_t = 100)]
        rate: u32,
        /// Seconds the destination is down.
        #[arg(long, default_value_t = 600)]
        down_secs: u64,
        /// The breaker's pause between probes.
        #[arg(long, default_value_t = 30)]
        probe_secs: u64,
    },
    /// A healthy, B down then back, C filtered to pull requests of two
    /// repositories; one stream of mixed deliveries.
    Mixed {
        /// Deliveries in all.
        #[arg(long, default_value_t = 10_000)]
        deliveries: usize,
        /// Deliveries per second.
        #[arg(long, default_value_t = 200)]
        rate: u32,
        /// Pairs of runs (A alone, then A beside B and C), alternated so
        /// that the machine's drift falls on both; the medians are
        /// compared.
        #[arg(long, default_value_t = 1)]
        pairs: usize,
    },
    /// A destination rate-limited until a reset ahead: every leg is
    /// deferred to it (`429` with `Retry-After`), then delivered.
    Defer {
        /// Deliveries sent while it is limited.
        #[arg(long, default_value_t = 1000)]
        deliveries: usize,
        /// Seconds from the start until the limit resets.
        #[arg(long, default_value_t = 60)]
        reset_secs: u64,
    },
    /// Installation A floods a slow destination while installation B
    /// sends a few deliveries a second.
    Fairness {
        /// A's deliveries.
        #[arg(long, default_value_t = 50_000)]
        flood: usize,
        /// A's deliveries per second.
        #[arg(long, default_value_t = 500)]
        flood_rate: u32,
        /// B's deliveries.
        #[arg(long, default_value_t = 100)]
        other: usize,
        /// B's deliveries per second.
        #[arg(long, default_value_t = 1)]
        other_rate: u32,
        /// How long the destination takes to answer.
        #[arg(long, default_value_t = 40)]
        slow_ms: u64,
        /// The destination's `concurrency`.
        #[arg(long, default_value_t = 8)]
        concurrency: u16,
        /// Skip the run with fairness off (minutes of B behind the flood).
        #[arg(long)]
        skip_off: bool,
        /// Also run B beside A's flood to a destination of its own with
        /// fairness off there: the machine's share of B's time without the
        /// holds and releases of A's legs.
        #[arg(long)]
        apart_off: bool,
    },
    /// One source forwarding every delivery to N destinations (one local
    /// receiver): CPU per leg at a fixed rate, then S.
    Fanout {
        /// The destination counts to measure.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 3, 10])]
        destinations: Vec<usize>,
        /// Deliveries per second of the costed run.
        #[arg(long, default_value_t = 100)]
        rate: u32,
        /// Seconds of each costed run and of each search step.
        #[arg(long, default_value_t = 20)]
        step_secs: u64,
        /// Seconds a step's legs may take past its end and still hold.
        #[arg(long, default_value_t = 2)]
        lag_secs: u64,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Args::parse().scenario {
        Scenario::Isolation {
            backlog,
            fast,
            slow_ms,
        } => isolation(backlog, fast, Duration::from_millis(slow_ms)).await,
        Scenario::Misconfigured { deliveries } => misconfigured(deliveries).await,
        Scenario::Outage {
            rate,
            down_secs,
            probe_secs,
        } => outage(rate, Duration::from_secs(down_secs), probe_secs).await,
        Scenario::Mixed {
            deliveries,
            rate,
            pairs,
        } => mixed(deliveries, rate, pairs).await,
        Scenario::Defer {
            deliveries,
            reset_secs,
        } => defer(deliveries, Duration::from_secs(reset_secs)).await,
        Scenario::Fairness {
            flood,
            flood_rate,
            other,
            other_rate,
            slow_ms,
            concurrency,
            skip_off,
            apart_off,
        } => {
            fairness::fairness(fairness::Plan {
                flood,
                flood_rate,
                other,
                other_rate,
                slow_ms,
                concurrency,
                skip_off,
                apart_off,
            })
            .await
        }
        Scenario::Fanout {
            destinations,
            rate,
            step_secs,
            lag_secs,
        } => {
            fanout::run(
                &destinations,
                rate,
                Duration::from_secs(step_secs),
                Duration::from_secs(lag_secs),
            )
            .await
        }
    }
}

/// How a [`Sink`] answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// 200 at once.
    Ok,
    /// This status at once.
    Status(u16),
    /// 200 after this many milliseconds.
    Slow(u64),
}

/// One request a sink saw: its key, the delivery id, when, and whether it
/// was answered 2xx (taken).
#[derive(Clone, Debug)]
struct Seen {
    key: String,
    delivery: String,
    at: Instant,
    taken: bool,
}

#[derive(Default)]
struct SinkState {
    seen: Mutex<Vec<Seen>>,
    /// The answer's status (0: 200), or a delay in ms (above 10,000:
    /// `ms - 10,000`).
    mode: AtomicU16,
    slow_ms: AtomicU64,
    /// Until then, every request is answered `429` with `Retry-After`
    /// naming it (whole seconds, rounded up): a rate limit's reset.
    limited_until: Mutex<Option<Instant>>,
}

/// A local receiver that records each request's `Idempotency-Key` and
/// arrival, answering as its mode says; it can be stopped (connections
/// refused) and started again on the same port.
struct Sink {
    port: u16,
    state: Arc<SinkState>,
    server: Mutex<Option<actix_web::dev::ServerHandle>>,
}

async fn sink(req: HttpRequest, state: web::Data<SinkState>) -> HttpResponse {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let now = Instant::now();
    let reset_in = state
        .limited_until
        .lock()
        .expect("lock")
        .and_then(|until| until.checked_duration_since(now))
        .filter(|left| !left.is_zero());
    let status = match (reset_in, state.mode.load(Ordering::Relaxed)) {
        (Some(_), _) => 429,
        (None, 0) => 200,
        (None, n) => n,
    };
    state.seen.lock().expect("lock").push(Seen {
        key: header("idempotency-key"),
        delivery: header("x-github-delivery"),
        at: Instant::now(),
        taken: (200..300).contains(&status),
    });
    let slow = state.slow_ms.load(Ordering::Relaxed);
    if slow > 0 {
        tokio::time::sleep(Duration::from_millis(slow)).await;
    }
    let mut response =
        HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap_or_default());
    if let Some(left) = reset_in {
        let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
        response.insert_header(("retry-after", secs.to_string()));
    }
    response.finish()
}

impl Sink {
    async fn start(mode: Mode) -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let sink = Arc::new(Self {
            port,
            state: Arc::new(SinkState::default()),
            server: Mutex::new(None),
        });
        sink.set(mode);
        sink.serve(listener);
        sink
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    fn set(&self, mode: Mode) {
        let (status, slow) = match mode {
            Mode::Ok => (0, 0),
            Mode::Status(s) => (s, 0),
            Mode::Slow(ms) => (0, ms),
        };
        self.state.mode.store(status, Ordering::Relaxed);
        self.state.slow_ms.store(slow, Ordering::Relaxed);
    }

    /// Answers `429` with `Retry-After` until `until`.
    fn limit_until(&self, until: Instant) {
        *self.state.limited_until.lock().expect("lock") = Some(until);
    }

    fn serve(&self, listener: TcpListener) {
        let data = web::Data::from(self.state.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .default_service(web::to(sink))
        })
        .workers(2)
        .max_connection_rate(4096)
        .backlog(4096)
        .disable_signals()
        .listen(listener)
        .expect("listen")
        .run();
        *self.server.lock().expect("lock") = Some(server.handle());
        tokio::spawn(server);
    }

    /// Stops listening: connections are refused until [`Sink::up`].
    async fn down(&self) {
        let handle = self.server.lock().expect("lock").take();
        if let Some(handle) = handle {
            handle.stop(false).await;
        }
    }

    /// Listens again on the same port.
    async fn up(&self) {
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", self.port)) {
                Ok(l) => break l,
                Err(_) if tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("the port came back taken: {e}"),
            }
        };
        self.serve(listener);
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().expect("lock").clone()
    }

    /// Keys taken (answered 2xx), and how many of them were taken more
    /// than once.
    fn duplicates(&self) -> (usize, usize) {
        let mut per_key: HashMap<String, usize> = HashMap::new();
        for s in self.seen().into_iter().filter(|s| s.taken) {
            *per_key.entry(s.key).or_default() += 1;
        }
        let dup = per_key.values().filter(|n| **n > 1).count();
        (per_key.len(), dup)
    }
}

/// Ingest's pool in the manifests and the compose file; `INGEST_POOL`
/// says otherwise.
const INGEST_POOL: &str = "4";
/// A worker's pool in the manifests and the compose file; `WORKER_POOL`
/// says otherwise.
const WORKER_POOL: &str = "11";

/// The pools of ingest and of a worker: `INGEST_POOL` and `WORKER_POOL`
/// when set and not empty, else the manifests'.
fn pools() -> (String, String) {
    let pool = |name: &str, default: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| default.to_owned())
    };
    (
        pool("INGEST_POOL", INGEST_POOL),
        pool("WORKER_POOL", WORKER_POOL),
    )
}

/// A stack on a fresh database: ingest and a worker on `config`.
struct Stack {
    env: TestEnv,
    ingest: Spawned,
    worker: Spawned,
    http: reqwest::Client,
}

impl Stack {
    async fn start(config: &str, worker_env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let env = TestEnv::new().await;
        let path = env.config_file(config);
        let path = path.to_string_lossy().into_owned();
        let common = [
            ("HOOKINBOX_CONFIG", path.as_str()),
            ("HOOKINBOX_LOG_FORMAT", "json"),
            ("RUST_LOG", "warn"),
            // The receivers are local: let forward reach loopback.
            ("HOOKINBOX_FORWARD_ALLOW_NETWORKS", "127.0.0.0/8"),
        ];
        // The pools the manifests and the compose file give each process
        // (docs/operations.md, "Pool sizes"), not the default (16): after
        // each vacuum or analyze of `deliveries` every connection a
        // process has plans its statements again, so the pool's size is
        // part of what is measured.
        let (ingest_pool, worker_pool) = pools();
        let mut ienv: Vec<(&str, &str)> = common.to_vec();
        ienv.push(("HOOKINBOX_DB_POOL_SIZE", &ingest_pool));
        let ingest = env.spawn("hookinbox-ingest", &ienv);
        ingest.wait_ready().await;
        let mut wenv: Vec<(&str, &str)> = common.to_vec();
        wenv.push(("HOOKINBOX_DB_POOL_SIZE", &worker_pool));
        wenv.extend_from_slice(worker_env);
        let worker = env.spawn("hookinbox-worker", &wenv);
        let stack = Self {
            env,
            ingest,
            worker,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                .build()?,
        };
        // The worker has registered the destinations once their rows exist.
        let ready = wait_for(Duration::from_secs(30), || async {
            stack.env.count("select count(*) from destinations").await > 0
        })
        .await;
        if !ready {
            bail!("the worker did not start:\n{}", stack.worker.logs());
        }
        Ok(stack)
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.ingest.port)
    }

    /// The status ingest answered, or why no answer came (a connection
    /// the server closed as a request went out on it, under a flood).
    async fn send(&self, hook: &Hook) -> anyhow::Result<u16> {
        let answer = hook
            .try_post(&self.http, &self.base())
            .await
            .context("ingest did not answer")?;
        Ok(answer.status)
    }

    async fn count(&self, sql: &str) -> i64 {
        self.env.count(sql).await
    }

    async fn stop(self) {
        self.env.cleanup().await;
    }
}

/// The source `default` forwarding to `app` as destination `app`, with
/// `extra` settings (TOML lines) for it.
fn one_forward(app: &Sink, extra: &str) -> String {
    forward_source("default", app, extra)
}

/// The source `source` forwarding to `app` as destination `app`, with
/// `extra` settings (TOML lines) for it: one `[[sources]]` block.
fn forward_source(source: &str, app: &Sink, extra: &str) -> String {
    format!(
        r#"
[[sources]]
name = "{source}"
secrets = ["{SECRET}"]
[[sources.destinations]]
name = "app"
kind = "forward"
url = "{}"
{extra}"#,
        app.url()
    )
}

/// Polls `check` every 100 ms until it holds (true) or `limit` passes.
async fn wait_for<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A delivery of `event` about `repository` of installation
/// `installation`, with a body of its own.
fn about(source: &str, event: &str, action: &str, repository: &str, installation: u64) -> Hook {
    let mut hook = Hook::new(
        event,
        format!(
            r#"{{"action":"{action}","repository":{{"id":1,"full_name":"{repository}"}},"installation":{{"id":{installation}}},"nonce":"{}"}}"#,
            uuid::Uuid::new_v4()
        ),
    );
    if source != "default" {
        hook.path = format!("/webhooks/github/{source}");
    }
    hook
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

fn secs(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}

/// `fast` completes while `slow` has a backlog.
async fn isolation(backlog: usize, fast: usize, slow_ms: Duration) -> anyhow::Result<()> {
    let slow = Sink::start(Mode::Slow(slow_ms.as_millis() as u64)).await;
    let config = format!(
        r#"
[[sources]]
name = "slow"
secrets = ["{SECRET}"]
[[sources.destinations]]
name = "app"
kind = "forward"
url = "{}"
timeout_ms = {}

[[sources]]
name = "fast"
secrets = ["{SECRET}"]
[[sources.destinations]]
name = "store"
kind = "store"
"#,
        slow.url(),
        slow_ms.as_millis() as u64 * 2
    );
    let stack = Stack::start(&config, &[]).await?;
    for _ in 0..backlog {
        let status = stack
            .send(&about("slow", "push", "none", "acme/widgets", 1))
            .await?;
        if status != 202 {
            bail!("slow: {status}");
        }
    }
    let started = Instant::now();
    let mut sent = Vec::new();
    for _ in 0..fast {
        let hook = about("fast", "push", "none", "acme/widgets", 1);
        let status = stack.send(&hook).await?;
        if status != 202 {
            bail!("fast: {status}");
        }
        sent.push(hook);
    }
    let done = wait_for(Duration::from_secs(120), || async {
        stack
            .count("select count(*) from deliveries where source = 'fast' and status = 'completed'")
            .await
            == fast as i64
    })
    .await;
    let fast_done = started.elapsed();
    let slow_left = stack
        .count("select count(*) from deliveries where source = 'slow' and status <> 'completed'")
        .await;
    let e2e_max: f64 = stack
        .env
        .db
        .query_one(
            "select coalesce(max(extract(epoch from completed_at - created_at)), 0)::float8
             from deliveries where source = 'fast'",
            &[],
        )
        .await?
        .get(0);
    println!("| scenario | figure |\n|---|---|");
    println!(
        "| slow destination's backlog sent first | {backlog} legs, {} ms each |",
        slow_ms.as_millis()
    );
    println!("| fast deliveries | {fast} |");
    println!(
        "| every fast one completed | {} (within {} s of the first send) |",
        done,
        secs(fast_done)
    );
    println!(
        "| fast end-to-end, slowest (claim to completion) | {:.1} ms |",
        e2e_max * 1000.0
    );
    println!("| slow legs not yet completed then | {slow_left} |");
    stack.stop().await;
    if !done {
        bail!("the fast deliveries did not complete");
    }
    Ok(())
}

/// A 404 destination, fixed, then resumed.
async fn misconfigured(deliveries: usize) -> anyhow::Result<()> {
    let app = Sink::start(Mode::Status(404)).await;
    let config = one_forward(&app, "");
    let stack = Stack::start(&config, &[]).await?;
    for _ in 0..deliveries {
        stack
            .send(&about("default", "push", "none", "acme/widgets", 1))
            .await?;
    }
    let settled = wait_for(Duration::from_secs(60), || async {
        stack
            .count("select count(*) from deliveries where status = 'failed'")
            .await
            == deliveries as i64
    })
    .await;
    let held = stack
        .count("select count(*) from deliveries where status = 'failed' and retryable and last_error_class = 'held'")
        .await;
    let dead = stack
        .count("select count(*) from deliveries where status = 'failed' and not retryable")
        .await;
    let state: String = stack
        .env
        .db
        .query_one("select state from destinations where name = 'app'", &[])
        .await?
        .get(0);
    let requests_while_broken = app.seen().len();
    // The route is fixed downstream; an operator resumes the destination.
    app.set(Mode::Ok);
    let pool = stack.env.pool(1);
    let client = pool.get().await?;
    hookinbox::deliveries::set_by_operator(
        &client,
        &hookinbox::SourceName::default_source(),
        &hookinbox::DestinationName::parse("app")?,
        hookinbox::deliveries::BreakerState::Closed,
        "destbench",
    )
    .await?;
    let resumed = Instant::now();
    let delivered = wait_for(Duration::from_secs(120), || async {
        stack
            .count("select count(*) from deliveries where status = 'completed'")
            .await
            == deliveries as i64
    })
    .await;
    let (keys, duplicates) = app.duplicates();
    println!("| scenario | figure |\n|---|---|");
    println!("| deliveries while it answered 404 | {deliveries} (all settled: {settled}) |");
    println!("| held (waiting, no attempt spent) | {held} |");
    println!("| dead-lettered | {dead} |");
    println!("| breaker | {state} |");
    println!("| requests it received while broken | {requests_while_broken} |");
    println!(
        "| delivered after the fix and resume | {} in {} s |",
        stack
            .count("select count(*) from deliveries where status = 'completed'")
            .await,
        secs(resumed.elapsed())
    );
    println!("| keys taken (2xx), keys taken twice | {keys}, {duplicates} |");
    stack.stop().await;
    if dead > 0 || !delivered {
        bail!("dead letters or legs not delivered");
    }
    Ok(())
}

/// A destination answering `429` with `Retry-After` until a reset
/// `reset` from the start: every leg deferred to it, none spending an
/// attempt, then all delivered.
async fn defer(deliveries: usize, reset: Duration) -> anyhow::Result<()> {
    let app = Sink::start(Mode::Ok).await;
    let config = one_forward(&app, "");
    let stack = Stack::start(&config, &[]).await?;
    let start = Instant::now();
    let reset_at = start + reset;
    app.limit_until(reset_at);
    for _ in 0..deliveries {
        stack
            .send(&about("default", "push", "none", "acme/widgets", 1))
            .await?;
    }
    let sent_in = start.elapsed();
    let completed = "select count(*) from deliveries where status = 'completed'";
    let delivered = wait_for(reset + Duration::from_secs(300), || async {
        stack.count(completed).await == deliveries as i64
    })
    .await;
    let done_at = Instant::now();
    let seen = app.seen();
    let deferred_answers = seen.iter().filter(|s| !s.taken).count();
    let first_ok = seen.iter().filter(|s| s.taken).map(|s| s.at).min();
    let extra_attempts = stack
        .count("select coalesce(sum(attempts - 1), 0) from deliveries")
        .await;
    let logged = stack
        .count("select count(*) from destination_attempts where result = 'deferred'")
        .await;
    let dead = stack
        .count("select count(*) from deliveries where status = 'failed' and not retryable")
        .await;
    let (keys, duplicates) = app.duplicates();
    println!("| figure | value |\n|---|---|");
    println!(
        "| deliveries sent while limited | {deliveries} in {} s |",
        secs(sent_in)
    );
    println!("| the reset, from the start | {} s |", secs(reset));
    println!("| answers 429 with Retry-After (deferrals) | {deferred_answers} |");
    println!("| deferrals in the attempt log | {logged} |");
    println!("| attempts spent beyond each leg's one success | {extra_attempts} |");
    println!("| dead-lettered | {dead} |");
    println!(
        "| first success after the reset | {} s |",
        first_ok.map_or("none".to_owned(), |at| secs(
            at.saturating_duration_since(reset_at)
        ))
    );
    println!(
        "| every leg delivered | {delivered}, {} s after the reset ({} s after the start) |",
        secs(done_at.saturating_duration_since(reset_at)),
        secs(done_at.duration_since(start))
    );
    println!("| keys taken (2xx), keys taken twice | {keys}, {duplicates} |");
    stack.stop().await;
    if dead > 0 || !delivered || extra_attempts > 0 || duplicates > 0 {
        bail!("dead letters, spent attempts, missing legs or duplicates");
    }
    Ok(())
}

/// A destination down for `down` at `rate`.
async fn outage(rate: u32, down: Duration, probe_secs: u64) -> anyhow::Result<()> {
    let app = Sink::start(Mode::Ok).await;
    let config = one_forward(
        &app,
        &format!("timeout_ms = 2000\nbreaker = {{ probe_secs = {probe_secs} }}\n"),
    );
    let stack = Arc::new(Stack::start(&config, &[]).await?);
    app.down().await;
    let went_down = Instant::now();
    // Each request on a task of its own (fanout::send_at), so the rate
    // holds however long ingest takes to answer one.
    let sending = tokio::spawn({
        let stack = stack.clone();
        async move {
            let total = (down.as_secs_f64() * f64::from(rate)) as usize;
            let accepted = fanout::send_at(&stack, rate, down).await;
            accepted.map(|accepted| (total, total - accepted))
        }
    });
    // While down: the breaker's state, sampled each second.
    let mut opened_at: Option<Instant> = None;
    while went_down.elapsed() < down {
        let state: String = stack
            .env
            .db
            .query_one("select state from destinations where name = 'app'", &[])
            .await?
            .get(0);
        if opened_at.is_none() && state != "closed" {
            opened_at = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (sent, refused) = sending.await??;
    let dead_during = stack
        .count("select count(*) from deliveries where status = 'failed' and not retryable")
        .await;
    let attempts_while_down = stack
        .count("select count(*) from destination_attempts")
        .await;
    let probes = stack
        .count("select count(*) from destination_attempts where probe")
        .await;
    app.up().await;
    let came_up = Instant::now();
    let all = wait_for(Duration::from_secs(1800), || async {
        stack
            .count("select count(*) from deliveries where status = 'completed'")
            .await
            == (sent - refused) as i64
    })
    .await;
    let drained = came_up.elapsed();
    let (keys, duplicates) = app.duplicates();
    let dead = stack
        .count("select count(*) from deliveries where status = 'failed' and not retryable")
        .await;
    let open_secs = opened_at
        .map(|t| went_down.elapsed().min(t.elapsed()))
        .unwrap_or_default();
    println!("| scenario | figure |\n|---|---|");
    println!("| down for | {} s, {rate} deliveries/s |", secs(down));
    println!("| sent, refused by ingest | {sent}, {refused} |");
    println!(
        "| breaker opened after | {} s |",
        opened_at
            .map(|t| secs(t - went_down))
            .unwrap_or_else(|| "never".into())
    );
    println!(
        "| attempts while down (the attempt log), of which probes | {attempts_while_down}, {probes} |"
    );
    println!(
        "| probes allowed by probe_secs = {probe_secs} over {} s open | {} |",
        secs(open_secs),
        open_secs.as_secs() / probe_secs + 1
    );
    println!("| dead-lettered while down, in all | {dead_during}, {dead} |");
    println!(
        "| every leg delivered after it came back | {all}, in {} s |",
        secs(drained)
    );
    println!("| keys taken (2xx), keys taken twice | {keys}, {duplicates} |");
    let stack = Arc::try_unwrap(stack).map_err(|_| anyhow::anyhow!("stack still shared"))?;
    stack.stop().await;
    if dead > 0 || !all || duplicates > 0 {
        bail!("dead letters, missing legs or duplicates");
    }
    Ok(())
}

/// Sends `deliveries` at `rate` to a source with destinations A, B and C,
/// B's receiver down for the middle third of the run (or, `with_b` false,
/// A alone), and returns A's end-to-end latency histograms (send to
/// receipt, µs) over the sends of the first third (B up) and of the middle
/// third (B down), and what the run saw.
async fn mixed_run(
    deliveries: usize,
    rate: u32,
    with_b: bool,
) -> anyhow::Result<([Histogram<u64>; 2], MixedRun)> {
    let a = Sink::start(Mode::Ok).await;
    let b = Sink::start(Mode::Ok).await;
    let c = Sink::start(Mode::Ok).await;
    let mut config = format!(
        r#"
[[sources]]
name = "default"
secrets = ["{SECRET}"]
[[sources.destinations]]
name = "a"
kind = "forward"
url = "{}"
"#,
        a.url()
    );
    if with_b {
        config.push_str(&format!(
            r#"
[[sources.destinations]]
name = "b"
kind = "forward"
url = "{}"
timeout_ms = 2000
breaker = {{ probe_secs = 5 }}

[[sources.destinations]]
name = "c"
kind = "forward"
url = "{}"
events = ["pull_request"]
repositories = ["acme/widgets", "acme/gadgets"]
"#,
            b.url(),
            c.url()
        ));
    }
    let stack = Stack::start(&config, &[]).await?;
    let repositories = ["acme/widgets", "acme/gadgets", "acme/other", "someone/else"];
    let third = deliveries / 3;
    let period = Duration::from_secs(1) / rate;
    let start = tokio::time::Instant::now();
    let mut sent_at: HashMap<String, Instant> = HashMap::new();
    let mut while_up: Vec<String> = Vec::new();
    let mut while_down: Vec<String> = Vec::new();
    let mut c_expected = 0usize;
    let mut accepted = 0usize;
    for i in 0..deliveries {
        if with_b && i == third {
            b.down().await;
        }
        if with_b && i == 2 * third {
            b.up().await;
        }
        tokio::time::sleep_until(start + period * i as u32).await;
        let repository = repositories[i % repositories.len()];
        let (event, action) = if i % 3 == 0 {
            ("pull_request", "opened")
        } else {
            ("push", "none")
        };
        let hook = about("default", event, action, repository, 1);
        // The clock starts before the send: A's leg may arrive before
        // ingest answers (the answer waits for every leg's confirm).
        let sent = Instant::now();
        let status = stack.send(&hook).await?;
        if status == 202 {
            accepted += 1;
            if event == "pull_request"
                && repository.starts_with("acme/")
                && repository != "acme/other"
            {
                c_expected += 1;
            }
            if (third..2 * third).contains(&i) {
                while_down.push(hook.id().to_owned());
            } else if i < third {
                while_up.push(hook.id().to_owned());
            }
            sent_at.insert(hook.id().to_owned(), sent);
        }
    }
    // Everything arrives: A and C at once, B after it came back.
    let everything = wait_for(Duration::from_secs(600), || async {
        a.duplicates().0 >= accepted
            && (!with_b || (b.duplicates().0 >= accepted && c.duplicates().0 >= c_expected))
    })
    .await;
    let a_seen: HashMap<String, Instant> =
        a.seen().into_iter().map(|s| (s.delivery, s.at)).collect();
    let mut histograms = [Histogram::<u64>::new(3)?, Histogram::<u64>::new(3)?];
    for (histogram, ids) in histograms.iter_mut().zip([&while_up, &while_down]) {
        for id in ids {
            if let (Some(sent), Some(got)) = (sent_at.get(id), a_seen.get(id)) {
                histogram.record(got.saturating_duration_since(*sent).as_micros() as u64)?;
            }
        }
    }
    let run = MixedRun {
        accepted,
        everything,
        a: a.duplicates(),
        b: b.duplicates(),
        c: c.duplicates(),
        c_expected,
        dead: stack
            .count("select count(*) from deliveries where status = 'failed' and not retryable")
            .await,
        c_wrong: c
            .seen()
            .iter()
            .filter(|s| s.taken)
            .count()
            .saturating_sub(c_expected),
    };
    stack.stop().await;
    Ok((histograms, run))
}

/// What a mixed run saw.
struct MixedRun {
    accepted: usize,
    everything: bool,
    a: (usize, usize),
    b: (usize, usize),
    c: (usize, usize),
    c_expected: usize,
    dead: i64,
    c_wrong: usize,
}

async fn mixed(deliveries: usize, rate: u32, pairs: usize) -> anyhow::Result<()> {
    let p = |h: &Histogram<u64>, q: f64| Duration::from_micros(h.value_at_quantile(q));
    let mut rows: Vec<[Duration; 6]> = Vec::new();
    let mut last = None;
    for pair in 1..=pairs.max(1) {
        let ([_, alone], _) = mixed_run(deliveries, rate, false)
            .await
            .with_context(|| format!("A alone, pair {pair}"))?;
        let ([b_up, b_down], run) = mixed_run(deliveries, rate, true)
            .await
            .with_context(|| format!("A beside B and C, pair {pair}"))?;
        rows.push([
            p(&alone, 0.5),
            p(&b_up, 0.5),
            p(&b_down, 0.5),
            p(&alone, 0.99),
            p(&b_up, 0.99),
            p(&b_down, 0.99),
        ]);
        let bad = !run.everything || run.a.1 + run.b.1 + run.c.1 > 0 || run.c.0 != run.c_expected;
        last = Some(run);
        if bad {
            break;
        }
    }
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-6);
    println!(
        "| A's end-to-end (send to receipt), ms | p50 A alone | p50 B up | p50 B down | p99 A alone | p99 B up | p99 B down | p99 B up / alone | p99 B down / alone | p99 B down / B up |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    let line = |name: String, r: &[Duration; 6]| {
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} |",
            ms(r[0]),
            ms(r[1]),
            ms(r[2]),
            ms(r[3]),
            ms(r[4]),
            ms(r[5]),
            ratio(r[4], r[3]),
            ratio(r[5], r[3]),
            ratio(r[5], r[4])
        )
    };
    for (i, row) in rows.iter().enumerate() {
        line(format!("pair {}", i + 1), row);
    }
    if rows.len() > 1 {
        let median: [Duration; 6] = std::array::from_fn(|c| {
            let mut column: Vec<Duration> = rows.iter().map(|r| r[c]).collect();
            column.sort();
            column[column.len() / 2]
        });
        line("median".to_owned(), &median);
    }
    let Some(run) = last else {
        bail!("no run");
    };
    println!();
    println!("| figure | value |\n|---|---|");
    println!("| deliveries accepted | {} |", run.accepted);
    println!("| everything arrived | {} |", run.everything);
    println!("| A: keys, keys twice | {}, {} |", run.a.0, run.a.1);
    println!(
        "| B (down a third of the run): keys, keys twice | {}, {} |",
        run.b.0, run.b.1
    );
    println!(
        "| C: keys (expected {}), keys twice, extra | {}, {}, {} |",
        run.c_expected, run.c.0, run.c.1, run.c_wrong
    );
    println!("| dead-lettered | {} |", run.dead);
    if !run.everything || run.a.1 + run.b.1 + run.c.1 > 0 || run.c.0 != run.c_expected {
        bail!("missing, duplicated or wrongly filtered legs");
    }
    Ok(())
}
