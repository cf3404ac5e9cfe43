//! Model-based test of ordered legs against the real Postgres: random
//! interleavings of claims (and redeliveries), takes presenting any token
//! ever handed out, completions, transient and permanent failures, lease
//! expiry, the scheduler (its wake of ordered keys and its pick), a
//! worker's publish of a key's next leg, the reaper, replays, and an operator's skip and retry of a halted key, on
//! four deliveries of one key and one of another, to a destination ordered
//! by repository. Checked after every step:
//!
//! - a take starts a leg only when every earlier leg of its key (by claim
//!   order) is completed or skipped: legs start in claim order;
//! - no take starts a leg while another leg of its key is held under a
//!   live lease: one in flight per key;
//! - a key's legs complete in claim order, each at most once;
//! - a leg that waits has an earlier open leg of its key, and a leg of
//!   another key never waits for this one.
//!
//! `a_planted_bug_that_lets_two_legs_of_a_key_run_at_once_is_caught` runs
//! the same machine with a take that forgets the order gate, and expects
//! the checks to fail: the test can see the bug it is there to catch.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hookinbox::deliveries::{self, ErrorClass, Failure, LegClaim, Policy, Replayed, Take};
use hookinbox::key::{
    ClaimToken, DeliveryId, DeliveryKey, DestinationName, HookId, LegKey, SourceName,
};
use proptest::prelude::*;
use proptest::test_runner::Config;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};

const MAX_ATTEMPTS: i32 = 4;
/// Deliveries 0..4 are of key `7`; the last is of key `8`.
const LEGS: usize = 5;
const DESTINATION: &str = "o";

fn key_of(leg: usize) -> &'static str {
    if leg < LEGS - 1 { "7" } else { "8" }
}

/// How often the cases reached each path (takes that started a leg, legs
/// that waited, completions, skips, retries): the run must reach them all.
static REACHED: [AtomicUsize; 5] = [const { AtomicUsize::new(0) }; 5];
const STARTED: usize = 0;
const WAITED: usize = 1;
const COMPLETED: usize = 2;
const SKIPPED: usize = 3;
const RETRIED: usize = 4;

fn reached(path: usize) {
    REACHED[path].fetch_add(1, Ordering::Relaxed);
}

thread_local! {
    /// The planted bug: takes that ignore the order gate.
    static BUGGY: Cell<bool> = const { Cell::new(false) };
}

/// One database and runtime for each of the two tests (the planted bug's
/// its own, so that either can drop its database when done).
fn shared() -> &'static hookinbox_tests::ModelDb {
    static SHARED: OnceLock<hookinbox_tests::ModelDb> = OnceLock::new();
    static PLANTED: OnceLock<hookinbox_tests::ModelDb> = OnceLock::new();
    let cell = if BUGGY.with(Cell::get) {
        &PLANTED
    } else {
        &SHARED
    };
    cell.get_or_init(|| hookinbox_tests::ModelDb::new("hookinbox_model_order", ""))
}

#[derive(Clone, Debug)]
enum Op {
    /// GitHub delivers (or redelivers) a delivery.
    Claim { leg: usize },
    /// A worker takes a leg, presenting the n-th token ever seen of it.
    Take { leg: usize, token: usize },
    /// The leg's holder completes it.
    Complete { leg: usize },
    /// The leg's holder records a failure, retryable or for good.
    Fail { leg: usize, permanent: bool },
    /// The leg's lease runs out (its holder died).
    Expire { leg: usize },
    /// The scheduler runs: it wakes ordered keys and publishes due legs.
    Schedule,
    /// A worker that completed a leg publishes its key's next one.
    NextOfKey { leg: usize },
    /// The reaper runs.
    Reap,
    /// An operator replays a failed leg.
    Replay { leg: usize },
    /// An operator skips the leg that halts key `7`.
    Skip,
    /// An operator retries the leg that halts key `7`, in its place.
    Retry,
}

struct Model;

impl ReferenceStateMachine for Model {
    type State = ();
    type Transition = Op;

    fn init_state() -> BoxedStrategy<()> {
        Just(()).boxed()
    }

    fn transitions(_: &()) -> BoxedStrategy<Op> {
        let leg = 0..LEGS;
        prop_oneof![
            4 => leg.clone().prop_map(|leg| Op::Claim { leg }),
            6 => (leg.clone(), 0..6usize).prop_map(|(leg, token)| Op::Take { leg, token }),
            4 => leg.clone().prop_map(|leg| Op::Complete { leg }),
            3 => (leg.clone(), prop_oneof![1 => Just(false), 1 => Just(true)])
                .prop_map(|(leg, permanent)| Op::Fail { leg, permanent }),
            1 => leg.clone().prop_map(|leg| Op::Expire { leg }),
            3 => Just(Op::Schedule),
            2 => leg.clone().prop_map(|leg| Op::NextOfKey { leg }),
            1 => Just(Op::Reap),
            1 => leg.clone().prop_map(|leg| Op::Replay { leg }),
            2 => Just(Op::Skip),
            2 => Just(Op::Retry),
        ]
        .boxed()
    }

    fn apply(state: (), _: &Op) {
        state
    }
}

/// One leg's row, as the checks read it.
#[derive(Debug)]
struct Row {
    leg: usize,
    seq: i64,
    status: String,
    skipped: bool,
    token: uuid::Uuid,
    live: bool,
}

struct Sut {
    source: SourceName,
    keys: Vec<LegKey>,
    /// Every token handed out per leg.
    tokens: Vec<Vec<ClaimToken>>,
    /// The token of each leg's last successful take, while its holder is
    /// alive.
    held: Vec<Option<ClaimToken>>,
    /// Each key's completed legs' places, in the order they completed.
    completions: Vec<(String, i64)>,
    policy: Policy,
}

impl Sut {
    fn leg_of(&self, key: &LegKey) -> usize {
        self.keys
            .iter()
            .position(|k| k == key)
            .expect("a leg of the case")
    }

    async fn rows(&self, order_key: &str) -> Vec<Row> {
        let client = shared().pool.get().await.expect("client");
        client
            .query(
                "select delivery_id, order_seq, status, order_skipped_at is not null, \
                        claim_token, coalesce(lease_until > now(), false) \
                 from deliveries where source = $1 and destination = $2 and order_key = $3",
                &[&self.source.as_str(), &DESTINATION, &order_key],
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
                    seq: r.get(1),
                    status: r.get(2),
                    skipped: r.get(3),
                    token: r.get(4),
                    live: r.get(5),
                }
            })
            .collect()
    }

    /// The checks on a take that started `leg` under `token`.
    async fn started(&mut self, leg: usize, token: ClaimToken) {
        reached(STARTED);
        let rows = self.rows(key_of(leg)).await;
        let me = rows.iter().find(|r| r.leg == leg).expect("its row");
        for other in rows.iter().filter(|r| r.leg != leg) {
            let finished =
                other.status == "completed" || (other.status == "failed" && other.skipped);
            assert!(
                other.seq > me.seq || finished,
                "leg {leg} started ahead of leg {} of its key, which was claimed before it and is \
                 {} ({rows:?})",
                other.leg,
                other.status
            );
            let running = self.held[other.leg]
                .is_some_and(|t| other.status == "processing" && other.token == t.0 && other.live);
            assert!(
                !running,
                "legs {leg} and {} of one key at once ({rows:?})",
                other.leg
            );
        }
        for held in self
            .held
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| *i == leg)
            .map(|(_, h)| h)
        {
            *held = Some(token);
        }
        self.tokens[leg].push(token);
    }

    async fn take(&mut self, leg: usize, presented: ClaimToken) {
        let client = shared().pool.get().await.expect("client");
        if BUGGY.with(Cell::get) {
            // A take that forgot the order gate: what the checks must catch.
            let token = ClaimToken::new();
            let k = &self.keys[leg];
            let row = client
                .query_opt(
                    "update deliveries set status = 'processing', claim_token = $6, \
                         lease_until = now() + interval '60 s', attempts = attempts + 1 \
                     where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4 \
                       and destination = $5 and attempts < 4 \
                       and ((status = 'processing' and (claim_token = $7 or lease_until < now())) \
                            or (status = 'failed' and last_error_class in ('lost', 'ordered'))) \
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
            if row.is_some() {
                self.started(leg, token).await;
            }
            return;
        }
        let take = deliveries::take(
            &client,
            &self.policy,
            &self.keys[leg],
            presented,
            MAX_ATTEMPTS,
        )
        .await
        .expect("take");
        match take {
            Take::Taken { token, .. } => self.started(leg, token).await,
            Take::Waiting => {
                reached(WAITED);
                assert!(leg < LEGS - 1, "a leg of key 8 waited for key 7's legs");
                let rows = self.rows(key_of(leg)).await;
                let me = rows.iter().find(|r| r.leg == leg).expect("its row");
                assert!(
                    rows.iter().any(|r| r.seq < me.seq
                        && (r.status == "processing" || (r.status == "failed" && !r.skipped))),
                    "leg {leg} waits with no open leg before it ({rows:?})"
                );
            }
            _ => {}
        }
    }

    async fn apply(&mut self, op: Op) {
        let client = shared().pool.get().await.expect("client");
        match op {
            Op::Claim { leg } => {
                let k = &self.keys[leg];
                let claim = deliveries::claim(
                    &client,
                    &self.policy,
                    &hookinbox_tests::model_claim(k, leg as u8, Some(key_of(leg).to_owned()), None),
                )
                .await
                .expect("claim");
                if let deliveries::Claim::Legs(legs) = claim {
                    for (_, claimed) in legs {
                        match claimed {
                            LegClaim::Claimed { token, .. } | LegClaim::Republish { token } => {
                                self.tokens[leg].push(token)
                            }
                            _ => {}
                        }
                    }
                }
            }
            Op::Take { leg, token } => {
                let seen = &self.tokens[leg];
                if seen.is_empty() {
                    return;
                }
                let presented = seen[token % seen.len()];
                self.take(leg, presented).await;
            }
            Op::Complete { leg } => {
                let Some(token) = self.held[leg] else {
                    return;
                };
                let done =
                    deliveries::complete(&client, &self.keys[leg], token, None, MAX_ATTEMPTS)
                        .await
                        .expect("complete");
                self.held[leg] = None;
                if done.is_some() {
                    reached(COMPLETED);
                    let rows = self.rows(key_of(leg)).await;
                    let seq = rows.iter().find(|r| r.leg == leg).expect("its row").seq;
                    let key = key_of(leg).to_owned();
                    if let Some((_, last)) = self.completions.iter().rev().find(|(k, _)| *k == key)
                    {
                        assert!(
                            *last < seq,
                            "leg {leg} (place {seq}) completed after a later leg (place {last})"
                        );
                    }
                    self.completions.push((key, seq));
                }
            }
            Op::Fail { leg, permanent } => {
                let Some(token) = self.held[leg] else {
                    return;
                };
                let failure = Failure {
                    class: if permanent {
                        ErrorClass::Permanent
                    } else {
                        ErrorClass::Transient
                    },
                    message: "model".into(),
                    retry_in: (!permanent).then_some(Duration::ZERO),
                };
                deliveries::fail(&client, &self.keys[leg], token, &failure)
                    .await
                    .expect("fail");
                self.held[leg] = None;
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
            Op::Schedule => {
                deliveries::wake_ordered(&client).await.expect("wake");
                let due = deliveries::schedule_due(&client, &self.policy, 100)
                    .await
                    .expect("schedule");
                for parked in due.into_iter().flatten() {
                    if parked.envelope.key.source == self.source {
                        let leg = self.leg_of(&parked.envelope.key);
                        self.tokens[leg].push(parked.envelope.token);
                    }
                }
            }
            Op::NextOfKey { leg } => {
                let next = deliveries::next_of_key(&client, &self.policy, &self.keys[leg])
                    .await
                    .expect("next of key");
                if let Some(Ok(parked)) = next {
                    let next = self.leg_of(&parked.envelope.key);
                    assert_eq!(key_of(next), key_of(leg), "another key's leg");
                    self.tokens[next].push(parked.envelope.token);
                }
            }
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
                    self.tokens[leg].push(parked.envelope.token);
                }
            }
            Op::Skip | Op::Retry => {
                let destination = DestinationName::parse(DESTINATION).expect("name");
                if matches!(op, Op::Skip) {
                    let skipped =
                        deliveries::skip(&client, &self.source, &destination, "7", "model")
                            .await
                            .expect("skip");
                    if skipped.is_some() {
                        reached(SKIPPED);
                    }
                } else {
                    let retried = deliveries::retry(&client, &self.source, &destination, "7")
                        .await
                        .expect("retry");
                    if retried.is_some() {
                        reached(RETRIED);
                    }
                }
            }
        }
    }
}

struct OrderingStateMachine;

impl StateMachineTest for OrderingStateMachine {
    type SystemUnderTest = Sut;
    type Reference = Model;

    fn init_test(_: &()) -> Sut {
        let source = SourceName::parse(&format!(
            "o{}",
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
            tokens: vec![Vec::new(); LEGS],
            held: vec![None; LEGS],
            completions: Vec::new(),
            policy: Policy {
                lease: Duration::from_secs(60),
                max_attempts: MAX_ATTEMPTS,
                publish_timeout: Duration::from_secs(5),
            },
        }
    }

    fn apply(mut sut: Sut, _: &(), op: Op) -> Sut {
        shared().runtime.block_on(sut.apply(op));
        sut
    }
}

prop_state_machine! {
    #![proptest_config(Config {
        cases: hookinbox_tests::proptest_cases(256),
        failure_persistence: None,
        .. Config::default()
    })]

    fn run_every_case(sequential 1..80 => OrderingStateMachine);
}

prop_state_machine! {
    #![proptest_config(Config {
        cases: 64,
        failure_persistence: None,
        max_shrink_iters: 0,
        .. Config::default()
    })]

    fn run_with_the_planted_bug(sequential 1..60 => OrderingStateMachine);
}

#[test]
fn ordered_legs_start_and_complete_in_claim_order_one_at_a_time() {
    run_every_case();
    hookinbox_tests::assert_reached(
        &REACHED,
        &["started", "waited", "completed", "skipped", "retried"],
    );
    shared().drop_database();
}

#[test]
fn a_planted_bug_that_lets_two_legs_of_a_key_run_at_once_is_caught() {
    hookinbox_tests::expect_planted_bug_caught(
        |on| BUGGY.with(|b| b.set(on)),
        run_with_the_planted_bug,
        "a take that ignores the order gate",
    );
    shared().drop_database();
}
