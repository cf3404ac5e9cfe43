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
//!
//! A third source, `fanout`, sends each delivery to three destinations
//! (`store`, and `forward`s to two receivers of the suite's, `steady` and
//! `flaky`), and each cycle also breaks `flaky`: slow, 503, 404, refusing
//! connections, resetting them mid-answer, and once a run down for longer
//! than its retry schedule (`HOOKINBOX_FAULT_OUTAGE_SECS`). At the end no
//! leg may be lost, dead-lettered, or answered 2xx twice outside a worker
//! or infrastructure fault, and no 404 may have spent an attempt.
//!
//! `scripts/faults.sh --cluster` (`HOOKINBOX_FAULT_CLUSTER`) runs the
//! broker as a three-node cluster and Postgres with a synchronous standby,
//! and adds the cluster's faults (`cluster`): after a baseline of the
//! end-to-end p99, each is reported with its seconds of `5xx` at ingest
//! and the time until the p99 is back (`recovery`). With
//! `HOOKINBOX_FAULT_LEADER_KILLS=N` it runs only `N` kills of the node that
//! leads the most queues, and reports their ledger (`leader_loop`).
//!
//! The steps, one module each: `stack` starts the private `services`, the
//! receivers (`sink`) and the binaries, `load` sends, `faults` (with
//! `kills` and `destinations`) injects one cycle, `settle` lets the
//! reconciler finish, `check` and `legs` do the accounting and `report`
//! prints it.

mod check;
mod cluster;
mod destinations;
mod faults;
mod kills;
mod leader_loop;
mod legs;
mod load;
mod recovery;
mod report;
mod services;
mod settle;
mod sink;
mod stack;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::load::{Load, RATE};
use crate::stack::Suite;

/// What a run was asked for.
pub struct Settings {
    /// Cycles of faults.
    pub cycles: u32,
    /// Worker kills in each cycle.
    pub kills_per_cycle: u32,
    /// The failpoint build of the binaries (`HOOKINBOX_FAULT_BINS`).
    pub bins: PathBuf,
    /// Where to write the report too (`HOOKINBOX_FAULT_REPORT`).
    pub report_path: Option<PathBuf>,
    /// The working folder.
    pub root: PathBuf,
    /// How long the long destination outage lasts
    /// (`HOOKINBOX_FAULT_OUTAGE_SECS`, 15 s by default).
    pub outage: Duration,
    /// A three-node broker cluster and a Postgres standby, and their
    /// faults (`HOOKINBOX_FAULT_CLUSTER`).
    pub cluster: bool,
    /// With `cluster`: only this many kills of the leading node, in place
    /// of the cycles (`HOOKINBOX_FAULT_LEADER_KILLS`, see `leader_loop`).
    pub leader_kills: u32,
}

impl Settings {
    /// `[CYCLES] [KILLS_PER_CYCLE]` and the environment.
    fn read() -> anyhow::Result<Self> {
        let mut args = std::env::args().skip(1);
        Ok(Self {
            cycles: args.next().and_then(|a| a.parse().ok()).unwrap_or(1),
            kills_per_cycle: args.next().and_then(|a| a.parse().ok()).unwrap_or(3),
            bins: PathBuf::from(
                std::env::var("HOOKINBOX_FAULT_BINS")
                    .context("HOOKINBOX_FAULT_BINS names the failpoint build")?,
            ),
            report_path: std::env::var_os("HOOKINBOX_FAULT_REPORT").map(PathBuf::from),
            root: std::env::temp_dir().join(format!("hookinbox-faults-{}", std::process::id())),
            outage: Duration::from_secs(match std::env::var("HOOKINBOX_FAULT_OUTAGE_SECS") {
                Ok(v) => v
                    .parse()
                    .context("HOOKINBOX_FAULT_OUTAGE_SECS is a number of seconds")?,
                Err(_) => 15,
            }),
            cluster: std::env::var_os("HOOKINBOX_FAULT_CLUSTER").is_some_and(|v| !v.is_empty()),
            leader_kills: match std::env::var("HOOKINBOX_FAULT_LEADER_KILLS") {
                Ok(v) if !v.is_empty() => v
                    .parse()
                    .context("HOOKINBOX_FAULT_LEADER_KILLS is a number of kills")?,
                _ => 0,
            },
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = Settings::read()?;
    let mut suite = Suite::start(&settings).await?;
    let mut load = Load::start(suite.github.clone(), RATE);
    let placed_before = if settings.cluster {
        // The baseline the recovery times are measured against: the load
        // with no fault.
        tokio::time::sleep(recovery::BASELINE).await;
        Some(tokio::task::block_in_place(|| {
            cluster::placement(&suite, 0)
        })?)
    } else {
        None
    };
    if settings.leader_kills > 0 {
        anyhow::ensure!(
            settings.cluster,
            "HOOKINBOX_FAULT_LEADER_KILLS needs the cluster (--cluster)"
        );
        leader_loop::run(&mut suite, settings.leader_kills).await?;
    } else {
        for cycle in 0..settings.cycles {
            faults::cycle(&mut suite, &settings, cycle).await?;
        }
    }
    load.stop().await;
    let settled = settle::settle(&suite, &load.ledger).await?;
    let checked = check::check(&suite, &load.ledger, load.started).await?;
    let legs = legs::check(&suite, &load.ledger, load.started).await?;
    report::windows(&suite, load.started);
    let mut report = report::markdown(&settings, &suite, load.started, &checked, &settled);
    report.push_str(&report::destinations(&suite, &legs));
    if settings.leader_kills > 0 {
        let ledger = leader_loop::ledger(&suite, settings.leader_kills).await?;
        report.push_str(&leader_loop::markdown(
            &ledger,
            checked.accepted,
            checked.duplicates.len(),
        ));
    }
    if let Some(before) = placed_before {
        let after = tokio::task::block_in_place(|| cluster::placement(&suite, 0))?;
        let recovered = recovery::measure(&suite, &load).await?;
        report.push_str(&recovery::markdown(&before, &after, &recovered));
    }
    println!("{report}");
    if let Some(path) = &settings.report_path {
        std::fs::write(path, &report)?;
    }
    let failures: Vec<String> = [
        settled.unsettled.clone(),
        checked.failure(settled.never_brought_back),
        legs.failure(),
        suite.receivers.failure(),
    ]
    .into_iter()
    .flatten()
    .collect();
    suite
        .stop((!failures.is_empty()).then(|| failures.join("; ")))
        .await
}
