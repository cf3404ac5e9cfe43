//! `fairness`: installation A floods a slow destination while installation
//! B sends a few deliveries a second; B's end-to-end latency (send to the
//! receiver's first request) alone, beside A's flood with fairness on,
//! beside it with fairness off, and beside the same flood sent to a
//! destination of A's own (a source apart, sharing with B only the
//! processes and the machine: a reference for what B sees with no
//! destination shared), from one run of this tool.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use futures::StreamExt;
use hdrhistogram::Histogram;

use super::{Mode, Sink, Stack, about, forward_source, ms, one_forward};

/// What one run is asked to do.
#[derive(Clone, Copy)]
pub(super) struct Plan {
    /// A's deliveries (0: B alone).
    pub(super) flood: usize,
    /// A's deliveries per second.
    pub(super) flood_rate: u32,
    /// B's deliveries.
    pub(super) other: usize,
    /// B's deliveries per second.
    pub(super) other_rate: u32,
    /// How long the receiver takes to answer.
    pub(super) slow_ms: u64,
    /// The destination's `concurrency`.
    pub(super) concurrency: u16,
    /// Skip the run with fairness off.
    pub(super) skip_off: bool,
    /// Also run beside A's flood to a destination of its own with
    /// fairness off there.
    pub(super) apart_off: bool,
}

/// Where A's flood goes, beside B's deliveries.
#[derive(Clone, Copy)]
enum Layout {
    /// One destination for both, with fairness on or off.
    Shared { fairness: bool },
    /// A's source and destination apart from B's: nothing of the
    /// destination is shared, only ingest, the worker, Postgres, RabbitMQ
    /// and the machine's cores; fairness on or off at A's destination (off:
    /// A's legs wait in its queue, not held in Postgres).
    Apart { fairness: bool },
}

/// What one run saw of B, and of A meanwhile.
struct Run {
    b: Histogram<u64>,
    b_arrived: usize,
    b_twice: usize,
    a_sent: usize,
    a_arrived_meanwhile: usize,
    yielded: i64,
    /// B's slowest deliveries: end-to-end, and of it the part from the
    /// send to the claim's transaction (ingest) and from there to the
    /// receipt (the broker, the worker and the request), in ms; and how
    /// many other requests the receiver was answering as it came.
    slowest: Vec<(f64, f64, f64, usize, usize)>,
    /// The warm-up's deliveries of B, end-to-end, ms, in the order sent.
    warm: Vec<f64>,
    /// The most of A's requests the receiver answered at once.
    a_peak: usize,
    /// How many of A's requests came while the receiver was answering
    /// `concurrency` of A's (so A ran on the worker's spare slot), of how
    /// many of A's came.
    a_past_concurrency: (usize, usize),
}

/// Sends A's flood at its rate (in the background) and B's deliveries at
/// theirs; when B's have all arrived, notes what arrived of A and stops.
async fn run(plan: Plan, layout: Layout) -> anyhow::Result<Run> {
    let sink = Sink::start(Mode::Slow(plan.slow_ms)).await;
    let shape = |fairness: bool| {
        format!(
            "concurrency = {}\ntimeout_ms = 30000\nbreaker = false\nfairness = {fairness}\n",
            plan.concurrency
        )
    };
    let (config, b_source) = match layout {
        Layout::Shared { fairness } => (one_forward(&sink, &shape(fairness)), "default"),
        Layout::Apart { fairness } => (
            one_forward(&sink, &shape(fairness)) + &forward_source("other", &sink, &shape(true)),
            "other",
        ),
    };
    let stack = Arc::new(Stack::start(&config, &[]).await?);
    // Every run starts on a warm stack: a fresh one's first deliveries
    // open connections and prepare statements, tens of ms that only the
    // run of B alone would otherwise count (the flood warms the others).
    let warm_sent = warm_up(&stack, &sink, b_source).await?;
    let flood = tokio::spawn({
        let stack = stack.clone();
        async move {
            let period = Duration::from_secs(1) / plan.flood_rate.max(1);
            let start = tokio::time::Instant::now();
            futures::stream::iter(0..plan.flood)
                .map(|i| {
                    let stack = stack.clone();
                    async move {
                        tokio::time::sleep_until(start + period * i as u32).await;
                        let hook = about("default", "push", "none", "acme/flood", 1);
                        matches!(stack.send(&hook).await, Ok(202))
                    }
                })
                .buffer_unordered(64)
                .filter(|ok| std::future::ready(*ok))
                .count()
                .await
        }
    });
    // B starts once A's backlog has begun to build.
    if plan.flood > 0 {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let period = Duration::from_secs(1) / plan.other_rate.max(1);
    let start = tokio::time::Instant::now();
    let mut sent_at: HashMap<String, Sent> = HashMap::new();
    for i in 0..plan.other {
        tokio::time::sleep_until(start + period * i as u32).await;
        let hook = about(b_source, "push", "none", "acme/other", 2);
        let sent = Instant::now();
        let wall = std::time::SystemTime::now();
        // No answer (a kept-alive connection closed as the request went
        // out): sent again, as GitHub would; the claim keeps it one.
        let status = match stack.send(&hook).await {
            Ok(status) => status,
            Err(_) => stack.send(&hook).await?,
        };
        // A resend that finds the first one claimed is answered 200.
        if status == 202 || status == 200 {
            sent_at.insert(
                hook.id().to_owned(),
                Sent {
                    at: sent,
                    wall,
                    place: i,
                },
            );
        }
    }
    let arrived = |seen: &[super::Seen]| {
        seen.iter()
            .filter(|s| sent_at.contains_key(&s.delivery))
            .map(|s| s.delivery.clone())
            .collect::<std::collections::HashSet<_>>()
            .len()
    };
    super::wait_for(Duration::from_secs(600), || async {
        arrived(&sink.seen()) >= sent_at.len()
    })
    .await;
    let seen = sink.seen();
    let mut b = Histogram::<u64>::new(3)?;
    let mut first: HashMap<&str, Instant> = HashMap::new();
    let mut b_requests = 0usize;
    for s in &seen {
        if sent_at.contains_key(&s.delivery) {
            b_requests += 1;
            first.entry(s.delivery.as_str()).or_insert(s.at);
        }
    }
    for (id, at) in &first {
        b.record(at.saturating_duration_since(sent_at[*id].at).as_micros() as u64)?;
    }
    let warm: Vec<f64> = warm_sent
        .iter()
        .map(|(id, sent)| {
            seen.iter()
                .find(|s| &s.delivery == id)
                .map_or(f64::NAN, |s| {
                    s.at.saturating_duration_since(*sent).as_secs_f64() * 1000.0
                })
        })
        .collect();
    let mut a_at: Vec<Instant> = seen
        .iter()
        .filter(|s| {
            !sent_at.contains_key(&s.delivery) && !warm_sent.iter().any(|(id, _)| *id == s.delivery)
        })
        .map(|s| s.at)
        .collect();
    a_at.sort();
    let a_arrived_meanwhile = a_at.len();
    // What the receiver was answering at once, from the arrivals alone:
    // each request is answered `slow_ms` after it came.
    let answer = Duration::from_millis(plan.slow_ms);
    let mut all_at: Vec<Instant> = seen.iter().map(|s| s.at).collect();
    all_at.sort();
    let a_beside: Vec<usize> = a_at
        .iter()
        .map(|at| answering(&a_at, *at, answer))
        .collect();
    let a_peak = a_beside.iter().map(|n| n + 1).max().unwrap_or(0);
    let a_past_concurrency = (
        a_beside
            .iter()
            .filter(|n| **n >= usize::from(plan.concurrency))
            .count(),
        a_at.len(),
    );
    // The slowest five, split at the claim's transaction (Postgres's
    // clock is this machine's).
    let mut by_time: Vec<(&str, Duration)> = first
        .iter()
        .map(|(id, at)| (*id, at.saturating_duration_since(sent_at[*id].at)))
        .collect();
    by_time.sort_by_key(|(_, d)| std::cmp::Reverse(*d));
    let mut slowest = Vec::new();
    for (id, total) in by_time.into_iter().take(5) {
        let claimed = stack
            .env
            .db
            .query_one(
                "select extract(epoch from claimed_at)::float8 from deliveries where delivery_id = $1",
                &[&id],
            )
            .await
            .map(|r| r.get::<_, f64>(0))
            .unwrap_or(f64::NAN);
        let sent = sent_at[id]
            .wall
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(f64::NAN);
        let to_claim = (claimed - sent) * 1000.0;
        let total = total.as_secs_f64() * 1000.0;
        let beside = answering(&all_at, first[id], answer);
        slowest.push((total, to_claim, total - to_claim, beside, sent_at[id].place));
    }
    let yielded = stack
        .count("select count(*) from deliveries where last_error_class = 'fair'")
        .await;
    flood.abort();
    let _ = flood.await;
    let a_sent = plan.flood;
    let Ok(stack) = Arc::try_unwrap(stack) else {
        bail!("the stack is still shared");
    };
    stack.stop().await;
    Ok(Run {
        b,
        b_arrived: first.len(),
        b_twice: b_requests - first.len(),
        a_sent,
        a_arrived_meanwhile,
        yielded,
        slowest,
        warm,
        a_peak,
        a_past_concurrency,
    })
}

/// B's deliveries sent before a run, each once the one before it arrived,
/// not counted in it: returns each one's id and send instant.
async fn warm_up(
    stack: &Stack,
    sink: &Sink,
    b_source: &str,
) -> anyhow::Result<Vec<(String, Instant)>> {
    let mut sent = Vec::new();
    for _ in 0..WARM_UP {
        let hook = about(b_source, "push", "none", "acme/other", 2);
        let at = Instant::now();
        let status = stack.send(&hook).await?;
        if status != 202 {
            bail!("a warm-up delivery was answered {status}");
        }
        let id = hook.id().to_owned();
        let arrived = super::wait_for(Duration::from_secs(60), || async {
            sink.seen().iter().any(|s| s.delivery == id)
        })
        .await;
        if !arrived {
            bail!("a warm-up delivery did not arrive within 60 s");
        }
        sent.push((id, at));
    }
    Ok(sent)
}

/// One of B's sends: when (the instant, and the wall clock beside
/// Postgres's `claimed_at`: derived later from the instant, it drifted by
/// milliseconds), and its place among B's sends.
struct Sent {
    at: Instant,
    wall: std::time::SystemTime,
    place: usize,
}

/// B's deliveries sent to warm the stack before each run.
const WARM_UP: usize = 5;

/// How many requests of `arrivals` (sorted) the receiver was still
/// answering when one came at `at`: those that came within `answer`
/// before it (`at` itself not counted).
fn answering(arrivals: &[Instant], at: Instant, answer: Duration) -> usize {
    let before = arrivals.partition_point(|t| *t < at);
    let since = arrivals.partition_point(|t| *t + answer <= at);
    before - since.min(before)
}

/// B alone, B beside A's flood with fairness on, with it off, and
/// beside A's flood to a destination of its own.
pub(super) async fn fairness(plan: Plan) -> anyhow::Result<()> {
    let shared = Layout::Shared { fairness: true };
    let alone = run(Plan { flood: 0, ..plan }, shared).await?;
    let on = run(plan, shared).await?;
    let apart = run(plan, Layout::Apart { fairness: true }).await?;
    let apart_off = if plan.apart_off {
        Some(run(plan, Layout::Apart { fairness: false }).await?)
    } else {
        None
    };
    let off = if plan.skip_off {
        None
    } else {
        Some(run(plan, Layout::Shared { fairness: false }).await?)
    };
    let p = |h: &Histogram<u64>, q: f64| Duration::from_micros(h.value_at_quantile(q));
    let base = p(&alone.b, 0.99).as_secs_f64().max(1e-6);
    let (ingest_pool, worker_pool) = super::pools();
    println!(
        "A floods {} deliveries at {}/s to a destination answering in {} ms, {} at once; B sends {} at {}/s. Pools: ingest {ingest_pool}, worker {worker_pool}.\n",
        plan.flood, plan.flood_rate, plan.slow_ms, plan.concurrency, plan.other, plan.other_rate
    );
    println!(
        "| B's end-to-end (send to receipt), ms | p50 | p99 | max | p99 / alone | B arrived (twice) | A's legs arrived meanwhile | A's legs waiting for their turn at the end |\n|---|---|---|---|---|---|---|---|"
    );
    let runs = [
        ("B alone", Some(&alone)),
        ("beside A's flood, fairness on", Some(&on)),
        ("beside A's flood to a destination of its own", Some(&apart)),
        (
            "beside A's flood to a destination of its own, fairness off there",
            apart_off.as_ref(),
        ),
        ("beside A's flood, fairness off", off.as_ref()),
    ];
    let runs: Vec<(&str, &Run)> = runs
        .iter()
        .filter_map(|(n, r)| r.map(|r| (*n, r)))
        .collect();
    for (name, r) in &runs {
        println!(
            "| {name} | {} | {} | {} | {:.2} | {} ({}) | {} of {} | {} |",
            ms(p(&r.b, 0.5)),
            ms(p(&r.b, 0.99)),
            ms(Duration::from_micros(r.b.max())),
            p(&r.b, 0.99).as_secs_f64() / base,
            r.b_arrived,
            r.b_twice,
            r.a_arrived_meanwhile,
            r.a_sent,
            r.yielded,
        );
    }
    println!(
        "\nB's slowest five, ms: #its place in B's sends, end-to-end = send to claim (ingest) + claim to receipt [requests the receiver was answering as it came]; the most of A's the receiver answered at once; the warm-up's {WARM_UP} of B before the run"
    );
    for (name, r) in &runs {
        let parts: Vec<String> = r
            .slowest
            .iter()
            .map(|(t, a, b, n, i)| {
                // A release or a reclaim sets `claimed_at` again: past the
                // receipt, it no longer tells where the time went.
                if *a > *t {
                    format!("#{i} {t:.1} (claimed again {a:.1} after the send) [{n}]")
                } else {
                    format!("#{i} {t:.1} = {a:.1} + {b:.1} [{n}]")
                }
            })
            .collect();
        println!(
            "- {name}: {}; most of A's at once {} ({} of A's {} requests came beside {} of A's); warm-up {}",
            parts.join("; "),
            r.a_peak,
            r.a_past_concurrency.0,
            r.a_past_concurrency.1,
            plan.concurrency,
            r.warm
                .iter()
                .map(|w| format!("{w:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if runs
        .iter()
        .map(|(_, r)| r)
        .any(|r| r.b_arrived < plan.other || r.b_twice > 0)
    {
        bail!("some of B's deliveries did not arrive, or arrived twice");
    }
    Ok(())
}
