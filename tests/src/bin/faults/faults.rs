//! One cycle of faults, in order, each one function: the kills
//! (`kills.rs`), a broker restart, a Postgres crash, connections cut,
//! half-open and slowed, each recording its window, with the destination
//! faults (`destinations.rs`) after ingest's kill; then a quiet stretch.
//! In cluster mode the broker's restart is a cluster's faults instead
//! (`cluster.rs`): the node leading the most queues killed, the nodes
//! restarted in turn, and in the last cycle a Postgres failover.

use std::time::{Duration, Instant};

use crate::Settings;
use crate::cluster;
use crate::destinations;
use crate::stack::Suite;

/// How long after a fault ends a relayed key may still arrive again: a
/// lease, the reaper's delay, a retry.
pub const REPEAT_GRACE: Duration = Duration::from_secs(10);

/// Half-open and delayed connections last this long.
const STALL: Duration = Duration::from_secs(5);

/// The worker's kill points, used in turn.
const POINTS: [&str; 3] = [
    "worker.after_take",
    "worker.mid_effect",
    "worker.after_commit",
];

/// Which proxied path a fault hits.
enum Which {
    /// Workers to Postgres.
    Postgres,
    /// Ingest to RabbitMQ.
    Broker,
}

/// Cycle `cycle` (from 0): every fault once, the worker kills
/// `kills_per_cycle` times, the destination faults (the long outage in the
/// first cycle only) after ingest's, then a quiet stretch.
pub async fn cycle(suite: &mut Suite, settings: &Settings, cycle: u32) -> anyhow::Result<()> {
    eprintln!("faults: cycle {}/{}", cycle + 1, settings.cycles);
    worker_kills(suite, settings.kills_per_cycle).await?;
    ingest_kill(suite).await?;
    // Right after ingest's restart: a fresh ingest, before the broker and
    // connection faults that leave its publishes failing (and parked) until
    // its next restart.
    destinations::faults(suite, (cycle == 0).then_some(settings.outage)).await?;
    lease_steal(suite, cycle).await?;
    if settings.cluster {
        // Each cluster fault is followed by a quiet stretch, so that the
        // time until the end-to-end p99 is back is its own.
        cluster::leader_kill(suite).await?;
        quiet().await;
        cluster::rolling_restart(suite).await?;
        quiet().await;
    } else {
        broker_restart(suite, cycle)?;
    }
    postgres_crash(suite).await?;
    cut(suite, Which::Postgres, "worker-postgres connections cut").await;
    cut(suite, Which::Broker, "ingest-broker connections cut").await;
    degrade(
        suite,
        Which::Postgres,
        true,
        "worker-postgres connections half-open 5 s",
    )
    .await;
    degrade(
        suite,
        Which::Postgres,
        false,
        "worker-postgres connections delayed 200 ms for 5 s",
    )
    .await;
    degrade(
        suite,
        Which::Broker,
        true,
        "ingest-broker connections half-open 5 s",
    )
    .await;
    degrade(
        suite,
        Which::Broker,
        false,
        "ingest-broker connections delayed 200 ms for 5 s",
    )
    .await;
    if settings.cluster && cycle + 1 == settings.cycles {
        // Last: after it the workers' Postgres proxy leads to the old
        // primary, gone, so the connection faults above would cut nothing.
        quiet().await;
        cluster::postgres_failover(suite).await?;
    }
    quiet().await;
    Ok(())
}

/// `kills` worker `kill -9`s at the kill points in turn, over the
/// workers in turn.
async fn worker_kills(suite: &mut Suite, kills: u32) -> anyhow::Result<()> {
    for k in 0..kills {
        let point = POINTS[(k as usize) % POINTS.len()];
        let since = Instant::now();
        suite.worker_kill((k as usize) % 3, point).await?;
        suite.window(since);
    }
    Ok(())
}

/// Ingest `kill -9`ed between its claim and its publish.
async fn ingest_kill(suite: &mut Suite) -> anyhow::Result<()> {
    let since = Instant::now();
    suite.ingest_kill().await?;
    suite.window(since);
    Ok(())
}

/// A lease stolen from a stopped worker, a different worker each cycle.
async fn lease_steal(suite: &mut Suite, cycle: u32) -> anyhow::Result<()> {
    let since = Instant::now();
    suite.lease_steal(cycle as usize % 3).await?;
    suite.window(since);
    Ok(())
}

/// The broker restarted: `stop_app`/`start_app` in even cycles, `kill -9`
/// of the node in odd ones.
fn broker_restart(suite: &mut Suite, cycle: u32) -> anyhow::Result<()> {
    let since = Instant::now();
    if cycle.is_multiple_of(2) {
        suite.rabbits[0].restart_app()?;
        suite.count("broker stop_app/start_app");
    } else {
        suite.rabbits[0].kill9_and_boot()?;
        suite.count("broker kill -9");
    }
    suite.window(since);
    Ok(())
}

/// Postgres stopped as a crash would, then started.
async fn postgres_crash(suite: &mut Suite) -> anyhow::Result<()> {
    let since = Instant::now();
    suite.pg.stop_immediate()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    suite.pg.start()?;
    suite.count("postgres stop -m immediate");
    suite.window(since);
    Ok(())
}

/// The connections of `which` cut, and new ones refused, for 2 s.
async fn cut(suite: &mut Suite, which: Which, what: &'static str) {
    let since = Instant::now();
    let proxy = match which {
        Which::Postgres => &suite.pg_proxy,
        Which::Broker => &suite.amqp_proxy,
    };
    proxy.close();
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.reopen();
    suite.count(what);
    suite.window(since);
}

/// Leaves the connections of `which` half-open (`stall`) or slow for
/// [`STALL`], then opens them.
async fn degrade(suite: &mut Suite, which: Which, stall: bool, what: &'static str) {
    let since = Instant::now();
    let proxy = match which {
        Which::Postgres => &suite.pg_proxy,
        Which::Broker => &suite.amqp_proxy,
    };
    if stall {
        proxy.stall();
    } else {
        proxy.delay(Duration::from_millis(200));
    }
    tokio::time::sleep(STALL).await;
    proxy.open();
    suite.count(what);
    suite.window(since);
}

/// A quiet stretch under traffic: any repeat here is a bug. The
/// destination faults' windows are not fault windows: a relayed key, or a
/// `fanout` key answered 2xx, arriving again then is a bug too.
pub async fn quiet() {
    tokio::time::sleep(REPEAT_GRACE + STALL).await;
}
