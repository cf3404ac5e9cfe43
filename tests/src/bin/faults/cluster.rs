//! The cluster's faults (`HOOKINBOX_FAULT_CLUSTER`): the broker node that
//! leads the most queues killed and booted again, every node restarted in
//! turn, and a Postgres failover (the primary stopped as a crash would,
//! the synchronous standby promoted). Each records a named window, for the
//! `5xx` seconds and the recovery time (`recovery.rs`), and the placement
//! of queue leaders over the nodes is read before and after.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::stack::Suite;

/// How long the killed node stays down.
const DOWN: Duration = Duration::from_secs(10);

/// One broker node's share of the queues.
#[derive(Clone, Copy, Default)]
pub struct Placed {
    /// Queues it leads.
    pub leads: usize,
    /// Queues it holds a replica of (those it leads included).
    pub replicas: usize,
}

/// Each node's queues, as node `asked` sees them (every node listed, with
/// 0 where it has none).
pub fn placement(suite: &Suite, asked: usize) -> anyhow::Result<BTreeMap<String, Placed>> {
    let mut per_node: BTreeMap<String, Placed> = suite
        .rabbits
        .iter()
        .map(|r| (r.node.clone(), Placed::default()))
        .collect();
    for queue in suite.rabbits[asked].queues()? {
        per_node.entry(queue.leader).or_default().leads += 1;
        for member in queue.members {
            per_node.entry(member).or_default().replicas += 1;
        }
    }
    Ok(per_node)
}

/// `kill -9` of the node that leads the most queues, booted again
/// [`DOWN`] later; then `rabbitmq-queues rebalance quorum` moves leaders
/// back onto it, as the operations guide says to after a node's return.
pub async fn leader_kill(suite: &mut Suite) -> anyhow::Result<()> {
    leader_kill_for(suite, DOWN).await
}

/// [`leader_kill`], the node down for `down`.
pub async fn leader_kill_for(suite: &mut Suite, down: Duration) -> anyhow::Result<()> {
    let per_node = tokio::task::block_in_place(|| placement(suite, 0))?;
    let (busiest, led) = per_node
        .iter()
        .max_by_key(|(_, placed)| placed.leads)
        .map(|(node, placed)| (node.clone(), placed.leads))
        .context("no broker nodes")?;
    let i = suite
        .rabbits
        .iter()
        .position(|r| r.node == busiest)
        .context("the busiest node is not one of the suite's")?;
    eprintln!("faults: kill -9 of {busiest}, leader of {led} queues");
    let since = Instant::now();
    tokio::task::block_in_place(|| suite.rabbits[i].kill9())?;
    tokio::time::sleep(down).await;
    tokio::task::block_in_place(|| {
        suite.rabbits[i].boot()?;
        suite.rabbits[i].rebalance()
    })?;
    suite.count("broker node leading the most queues kill -9, booted again");
    suite.named_window("leader node kill -9", since);
    Ok(())
}

/// Every node restarted in turn (`stop_app`, `start_app`, waiting for it
/// before the next).
pub async fn rolling_restart(suite: &mut Suite) -> anyhow::Result<()> {
    let since = Instant::now();
    for i in 0..suite.rabbits.len() {
        tokio::task::block_in_place(|| suite.rabbits[i].restart_app())?;
    }
    tokio::task::block_in_place(|| suite.rabbits[0].rebalance())?;
    suite.count("broker nodes restarted one by one");
    suite.named_window("rolling restart", since);
    Ok(())
}

/// The primary stopped as a crash would (`pg_ctl stop -m immediate`) and
/// the synchronous standby promoted: every `DATABASE_URL` lists it after
/// the primary, so the pools find it by themselves.
pub async fn postgres_failover(suite: &mut Suite) -> anyhow::Result<()> {
    let since = Instant::now();
    tokio::task::block_in_place(|| {
        suite.pg.stop_immediate()?;
        suite
            .standby
            .as_ref()
            .context("the cluster run has a standby")?
            .promote()
    })?;
    suite.count("postgres failover (primary stopped -m immediate, standby promoted)");
    suite.named_window("postgres failover", since);
    Ok(())
}
