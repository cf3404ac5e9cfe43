//! What each cluster fault cost the senders: the seconds in which a
//! request to ingest got no `2xx` (a `5xx`, or no answer), and the time
//! from the fault's end until the end-to-end p99 is back within twice the
//! baseline's. End to end is from a `store` delivery's first send to its
//! effect's commit (the effect log's time); the p99 is over the
//! deliveries first sent in each second, so "back" means the deliveries
//! sent from then on went through as fast as before the faults.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, UNIX_EPOCH};

use crate::cluster::Placed;
use crate::faults::REPEAT_GRACE;
use crate::load::Load;
use crate::stack::Suite;

/// The load's first seconds, with no fault: the baseline p99.
pub const BASELINE: Duration = Duration::from_secs(15);

/// How far past a fault's end its `5xx` seconds are counted, and the
/// recovery looked for: the quiet stretch after it.
const AFTER: Duration = Duration::from_secs(60);

/// One cluster fault's cost.
pub struct Recovered {
    /// The fault.
    pub name: &'static str,
    /// How long it lasted.
    pub lasted: Duration,
    /// Seconds, from its start until 10 s after its end, in which a
    /// request got no `2xx`.
    pub failing_seconds: usize,
    /// From its end until the first second whose deliveries' p99 is
    /// within twice the baseline (none if not within [`AFTER`]).
    pub back_after: Option<Duration>,
    /// The worst second's p99 in between, seconds.
    pub worst_p99: f64,
}

/// The baseline and each cluster fault's cost.
pub struct Recovery {
    /// The end-to-end p99 of the deliveries sent in [`BASELINE`], seconds.
    pub baseline_p99: f64,
    /// Deliveries it was taken over.
    pub baseline_count: usize,
    /// Each fault, in order.
    pub faults: Vec<Recovered>,
}

/// Reads every `store` delivery's first effect and computes the recovery
/// of each of the suite's named windows.
pub async fn measure(suite: &Suite, load: &Load) -> anyhow::Result<Recovery> {
    let db = hookinbox_tests::connect(&suite.database_url()).await;
    let effects: HashMap<String, f64> = db
        .query(
            "select delivery_id, extract(epoch from min(at))::float8 from hookinbox_effect_log \
             where source = 'store' group by delivery_id",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let wall = load
        .started_wall
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let ledger = load.ledger.lock().expect("ledger");
    // Second of first send (from the load's start) -> end-to-end times.
    let mut per_second: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for (id, sent) in &ledger.sent {
        if sent.source != "store" {
            continue;
        }
        let Some(effect) = effects.get(id) else {
            continue;
        };
        let at = sent
            .at
            .saturating_duration_since(load.started)
            .as_secs_f64();
        per_second
            .entry(at as u64)
            .or_default()
            .push(effect - (wall + at));
    }
    let mut baseline: Vec<f64> = per_second
        .range(..BASELINE.as_secs())
        .flat_map(|(_, v)| v.iter().copied())
        .collect();
    let baseline_p99 = p99(&mut baseline);
    let since = |t: Instant| t.saturating_duration_since(load.started);
    let faults = suite
        .named
        .iter()
        .map(|&(name, began, ended)| {
            let (b, e) = (since(began), since(ended));
            let failing: std::collections::BTreeSet<u64> = ledger
                .requests
                .iter()
                .filter(|(at, ok)| !ok && *at >= began && *at < ended + REPEAT_GRACE)
                .map(|(at, _)| since(*at).as_secs())
                .collect();
            let mut worst_p99: f64 = 0.0;
            let mut back_after = None;
            for (second, times) in per_second.range(b.as_secs()..(e + AFTER).as_secs()) {
                let mut times = times.clone();
                let p = p99(&mut times);
                if *second >= e.as_secs() && p <= 2.0 * baseline_p99 {
                    back_after = Some(Duration::from_secs(*second).saturating_sub(e));
                    break;
                }
                worst_p99 = worst_p99.max(p);
            }
            Recovered {
                name,
                lasted: e.saturating_sub(b),
                failing_seconds: failing.len(),
                back_after,
                worst_p99,
            }
        })
        .collect();
    Ok(Recovery {
        baseline_p99,
        baseline_count: baseline.len(),
        faults,
    })
}

/// The 99th percentile of `v` (0 when empty).
fn p99(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * 0.99).round() as usize]
}

/// The cluster section of the report: leader placement before and after,
/// and each fault's `5xx` seconds and recovery.
pub fn markdown(
    before: &BTreeMap<String, Placed>,
    after: &BTreeMap<String, Placed>,
    r: &Recovery,
) -> String {
    let mut out = String::from(
        "\n### The cluster\n\n| broker node | queues led at the start | at the end | replicas held at the start / at the end |\n|---|---|---|---|\n",
    );
    for (node, b) in before {
        let a = after.get(node).copied().unwrap_or_default();
        out.push_str(&format!(
            "| {node} | {} | {} | {} / {} |\n",
            b.leads, a.leads, b.replicas, a.replicas
        ));
    }
    out.push_str(&format!(
        "\nBaseline: end-to-end p99 {:.1} ms over the first {} s ({} `store` deliveries); \"back\" is the first second after the fault whose deliveries' p99 is within 2 × that.\n\n\
         | fault | lasted, s | seconds with a request not answered 2xx | worst p99 until back, ms | back within 2 × baseline after |\n|---|---|---|---|---|\n",
        r.baseline_p99 * 1000.0,
        BASELINE.as_secs(),
        r.baseline_count
    ));
    for f in &r.faults {
        out.push_str(&format!(
            "| {} | {:.1} | {} | {:.1} | {} |\n",
            f.name,
            f.lasted.as_secs_f64(),
            f.failing_seconds,
            f.worst_p99 * 1000.0,
            f.back_after.map_or_else(
                || format!("not within {} s", AFTER.as_secs()),
                |d| format!("{} s", d.as_secs())
            ),
        ));
    }
    out
}
