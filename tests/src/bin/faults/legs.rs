//! The accounting of the destinations' legs (source `fanout`): every leg
//! of every delivery answered 2xx completed with its effect (a
//! `github_events` row for `store`, a 2xx answer at the receiver for
//! `steady` and `flaky`); no key answered 2xx twice except around a worker
//! or infrastructure fault; every request carried its leg's key, delivery
//! id and body; no leg dead-lettered; no 404 spent an attempt.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::check::stray_repeats;
use crate::destinations::{LEGS, SOURCE};
use crate::load::Ledger;
use crate::sink::{Answer, Arrival};
use crate::stack::Suite;

/// What one receiver saw.
#[derive(Default)]
pub struct Received {
    /// Requests it read.
    pub requests: usize,
    /// Of them answered 2xx in full: effects.
    pub effects: usize,
    /// Keys with an effect.
    pub keys: usize,
}

/// What the accounting of the legs found.
pub struct Legs {
    /// `fanout` deliveries answered 2xx.
    pub deliveries: usize,
    /// Their legs, and all legs of the source in the database.
    pub expected: usize,
    /// Legs completed.
    pub completed: i64,
    /// Legs (`id:destination`) not completed, or without their effect,
    /// and not dead-lettered.
    pub lost: Vec<String>,
    /// Legs dead-lettered.
    pub dead: i64,
    /// `steady` and `flaky`.
    pub receivers: [Received; 2],
    /// Effects after a key's first.
    pub repeats: usize,
    /// Those no worker or infrastructure fault explains.
    pub duplicates: Vec<String>,
    /// Requests with a wrong key, delivery id or body.
    pub wrong: usize,
    /// 404 answers in `flaky`'s attempt log, and those whose leg's next
    /// attempt counted one more (the 404 spent an attempt).
    pub not_found: (i64, i64),
    /// The slowest `steady` effect after its delivery's send, for
    /// deliveries sent while a fault hit `flaky`.
    pub steady_slowest: Option<Duration>,
    /// `store` is ordered by repository: its keys, its completed legs, and
    /// the legs that completed before an earlier leg of their key (by
    /// claim order) had.
    pub ordered: (i64, i64, Vec<String>),
    /// `steady` is fair (one installation, the source's own): its legs
    /// that waited for their turn in Postgres, held at the claim or
    /// yielding at the take.
    pub fair_waited: i64,
}

/// Checks the legs against the database and the receivers.
pub async fn check(
    suite: &Suite,
    ledger: &Mutex<Ledger>,
    started: Instant,
) -> anyhow::Result<Legs> {
    let db = hookinbox_tests::connect(&suite.database_url()).await;
    let rows = db
        .query(
            "select delivery_id, destination, status, retryable from deliveries where source = $1",
            &[&SOURCE],
        )
        .await?;
    let status: HashMap<(String, String), (String, bool)> = rows
        .iter()
        .map(|r| ((r.get(0), r.get(1)), (r.get(2), r.get(3))))
        .collect();
    let stored: HashMap<String, i64> = db
        .query(
            "select delivery_id, count(*) from hookinbox_effect_log where source = $1 group by 1",
            &[&SOURCE],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let row = db
        .query_one(
            "select count(*), count(*) filter (where n.attempt > a.attempt)
             from destination_attempts a
             left join lateral (
                 select b.attempt from destination_attempts b
                 where b.provider = a.provider and b.source = a.source and b.hook_id = a.hook_id
                   and b.delivery_id = a.delivery_id and b.destination = a.destination
                   and b.id > a.id
                 order by b.id limit 1) n on true
             where a.source = $1 and a.destination = 'flaky' and a.status_code = 404",
            &[&SOURCE],
        )
        .await?;
    let not_found = (row.get(0), row.get(1));
    let ordered = out_of_order(&db).await?;
    let fair_waited: i64 = db
        .query_one(
            "select count(*) from deliveries
             where source = $1 and destination = 'steady' and last_error_class = 'fair'",
            &[&SOURCE],
        )
        .await?
        .get(0);
    let arrivals = [
        suite.receivers.steady.arrivals(),
        suite.receivers.flaky.arrivals(),
    ];
    let l = ledger.lock().expect("ledger");
    let accepted: Vec<&String> = l
        .sent
        .iter()
        .filter(|(_, s)| s.ok && s.source == SOURCE)
        .map(|(id, _)| id)
        .collect();
    // Each receiver's effects, by key, in time.
    let effects: [HashMap<&str, Vec<Instant>>; 2] = arrivals.each_ref().map(|all| {
        let mut by_key: HashMap<&str, Vec<Instant>> = HashMap::new();
        for a in all.iter().filter(|a| a.answer == Answer::Effect) {
            by_key.entry(&a.key).or_default().push(a.at);
        }
        by_key
    });
    // Every leg of every delivery answered 2xx, and every leg claimed.
    let mut legs: Vec<(String, &str)> = accepted
        .iter()
        .flat_map(|id| LEGS.map(|leg| ((*id).clone(), leg)))
        .collect();
    for (id, leg) in status.keys() {
        if !l.sent.get(id).is_some_and(|s| s.ok)
            && let Some(leg) = LEGS.iter().find(|name| *name == leg)
        {
            legs.push((id.clone(), leg));
        }
    }
    let lost: Vec<String> = legs
        .iter()
        .filter(|(id, leg)| {
            let row = status.get(&(id.clone(), (*leg).to_owned()));
            let dead = row.is_some_and(|(s, retryable)| s == "failed" && !retryable);
            let completed = row.is_some_and(|(s, _)| s == "completed");
            let effect = match *leg {
                "store" => stored.get(id).copied() == Some(1),
                "steady" => effects[0].contains_key(key(id, leg).as_str()),
                _ => effects[1].contains_key(key(id, leg).as_str()),
            };
            let done = completed && effect;
            !dead && !done
        })
        .map(|(id, leg)| format!("{id}:{leg}"))
        .collect();
    let mut repeats = 0;
    let mut duplicates = Vec::new();
    for by_key in &effects {
        let (n, stray) = stray_repeats(
            by_key.iter().map(|(k, times)| (*k, times.clone())),
            &suite.windows,
            started,
        );
        repeats += n;
        duplicates.extend(stray);
    }
    // Requests whose key names no leg of a `fanout` delivery, or whose
    // delivery id or body is not that delivery's.
    let mut bodies: HashMap<&str, [u8; 32]> = HashMap::new();
    let mut wrong = 0;
    for (all, leg) in arrivals.iter().zip(["steady", "flaky"]) {
        for a in all {
            let sent = a
                .key
                .strip_prefix(&format!("github:{SOURCE}:4242:"))
                .and_then(|rest| rest.strip_suffix(&format!(":{leg}")))
                .and_then(|id| Some((id, l.sent.get_key_value(id)?)))
                .filter(|(_, (_, s))| s.source == SOURCE);
            let right = sent.is_some_and(|(id, (stored_id, s))| {
                let body = *bodies
                    .entry(stored_id.as_str())
                    .or_insert_with(|| Sha256::digest(&s.body).into());
                a.delivery == id && a.body == body
            });
            if !right {
                wrong += 1;
            }
        }
    }
    let steady_slowest = steady_slowest(suite, &l, &arrivals[0]);
    let dead = status
        .values()
        .filter(|(s, retryable)| s == "failed" && !retryable)
        .count() as i64;
    let completed = status.values().filter(|(s, _)| s == "completed").count() as i64;
    Ok(Legs {
        deliveries: accepted.len(),
        expected: legs.len(),
        completed,
        lost,
        dead,
        receivers: arrivals.each_ref().map(|all| Received {
            requests: all.len(),
            effects: all.iter().filter(|a| a.answer == Answer::Effect).count(),
            keys: all
                .iter()
                .filter(|a| a.answer == Answer::Effect)
                .map(|a| a.key.as_str())
                .collect::<std::collections::HashSet<_>>()
                .len(),
        }),
        repeats,
        duplicates,
        wrong,
        not_found,
        steady_slowest,
        ordered,
        fair_waited,
    })
}

/// The ordered `store` leg's keys, completed legs, and legs that completed
/// before an earlier leg of their key (the effect and the completion share
/// a transaction, so the completion's time orders the effects; one key
/// never has two legs in one completing statement).
async fn out_of_order(db: &tokio_postgres::Client) -> anyhow::Result<(i64, i64, Vec<String>)> {
    let row = db
        .query_one(
            "select count(distinct order_key), count(*) from deliveries
             where source = $1 and destination = 'store' and order_key is not null
               and status = 'completed'",
            &[&SOURCE],
        )
        .await?;
    let early = db
        .query(
            "select delivery_id from (
                 select delivery_id, completed_at,
                        max(completed_at) over (partition by order_key order by order_seq
                            rows between unbounded preceding and 1 preceding) as before
                 from deliveries
                 where source = $1 and destination = 'store' and order_key is not null
                   and status = 'completed') c
             where completed_at <= before",
            &[&SOURCE],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    Ok((row.get(0), row.get(1), early))
}

/// The `Idempotency-Key` of leg `leg` of delivery `id`.
fn key(id: &str, leg: &str) -> String {
    format!("github:{SOURCE}:4242:{id}:{leg}")
}

/// The slowest first `steady` effect after its delivery's first send, over
/// the deliveries sent while a fault hit `flaky`.
fn steady_slowest(suite: &Suite, l: &Ledger, steady: &[Arrival]) -> Option<Duration> {
    let mut first: HashMap<&str, Instant> = HashMap::new();
    for a in steady.iter().filter(|a| a.answer == Answer::Effect) {
        let at = first.entry(&a.key).or_insert(a.at);
        *at = (*at).min(a.at);
    }
    l.sent
        .iter()
        .filter(|(_, s)| s.source == SOURCE)
        .filter(|(_, s)| {
            suite
                .receivers
                .faults
                .iter()
                .any(|f| f.begin <= s.at && s.at <= f.end)
        })
        .filter_map(|(id, s)| {
            let got = first.get(key(id, "steady").as_str())?;
            Some(got.saturating_duration_since(s.at))
        })
        .max()
}

impl Legs {
    /// Whether the legs' accounting failed, and why.
    pub fn failure(&self) -> Option<String> {
        let failed = !self.lost.is_empty()
            || !self.duplicates.is_empty()
            || self.dead > 0
            || self.wrong > 0
            || self.not_found.1 > 0
            || !self.ordered.2.is_empty();
        failed.then(|| {
            format!(
                "legs lost {:?}, duplicate effects {:?}, dead letters {}, wrong requests {}, 404s that spent an attempt {}, ordered legs completed out of claim order {:?}",
                self.lost, self.duplicates, self.dead, self.wrong, self.not_found.1, self.ordered.2
            )
        })
    }
}
