//! The record's size with real payloads (`cargo run --release -p
//! hookinbox-tests --bin recordsize`):
//! the repository's own payloads and every payload of the corpus
//! (`HOOKINBOX_GITHUB_FIXTURES`, when set) claimed `--rounds` times under new ids, each made unique, with
//! the headers ingest keeps and the replay guard on, then taken and
//! completed by the `store` handler, through the library as ingest and
//! the worker do. It prints the WAL each delivery wrote and each table's
//! size per delivery and per million, as written (completion's dead rows
//! included) and after a `VACUUM FULL`.

use anyhow::Context as _;
use clap::Parser;
use hookinbox::deliveries::Encoded;
use hookinbox_tests::{Hook, TestEnv, claim_and_store, claim_request, fixtures, store_leg};

#[derive(Parser)]
#[command(about = "Bytes written per delivery, and table sizes per million, with real payloads")]
struct Args {
    /// How many times each payload is delivered.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
}

/// The tables of the record and of the `store` handler's effect.
const TABLES: [&str; 4] = ["bodies", "deliveries", "seen_bodies", "github_events"];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let corpus = fixtures::all();
    let env = TestEnv::new().await;
    let pool = env.pool(2);
    let client = pool.get().await.context("client")?;
    let policy = env.policy();
    let wal_start = wal_lsn(&env).await?;
    let mut delivered = 0u64;
    let mut raw_bytes = 0u64;
    for round in 0..args.rounds {
        for (i, fixture) in corpus.iter().enumerate() {
            let body = fixtures::with_nonce(&fixture.body, &format!("r{round}i{i}"));
            raw_bytes += body.len() as u64;
            let hook = Hook::new(&fixture.event, body);
            let mut request = claim_request(&hook, vec![store_leg()]);
            request.guarded = true;
            request.body = Encoded::of(&hookinbox::Body {
                content_type: "application/json".to_owned(),
                github_headers: kept_headers(&hook),
                bytes: bytes::Bytes::copy_from_slice(&hook.body),
            });
            let payload = bytes::Bytes::copy_from_slice(&hook.body);
            claim_and_store(&client, &policy, &request, &fixture.event, payload).await?;
            delivered += 1;
        }
    }
    let wal = wal_lsn(&env).await? - wal_start;
    println!(
        "# The record with real payloads: {} payloads × {} rounds = {delivered} deliveries, \
         {:.0} bytes a body on average as received\n",
        corpus.len(),
        args.rounds,
        raw_bytes as f64 / delivered as f64,
    );
    println!(
        "- WAL: {:.0} bytes a delivery (claim, take and completion, stored event)",
        wal / delivered as f64
    );
    let as_written = sizes(&env).await?;
    env.db
        .batch_execute(&format!("vacuum (full, analyze) {}", TABLES.join(", ")))
        .await?;
    let vacuumed = sizes(&env).await?;
    println!(
        "\n| table | bytes a delivery, as written | after VACUUM FULL | GB per million, as written |"
    );
    println!("|---|---|---|---|");
    for ((table, written), (_, full)) in as_written.iter().zip(&vacuumed) {
        println!(
            "| {table} | {:.0} | {:.0} | {:.2} |",
            *written as f64 / delivered as f64,
            *full as f64 / delivered as f64,
            *written as f64 / delivered as f64 * 1e6 / 1e9
        );
    }
    env.cleanup().await;
    Ok(())
}

/// The headers ingest keeps with a body (`X-GitHub-*` and `User-Agent`),
/// as GitHub sends them.
fn kept_headers(hook: &Hook) -> Vec<(String, String)> {
    let mut headers = vec![
        (
            "user-agent".to_owned(),
            "GitHub-Hookshot/8c4e6b2".to_owned(),
        ),
        ("x-github-delivery".to_owned(), hook.id().to_owned()),
        ("x-github-hook-id".to_owned(), "123456".to_owned()),
        (
            "x-github-hook-installation-target-id".to_owned(),
            "79929171".to_owned(),
        ),
        (
            "x-github-hook-installation-target-type".to_owned(),
            "repository".to_owned(),
        ),
    ];
    if let Some(event) = &hook.event {
        headers.push(("x-github-event".to_owned(), event.clone()));
    }
    headers
}

/// Postgres's WAL insert position, in bytes: the whole server's, so the
/// figure holds on a server nothing else writes to.
async fn wal_lsn(env: &TestEnv) -> anyhow::Result<f64> {
    let row = env
        .db
        .query_one(
            "select pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::float8",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// Each of [`TABLES`]'s size on disk (every partition, index and TOAST
/// table).
async fn sizes(env: &TestEnv) -> anyhow::Result<Vec<(&'static str, i64)>> {
    let mut out = Vec::new();
    for table in TABLES {
        let row = env
            .db
            .query_one(
                "select coalesce(sum(pg_total_relation_size(c.oid)), 0)::int8
                 from pg_class c
                 where (c.oid = $1::text::regclass and c.relkind = 'r')
                    or c.oid in (select relid from pg_partition_tree($1::text::regclass))",
                &[&table],
            )
            .await?;
        out.push((table, row.get(0)));
    }
    Ok(out)
}
