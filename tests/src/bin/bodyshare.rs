//! What each half of a delivery costs the broker and Postgres, run one
//! half at a time at a fixed rate, so that `scripts/bench.sh --body-share`
//! can read the CPU it costs the broker or Postgres from `/proc` (the
//! benchmark's "limit": two cores over the two):
//!
//! - `mq`: hookinbox's own publisher (confirms, window 256) publishes real
//!   jobs (a leg's key, as ingest sends it: no body) into a work queue of
//!   hookinbox's topology, and a consumer acks each (prefetch 64), as the
//!   worker does.
//! - `pg`: the Postgres statements of the same deliveries, in batches of
//!   `--batch` (what group commit forms): the claim with its body
//!   (`deliveries::claim_batch`), the read of the bodies the one-statement
//!   path makes (`deliveries::bodies::fetch_batch`), and the completion
//!   that takes and stores (`deliveries::complete_batch`), as a `store`
//!   job does.
//!
//! Until the claim wrote bodies the broker carried them (the design this
//! tool weighed them against, with `parked_bodies` then); the figures of
//! that comparison are in docs/benchmarks.md.
//!
//! Prints what it did; the CPU is read by the caller.

use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use futures::StreamExt;
use hookinbox::broker::{Publisher, Topology};
use hookinbox::deliveries::{self, ClaimRequest, Completing, Policy, StoredEvent};
use hookinbox::job::Envelope;
use hookinbox::key::{DeliveryId, DeliveryKey, EventName, HookId, SourceName};
use hookinbox_tests::fixtures;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use sha2::{Digest, Sha256};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Phase {
    Mq,
    Pg,
}

/// One half of one design, at a fixed rate.
#[derive(Parser)]
struct Args {
    #[arg(value_enum)]
    phase: Phase,
    /// Deliveries per second.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..))]
    rate: u32,
    /// Seconds.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    seconds: u64,
    /// Deliveries per statement in the Postgres phases.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// A migrated database (Postgres phases).
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// The broker (broker phases).
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    amqp_url: String,
    /// Broker phases: ack every n-th message with `multiple` (1: each on
    /// its own, as the worker does).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    ack_every: u64,
    /// Queue prefix (broker phases).
    #[arg(long, env = "HOOKINBOX_QUEUE_PREFIX", default_value = "bodyshare")]
    queue_prefix: String,
}

/// The `i`-th delivery: a key of its own and a body of its own.
fn delivery(
    i: u64,
    mix: &[(&'static str, Vec<u8>)],
    run: &str,
) -> (DeliveryKey, &'static str, Bytes) {
    let (event, body) = &mix[i as usize % mix.len()];
    let id = format!("{run}-{i}");
    let key = DeliveryKey::github(
        SourceName::default_source(),
        HookId::parse(Some(b"777")).expect("hook id"),
        DeliveryId::parse(id.as_bytes()).expect("delivery id"),
    );
    (key, event, Bytes::from(fixtures::with_nonce(body, &id)))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mix = fixtures::load_mix();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let total = u64::from(args.rate) * args.seconds;
    let started = Instant::now();
    match args.phase {
        Phase::Mq => broker(&args, &mix, &run, total).await?,
        Phase::Pg => postgres(&args, &mix, &run, total).await?,
    }
    println!(
        "{} deliveries in {:.1} s",
        total,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn broker(
    args: &Args,
    mix: &[(&'static str, Vec<u8>)],
    run: &str,
    total: u64,
) -> anyhow::Result<()> {
    let topology = Topology::new(&args.queue_prefix);
    let publisher = std::sync::Arc::new(Publisher::new(
        &args.amqp_url,
        "bodyshare",
        topology.clone(),
        Duration::from_secs(5),
    ));
    publisher.connect().await?;
    let (connection, channel) = hookinbox::broker::open_channel(
        &args.amqp_url,
        "bodyshare-consumer",
        Duration::from_secs(5),
        &topology,
    )
    .await?;
    topology
        .declare_leg_queue(
            &channel,
            &hookinbox::SourceName::default_source(),
            &hookinbox_tests::store_destination(),
        )
        .await?;
    channel.basic_qos(64, BasicQosOptions::default()).await?;
    let mut consumer = channel
        .basic_consume(
            &topology.leg_queue(
                &hookinbox::SourceName::default_source(),
                &hookinbox_tests::store_destination(),
            ),
            "",
            BasicConsumeOptions::default(),
            Default::default(),
        )
        .await?;
    let every = args.ack_every;
    let consuming = tokio::spawn(async move {
        let mut acked = 0u64;
        while acked < total {
            let Some(Ok(delivery)) = consumer.next().await else {
                break;
            };
            acked += 1;
            if acked.is_multiple_of(every) || acked == total {
                delivery
                    .acker
                    .ack(BasicAckOptions {
                        multiple: every > 1,
                    })
                    .await?;
            }
        }
        anyhow::Ok(acked)
    });
    let period = Duration::from_secs(1) / args.rate;
    let start = tokio::time::Instant::now();
    let mut publishes = tokio::task::JoinSet::new();
    for i in 0..total {
        tokio::time::sleep_until(start + period * i as u32).await;
        let (key, event, _) = delivery(i, mix, run);
        let job = Envelope {
            trace: Default::default(),
            key: key.leg(hookinbox_tests::store_destination()),
            event: EventName::parse(event.as_bytes()).expect("event"),
            action: Some("opened".to_owned()),
            token: hookinbox::key::ClaimToken::new(),
            attempts: Some(0),
            carried: None,
            copy: None,
        };
        let publisher = publisher.clone();
        publishes.spawn(async move { publisher.publish(&job).await });
        while let Some(done) = publishes.try_join_next() {
            done??;
        }
    }
    while let Some(done) = publishes.join_next().await {
        done??;
    }
    let acked = consuming.await??;
    anyhow::ensure!(acked == total, "consumed {acked} of {total}");
    let leg_queue = topology.leg_queue(
        &hookinbox::SourceName::default_source(),
        &hookinbox_tests::store_destination(),
    );
    for q in [
        topology.work_queue(),
        leg_queue,
        topology.dead_letter_queue(),
    ] {
        let _ = channel.queue_delete(&q, Default::default()).await;
    }
    let _ = connection.close(200, "done").await;
    publisher.close().await;
    Ok(())
}

async fn postgres(
    args: &Args,
    mix: &[(&'static str, Vec<u8>)],
    run: &str,
    total: u64,
) -> anyhow::Result<()> {
    let url = args
        .database_url
        .as_deref()
        .context("DATABASE_URL names a migrated database")?;
    let pool = hookinbox::postgres::pool(url, 4, hookinbox::postgres::DEFAULT_REQUEST_TIMEOUT)?;
    let policy = Policy {
        lease: Duration::from_secs(60),
        max_attempts: 8,
        publish_timeout: Duration::from_secs(5),
    };
    let batch = u64::from(args.batch);
    let period = Duration::from_secs(1) / args.rate * args.batch;
    let start = tokio::time::Instant::now();
    let mut first = 0u64;
    while first < total {
        tokio::time::sleep_until(start + period * (first / batch) as u32).await;
        let deliveries: Vec<_> = (first..(first + batch).min(total))
            .map(|i| delivery(i, mix, run))
            .collect();
        first += batch;
        let client = pool.get().await?;
        let requests: Vec<ClaimRequest> = deliveries
            .iter()
            .map(|(key, event, body)| ClaimRequest {
                origin: Default::default(),
                key: key.clone(),
                event: (*event).to_owned(),
                action: Some("opened".to_owned()),
                repository: None,
                body_sha256: Sha256::digest(body).into(),
                guarded: true,
                pinned: false,
                legs: vec![deliveries::LegRequest {
                    destination: hookinbox_tests::store_destination(),
                    filtered: None,
                    order_key: None,
                    fair: None,
                    stale_clock: None,
                }],
                body: hookinbox_tests::json_body(body),
            })
            .collect();
        let claims = deliveries::claim_batch(&client, &policy, &requests).await?;
        // The worker reads the body its message does not carry.
        let legs: Vec<_> = deliveries
            .iter()
            .map(|(key, _, _)| key.clone().leg(hookinbox_tests::store_destination()))
            .collect();
        let read = deliveries::bodies::fetch_batch(&client, &legs).await?;
        anyhow::ensure!(
            read.iter().all(Option::is_some),
            "read {} of {} bodies",
            read.iter().flatten().count(),
            legs.len()
        );
        let completing: Vec<Completing> = deliveries
            .iter()
            .zip(&claims)
            .map(|((key, event, body), claim)| {
                let deliveries::Claim::Legs(legs) = claim else {
                    panic!("a new key is claimed: {claim:?}")
                };
                let [(_, deliveries::LegClaim::Claimed { token, .. })] = legs[..] else {
                    panic!("a new key is claimed: {claim:?}")
                };
                Completing {
                    key: key.clone().leg(hookinbox_tests::store_destination()),
                    token,
                    take: Some(0),
                    max_attempts: policy.max_attempts,
                    store: Some(StoredEvent {
                        event: (*event).to_owned(),
                        action: Some("opened".to_owned()),
                        payload: body.clone(),
                    }),
                }
            })
            .collect();
        let done = deliveries::complete_batch(&client, &completing).await?;
        anyhow::ensure!(done.iter().all(Option::is_some), "every row completed");
    }
    Ok(())
}
