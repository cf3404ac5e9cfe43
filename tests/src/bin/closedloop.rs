//! Closed-loop load: `--connections` senders, each sending its next
//! request as soon as the last is answered, for `--duration` seconds. The
//! same signed real payloads as the load generator (70 % `push`, 30 %
//! `pull_request`), each request a new delivery id with a body of its own
//! (GitHub never sends one body under two ids). Prints the requests
//! answered per second, by status, and the latency percentiles. The
//! benchmark runs it against ingest and against octokit's receiver
//! (B_octokit), alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use hookinbox_tests::{fixtures, sign};

/// Closed-loop load against a webhook receiver.
#[derive(Parser)]
struct Args {
    /// Webhook URL.
    #[arg(long)]
    url: String,
    /// Webhook secret.
    #[arg(long, env = "HOOKINBOX_GITHUB_SECRET")]
    secret: String,
    /// Senders at once, each on its own keep-alive connection.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    connections: u16,
    /// Seconds to send.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    duration: u64,
}

/// What one sender saw.
struct Seen {
    statuses: std::collections::BTreeMap<String, u64>,
    latency: Histogram<u64>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mix = Arc::new(fixtures::load_mix());
    let until = Instant::now() + Duration::from_secs(args.duration);
    let started = Instant::now();
    let mut senders = tokio::task::JoinSet::new();
    for n in 0..args.connections {
        let (mix, url, secret) = (mix.clone(), args.url.clone(), args.secret.clone());
        senders.spawn(async move {
            let http = reqwest::Client::builder()
                .pool_max_idle_per_host(1)
                .build()?;
            let mut seen = Seen {
                statuses: Default::default(),
                latency: Histogram::new_with_bounds(1, 60_000_000, 3)?,
            };
            let mut i = usize::from(n);
            while Instant::now() < until {
                let (event, body) = &mix[i % mix.len()];
                i += 1;
                let id = uuid::Uuid::new_v4().to_string();
                let body = fixtures::with_nonce(body, &id);
                let signature = sign(&secret, &body);
                let sent = Instant::now();
                let answer = fixtures::delivery_request(&http, &url, event, &id, &signature, body)
                    .send()
                    .await;
                let status = match answer {
                    Ok(r) => {
                        let status = r.status().as_u16().to_string();
                        let _ = r.bytes().await;
                        status
                    }
                    Err(_) => "error".to_owned(),
                };
                let _ = seen
                    .latency
                    .record((sent.elapsed().as_micros() as u64).max(1));
                *seen.statuses.entry(status).or_default() += 1;
            }
            anyhow::Ok(seen)
        });
    }
    let mut statuses = std::collections::BTreeMap::<String, u64>::new();
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    while let Some(seen) = senders.join_next().await {
        let seen = seen??;
        for (status, n) in seen.statuses {
            *statuses.entry(status).or_default() += n;
        }
        latency.add(&seen.latency)?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let ok: u64 = statuses
        .iter()
        .filter(|(s, _)| s.starts_with('2'))
        .map(|(_, n)| n)
        .sum();
    let all: u64 = statuses.values().sum();
    println!(
        "closed loop, {} connections, {:.0} s: {:.0} requests/s answered 2xx ({ok} of {all}; {}); latency p50 {:.2} ms, p99 {:.2} ms",
        args.connections,
        elapsed,
        ok as f64 / elapsed,
        statuses
            .iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        latency.value_at_quantile(0.5) as f64 / 1000.0,
        latency.value_at_quantile(0.99) as f64 / 1000.0,
    );
    Ok(())
}
