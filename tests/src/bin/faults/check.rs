//! The final accounting: the ledger against the effects, the dead letters
//! and the relay's receiver. Every delivery answered 2xx has exactly one
//! `store` effect or is a dead letter; no effect is duplicated or exists
//! for a delivery never sent; every relayed key arrived, with its own
//! delivery id and body, and arrived again only around a fault.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use hookinbox_tests::receiver::Received;

use crate::faults::REPEAT_GRACE;
use crate::load::Ledger;
use crate::stack::Suite;

/// The relay source's one destination is its old `handler`, named after
/// its kind; the Idempotency-Key ends with that name.
const RELAY_KEY_SUFFIX: &str = ":forward";

/// What the accounting found.
pub struct Checked {
    /// Deliveries sent.
    pub sent: usize,
    /// Redeliveries sent.
    pub redeliveries: u64,
    /// Requests that got no 2xx.
    pub failed_requests: u64,
    /// Deliveries answered 2xx.
    pub accepted: usize,
    /// Deliveries with a `store` effect.
    pub effects: usize,
    /// Dead letters.
    pub dead: usize,
    /// Answered 2xx, no effect (or relayed key), not dead-lettered.
    pub lost: Vec<String>,
    /// Deliveries with more than one effect, and how many.
    pub duplicates: Vec<(String, i64)>,
    /// Effects for ids never sent.
    pub unknown: Vec<String>,
    /// Effects of deliveries that had a failed request (allowed).
    pub effects_after_failure: usize,
    /// "job done … fenced" lines in the workers' logs.
    pub fenced: usize,
    /// One-statement completions fenced, in the workers' logs.
    pub fused_fenced: usize,
    /// Relayed deliveries answered 2xx.
    pub relayed_accepted: usize,
    /// Relayed keys that arrived.
    pub relayed_keys: usize,
    /// Arrivals of a key after its first.
    pub repeats: usize,
    /// Repeats that no fault window explains.
    pub stray: Vec<String>,
    /// Arrivals with a wrong key, delivery id or body.
    pub wrong: usize,
}

/// Checks the ledger against the database and the relay's receiver;
/// `started` is when the load started (repeats are named by their time
/// since).
pub async fn check(
    suite: &Suite,
    ledger: &Mutex<Ledger>,
    started: Instant,
) -> anyhow::Result<Checked> {
    let db = hookinbox_tests::connect(&suite.database_url()).await;
    let effects: HashMap<String, i64> = db
        .query(
            "select delivery_id, count(*) from hookinbox_effect_log group by delivery_id",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let dead: HashSet<String> = db
        .query(
            "select delivery_id from deliveries where status = 'failed' and not retryable",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let l = ledger.lock().expect("ledger");
    let accepted: Vec<&String> = l
        .sent
        .iter()
        .filter(|(_, s)| s.ok)
        .map(|(id, _)| id)
        .collect();
    // Relayed deliveries, by the idempotency key they arrived with.
    let arrivals = suite.receiver.received();
    let mut by_key: HashMap<&str, Vec<&Received>> = HashMap::new();
    for r in &arrivals {
        by_key
            .entry(r.header("idempotency-key").unwrap_or(""))
            .or_default()
            .push(r);
    }
    let wrong = wrong_arrivals(&by_key, &l);
    let (repeats, stray) = stray_repeats(
        by_key
            .iter()
            .map(|(key, rs)| (*key, rs.iter().map(|r| r.at).collect())),
        &suite.windows,
        started,
    );
    let lost: Vec<String> = accepted
        .iter()
        .filter(|id| {
            let done = match l.sent[id.as_str()].source {
                "relay" => by_key
                    .contains_key(format!("github:relay:4242:{id}{RELAY_KEY_SUFFIX}").as_str()),
                _ => effects.get(id.as_str()).copied().unwrap_or(0) == 1,
            };
            !done && !dead.contains(id.as_str())
        })
        .map(|id| (*id).clone())
        .collect();
    let duplicates: Vec<(String, i64)> = effects
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, n)| (id.clone(), *n))
        .collect();
    let unknown: Vec<String> = effects
        .keys()
        .filter(|id| !l.sent.contains_key(*id))
        .cloned()
        .collect();
    Ok(Checked {
        sent: l.sent.len(),
        redeliveries: l.redeliveries,
        failed_requests: l.requests.iter().filter(|(_, ok)| !ok).count() as u64,
        accepted: accepted.len(),
        effects: effects.len(),
        dead: dead.len(),
        lost,
        duplicates,
        unknown,
        effects_after_failure: l
            .sent
            .iter()
            .filter(|(id, s)| s.failures > 0 && effects.contains_key(id.as_str()))
            .count(),
        fenced: in_worker_logs(
            &suite.root,
            "\"message\":\"job done\",\"outcome\":\"fenced\"",
        )?,
        fused_fenced: in_worker_logs(&suite.root, "\"one-statement completion fenced")?,
        relayed_accepted: accepted
            .iter()
            .filter(|id| l.sent[id.as_str()].source == "relay")
            .count(),
        relayed_keys: by_key.len(),
        repeats,
        stray,
        wrong,
    })
}

impl Checked {
    /// Whether the run failed, and why.
    pub fn failure(&self, never_brought_back: usize) -> Option<String> {
        let failed = !self.lost.is_empty()
            || never_brought_back > 0
            || !self.duplicates.is_empty()
            || !self.unknown.is_empty()
            || !self.stray.is_empty()
            || self.wrong > 0;
        failed.then(|| {
            format!(
                "lost {:?}, never brought back {never_brought_back}, duplicated {:?}, unknown {:?}, stray repeats {:?}, wrong arrivals {}",
                self.lost, self.duplicates, self.unknown, self.stray, self.wrong
            )
        })
    }
}

/// Arrivals whose key names no relayed delivery, or whose delivery header
/// or body is not that delivery's.
fn wrong_arrivals(by_key: &HashMap<&str, Vec<&Received>>, l: &Ledger) -> usize {
    let mut wrong = 0usize;
    for (key, rs) in by_key {
        let sent = key
            .strip_prefix("github:relay:4242:")
            .and_then(|rest| rest.strip_suffix(RELAY_KEY_SUFFIX))
            .and_then(|id| Some((id, l.sent.get(id)?)))
            .filter(|(_, s)| s.source == "relay");
        wrong += match sent {
            Some((id, s)) => rs
                .iter()
                .filter(|r| r.header("x-github-delivery") != Some(id) || r.body != s.body)
                .count(),
            None => rs.len(),
        };
    }
    wrong
}

/// Arrivals (or effects) of a key after its first, and those of them
/// that no fault's window (extended by [`REPEAT_GRACE`]) overlaps: from the
/// first to the repeat. `started` names their times in the list.
pub fn stray_repeats<'a>(
    by_key: impl Iterator<Item = (&'a str, Vec<Instant>)>,
    windows: &[(Instant, Instant)],
    started: Instant,
) -> (usize, Vec<String>) {
    let (mut repeats, mut stray) = (0usize, Vec::new());
    for (key, mut times) in by_key {
        times.sort();
        let Some((&first, again)) = times.split_first() else {
            continue;
        };
        for &at in again {
            repeats += 1;
            let around_a_fault = windows
                .iter()
                .any(|(begin, end)| *begin <= at && *end + REPEAT_GRACE >= first);
            if !around_a_fault {
                let secs = |t: Instant| t.saturating_duration_since(started).as_secs_f64();
                stray.push(format!(
                    "{key} (first at {:.1} s, again at {:.1} s)",
                    secs(first),
                    secs(at)
                ));
            }
        }
    }
    (repeats, stray)
}

/// How often `needle` occurs in the workers' logs.
fn in_worker_logs(root: &Path, needle: &str) -> anyhow::Result<usize> {
    Ok(std::fs::read_dir(root)?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("worker-"))
        .map(|e| {
            std::fs::read_to_string(e.path())
                .unwrap_or_default()
                .matches(needle)
                .count()
        })
        .sum())
}
