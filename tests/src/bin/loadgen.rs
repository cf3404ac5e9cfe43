//! Open-loop load generator for hookinbox.
//!
//! Sends signed real payloads (70 % `push`, 30 % `pull_request`) at a
//! constant arrival rate, timing each request from its *scheduled* send
//! (so a slow server cannot slow the generator down and hide its own
//! latency), with a share of redeliveries of earlier ids. It reports ingest
//! latency percentiles (HdrHistogram), end-to-end latency from the 202 to
//! `completed` (read from Postgres), non-2xx counts and the achieved rate.
//! `--search` finds the highest sustainable rate S: no 5xx, every accepted
//! delivery completed, the work queue not growing. Short steps find a
//! candidate; S is the candidate only once it has held for `--hold` seconds
//! (otherwise the rate is lowered by a tenth and held again); with
//! `--verify`, it must first hold that long (V), and the `--hold` starts
//! from V. A run whose queue outgrows the bound stops sending at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Parser;
use hdrhistogram::Histogram;
use hookinbox_tests::{fixtures, sign};
use tokio::sync::Mutex;

/// Open-loop load against a running hookinbox.
#[derive(Parser, Clone)]
struct Args {
    /// Webhook URL.
    #[arg(long, default_value = "http://127.0.0.1:8080/webhooks/github")]
    url: String,
    /// Webhook secret.
    #[arg(long, env = "HOOKINBOX_GITHUB_SECRET")]
    secret: String,
    /// Postgres of the deployment under test (for end-to-end latency).
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// AMQP URL and queue prefix (for the queue depth).
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    amqp_url: String,
    /// Queue prefix.
    #[arg(long, env = "HOOKINBOX_QUEUE_PREFIX", default_value = "hookinbox")]
    queue_prefix: String,
    /// Requests per second.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    rate: u32,
    /// Seconds to send.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Share of requests that redeliver an earlier id (0 to 1).
    #[arg(long, default_value_t = 0.0)]
    redeliver: f64,
    /// Only redeliveries of ids sent in a warm-up (duplicate throughput).
    #[arg(long)]
    duplicates_only: bool,
    /// Find the highest sustainable rate, starting here.
    #[arg(long)]
    search: bool,
    /// Seconds per search step.
    #[arg(long, default_value_t = 10)]
    step_duration: u64,
    /// Seconds a search's candidate must hold before it is reported as S.
    #[arg(long, default_value_t = 60)]
    hold: u64,
    /// Seconds the candidate must first hold before the `--hold` (0: no
    /// such step). The rate that does is reported as V; the `--hold` then
    /// starts from V, so a long hold is only tried at a rate a shorter one
    /// has already sustained.
    #[arg(long, default_value_t = 0)]
    verify: u64,
    /// How many seconds of arrivals the work queue may hold, above its
    /// depth at the start, during a `--verify`, a `--hold` or a fixed-rate
    /// run (a search step allows one). Over minutes the worker now and then
    /// falls a second or two behind and catches up again; a rate the
    /// workers cannot keep up with grows past any such bound.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    hold_lag: u32,
    /// Appends every queue-depth sample (unix time, rate, depth) to this
    /// file, to line the queue up with other logs (Postgres checkpoints).
    #[arg(long)]
    depth_log: Option<std::path::PathBuf>,
    /// Upper bound for the search.
    #[arg(long, default_value_t = 20_000)]
    max_rate: u32,
    /// A pid whose largest RSS during the run to report (sampled every
    /// second, so a run reports its own peak, not an earlier run's).
    #[arg(long)]
    pid: Option<u32>,
    /// Skip the end-to-end part (for a target without Postgres).
    #[arg(long)]
    no_e2e: bool,
    /// Spread the payloads over this many repositories (`repository.id`
    /// 1 to N, by delivery id), for a destination ordered by repository;
    /// 0 keeps the fixtures' own.
    #[arg(long, default_value_t = 0)]
    repositories: u64,
}

struct Payload {
    event: &'static str,
    body: Vec<u8>,
    /// See `Args::repositories`.
    repositories: u64,
}

impl Payload {
    /// The body sent under delivery `id`, and its signature: each id its
    /// own body (its nonce is the id), as GitHub's are, since ingest's
    /// replay guard refuses a body seen under another id; a redelivery of
    /// the id sends the same bytes.
    fn for_delivery(&self, id: &str, secret: &str) -> (bytes::Bytes, String) {
        let mut body = fixtures::with_nonce(&self.body, id);
        if self.repositories > 0 {
            let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
            body = fixtures::with_repository_id(&body, 1 + hash % self.repositories);
        }
        let signature = sign(secret, &body);
        (body.into(), signature)
    }
}

/// What one run measured.
#[derive(Default, Debug)]
struct Outcome {
    rate: u32,
    sent: u64,
    achieved: f64,
    ok2xx: u64,
    accepted: u64,
    status4xx: u64,
    /// Non-2xx statuses and client errors by kind, for the printout.
    failures: std::collections::BTreeMap<String, u64>,
    status5xx: u64,
    errors: u64,
    ingest: Option<[f64; 4]>,
    e2e: Option<[f64; 4]>,
    completed: u64,
    depth_start: u32,
    depth_end: u32,
    depth_max: u32,
    rss_mib: Option<f64>,
    /// Seconds of arrivals the queue may lag (see `--hold-lag`).
    lag: u32,
    /// Seconds into the run at which sending stopped because it had
    /// already failed (the queue past its bound, or a request failed).
    stopped_at: Option<f64>,
}

impl Outcome {
    /// Every request answered 2xx (no 5xx, and no 429 shedding either),
    /// the rate held, every accepted delivery completed, and the work queue
    /// never more than `lag` seconds of work deeper than at the start.
    fn sustainable(&self) -> bool {
        self.stopped_at.is_none()
            && self.status5xx == 0
            && self.status4xx == 0
            && self.errors == 0
            && self.achieved >= 0.95 * f64::from(self.rate)
            && (self.accepted == 0 || self.completed == self.accepted)
            && !self.queue_outgrown(self.depth_max)
            && self.depth_end <= self.depth_start + self.rate / 2 + 10
    }

    fn queue_outgrown(&self, depth: u32) -> bool {
        outgrown(depth, self.depth_start, self.rate, self.lag)
    }

    fn print(&self) {
        let fmt = |p: &Option<[f64; 4]>| match p {
            Some([a, b, c, d]) => {
                format!("p50 {a:.2} ms, p99 {b:.2} ms, p99.9 {c:.2} ms, max {d:.2} ms")
            }
            None => "-".to_owned(),
        };
        println!(
            "rate {} /s: {}sent {}, achieved {:.0} /s, 2xx {} (accepted {}), 4xx {}, 5xx {}, errors {}{}; ingest {}; e2e {}; completed {}/{}; queue depth {} -> {} (max {}){}; {}",
            self.rate,
            self.stopped_at
                .map(|t| format!("stopped after {t:.0} s (failed already), "))
                .unwrap_or_default(),
            self.sent,
            self.achieved,
            self.ok2xx,
            self.accepted,
            self.status4xx,
            self.status5xx,
            self.errors,
            if self.failures.is_empty() {
                String::new()
            } else {
                let kinds: Vec<String> = self
                    .failures
                    .iter()
                    .map(|(kind, n)| format!("{kind} ×{n}"))
                    .collect();
                format!(" ({})", kinds.join(", "))
            },
            fmt(&self.ingest),
            fmt(&self.e2e),
            self.completed,
            self.accepted,
            self.depth_start,
            self.depth_end,
            self.depth_max,
            self.rss_mib
                .map(|r| format!("; ingest RSS max {r:.1} MiB"))
                .unwrap_or_default(),
            if self.sustainable() {
                "SUSTAINED"
            } else {
                "NOT SUSTAINED"
            }
        );
    }
}

fn percentiles(h: &Histogram<u64>) -> Option<[f64; 4]> {
    (!h.is_empty()).then(|| {
        [
            h.value_at_quantile(0.5) as f64 / 1000.0,
            h.value_at_quantile(0.99) as f64 / 1000.0,
            h.value_at_quantile(0.999) as f64 / 1000.0,
            h.max() as f64 / 1000.0,
        ]
    })
}

/// Ready messages in the work queue; `None` when the broker did not
/// answer (a missing sample, not an empty queue).
async fn queue_depth(args: &Args) -> Option<u32> {
    // One connection for the whole run: a connection opened and closed
    // every second costs the broker more than the sample is worth.
    let publisher = DEPTH_PUBLISHER.get_or_init(|| {
        hookinbox::broker::Publisher::new(
            &args.amqp_url,
            "loadgen",
            hookinbox::broker::Topology::new(&args.queue_prefix),
            Duration::from_secs(5),
        )
    });
    // The legacy shared queue and the default source's destination's
    // (`store` or `forward`): whichever exist.
    let mut depth = None;
    for queue in ["work", "work.default.store", "work.default.forward"] {
        let queue = format!("{}.{queue}", args.queue_prefix);
        if let Ok((messages, _)) = publisher.queue_stats(&queue).await {
            depth = Some(depth.unwrap_or(0) + messages);
        }
    }
    depth
}

/// The broker connection [`queue_depth`] samples through.
static DEPTH_PUBLISHER: std::sync::OnceLock<hookinbox::broker::Publisher> =
    std::sync::OnceLock::new();

/// Waits (up to 5 minutes) until the work queue is empty, so that a search
/// step never inherits the backlog of an unsustained step before it.
async fn drained(args: &Args) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while queue_depth(args).await.is_none_or(|d| d > 0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The work queue is more than `lag` seconds of arrivals deeper than at
/// the start: the workers are behind, whatever happens next.
fn outgrown(depth: u32, start: u32, rate: u32, lag: u32) -> bool {
    depth
        > start
            .saturating_add(lag.saturating_mul(rate))
            .saturating_add(50)
}

async fn failed(failures: &Mutex<std::collections::BTreeMap<String, u64>>, kind: &str) {
    *failures.lock().await.entry(kind.to_owned()).or_default() += 1;
}

fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn larger(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

async fn run(
    args: &Args,
    rate: u32,
    duration: u64,
    lag: u32,
    stop_early: bool,
    payloads: &Arc<Vec<Payload>>,
    warm: &[String],
) -> anyhow::Result<Outcome> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(512)
        // Below the server's keep-alive (actix: 5 s), so the client never
        // picks a pooled connection the server is closing: that race is a
        // connection error no webhook sender would count against us.
        .pool_idle_timeout(Duration::from_secs(4))
        .build()?;
    let ingest = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1,
        120_000_000,
        3,
    )?));
    let accepted = Arc::new(Mutex::new(Vec::<(String, f64)>::new()));
    let counts = Arc::new([(); 5].map(|_| AtomicU64::new(0))); // 2xx, 4xx, 5xx, errors, accepted
    let sent_ids = Arc::new(Mutex::new(Vec::<(String, usize)>::new()));
    let failures = Arc::new(Mutex::new(std::collections::BTreeMap::new()));
    let total = rate as u64 * duration;
    let start = tokio::time::Instant::now();
    let depth_start = queue_depth(args)
        .await
        .context("the broker did not answer the queue depth at the start")?;
    let mut depth_max = depth_start;
    let mut rss_max = args.pid.and_then(rss_mib);
    let mut tasks = tokio::task::JoinSet::new();
    let period = Duration::from_secs(1) / rate;
    let mut last_depth = Instant::now();
    let (mut sent, mut stopped_at) = (total, None);
    // Opened once: at ten thousand requests a second every descriptor is
    // in use by a socket.
    let mut depth_log = match &args.depth_log {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?,
        ),
        None => None,
    };
    for i in 0..total {
        let scheduled = start + period * i as u32;
        tokio::time::sleep_until(scheduled).await;
        if last_depth.elapsed() >= Duration::from_secs(1) {
            last_depth = Instant::now();
            // A sample the broker did not answer is skipped, not read as 0.
            let depth = queue_depth(args).await.unwrap_or(depth_max);
            depth_max = depth_max.max(depth);
            if let (Some(file), Some(path)) = (&mut depth_log, &args.depth_log) {
                use std::io::Write;
                writeln!(
                    file,
                    "{:.0} {} {rate} {depth}",
                    unix_now(),
                    args.queue_prefix
                )
                .with_context(|| format!("writing {}", path.display()))?;
            }
            rss_max = larger(rss_max, args.pid.and_then(rss_mib));
            // Once the queue has outgrown the bound, or a request has
            // failed, a search's run has failed; sending on would only
            // deepen a backlog the next run must wait out (and a failing
            // 10-minute hold would spend its 10 minutes). A fixed-rate run
            // measures latency, so it goes on.
            let failed = counts[1..4].iter().any(|c| c.load(Ordering::Relaxed) > 0);
            if stop_early && (failed || outgrown(depth_max, depth_start, rate, lag)) {
                (sent, stopped_at) = (i, Some(start.elapsed().as_secs_f64()));
                break;
            }
        }
        // Which payload, and a new id or an earlier one.
        let (id, idx) = if args.duplicates_only && !warm.is_empty() {
            {
                // The same id with the same body as in the warm-up: a true
                // redelivery, not a conflict.
                let w = i as usize % warm.len();
                (warm[w].clone(), w % payloads.len())
            }
        } else {
            let ids = sent_ids.lock().await;
            let again = args.redeliver > 0.0
                && !ids.is_empty()
                && ((i * 7919) % 1000) as f64 / 1000.0 < args.redeliver;
            if again {
                ids[(i as usize * 31) % ids.len()].clone()
            } else {
                drop(ids);
                (
                    uuid::Uuid::new_v4().to_string(),
                    i as usize % payloads.len(),
                )
            }
        };
        let (http, url, secret) = (http.clone(), args.url.clone(), args.secret.clone());
        let failures = failures.clone();
        let (payloads, ingest, accepted, counts, sent_ids) = (
            payloads.clone(),
            ingest.clone(),
            accepted.clone(),
            counts.clone(),
            sent_ids.clone(),
        );
        tasks.spawn(async move {
            let p = &payloads[idx];
            let (body, signature) = p.for_delivery(&id, &secret);
            let response = fixtures::delivery_request(&http, &url, p.event, &id, &signature, body)
                .send()
                .await;
            // Latency from the scheduled send: open loop.
            let micros = scheduled.elapsed().as_micros() as u64;
            let _ = ingest.lock().await.record(micros.max(1));
            match response {
                Ok(r) if r.status().is_success() => {
                    counts[0].fetch_add(1, Ordering::Relaxed);
                    if r.status().as_u16() == 202 {
                        let body = r.text().await.unwrap_or_default();
                        if body.contains("\"accepted\"") {
                            counts[4].fetch_add(1, Ordering::Relaxed);
                            accepted.lock().await.push((id.clone(), unix_now()));
                        }
                    }
                    sent_ids.lock().await.push((id, idx));
                }
                Ok(r) if r.status().is_client_error() => {
                    counts[1].fetch_add(1, Ordering::Relaxed);
                    failed(&failures, r.status().as_str()).await;
                }
                Ok(r) => {
                    counts[2].fetch_add(1, Ordering::Relaxed);
                    failed(&failures, r.status().as_str()).await;
                }
                Err(e) => {
                    counts[3].fetch_add(1, Ordering::Relaxed);
                    let kind = if e.is_timeout() {
                        "timeout"
                    } else if e.is_connect() {
                        "connect error"
                    } else if e.is_body() || e.is_decode() {
                        "body error"
                    } else {
                        "request error"
                    };
                    failed(&failures, kind).await;
                }
            }
        });
        while let Some(done) = tasks.try_join_next() {
            done.ok();
        }
    }
    let sending = start.elapsed().as_secs_f64();
    while tasks.join_next().await.is_some() {}
    let mut out = Outcome {
        rate,
        sent,
        achieved: sent as f64 / sending,
        ok2xx: counts[0].load(Ordering::Relaxed),
        status4xx: counts[1].load(Ordering::Relaxed),
        failures: failures.lock().await.clone(),
        status5xx: counts[2].load(Ordering::Relaxed),
        errors: counts[3].load(Ordering::Relaxed),
        accepted: counts[4].load(Ordering::Relaxed),
        ingest: percentiles(&*ingest.lock().await),
        depth_start,
        depth_max,
        lag,
        stopped_at,
        ..Outcome::default()
    };
    out.rss_mib = larger(rss_max, args.pid.and_then(rss_mib));
    // The depth when sending stops, not after the wait for completions
    // below: by then any backlog has drained, and a queue that grew all
    // run long would look flat.
    out.depth_end = queue_depth(args)
        .await
        .context("the broker did not answer the queue depth at the end")?;
    if args.no_e2e {
        // Nothing behind the target to complete: only the HTTP side counts.
        out.completed = out.accepted;
    } else {
        let db = hookinbox_tests::connect(&args.database_url).await;
        let accepted = accepted.lock().await.clone();
        let ids: Vec<String> = accepted.iter().map(|(id, _)| id.clone()).collect();
        // Wait (bounded) for the workers to finish what was accepted.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let done: i64 = db
                .query_one(
                    "select count(*) from deliveries where delivery_id = any($1) and status = 'completed'",
                    &[&ids],
                )
                .await?
                .get(0);
            out.completed = done as u64;
            if done as usize >= ids.len() || Instant::now() > deadline {
                break;
            }
            // Seldom: each poll reads every id of the run, and the generator's
            // CPU is measured too.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let rows = db
            .query(
                "select delivery_id, extract(epoch from completed_at)::float8 from deliveries \
                 where delivery_id = any($1) and status = 'completed'",
                &[&ids],
            )
            .await?;
        let answered: std::collections::HashMap<&str, f64> =
            accepted.iter().map(|(id, t)| (id.as_str(), *t)).collect();
        let mut e2e = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
        for row in rows {
            let id: String = row.get(0);
            let done: f64 = row.get(1);
            if let Some(at) = answered.get(id.as_str()) {
                let _ = e2e.record((((done - at) * 1e6).max(1.0)) as u64);
            }
        }
        out.e2e = percentiles(&e2e);
    }
    Ok(out)
}

/// Holds `rate` for `secs`, lowering it by a tenth after each failure (up
/// to six times); the rate that held, if any.
async fn hold(
    args: &Args,
    mut rate: u32,
    secs: u64,
    label: &str,
    payloads: &Arc<Vec<Payload>>,
    warm: &[String],
) -> anyhow::Result<Option<u32>> {
    for _ in 0..6 {
        if rate == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        drained(args).await;
        let out = run(args, rate, secs, args.hold_lag, true, payloads, warm).await?;
        print!(
            "{label} {secs} s (queue bound {} s of work): ",
            args.hold_lag
        );
        out.print();
        if out.sustainable() {
            return Ok(Some(rate));
        }
        rate = rate * 9 / 10;
    }
    Ok(None)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let result = measure(Args::parse()).await;
    if let Some(publisher) = DEPTH_PUBLISHER.get() {
        publisher.close().await;
    }
    result
}

async fn measure(args: Args) -> anyhow::Result<()> {
    // 7 push, 3 pull_request in every 10: the 70/30 mix.
    let payloads: Vec<Payload> = fixtures::load_mix()
        .into_iter()
        .map(|(event, body)| Payload {
            event,
            body,
            repositories: args.repositories,
        })
        .collect();
    let payloads = Arc::new(payloads);
    let mut warm = Vec::new();
    if args.duplicates_only {
        // Ids to redeliver: sent (and completed) once before the timed run.
        let ids: Vec<String> = (0..2000)
            .map(|_| uuid::Uuid::new_v4().to_string())
            .collect();
        let http = reqwest::Client::new();
        for (i, id) in ids.iter().enumerate() {
            let p = &payloads[i % payloads.len()];
            let (body, signature) = p.for_delivery(id, &args.secret);
            fixtures::delivery_request(&http, &args.url, p.event, id, &signature, body)
                .send()
                .await
                .context("warm-up")?;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        warm = ids;
    }
    if !args.search {
        run(
            &args,
            args.rate,
            args.duration,
            args.hold_lag,
            false,
            &payloads,
            &warm,
        )
        .await?
        .print();
        return Ok(());
    }
    // Double until a rate is not sustained, then bisect.
    let (mut good, mut bad) = (0u32, 0u32);
    let mut rate = args.rate;
    while rate <= args.max_rate {
        let out = run(&args, rate, args.step_duration, 1, true, &payloads, &warm).await?;
        out.print();
        if out.sustainable() {
            good = rate;
            rate *= 2;
        } else {
            bad = rate;
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        drained(&args).await;
    }
    if bad == 0 {
        bad = args.max_rate;
    }
    while bad > good + good / 20 + 1 {
        let mid = (good + bad) / 2;
        tokio::time::sleep(Duration::from_secs(2)).await;
        drained(&args).await;
        let out = run(&args, mid, args.step_duration, 1, true, &payloads, &warm).await?;
        out.print();
        if out.sustainable() {
            good = mid;
        } else {
            bad = mid;
        }
    }
    // Short steps overrate what holds: a slow decay (a growing table, a
    // broker backlog) needs longer than a step to show. The candidate must
    // hold for the whole `--verify` (reported as V), then for the whole
    // `--hold` (reported as S); each failure lowers it by a tenth.
    let mut s = good;
    if args.verify > 0 {
        match hold(&args, s, args.verify, "verified", &payloads, &warm).await? {
            Some(v) => {
                println!("V = {v} deliveries/s");
                s = v;
            }
            None => s = 0,
        }
    }
    if let Some(s) = hold(&args, s, args.hold, "held", &payloads, &warm).await? {
        println!("S = {s} deliveries/s");
        return Ok(());
    }
    println!("S = 0 deliveries/s (no candidate held for {} s)", args.hold);
    Ok(())
}
