//! Storage at volume (`scripts/bench.sh --storage`): a database filled with
//! N completed deliveries spread over D days (each with its claim row, its
//! replay guard's body and its stored event), then the retention sweep run
//! under live traffic, in two layouts from one run of this tool:
//!
//! - `rows`: every past day in one partition, as an upgraded database has
//!   them (`github_events_to_YYYYMMDD`), so that retention deletes stored
//!   events row by row, as before day partitions;
//! - `days`: a partition per day, so that retention drops whole days.
//!
//! Live traffic is the worker's store path through the library: a claim
//! (replay guard on), then the fused take, completion and stored event, at
//! a fixed rate; their latencies are reported before and during the sweep.
//! After the sweep, each table's live and dead rows and size. Then, with
//! `--rr-secs`, on the `days` layout, the same lifecycle as fast as 8 sessions go, for that long
//! without and then with a `REPEATABLE READ` transaction open: its rate per
//! minute, and the dead rows it leaves.
//!
//! Rows are written by `generate_series` in Postgres, in chunks; payloads
//! are `--payload-bytes` of JSON (real ones are larger: this measures rows,
//! not bytes).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{Days, Utc};
use clap::Parser;
use hdrhistogram::Histogram;
use hookinbox::deliveries::partitions::GITHUB_EVENTS;
use hookinbox::deliveries::{self, Policy, Retention};
use hookinbox_tests::{Hook, TestEnv, claim_and_store, claim_request, store_leg};
use std::sync::Mutex;

#[derive(Parser)]
#[command(about = "Retention and claims at volume, before and after day partitions")]
struct Args {
    /// Completed deliveries to fill the database with.
    #[arg(long, default_value_t = 10_000_000)]
    deliveries: i64,
    /// Days they are spread over, ending now.
    #[arg(long, default_value_t = 40)]
    days: i64,
    /// The completed and events retention, in days.
    #[arg(long, default_value_t = 30)]
    retention_days: u64,
    /// Bytes of each stored event's payload.
    #[arg(long, default_value_t = 512)]
    payload_bytes: usize,
    /// Live deliveries per second during the measured windows.
    #[arg(long, default_value_t = 100)]
    rate: u32,
    /// Seconds of the window before the sweep.
    #[arg(long, default_value_t = 30)]
    window_secs: u64,
    /// Seconds of the closed-loop run with a REPEATABLE READ transaction
    /// open, after the `days` layout's sweep (0: skip both closed loops).
    #[arg(long, default_value_t = 0)]
    rr_secs: u64,
    /// Seconds of the closed-loop run without it (default: `--rr-secs`).
    #[arg(long)]
    baseline_secs: Option<u64>,
    /// The layouts to measure, in order.
    #[arg(long, value_delimiter = ',', default_values_t = [String::from("rows"), String::from("days")])]
    layouts: Vec<String>,
}

/// Rows written per statement while filling.
const CHUNK: i64 = 500_000;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    println!(
        "# Storage: {} deliveries over {} days, retention {} days, live rate {}/s\n",
        args.deliveries, args.days, args.retention_days, args.rate
    );
    for layout in &args.layouts {
        let by_day = match layout.as_str() {
            "rows" => false,
            "days" => true,
            other => anyhow::bail!("unknown layout {other:?}: rows or days"),
        };
        run_layout(&args, by_day).await?;
    }
    Ok(())
}

/// One layout: fill, measure the sweep under traffic, count what it left.
async fn run_layout(args: &Args, by_day: bool) -> anyhow::Result<()> {
    let name = if by_day { "days" } else { "rows" };
    println!("## Layout `{name}`\n");
    let env = TestEnv::new().await;
    let pool = env.pool(12);
    let client = pool.get().await.context("client")?;
    let today = Utc::now().date_naive();
    if by_day {
        let mut start = today - Days::new(args.days as u64 + 1);
        while start <= today {
            GITHUB_EVENTS.ensure(&client, start).await?;
            start = start + Days::new(8);
        }
    } else {
        // What migration 0022 makes of a table with rows.
        let tomorrow = today + Days::new(1);
        env.db
            .batch_execute(&format!(
                "create table github_events_to_{to} (like github_events including defaults \
                     including storage including compression);
                 alter table github_events attach partition github_events_to_{to}
                     for values from (minvalue) to ('{tomorrow} 00:00:00+00')",
                to = tomorrow.format("%Y%m%d"),
            ))
            .await?;
    }
    let filled = Instant::now();
    fill(&env, args).await?;
    let fill_secs = filled.elapsed().as_secs_f64();
    let vacuumed = Instant::now();
    env.db
        .batch_execute("vacuum (analyze) deliveries, seen_bodies, github_events")
        .await?;
    println!(
        "- filled in {fill_secs:.0} s ({:.0} deliveries/s), vacuumed in {:.0} s",
        args.deliveries as f64 / fill_secs,
        vacuumed.elapsed().as_secs_f64()
    );
    print_tables(&env, "after the fill").await?;

    let live = Live::start(pool.clone(), env.policy(), args.rate, args.payload_bytes);
    tokio::time::sleep(Duration::from_secs(args.window_secs)).await;
    let before = live.window();
    let swept_at = Instant::now();
    let kept = Duration::from_secs(args.retention_days * 86_400);
    let retention = Retention {
        completed: kept,
        failed: kept,
        events: Some(kept),
        bodies: Duration::from_secs(7 * 86_400),
    };
    let swept = deliveries::sweep(&client, &retention, 500).await?;
    let sweep_secs = swept_at.elapsed().as_secs_f64();
    let during = live.window();
    let errors = live.stop().await;
    println!(
        "- the sweep took {sweep_secs:.1} s: {} deliveries, {} remembered bodies and {} stored \
         events deleted by rows, {} day partitions dropped",
        swept.completed + swept.failed,
        swept.seen_bodies,
        swept.events,
        swept.partitions
    );
    println!(
        "\n| live traffic | done | failed | claim p50 | claim p99 | store+complete p50 | \
         store+complete p99 |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (label, w) in [("before the sweep", &before), ("during the sweep", &during)] {
        println!(
            "| {label} | {} | {} | {} | {} | {} | {} |",
            w.claim.len(),
            w.failed,
            ms(&w.claim, 0.5),
            ms(&w.claim, 0.99),
            ms(&w.complete, 0.5),
            ms(&w.complete, 0.99)
        );
    }
    println!("\nlive errors: {errors}\n");
    // The sweep's session sends its statistics at its next transaction's
    // end; the live sessions' within a second or so (a reading, not a wait
    // for a condition).
    client
        .batch_execute("select pg_stat_force_next_flush(); select 1")
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    print_tables(&env, "right after the sweep").await?;

    if args.rr_secs > 0 && by_day {
        closed_loops(&env, &pool, args).await?;
    }
    drop(client);
    env.cleanup().await;
    Ok(())
}

/// Writes the deliveries, their remembered bodies and their events, in
/// chunks, spread evenly over the days up to now.
async fn fill(env: &TestEnv, args: &Args) -> anyhow::Result<()> {
    let pad = "x".repeat(args.payload_bytes.saturating_sub(80));
    let statement = format!(
        "with s as (
             select i, 'fill-' || i as id,
                    now() - make_interval(secs => {span} * ({n} - i)::float8 / {n}) as t
             from generate_series($1::int8, $2::int8) i
         ), d as (
             insert into deliveries
                 (provider, source, hook_id, delivery_id, destination, event, body_sha256, status,
                  claim_token, claimed_at, attempts, created_at, completed_at)
             select 'github', 'filled', '', id, 'store', 'push', sha256(id::bytea), 'completed',
                    gen_random_uuid(), t, 1, t, t + interval '1 second'
             from s
         ), b as (
             insert into seen_bodies (provider, source, body_sha256, hook_id, delivery_id, seen_at)
             select 'github', 'filled', sha256(id::bytea), '', id, t from s
         )
         insert into github_events
             (provider, source, hook_id, delivery_id, event, action, payload, received_at)
         select 'github', 'filled', '', id, 'push', null,
                jsonb_build_object('id', i, 'ref', 'refs/heads/main', 'pad', '{pad}'), t
         from s",
        span = args.days * 86_400,
        n = args.deliveries,
    );
    let mut from = 1;
    while from <= args.deliveries {
        let to = (from + CHUNK - 1).min(args.deliveries);
        env.db.execute(&statement, &[&from, &to]).await?;
        from = to + 1;
    }
    Ok(())
}

/// Each table's rows, dead rows and size.
async fn print_tables(env: &TestEnv, when: &str) -> anyhow::Result<()> {
    let rows = env
        .db
        .query(
            "select case when s.relname like 'github_events%' then 'github_events'
                         else s.relname end as t,
                    sum(s.n_live_tup)::int8, sum(s.n_dead_tup)::int8,
                    sum(pg_total_relation_size(s.relid))::int8,
                    count(*) filter (where s.relname ~ '_p[0-9]{8}$')::int8
             from pg_stat_user_tables s
             join pg_class c on c.oid = s.relid and c.relkind = 'r'
             where s.relname in ('deliveries', 'seen_bodies') or s.relname like 'github_events%'
             group by 1 order by 1",
            &[],
        )
        .await?;
    println!("\n{when}:\n\n| table | live rows | dead rows | size | day partitions |");
    println!("|---|---|---|---|---|");
    for r in rows {
        let size: i64 = r.get(3);
        println!(
            "| {} | {} | {} | {:.2} GiB | {} |",
            r.get::<_, String>(0),
            r.get::<_, i64>(1),
            r.get::<_, i64>(2),
            size as f64 / (1u64 << 30) as f64,
            r.get::<_, i64>(4)
        );
    }
    println!();
    Ok(())
}

/// The latencies of one window of live traffic.
struct Window {
    claim: Histogram<u64>,
    complete: Histogram<u64>,
    /// Deliveries that failed (the first error is printed), such as those
    /// that waited 5 s for a connection of the pool: a stall.
    failed: u64,
}

impl Window {
    fn new() -> Self {
        let h = || Histogram::new_with_bounds(1, 600_000_000, 3).expect("bounds");
        Self {
            claim: h(),
            complete: h(),
            failed: 0,
        }
    }
}

fn ms(h: &Histogram<u64>, q: f64) -> String {
    if h.is_empty() {
        return "–".into();
    }
    format!("{:.1} ms", h.value_at_quantile(q) as f64 / 1000.0)
}

/// Live deliveries at a fixed rate, each recorded in the window open when
/// it started.
struct Live {
    windows: Arc<Mutex<Vec<Window>>>,
    current: Arc<AtomicUsize>,
    errors: Arc<AtomicU64>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Live {
    fn start(pool: deadpool_postgres::Pool, policy: Policy, rate: u32, payload: usize) -> Self {
        let windows = Arc::new(Mutex::new(vec![Window::new()]));
        let current = Arc::new(AtomicUsize::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = {
            let (windows, current, errors) = (windows.clone(), current.clone(), errors.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut inflight = tokio::task::JoinSet::new();
                loop {
                    tokio::select! {
                        _ = stopped.changed() => break,
                        _ = tick.tick() => {}
                    }
                    let pool = pool.clone();
                    let (windows, current, errors) =
                        (windows.clone(), current.clone(), errors.clone());
                    inflight.spawn(async move {
                        let w = current.load(Ordering::Relaxed);
                        match lifecycle(&pool, &policy, payload).await {
                            Ok((claim, complete)) => {
                                let mut all = windows.lock().expect("windows");
                                let _ = all[w].claim.record(claim.as_micros() as u64);
                                let _ = all[w].complete.record(complete.as_micros() as u64);
                            }
                            Err(e) => {
                                windows.lock().expect("windows")[w].failed += 1;
                                if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                                    eprintln!("live delivery failed: {e:#}");
                                }
                            }
                        }
                    });
                    while inflight.try_join_next().is_some() {}
                }
                while inflight.join_next().await.is_some() {}
            })
        };
        Self {
            windows,
            current,
            errors,
            stop,
            task,
        }
    }

    /// Closes the current window and returns it; a new one opens.
    fn window(&self) -> Window {
        let mut all = self.windows.lock().expect("windows");
        all.push(Window::new());
        let closed = self.current.fetch_add(1, Ordering::Relaxed);
        std::mem::replace(&mut all[closed], Window::new())
    }

    async fn stop(self) -> u64 {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.errors.load(Ordering::Relaxed)
    }
}

/// One delivery's store path: the claim (replay guard on), then the
/// worker's fused take, completion and stored event.
async fn lifecycle(
    pool: &deadpool_postgres::Pool,
    policy: &Policy,
    payload: usize,
) -> anyhow::Result<(Duration, Duration)> {
    let id = uuid::Uuid::new_v4();
    let body = format!(
        "{{\"id\":\"{id}\",\"pad\":\"{}\"}}",
        "x".repeat(payload.saturating_sub(60))
    );
    let hook = Hook::new("push", body.clone());
    let mut request = claim_request(&hook, vec![store_leg()]);
    request.guarded = true;
    let client = pool.get().await?;
    claim_and_store(&client, policy, &request, "push", body.into()).await
}

/// The lifecycle as fast as 8 sessions go, for `--rr-secs` without and
/// then with a REPEATABLE READ transaction open: deliveries per minute and
/// the dead rows left.
async fn closed_loops(
    env: &TestEnv,
    pool: &deadpool_postgres::Pool,
    args: &Args,
) -> anyhow::Result<()> {
    println!(
        "| closed loop, 8 sessions | minute | deliveries/s | claim p99 | dead rows in deliveries at its end |"
    );
    println!("|---|---|---|---|---|");
    for held in [false, true] {
        let holder = if held {
            // A connection of its own: the pool's sessions end a
            // transaction left idle (idle_in_transaction_session_timeout).
            let c = hookinbox_tests::connect(&env.database_url).await;
            c.batch_execute(
                "begin isolation level repeatable read; select count(*) from deliveries",
            )
            .await?;
            Some(c)
        } else {
            None
        };
        let label = if held {
            "REPEATABLE READ open"
        } else {
            "none open"
        };
        let secs = if held {
            args.rr_secs
        } else {
            args.baseline_secs.unwrap_or(args.rr_secs)
        };
        let end = Instant::now() + Duration::from_secs(secs);
        let mut minute = 0;
        while Instant::now() < end {
            minute += 1;
            let until = (Instant::now() + Duration::from_secs(60)).min(end);
            let started = Instant::now();
            let done = Arc::new(AtomicU64::new(0));
            let claims = Arc::new(Mutex::new(Window::new()));
            let mut loops = tokio::task::JoinSet::new();
            for _ in 0..8 {
                let (pool, policy, done, claims) =
                    (pool.clone(), env.policy(), done.clone(), claims.clone());
                let payload = args.payload_bytes;
                loops.spawn(async move {
                    while Instant::now() < until {
                        if let Ok((claim, _)) = lifecycle(&pool, &policy, payload).await {
                            done.fetch_add(1, Ordering::Relaxed);
                            let _ = claims
                                .lock()
                                .expect("claims")
                                .claim
                                .record(claim.as_micros() as u64);
                        }
                    }
                });
            }
            while loops.join_next().await.is_some() {}
            let dead: i64 = env
                .db
                .query_one(
                    "select n_dead_tup from pg_stat_user_tables where relname = 'deliveries'",
                    &[],
                )
                .await?
                .get(0);
            let claims = claims.lock().expect("claims");
            println!(
                "| {label} | {minute} | {:.0} | {} | {dead} |",
                done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64(),
                ms(&claims.claim, 0.99)
            );
        }
        if let Some(c) = holder {
            c.batch_execute("commit").await?;
        }
    }
    println!();
    Ok(())
}
