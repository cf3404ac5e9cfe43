//! The leader-kill loop (`HOOKINBOX_FAULT_LEADER_KILLS=N` with
//! `--cluster`): instead of the cycles of faults, the broker node that
//! leads the most queues is killed `N` times under the load, each time
//! booted again a few seconds later and the leaders rebalanced. It asks
//! one question: does a publish the broker confirmed ever go missing, and
//! if it does, is it the broker's doing (no worker ever received the
//! message) or ours (a worker received it and acked it without taking the
//! leg)?
//!
//! Its ledger, from Postgres and the workers' logs once the run settled:
//! the kills; the deliveries answered 2xx; the legs whose message was lost
//! (reaped `lost` and published again from the body their claim wrote: on
//! the version before that, each stayed lost); for each, whether any
//! worker ran a job of it before the reaper marked it, which tells whose
//! loss it was; and the duplicate effects (the ordinary check's).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use crate::cluster;
use crate::stack::Suite;

/// How long each killed node stays down.
const DOWN: Duration = Duration::from_secs(3);
/// The load alone between two kills.
const BETWEEN: Duration = Duration::from_secs(4);

/// Kills the busiest node `kills` times.
pub async fn run(suite: &mut Suite, kills: u32) -> anyhow::Result<()> {
    for kill in 0..kills {
        eprintln!("faults: leader kill {}/{kills}", kill + 1);
        cluster::leader_kill_for(suite, DOWN).await?;
        tokio::time::sleep(BETWEEN).await;
    }
    Ok(())
}

/// A leg whose message was lost, and what the workers saw of it.
pub struct Lost {
    /// Its `X-GitHub-Delivery` id.
    pub delivery_id: String,
    /// Its destination.
    pub destination: String,
    /// Jobs of this leg the workers ran (each job's "job done" line), all
    /// told: one is the republished message's; more, and a worker received
    /// the original (late) or a copy.
    pub jobs: usize,
}

/// The loop's ledger.
pub struct Ledger {
    /// Kills.
    pub kills: u32,
    /// Legs whose message was lost and that were published again.
    pub lost: Vec<Lost>,
    /// Legs still not completed, not dead.
    pub open: i64,
    /// The messages left in each queue once the run settled (the originals
    /// of the lost legs would be here if they were only stuck).
    pub left_in_queues: Vec<(String, u64)>,
}

/// Reads the ledger once the run settled.
pub async fn ledger(suite: &Suite, kills: u32) -> anyhow::Result<Ledger> {
    let db = hookinbox_tests::connect(&suite.database_url()).await;
    // A leg the reaper marked `lost` keeps that class through its
    // completion (a completion does not clear the last error), and its
    // `first_failed_at` is when the reaper marked it.
    let rows = db
        .query(
            "select delivery_id, destination from deliveries
             where last_error_class = 'lost' order by first_failed_at",
            &[],
        )
        .await?;
    let jobs = jobs_by_delivery(&suite.root)?;
    let lost = rows
        .iter()
        .map(|r| {
            let (delivery_id, destination): (String, String) = (r.get(0), r.get(1));
            Lost {
                jobs: jobs
                    .get(&(delivery_id.clone(), destination.clone()))
                    .copied()
                    .unwrap_or(0),
                delivery_id,
                destination,
            }
        })
        .collect();
    let open: i64 = db
        .query_one(
            "select count(*) from deliveries
             where status = 'processing' or (status = 'failed' and retryable)",
            &[],
        )
        .await?
        .get(0);
    let left_in_queues = tokio::task::block_in_place(|| suite.rabbits[0].depths())?;
    Ok(Ledger {
        kills,
        lost,
        open,
        left_in_queues,
    })
}

/// The "job done" lines of each leg (delivery id, destination) in the
/// workers' logs.
fn jobs_by_delivery(root: &Path) -> anyhow::Result<HashMap<(String, String), usize>> {
    let mut jobs = HashMap::new();
    for entry in std::fs::read_dir(root)?.flatten() {
        if !entry.file_name().to_string_lossy().starts_with("worker-") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("\"job done\"")) {
            let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let field = |name: &str| {
                value["span"][name]
                    .as_str()
                    .or_else(|| value[name].as_str())
                    .map(str::to_owned)
            };
            if let Some(id) = field("delivery_id") {
                let destination = field("destination").unwrap_or_default();
                *jobs.entry((id, destination)).or_insert(0) += 1;
            }
        }
    }
    Ok(jobs)
}

/// The ledger as Markdown, beside the run's accepted deliveries and
/// duplicate effects.
pub fn markdown(ledger: &Ledger, accepted: usize, duplicates: usize) -> String {
    let never_received = ledger.lost.iter().filter(|l| l.jobs <= 1).count();
    let mut out = format!(
        "\n## Leader kills\n\n| measure | value |\n|---|---|\n\
         | leader kills | {} |\n| deliveries answered 2xx | {accepted} |\n\
         | legs whose message was lost, published again from Postgres | {} |\n\
         | of which no worker ever received the original message | {never_received} |\n\
         | legs left open after settling (lost after the fix) | {} |\n\
         | duplicate effects | {duplicates} |\n",
        ledger.kills,
        ledger.lost.len(),
        ledger.open,
    );
    out.push_str("\nMessages left in each queue once the run settled:\n\n");
    for (queue, messages) in &ledger.left_in_queues {
        out.push_str(&format!("- `{queue}`: {messages}\n"));
    }
    if !ledger.lost.is_empty() {
        out.push_str("\nThe legs whose message was lost (jobs: every job of the delivery the workers ran):\n\n");
        for l in &ledger.lost {
            out.push_str(&format!(
                "- `{}` to `{}`: {} job(s)\n",
                l.delivery_id, l.destination, l.jobs
            ));
        }
    }
    out
}
