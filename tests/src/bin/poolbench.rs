//! What a pooled Postgres connection costs per checkout and statement, in
//! the ways hookinbox can run: `fast` (no check, prepared statements),
//! `checked` (hookinbox's pool: connections idle over a second are checked
//! before use; busy ones are not), `always` (every checkout checked with a
//! round trip, deadpool's `Verified`), and `unnamed` (hookinbox's pool with
//! the statements a transaction pooler needs).
//!
//!   poolbench [ITERATIONS]     (default 20000; DATABASE_URL, default local)
//!
//! Prints µs per checkout plus one keyed `select` like a take's, for each.

use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use hookinbox::postgres::{PoolOptions, pool_with, sql};

const STATEMENT: &str = "select $1::text = $2::text and $3::int4 > 0";

async fn run(pool: &Pool, n: u32) -> anyhow::Result<Duration> {
    let (a, b, c) = ("github".to_owned(), "github".to_owned(), 1i32);
    let started = Instant::now();
    for _ in 0..n {
        let client = pool.get().await?;
        sql::query_one(&client, STATEMENT, &[&a, &b, &c]).await?;
    }
    Ok(started.elapsed())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let checked = pool_with(&url, &PoolOptions::new(4))?;
    let verified = Pool::builder(Manager::from_config(
        hookinbox::postgres::parse_url(&url)?,
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Verified,
        },
    ))
    .max_size(4)
    .runtime(Runtime::Tokio1)
    .build()?;
    let fast = Pool::builder(Manager::from_config(
        hookinbox::postgres::parse_url(&url)?,
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    ))
    .max_size(4)
    .runtime(Runtime::Tokio1)
    .build()?;
    let mut results = Vec::new();
    for (name, pool) in [
        ("fast", &fast),
        ("checked", &checked),
        ("always", &verified),
    ] {
        run(pool, 500).await?; // warm: connections made, statements prepared
        results.push((name, run(pool, n).await?));
    }
    // Unnamed statements are a process-wide switch: measured last.
    sql::use_unnamed_statements(pool_with(&url, &PoolOptions::new(1))?);
    run(&checked, 500).await?;
    results.push(("unnamed", run(&checked, n).await?));
    let base = results[0].1.as_secs_f64();
    for (name, took) in results {
        println!(
            "{name:8} {:7.1} µs per checkout and statement ({:.2} × fast), {n} in a row",
            took.as_secs_f64() * 1e6 / f64::from(n),
            took.as_secs_f64() / base
        );
    }
    Ok(())
}
