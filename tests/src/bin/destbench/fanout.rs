//! Fan-out's cost: one source forwarding every delivery to N `forward`
//! destinations that share one local receiver. For each N, a costed run at
//! a fixed rate (CPU µs per leg of ingest, the worker, Postgres and
//! RabbitMQ, from `/proc`), then S: the highest delivery rate at which
//! every leg of a step completes within the step plus a small lag.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::{Mode, Sink, Stack, about, secs, wait_for};

/// CPU time of processes, in clock ticks (user + system, `/proc/PID/stat`
/// fields 14 and 15). A process that is gone counts 0.
fn ticks(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| {
            // The command name (field 2) may hold spaces: count from its ')'.
            let rest = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let user: u64 = fields.get(11)?.parse().ok()?;
            let system: u64 = fields.get(12)?.parse().ok()?;
            Some(user + system)
        })
        .sum()
}

/// The processes whose command name is `name` (`postgres`, `beam.smp`).
fn named(name: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim() == name)
                .unwrap_or(false)
        })
        .collect()
}

/// Clock ticks per second (`CLK_TCK`; 100 on Linux).
const HZ: f64 = 100.0;

/// CPU ticks of each process of interest at one moment.
#[derive(Clone, Copy)]
struct Cpu {
    ingest: u64,
    worker: u64,
    postgres: u64,
    rabbitmq: u64,
    me: u64,
}

impl Cpu {
    fn now(stack: &Stack) -> Self {
        let pid = |s: &super::Spawned| s.child.id().into_iter().collect::<Vec<_>>();
        Self {
            ingest: ticks(&pid(&stack.ingest)),
            worker: ticks(&pid(&stack.worker)),
            postgres: ticks(&named("postgres")),
            rabbitmq: ticks(&named("beam.smp")),
            me: ticks(&[std::process::id()]),
        }
    }
}

/// The config: `n` forward destinations `d0`…, all to `url`.
fn config(n: usize, url: &str) -> String {
    let mut config = format!(
        "[[sources]]\nname = \"default\"\nsecrets = [\"{}\"]\n",
        hookinbox_tests::SECRET
    );
    for i in 0..n {
        config.push_str(&format!(
            "\n[[sources.destinations]]\nname = \"d{i}\"\nkind = \"forward\"\nurl = \"{url}\"\n"
        ));
    }
    config
}

/// Sends at `rate` for `length`, each request on a task of its own (a
/// request that waits does not hold back the next); returns how many
/// ingest accepted (202).
pub(super) async fn send_at(
    stack: &Arc<Stack>,
    rate: u32,
    length: Duration,
) -> anyhow::Result<usize> {
    let period = Duration::from_secs(1) / rate;
    let total = (length.as_secs_f64() * f64::from(rate)) as usize;
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(total);
    for i in 0..total {
        tokio::time::sleep_until(start + period * i as u32).await;
        let stack = stack.clone();
        tasks.push(tokio::spawn(async move {
            let hook = about("default", "push", "none", "acme/widgets", 1);
            stack.send(&hook).await
        }));
    }
    let mut accepted = 0;
    for task in tasks {
        if task.await?? == 202 {
            accepted += 1;
        }
    }
    Ok(accepted)
}

/// Legs completed so far.
async fn completed(stack: &Stack) -> i64 {
    stack
        .count("select count(*) from deliveries where status = 'completed'")
        .await
}

/// One N: the costed run, then the search for S. Returns the table row.
async fn measure(n: usize, rate: u32, step: Duration, lag: Duration) -> anyhow::Result<String> {
    let sink = Sink::start(Mode::Ok).await;
    let stack = Arc::new(Stack::start(&config(n, &sink.url()), &[]).await?);

    // The costed run: from the first send until every leg completed.
    let before = Cpu::now(&stack);
    let began = Instant::now();
    let accepted = send_at(&stack, rate, step).await?;
    let legs = (accepted * n) as i64;
    let done = wait_for(Duration::from_secs(600), || async {
        completed(&stack).await >= legs
    })
    .await;
    if !done {
        bail!("{n} destinations: legs did not complete at {rate}/s");
    }
    let took = began.elapsed();
    let after = Cpu::now(&stack);
    let per_leg = |a: u64, b: u64| (b.saturating_sub(a)) as f64 * 1e6 / HZ / legs.max(1) as f64;
    let cost = [
        per_leg(before.ingest, after.ingest),
        per_leg(before.worker, after.worker),
        per_leg(before.postgres, after.postgres),
        per_leg(before.rabbitmq, after.rabbitmq),
        per_leg(before.me, after.me),
    ];
    let (keys, duplicates) = sink.duplicates();
    if duplicates > 0 || keys < legs as usize {
        bail!("{n} destinations: {keys} keys taken of {legs}, {duplicates} twice");
    }

    // S: double the rate while a step's legs keep up, then halve the gap
    // between the last rate that held and the first that did not.
    let mut held = 0u32;
    let mut failed: Option<u32> = None;
    let mut try_rate = rate.max(50);
    for _ in 0..8 {
        let target = completed(&stack).await;
        let accepted = send_at(&stack, try_rate, step).await?;
        let goal = target + (accepted * n) as i64;
        let kept_up = wait_for(lag, || async { completed(&stack).await >= goal }).await;
        // Whatever it did, let the backlog drain before the next step.
        let drained = wait_for(Duration::from_secs(600), || async {
            completed(&stack).await >= goal
        })
        .await;
        if !drained {
            bail!("{n} destinations: a step's legs did not drain");
        }
        if kept_up {
            held = held.max(try_rate);
        } else {
            failed = Some(failed.map_or(try_rate, |f| f.min(try_rate)));
        }
        try_rate = match failed {
            None => try_rate * 2,
            Some(f) if f - held > f / 10 => held + (f - held) / 2,
            Some(_) => break,
        };
    }
    let stack = Arc::try_unwrap(stack).map_err(|_| anyhow::anyhow!("stack still shared"))?;
    stack.stop().await;
    Ok(format!(
        "| {n} | {rate} | {legs} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {held} | {} |",
        secs(took),
        cost[0],
        cost[1],
        cost[2],
        cost[3],
        cost[0] + cost[1] + cost[2] + cost[3],
        cost[4],
        held as usize * n,
    ))
}

/// Every N in `counts`, one table.
pub(super) async fn run(
    counts: &[usize],
    rate: u32,
    step: Duration,
    lag: Duration,
) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for &n in counts {
        rows.push(
            measure(n, rate, step, lag)
                .await
                .with_context(|| format!("fan-out to {n}"))?,
        );
    }
    println!(
        "CPU µs per leg, {} s at {rate} deliveries/s; S: the highest rate whose legs all completed within {} s of a {} s step",
        secs(step),
        secs(lag),
        secs(step)
    );
    println!(
        "| destinations | rate /s | legs | run (s) | ingest | worker | Postgres | RabbitMQ | stack | receiver and sender | S (deliveries/s) | S (legs/s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
    Ok(())
}
