//! Model-based test of fair legs against the real Postgres: random
//! interleavings of claims (one at a time or in a batch, and
//! redeliveries) with ingest's hold of a leg
//! its claim finds crowded (or ingest dying right after the claim), takes
//! presenting any message ever handed out, completions (by the live holder
//! or a late one), the one-statement path that takes and completes at
//! once, transient failures, lease expiry, the scheduler (its wake of
//! waiting installations and its pick), a worker's release of its
//! installation's next leg, the reaper and replays, on four deliveries of
//! installation `1` and two of installation `2`, to a fair destination
//! whose share is one or two legs in flight, soft or a hard cap (drawn for
//! each case). Checked after every step:
//!
//! - a take (or the one-statement path) starts a leg only while its
//!   installation has fewer than its share of other legs in flight, when
//!   another installation's leg waits for its take or the cap is hard: the
//!   share;
//! - a take yields only then: a lone installation is never held back;
//! - a claim holds a new leg only when its installation has a share of
//!   legs queued (not yet taken) and a share running, or two shares
//!   queued and running together, or legs waiting their turn and a share
//!   running; with a hard cap, always when it has a cap's worth queued;
//! - a release publishes a leg of the installation whose leg ended;
//! - a leg completes at most once;
//! - every leg that waits its installation's turn has its body parked, so
//!   that a release can publish it.
//!
//! At the end of every case nothing is lost: workers, the scheduler and
//! GitHub carry on as they would (a live holder completes its leg and
//! releases its installation's next, each leg's latest message is taken,
//! the scheduler passes; when nothing else moves, leases run out, the
//! reaper runs and GitHub redelivers what only it can) until every claimed
//! leg is completed, exactly once. A held or yielded leg is never
//! stranded.
//!
//! Two planted bugs run the same machine and expect the checks to fail,
//! so the test can see the bugs it is there to catch:
//! `a_planted_take_that_ignores_the_share_is_caught` (the take forgets the
//! gate) and `a_planted_release_that_releases_nothing_is_caught` (the
//! worker's release and the scheduler's wake do nothing).

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hookinbox::deliveries::{
    self, ClaimRequest, ErrorClass, Failure, LegClaim, Policy, Replayed, Take,
};
use hookinbox::key::{
    ClaimToken, DeliveryId, DeliveryKey, DestinationName, HookId, LegKey, SourceName,
};
use proptest::prelude::*;
use proptest::test_runner::Config;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};

/// High enough that no case spends a leg's attempts: every leg must end
/// completed, and a poisoned leg would not.
const MAX_ATTEMPTS: i32 = 1000;
/// Deliveries 0..4 are of installation `1`; the last two of `2`.
const LEGS: usize = 6;
const DESTINATION: &str = "f";
/// How many rounds the drain at the end of a case may take: each round
/// is a scheduler pass and every worker's step, so a handful suffice.
const DRAIN_ROUNDS: usize = 100;

fn installation_of(leg: usize) -> &'static str {
    if leg < 4 { "1" } else { "2" }
}

/// How often the cases reached each path (takes that started a leg, takes
/// that yielded, claims that held a leg, releases by a worker, wakes by
/// the scheduler, completions, and those on the one-statement path): the
/// run must reach them all.
static REACHED: [AtomicUsize; 7] = [const { AtomicUsize::new(0) }; 7];
const STARTED: usize = 0;
const YIELDED: usize = 1;
const HELD: usize = 2;
const RELEASED: usize = 3;
const WOKEN: usize = 4;
const COMPLETED: usize = 5;
const FUSED: usize = 6;
const PATHS: [&str; 7] = [
    "started",
    "yielded",
    "held",
    "released",
    "woken",
    "completed",
    "fused",
];

fn reached(path: usize) {
    REACHED[path].fetch_add(1, Ordering::Relaxed);
}

/// A bug planted in the test's own copy of a transition, for the checks
/// to catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    None,
    /// Takes that ignore the share (no `yields!` gate).
    IgnoresTheShare,
    /// A worker's release and the scheduler's wake that release nothing.
    ReleasesNothing,
}

thread_local! {
    static BUG: Cell<Bug> = const { Cell::new(Bug::None) };
}

fn bug() -> Bug {
    BUG.with(Cell::get)
}

/// One database and runtime for each test (each planted bug its own), so
/// that each can drop its database when done.
fn shared() -> &'static hookinbox_tests::ModelDb {
    static SHARED: OnceLock<hookinbox_tests::ModelDb> = OnceLock::new();
    static IGNORES_THE_SHARE: OnceLock<hookinbox_tests::ModelDb> = OnceLock::new();
    static RELEASES_NOTHING: OnceLock<hookinbox_tests::ModelDb> = OnceLock::new();
    let cell = match bug() {
        Bug::None => &SHARED,
        Bug::IgnoresTheShare => &IGNORES_THE_SHARE,
        Bug::ReleasesNothing => &RELEASES_NOTHING,
    };
    cell.get_or_init(|| hookinbox_tests::ModelDb::new("hookinbox_model_fair", ""))
}

/// The destination's share, drawn for each case: what its legs' claims
/// record (`LegRequest::fair`).
#[derive(Clone, Copy, Debug)]
struct Share {
    /// Legs in flight an installation keeps.
    cap: i32,
    /// Held whether or not others wait (`per_key_concurrency`).
    hard: bool,
}

#[derive(Clone, Debug)]
enum Op {
    /// GitHub delivers (or redelivers) a delivery; ingest holds it if its
    /// claim finds it crowded, else publishes it, unless it `dies` right
    /// after the claim.
    Claim { leg: usize, dies: bool },
    /// Deliveries of installation `1` come in one batch of claims
    /// (ingest's group commit), which counts each installation's legs once
    /// for the batch: a way its hold and round are gone over. Published or
    /// held as for `Claim`.
    ClaimBatch { legs: Vec<usize> },
    /// A worker takes a leg, presenting the n-th message of it ever handed
    /// out.
    Take { leg: usize, token: usize },
    /// A holder of the leg completes it, presenting the n-th token a take
    /// ever gave it: the live holder, or one whose lease ran out and who
    /// finishes late.
    Complete { leg: usize, token: usize },
    /// A holder of the leg (as for `Complete`) records a transient
    /// failure, due again at once.
    Fail { leg: usize, token: usize },
    /// A database-only handler's one-statement path: the completion is
    /// also the take, presenting the n-th message of the leg ever handed
    /// out and the attempts it was published with.
    Fused { leg: usize, token: usize },
    /// The leg's lease runs out (its holder died, or is only late).
    Expire { leg: usize },
    /// The scheduler runs: it wakes waiting installations whose turn it is
    /// and publishes due legs.
    Schedule,
    /// A worker whose leg ended publishes its installation's next one.
    NextFair { leg: usize },
    /// The reaper runs.
    Reap,
    /// An operator replays a failed leg.
    Replay { leg: usize },
}

struct Model;

impl ReferenceStateMachine for Model {
    type State = Share;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Share> {
        (1..=2i32, any::<bool>())
            .prop_map(|(cap, hard)| Share { cap, hard })
            .boxed()
    }

    fn transitions(_: &Share) -> BoxedStrategy<Op> {
        let leg = 0..LEGS;
        prop_oneof![
            5 => (leg.clone(), prop_oneof![7 => Just(false), 1 => Just(true)])
                .prop_map(|(leg, dies)| Op::Claim { leg, dies }),
            3 => proptest::sample::subsequence((0..4usize).collect::<Vec<_>>(), 2..=3)
                .prop_map(|legs| Op::ClaimBatch { legs }),
            6 => (leg.clone(), 0..6usize).prop_map(|(leg, token)| Op::Take { leg, token }),
            4 => (leg.clone(), 0..3usize).prop_map(|(leg, token)| Op::Complete { leg, token }),
            2 => (leg.clone(), 0..3usize).prop_map(|(leg, token)| Op::Fail { leg, token }),
            2 => (leg.clone(), 0..6usize).prop_map(|(leg, token)| Op::Fused { leg, token }),
            1 => leg.clone().prop_map(|leg| Op::Expire { leg }),
            2 => Just(Op::Schedule),
            3 => leg.clone().prop_map(|leg| Op::NextFair { leg }),
            1 => Just(Op::Reap),
            1 => leg.clone().prop_map(|leg| Op::Replay { leg }),
        ]
        .boxed()
    }

    fn apply(state: Share, _: &Op) -> Share {
        state
    }
}

/// One leg's row, as the checks read it.
#[derive(Debug)]
struct Row {
    leg: usize,
    installation: String,
    status: String,
    attempts: i32,
    class: Option<String>,
    parked: bool,
}

impl Row {
    /// Taken (or published again for a retry) and not ended: what the
    /// share counts.
    fn in_flight(&self) -> bool {
        self.status == "processing" && self.attempts > 0
    }

    /// Claimed or released, and not taken yet.
    fn waiting_for_take(&self) -> bool {
        self.status == "processing" && self.attempts == 0
    }

    /// Held by its claim or yielded at its take: waits its installation's
    /// turn.
    fn waiting_its_turn(&self) -> bool {
        self.status == "failed" && self.class.as_deref() == Some("fair")
    }
}

/// What a take came to, as the checks see it.
enum Taken {
    /// The take started the leg under this token.
    Started(ClaimToken),
    /// The leg yielded its installation's turn.
    Yielded,
    /// Anything else: a copy deferred to a live lease, or a leg that
    /// moved on.
    Not,
}

struct Sut {
    source: SourceName,
    keys: Vec<LegKey>,
    share: Share,
    /// Every message handed out per leg (by claims, releases, the
    /// scheduler, replays), in that order: its token and the attempts it
    /// was published with.
    messages: Vec<Vec<(ClaimToken, i32)>>,
    /// Every token a take gave each leg, in that order.
    holders: Vec<Vec<ClaimToken>>,
    /// The token of each leg's last successful take, while its holder is
    /// alive.
    held: Vec<Option<ClaimToken>>,
    /// How many times each leg's completion went through.
    completions: Vec<usize>,
    policy: Policy,
}

impl Sut {
    fn leg_of(&self, key: &LegKey) -> usize {
        self.keys
            .iter()
            .position(|k| k == key)
            .expect("a leg of the case")
    }

    /// Every leg of the case that was claimed.
    async fn rows(&self) -> Vec<Row> {
        let client = shared().pool.get().await.expect("client");
        client
            .query(
                "select d.delivery_id, d.fair_key, d.status, d.attempts, d.last_error_class, \
                        exists (select 1 from bodies b \
                                where b.provider = d.provider and b.source = d.source \
                                  and b.hook_id = d.hook_id and b.delivery_id = d.delivery_id \
                                  and b.received_at = d.created_at) \
                 from deliveries d where d.source = $1 and d.destination = $2",
                &[&self.source.as_str(), &DESTINATION],
            )
            .await
            .expect("rows")
            .iter()
            .map(|r| {
                let id: String = r.get(0);
                Row {
                    leg: self
                        .keys
                        .iter()
                        .position(|k| k.delivery_id.as_str() == id)
                        .expect("a leg of the case"),
                    installation: r.get(1),
                    status: r.get(2),
                    attempts: r.get(3),
                    class: r.get(4),
                    parked: r.get(5),
                }
            })
            .collect()
    }

    /// Whether the share holds `leg` back, judged on `rows` as its take
    /// finds them: its installation has its share of other legs in flight,
    /// and another installation's leg waits for its take or the cap is
    /// hard. What a take starting the leg must not meet, and what a take
    /// that yields must.
    fn share_reached(&self, leg: usize, rows: &[Row]) -> bool {
        let mine = installation_of(leg);
        let in_flight = rows
            .iter()
            .filter(|r| r.leg != leg && r.installation == mine && r.in_flight())
            .count();
        let others_wait = rows
            .iter()
            .any(|r| r.installation != mine && r.waiting_for_take());
        in_flight >= self.share.cap as usize && (self.share.hard || others_wait)
    }

    /// Checked after every step: every leg waiting its turn can be
    /// released, its body parked.
    async fn check(&self) {
        let rows = self.rows().await;
        for r in rows.iter().filter(|r| r.waiting_its_turn()) {
            assert!(
                r.parked,
                "leg {} waits its installation's turn without its body parked ({rows:?})",
                r.leg
            );
        }
    }

    /// A message of `leg` handed out under `token`, after `attempts`.
    fn published(&mut self, leg: usize, token: ClaimToken, attempts: i32) {
        self.messages[leg].push((token, attempts));
    }

    /// A worker takes `leg` presenting `presented`; returns the holder's
    /// token when the take started it.
    async fn take(&mut self, leg: usize, presented: ClaimToken) -> Option<ClaimToken> {
        let before = self.rows().await;
        let client = shared().pool.get().await.expect("client");
        let take = if bug() == Bug::IgnoresTheShare {
            // A take that forgot the share: what the checks must catch.
            let token = ClaimToken::new();
            let k = &self.keys[leg];
            let row = client
                .query_opt(
                    "update deliveries set status = 'processing', retryable = false, \
                         next_attempt_at = null, claim_token = $6, \
                         lease_until = now() + interval '60 s', attempts = attempts + 1 \
                     where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4 \
                       and destination = $5 \
                       and ((status = 'processing' and (claim_token = $7 or lease_until < now())) \
                            or (status = 'failed' and last_error_class = 'lost')) \
                     returning 1",
                    &[
                        &k.provider.as_str(),
                        &k.source.as_str(),
                        &k.hook_id.as_str(),
                        &k.delivery_id.as_str(),
                        &k.destination.as_str(),
                        &token.0,
                        &presented.0,
                    ],
                )
                .await
                .expect("buggy take");
            match row {
                Some(_) => Taken::Started(token),
                None => Taken::Not,
            }
        } else {
            match deliveries::take(
                &client,
                &self.policy,
                &self.keys[leg],
                presented,
                MAX_ATTEMPTS,
            )
            .await
            .expect("take")
            {
                Take::Taken { token, .. } => Taken::Started(token),
                Take::Waiting => Taken::Yielded,
                Take::Poisoned { attempts } => {
                    panic!("leg {leg} poisoned after {attempts} attempts ({before:?})")
                }
                _ => Taken::Not,
            }
        };
        match take {
            Taken::Started(token) => {
                reached(STARTED);
                assert!(
                    !self.share_reached(leg, &before),
                    "leg {leg} of installation {} started with its installation's share ({:?}) \
                     in flight ({before:?})",
                    installation_of(leg),
                    self.share
                );
                self.held[leg] = Some(token);
                self.holders[leg].push(token);
                Some(token)
            }
            Taken::Yielded => {
                reached(YIELDED);
                assert!(
                    self.share_reached(leg, &before),
                    "leg {leg} of installation {} yielded under its share ({:?}) ({before:?})",
                    installation_of(leg),
                    self.share
                );
                None
            }
            Taken::Not => None,
        }
    }

    /// A holder of `leg`, under `token`, completes it; returns whether the
    /// completion went through.
    async fn complete(&mut self, leg: usize, token: ClaimToken) -> bool {
        let client = shared().pool.get().await.expect("client");
        let done = deliveries::complete(&client, &self.keys[leg], token, None, MAX_ATTEMPTS)
            .await
            .expect("complete");
        if done.is_some() {
            self.held[leg] = None;
            self.completed(leg);
        }
        done.is_some()
    }

    /// The one check of a completion that went through: the leg's first.
    fn completed(&mut self, leg: usize) {
        reached(COMPLETED);
        self.completions[leg] += 1;
        assert_eq!(
            self.completions[leg], 1,
            "leg {leg} completed a second time"
        );
    }

    /// The one-statement path: the completion takes the leg, presenting a
    /// message's token and the attempts it was published with, and the
    /// worker then releases its installation's next leg. Fenced, it
    /// changes nothing (the worker goes the full way: a `Take`).
    async fn fused(&mut self, leg: usize, presented: ClaimToken, attempts: i32) {
        let before = self.rows().await;
        let client = shared().pool.get().await.expect("client");
        let done = deliveries::complete(
            &client,
            &self.keys[leg],
            presented,
            Some(attempts),
            MAX_ATTEMPTS,
        )
        .await
        .expect("fused completion");
        if done.is_some() {
            reached(FUSED);
            assert!(
                !self.share_reached(leg, &before),
                "leg {leg} of installation {} ran on the one-statement path with its \
                 installation's share ({:?}) in flight ({before:?})",
                installation_of(leg),
                self.share
            );
            self.completed(leg);
            self.next_fair(leg).await;
        }
    }

    /// A worker whose leg `leg` ended publishes its installation's next.
    async fn next_fair(&mut self, leg: usize) {
        if bug() == Bug::ReleasesNothing {
            return;
        }
        let client = shared().pool.get().await.expect("client");
        let next = deliveries::next_fair(&client, &self.policy, &self.keys[leg])
            .await
            .expect("next fair");
        if let Some(Ok(parked)) = next {
            reached(RELEASED);
            let next = self.leg_of(&parked.envelope.key);
            assert_eq!(
                installation_of(next),
                installation_of(leg),
                "leg {leg}'s end released leg {next} of another installation"
            );
            self.published(next, parked.envelope.token, parked.attempts);
        }
    }

    /// The scheduler's pass: the wake of fair legs, then its pick.
    async fn schedule(&mut self) {
        let waiting: Vec<usize> = self
            .rows()
            .await
            .iter()
            .filter(|r| r.waiting_its_turn())
            .map(|r| r.leg)
            .collect();
        let client = shared().pool.get().await.expect("client");
        if bug() != Bug::ReleasesNothing {
            deliveries::wake_fair(&client).await.expect("wake");
        }
        let due = deliveries::schedule_due(&client, &self.policy, 100)
            .await
            .expect("schedule");
        for parked in due.into_iter().flatten() {
            if parked.envelope.key.source == self.source {
                let leg = self.leg_of(&parked.envelope.key);
                if waiting.contains(&leg) {
                    reached(WOKEN);
                }
                self.published(leg, parked.envelope.token, parked.attempts);
            }
        }
    }

    /// GitHub delivers each of `legs` (several: in one batch of claims);
    /// ingest holds each when its claim says so, as `hold_leg` does, and
    /// publishes it otherwise, unless it `dies` first: then the claim waits
    /// for its lease, the reaper and a redelivery.
    async fn claim(&mut self, legs: &[usize], dies: bool) {
        let before = self.rows().await;
        let client = shared().pool.get().await.expect("client");
        let requests: Vec<ClaimRequest> = legs.iter().map(|&leg| self.request(leg)).collect();
        let claims = deliveries::claim_batch(&client, &self.policy, &requests)
            .await
            .expect("claim");
        for (&leg, claim) in legs.iter().zip(claims) {
            let deliveries::Claim::Legs(claimed) = claim else {
                continue;
            };
            self.claimed(&client, leg, claimed, &before, dies).await;
        }
    }

    /// A claim's request for `leg`'s delivery.
    fn request(&self, leg: usize) -> ClaimRequest {
        let fair = (
            installation_of(leg).to_owned(),
            self.share.cap,
            self.share.hard,
        );
        hookinbox_tests::model_claim(&self.keys[leg], leg as u8, None, Some(fair))
    }

    /// What ingest does with `leg`'s claimed legs, checked against the
    /// rows `before` the claim (the same for every claim of a batch).
    async fn claimed(
        &mut self,
        client: &deadpool_postgres::Client,
        leg: usize,
        legs: Vec<(DestinationName, LegClaim)>,
        before: &[Row],
        dies: bool,
    ) {
        for (_, claimed) in legs {
            match claimed {
                LegClaim::Claimed {
                    token,
                    reclaimed,
                    attempts,
                    held,
                } => {
                    let mine = || {
                        before
                            .iter()
                            .filter(|r| r.installation == installation_of(leg))
                    };
                    let crowd = mine().filter(|r| r.waiting_for_take()).count();
                    // The least hold there is: one share, a hard cap's;
                    // the least round: two shares, queued and running; or
                    // behind its waiting legs with its share running.
                    let hold = self.share.cap as usize;
                    let running = mine().filter(|r| r.in_flight()).count();
                    let behind = mine().any(|r| r.waiting_its_turn());
                    assert!(
                        !held
                            || (!reclaimed
                                && ((crowd >= hold
                                    && (self.share.hard || running >= self.share.cap as usize))
                                    || (!self.share.hard
                                        && (crowd + running >= 2 * hold
                                            || (behind && running >= self.share.cap as usize))))),
                        "leg {leg} held with {crowd} legs of its installation queued and {running} running \
                         ({:?}, reclaimed: {reclaimed}) ({before:?})",
                        self.share
                    );
                    assert!(
                        held || reclaimed || !self.share.hard || crowd < hold,
                        "leg {leg} not held with {crowd} legs of its installation queued \
                         under a hard cap of {} ({before:?})",
                        self.share.cap
                    );
                    if dies {
                        continue;
                    }
                    if held {
                        let parked =
                            deliveries::hold_fair(client, &self.keys[leg], token, attempts)
                                .await
                                .expect("hold fair");
                        assert!(parked, "leg {leg}'s hold found it moved on");
                        reached(HELD);
                    } else {
                        self.published(leg, token, attempts);
                    }
                }
                // Only an untaken claim is republished.
                LegClaim::Republish { token } if !dies => self.published(leg, token, 0),
                _ => {}
            }
        }
    }

    /// The `n`-th token a take ever gave `leg` (wrapping), if any.
    fn holder(&self, leg: usize, n: usize) -> Option<ClaimToken> {
        let seen = &self.holders[leg];
        (!seen.is_empty()).then(|| seen[n % seen.len()])
    }

    async fn apply(&mut self, op: Op) {
        let client = shared().pool.get().await.expect("client");
        match op {
            Op::Claim { leg, dies } => self.claim(&[leg], dies).await,
            Op::ClaimBatch { legs } => self.claim(&legs, false).await,
            Op::Take { leg, token } => {
                let seen = &self.messages[leg];
                if seen.is_empty() {
                    return;
                }
                let (presented, _) = seen[token % seen.len()];
                self.take(leg, presented).await;
            }
            Op::Complete { leg, token } => {
                if let Some(presented) = self.holder(leg, token) {
                    self.complete(leg, presented).await;
                }
            }
            Op::Fail { leg, token } => {
                let Some(token) = self.holder(leg, token) else {
                    return;
                };
                let failure = Failure {
                    class: ErrorClass::Transient,
                    message: "model".into(),
                    retry_in: Some(Duration::ZERO),
                };
                let failed = deliveries::fail(&client, &self.keys[leg], token, &failure)
                    .await
                    .expect("fail");
                if failed.is_some() {
                    self.held[leg] = None;
                }
            }
            Op::Expire { leg } => {
                let k = &self.keys[leg];
                client
                    .execute(
                        "update deliveries set lease_until = now() - interval '1 s' \
                         where source = $1 and delivery_id = $2 and status = 'processing'",
                        &[&k.source.as_str(), &k.delivery_id.as_str()],
                    )
                    .await
                    .expect("expire");
                // Its holder died with it.
                self.held[leg] = None;
            }
            Op::Schedule => self.schedule().await,
            Op::NextFair { leg } => self.next_fair(leg).await,
            Op::Reap => {
                deliveries::reap(&client, Duration::ZERO, 100)
                    .await
                    .expect("reap");
            }
            Op::Replay { leg } => {
                if let Replayed::Started(parked) = deliveries::replay(
                    &client,
                    &self.policy,
                    &self.keys[leg],
                    deliveries::Scope::Failed,
                )
                .await
                .expect("replay")
                {
                    self.published(leg, parked.envelope.token, parked.attempts);
                }
            }
            Op::Fused { leg, token } => {
                let seen = &self.messages[leg];
                if seen.is_empty() {
                    return;
                }
                let (presented, attempts) = seen[token % seen.len()];
                self.fused(leg, presented, attempts).await;
            }
        }
        self.check().await;
    }

    /// Nothing lost: the fleet carries on until every claimed leg is
    /// completed. Each round is a scheduler pass, then each leg's worker:
    /// a live holder completes its leg, else the leg's latest message is
    /// taken and completed, and after each completion the worker releases
    /// its installation's next leg. A round that completes nothing lets
    /// time pass: every lease runs out (holders are gone by then), the
    /// reaper runs, and GitHub redelivers the legs with no body parked
    /// that it turned `lost` (an ingest died before its publish). No
    /// operator: a leg waiting its turn is not due, so a redelivery does
    /// not take it back, and one that only a replay could bring back
    /// counts as stranded.
    async fn drain(&mut self) {
        for _ in 0..DRAIN_ROUNDS {
            let rows = self.rows().await;
            if rows.iter().all(|r| r.status == "completed") {
                break;
            }
            self.schedule().await;
            let mut completed = false;
            for leg in 0..LEGS {
                let Some(row) = rows.iter().find(|r| r.leg == leg) else {
                    continue;
                };
                if row.status == "completed" {
                    continue;
                }
                // A holder the row no longer knows gives up on the leg.
                let token = match self.held[leg].take() {
                    Some(token) => Some(token),
                    None => match self.messages[leg].last() {
                        Some(&(latest, _)) => self.take(leg, latest).await,
                        None => None,
                    },
                };
                if let Some(token) = token
                    && self.complete(leg, token).await
                {
                    self.next_fair(leg).await;
                    completed = true;
                }
                self.held[leg] = None;
                self.check().await;
            }
            if !completed {
                let client = shared().pool.get().await.expect("client");
                client
                    .execute(
                        "update deliveries set lease_until = now() - interval '1 s' \
                         where source = $1 and status = 'processing'",
                        &[&self.source.as_str()],
                    )
                    .await
                    .expect("leases run out");
                deliveries::reap(&client, Duration::ZERO, 100)
                    .await
                    .expect("reap");
                // The reconciler has GitHub redeliver what only a
                // redelivery can finish: no body parked, reaped.
                for r in self.rows().await {
                    if r.status == "failed" && r.class.as_deref() == Some("lost") && !r.parked {
                        self.claim(&[r.leg], false).await;
                    }
                }
            }
        }
        let rows = self.rows().await;
        for r in &rows {
            assert!(
                r.status == "completed" && self.completions[r.leg] == 1,
                "leg {} stranded: {} after {DRAIN_ROUNDS} rounds of the drain, completed {} \
                 times ({:?}) ({rows:?})",
                r.leg,
                r.status,
                self.completions[r.leg],
                self.share
            );
        }
    }
}

struct FairnessStateMachine;

impl StateMachineTest for FairnessStateMachine {
    type SystemUnderTest = Sut;
    type Reference = Model;

    fn init_test(share: &Share) -> Sut {
        let source = SourceName::parse(&format!(
            "f{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ))
        .expect("source");
        let keys = (0..LEGS)
            .map(|_| {
                DeliveryKey::github(
                    source.clone(),
                    HookId::parse(Some(b"1")).expect("hook"),
                    DeliveryId::parse(uuid::Uuid::new_v4().to_string().as_bytes()).expect("id"),
                )
                .leg(DestinationName::parse(DESTINATION).expect("name"))
            })
            .collect();
        Sut {
            source,
            keys,
            share: *share,
            messages: vec![Vec::new(); LEGS],
            holders: vec![Vec::new(); LEGS],
            held: vec![None; LEGS],
            completions: vec![0; LEGS],
            policy: Policy {
                lease: Duration::from_secs(60),
                max_attempts: MAX_ATTEMPTS,
                publish_timeout: Duration::from_secs(5),
            },
        }
    }

    fn apply(mut sut: Sut, _: &Share, op: Op) -> Sut {
        shared().runtime.block_on(sut.apply(op));
        sut
    }

    fn teardown(mut sut: Sut, _: Share) {
        shared().runtime.block_on(sut.drain());
    }
}

prop_state_machine! {
    #![proptest_config(Config {
        cases: hookinbox_tests::proptest_cases(256),
        failure_persistence: None,
        .. Config::default()
    })]

    fn run_every_case(sequential 1..60 => FairnessStateMachine);
}

prop_state_machine! {
    #![proptest_config(Config {
        cases: 64,
        failure_persistence: None,
        max_shrink_iters: 0,
        .. Config::default()
    })]

    fn run_with_a_planted_bug(sequential 1..60 => FairnessStateMachine);
}

#[test]
fn fair_legs_keep_their_share_and_none_is_lost() {
    run_every_case();
    hookinbox_tests::assert_reached(&REACHED, &PATHS);
    shared().drop_database();
}

/// Runs the machine with `planted` and expects the checks to fail.
fn catches(planted: Bug) {
    hookinbox_tests::expect_planted_bug_caught(
        |on| BUG.with(|b| b.set(if on { planted } else { Bug::None })),
        run_with_a_planted_bug,
        &format!("{planted:?}"),
    );
    shared().drop_database();
}

#[test]
fn a_planted_take_that_ignores_the_share_is_caught() {
    catches(Bug::IgnoresTheShare);
}

#[test]
fn a_planted_release_that_releases_nothing_is_caught() {
    catches(Bug::ReleasesNothing);
}
