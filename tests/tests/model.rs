//! Model-based test of the delivery state machine against the real
//! Postgres: random interleavings of claim, take, renew, complete, fail,
//! lease expiry, the scheduler, replay, sweep, reap and the breaker's gate,
//! on a delivery with two legs (destinations `a` and `b`), with the
//! invariants checked after every step:
//!
//! - at most one completed effect per leg;
//! - `completed` never goes back, and a `filtered` leg never changes;
//! - a write with a stale token never changes its leg, and a write on one
//!   leg never changes the other;
//! - a delivery's legs are decided by its first claim: a later claim never
//!   adds one;
//! - `attempts` never exceeds the maximum (a replay resets it to 0), and a
//!   failure the destination caused (`held`) gives its attempt back;
//! - while leg `b`'s destination is not closed, no take and no scheduler
//!   pass starts it, and a take that meets the gate holds it without
//!   spending an attempt;
//! - a completion that is also the take (the worker's one-statement path)
//!   changes the row only when it is processing under the presented token
//!   with the presented attempts, fewer than the maximum, and then counts
//!   its attempt;
//! - every leg that has not ended (processing, retrying, waiting, dead) has
//!   its delivery's body in Postgres, written once by the first claim;
//! - when the broker loses every message of the delivery (`LoseMessages`),
//!   the reaper and the scheduler publish each leg that has not ended again
//!   under a new token (but one behind its closed gate, which waits for its
//!   destination), so nothing answered 202 is left without a way out;
//! - a replay of a completed leg (`ReplayAny`) starts it again under a new
//!   token with its attempts at 0, and each replay adds at most one effect.
//!
//! Lease expiry is a transition of its own (it backdates `lease_until`), so
//! the test never waits for a clock.
//!
//! `a_planted_claim_that_writes_no_body_is_caught` runs the same machine
//! with a claim that leaves no body behind (what every claim did before
//! Postgres was the record), and expects the checks to fail.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::Duration;

use hookinbox::deliveries::{
    self, ClaimRequest, ErrorClass, Failure, LegClaim, LegRequest, Policy, Status, StoredEvent,
    Take, Taking,
};
use hookinbox::key::{
    ClaimToken, DeliveryId, DeliveryKey, DestinationName, HookId, LegKey, SourceName,
};
use hookinbox_worker::{Completion, Effect};
use proptest::prelude::*;
use proptest::test_runner::Config;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};

const MAX_ATTEMPTS: i32 = 3;

/// The delivery's two destinations; the breaker's gate is modelled on `b`.
const DESTINATIONS: [&str; 2] = ["a", "b"];

thread_local! {
    /// The planted bug: claims that keep no body.
    static BUGGY: Cell<bool> = const { Cell::new(false) };
}

/// One database and runtime for every case of each test of this binary
/// (the planted bug's its own, so that either can drop its database when
/// done); each case works on its own delivery key.
fn shared() -> &'static hookinbox_tests::ModelDb {
    static SHARED: OnceLock<hookinbox_tests::ModelDb> = OnceLock::new();
    static PLANTED: OnceLock<hookinbox_tests::ModelDb> = OnceLock::new();
    let cell = if BUGGY.with(Cell::get) {
        &PLANTED
    } else {
        &SHARED
    };
    cell.get_or_init(|| {
        hookinbox_tests::ModelDb::new(
            "hookinbox_model",
            "create table model_effects (delivery_id text not null, destination text not null,
                                         at timestamptz not null default now());
             create index on model_effects (delivery_id)",
        )
    })
}

#[derive(Clone, Debug)]
enum Op {
    /// A GitHub delivery (or a copy with another body) reaches ingest; with
    /// `filter_b`, `b`'s filters do not take it (decided at the first
    /// claim only).
    Claim { other_body: bool, filter_b: bool },
    /// A worker takes a leg, presenting the n-th token ever seen of it.
    Take { leg: usize, token: usize },
    /// Two messages of a leg, presenting the n-th and m-th tokens, are
    /// taken in one batch, and what the batch did not take goes through the
    /// full take, as the worker does.
    TakeBatched {
        leg: usize,
        first: usize,
        second: usize,
    },
    /// A holder renews its lease.
    Renew { leg: usize, token: usize },
    /// A holder runs the effect and completes.
    Complete { leg: usize, token: usize },
    /// A worker runs a job without a take: the n-th token, presented with
    /// the attempts it was published with (shifted by `skew`, to present
    /// stale counts too), completed by one statement that is also the take;
    /// the effect staged for the batched completion (leg `a`, the store),
    /// or written in the handler's transaction.
    FusedComplete {
        leg: usize,
        token: usize,
        skew: i32,
        in_transaction: bool,
    },
    /// A holder records a failure; `held`: the destination's, not the
    /// leg's (its attempt is given back).
    Fail {
        leg: usize,
        token: usize,
        retryable: bool,
        held: bool,
    },
    /// Time passes beyond the lease.
    Expire,
    /// Time passes until a retry is due, and the scheduler runs.
    Schedule,
    /// An operator replays a failed leg.
    Replay { leg: usize },
    /// An operator replays a leg that is not in flight, completed ones too.
    ReplayAny { leg: usize },
    /// The broker loses every message of the delivery; then time passes
    /// past the leases and the retries, the reaper and the scheduler run.
    LoseMessages,
    /// The retention sweeper runs.
    Sweep,
    /// The reaper runs.
    Reap,
    /// `b`'s destination opens (`true`) or closes.
    Gate(bool),
}

struct Model;

impl ReferenceStateMachine for Model {
    type State = ();
    type Transition = Op;

    fn init_state() -> BoxedStrategy<()> {
        Just(()).boxed()
    }

    fn transitions(_: &()) -> BoxedStrategy<Op> {
        let leg = 0..2usize;
        let token = 0..8usize;
        prop_oneof![
            3 => (any::<bool>(), prop_oneof![4 => Just(false), 1 => Just(true)])
                .prop_map(|(other_body, filter_b)| Op::Claim { other_body, filter_b }),
            4 => (leg.clone(), token.clone()).prop_map(|(leg, token)| Op::Take { leg, token }),
            2 => (leg.clone(), token.clone(), token.clone())
                .prop_map(|(leg, first, second)| Op::TakeBatched { leg, first, second }),
            2 => (leg.clone(), token.clone()).prop_map(|(leg, token)| Op::Renew { leg, token }),
            4 => (leg.clone(), token.clone()).prop_map(|(leg, token)| Op::Complete { leg, token }),
            4 => (leg.clone(), token.clone(), prop_oneof![6 => Just(0), 1 => Just(-1), 1 => Just(1)], any::<bool>())
                .prop_map(|(leg, token, skew, in_transaction)| Op::FusedComplete { leg, token, skew, in_transaction }),
            3 => (leg.clone(), token.clone(), any::<bool>(), prop_oneof![3 => Just(false), 1 => Just(true)])
                .prop_map(|(leg, token, retryable, held)| Op::Fail { leg, token, retryable, held }),
            2 => Just(Op::Expire),
            2 => Just(Op::Schedule),
            1 => leg.clone().prop_map(|leg| Op::Replay { leg }),
            1 => leg.clone().prop_map(|leg| Op::ReplayAny { leg }),
            1 => Just(Op::LoseMessages),
            1 => Just(Op::Sweep),
            1 => Just(Op::Reap),
            2 => any::<bool>().prop_map(Op::Gate),
        ]
        .boxed()
    }

    fn apply(state: (), _: &Op) {
        state
    }
}

/// What a leg's row looked like, for the stale-write check.
#[derive(Clone, Debug, PartialEq)]
struct Snapshot {
    status: Status,
    token: ClaimToken,
    attempts: i32,
    retryable: bool,
    lease_until: Option<chrono::DateTime<chrono::Utc>>,
    next_attempt_at: Option<chrono::DateTime<chrono::Utc>>,
    error_class: Option<ErrorClass>,
    replays: i32,
}

/// What the model knows of one leg.
#[derive(Default)]
struct LegModel {
    /// Every token ever handed out for this leg, in order, with the
    /// attempts the row had when it was handed out (what a job published
    /// with it would say).
    tokens: Vec<(ClaimToken, i32)>,
    completed_seen: bool,
    filtered_seen: bool,
    /// Replays seen on the row: a replay may start a completed leg again.
    replays: i32,
}

struct Sut {
    key: DeliveryKey,
    legs: [LegKey; 2],
    model: [LegModel; 2],
    policy: Policy,
    /// Whether `b`'s destination is not closed now.
    gated: bool,
    /// Whether the delivery's legs exist (its first claim happened).
    claimed: bool,
    /// The body hash the first claim stored.
    body: Option<[u8; 32]>,
    /// This case's two bodies (its own, so that the replay guard, which
    /// remembers bodies across keys, sees each only under this key).
    bodies: [[u8; 32]; 2],
}

const BODY: &[u8] = b"{\"action\":\"opened\"}";

impl Sut {
    async fn snapshot(&self, leg: usize) -> Option<Snapshot> {
        let client = shared().pool.get().await.expect("client");
        deliveries::get(&client, &self.legs[leg])
            .await
            .expect("get")
            .map(|d| Snapshot {
                status: d.status,
                token: d.claim_token,
                attempts: d.attempts,
                retryable: d.retryable,
                lease_until: d.lease_until,
                next_attempt_at: d.next_attempt_at,
                error_class: d.last_error_class,
                replays: d.replays,
            })
    }

    async fn snapshots(&self) -> [Option<Snapshot>; 2] {
        [self.snapshot(0).await, self.snapshot(1).await]
    }

    /// How many legs the delivery has.
    async fn leg_count(&self) -> i64 {
        let client = shared().pool.get().await.expect("client");
        client
            .query_one(
                "select count(*) from deliveries where delivery_id = $1",
                &[&self.key.delivery_id.as_str()],
            )
            .await
            .expect("count")
            .get(0)
    }

    fn published(&self, leg: usize, n: usize) -> Option<(ClaimToken, i32)> {
        let tokens = &self.model[leg].tokens;
        (!tokens.is_empty()).then(|| tokens[n % tokens.len()])
    }

    fn token(&self, leg: usize, n: usize) -> Option<ClaimToken> {
        self.published(leg, n).map(|(token, _)| token)
    }

    /// A leg's effects of either kind: written in a handler's transaction
    /// (`model_effects`) or, for `a` (the store), by the completing
    /// statement (`github_events`).
    async fn effects(&self, leg: usize) -> i64 {
        let client = shared().pool.get().await.expect("client");
        let events = if leg == 0 {
            "(select count(*) from github_events
              where provider = $1 and source = $2 and hook_id = $3 and delivery_id = $4)"
        } else {
            "0::int8"
        };
        client
            .query_one(
                &format!(
                    "select (select count(*) from model_effects
                             where delivery_id = $4 and destination = $5) + {events}
                     where $1::text is not null and $2::text is not null and $3::text is not null"
                ),
                &[
                    &self.key.provider,
                    &self.key.source.as_str(),
                    &self.key.hook_id.as_str(),
                    &self.key.delivery_id.as_str(),
                    &DESTINATIONS[leg],
                ],
            )
            .await
            .map(|row| row.get(0))
            .unwrap_or(0)
    }

    /// Runs a token-guarded write on `leg` and checks the fence: a token
    /// that does not hold the leg (by the snapshot before) must change
    /// nothing, and the other leg never changes.
    async fn guarded<F, Fut>(&mut self, leg: usize, token: ClaimToken, write: F)
    where
        F: FnOnce(ClaimToken) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        self.guarded_by(
            leg,
            |b| b.token == token && b.status == Status::Processing,
            write(token),
        )
        .await;
    }

    /// Runs `write` on `leg` and checks the fence: when `holds` is false of
    /// the leg before, the write must change nothing; the other leg never
    /// changes. Returns the leg's row before.
    async fn guarded_by<Fut>(
        &mut self,
        leg: usize,
        holds: impl FnOnce(&Snapshot) -> bool,
        write: Fut,
    ) -> Option<Snapshot>
    where
        Fut: std::future::Future<Output = ()>,
    {
        let before = self.snapshots().await;
        let effects_before = [self.effects(0).await, self.effects(1).await];
        write.await;
        let other = 1 - leg;
        assert_eq!(
            self.snapshot(other).await,
            before[other],
            "a write on one leg changed the other"
        );
        assert_eq!(
            self.effects(other).await,
            effects_before[other],
            "a write on one leg ran the other's effect"
        );
        let holds = before[leg].as_ref().is_some_and(holds);
        if !holds {
            assert_eq!(
                self.snapshot(leg).await,
                before[leg],
                "a stale token changed the row"
            );
            assert_eq!(
                self.effects(leg).await,
                effects_before[leg],
                "a stale token ran an effect"
            );
        }
        before[leg].clone()
    }

    /// Notes a take's answer; a leg behind a closed gate must never be
    /// taken, and a hold spends no attempt.
    fn took(&mut self, leg: usize, take: &Take, before: &Option<Snapshot>) {
        match take {
            Take::Taken {
                token, attempts, ..
            } => {
                assert!(
                    !(leg == 1 && self.gated),
                    "a leg was taken while its destination was not closed"
                );
                self.model[leg].tokens.push((*token, *attempts));
            }
            Take::Held => {
                assert!(leg == 1 && self.gated, "a leg was held behind an open gate");
                let _ = before;
            }
            _ => {}
        }
    }

    async fn apply(&mut self, op: Op) {
        let pool = &shared().pool;
        let client = pool.get().await.expect("client");
        match op {
            Op::Claim {
                other_body,
                filter_b,
            } => {
                let sha = self.bodies[usize::from(other_body)];
                let legs_before = self.leg_count().await;
                let claim = deliveries::claim(
                    &client,
                    &self.policy,
                    &ClaimRequest {
                        origin: Default::default(),
                        key: self.key.clone(),
                        event: "push".into(),
                        action: None,
                        repository: None,
                        body_sha256: sha,
                        // One key: the guard never refuses it, whatever
                        // happened to the row before.
                        guarded: true,
                        pinned: false,
                        legs: DESTINATIONS
                            .iter()
                            .map(|d| LegRequest {
                                destination: DestinationName::parse(d).expect("name"),
                                filtered: (filter_b && *d == "b").then_some("model"),
                                order_key: None,
                                fair: None,
                                stale_clock: None,
                            })
                            .collect(),
                        body: hookinbox_tests::json_body(BODY),
                    },
                )
                .await
                .expect("claim");
                if BUGGY.with(Cell::get) {
                    // The planted bug: a claim that keeps no body.
                    client
                        .execute(
                            "delete from bodies where delivery_id = $1",
                            &[&self.key.delivery_id.as_str()],
                        )
                        .await
                        .expect("forget");
                }
                let legs_after = self.leg_count().await;
                if legs_before > 0 {
                    assert_eq!(legs_after, legs_before, "a redelivery added a leg");
                }
                match claim {
                    deliveries::Claim::Legs(legs) => {
                        self.claimed |= legs_after > 0;
                        for (destination, leg) in legs {
                            let i = DESTINATIONS
                                .iter()
                                .position(|d| *d == destination.as_str())
                                .expect("a leg of the delivery's destinations");
                            match leg {
                                LegClaim::Claimed {
                                    token, attempts, ..
                                } => {
                                    // The first claim fixes the body; later
                                    // claims must match it.
                                    assert_eq!(
                                        *self.body.get_or_insert(sha),
                                        sha,
                                        "a different body was claimed"
                                    );
                                    self.model[i].tokens.push((token, attempts));
                                }
                                LegClaim::Republish { token } => {
                                    assert_eq!(
                                        *self.body.get_or_insert(sha),
                                        sha,
                                        "a different body was claimed"
                                    );
                                    self.model[i].tokens.push((token, 0));
                                }
                                LegClaim::Filtered => {
                                    assert_eq!(
                                        legs_before, 0,
                                        "a known delivery was filtered anew"
                                    );
                                    self.body.get_or_insert(sha);
                                }
                                LegClaim::Duplicate(_) => {}
                            }
                        }
                    }
                    deliveries::Claim::Conflict => {
                        assert_ne!(self.body, Some(sha), "the same body reported as a conflict")
                    }
                    deliveries::Claim::ReplayedBody | deliveries::Claim::Copy { .. } => {
                        panic!("the replay guard refused the key its body came with")
                    }
                }
            }
            Op::Take { leg, token } => {
                let Some(presented) = self.token(leg, token) else {
                    return;
                };
                let before = self.snapshot(leg).await;
                let take = deliveries::take(
                    &client,
                    &self.policy,
                    &self.legs[leg],
                    presented,
                    MAX_ATTEMPTS,
                )
                .await
                .expect("take");
                self.took(leg, &take, &before);
                if take == Take::Held {
                    let after = self.snapshot(leg).await.expect("the held leg");
                    assert_eq!(
                        Some(after.attempts),
                        before.map(|b| b.attempts),
                        "a hold spent an attempt"
                    );
                    assert_eq!(after.error_class, Some(ErrorClass::Held));
                }
            }
            Op::TakeBatched { leg, first, second } => {
                let (Some(first), Some(second)) = (self.token(leg, first), self.token(leg, second))
                else {
                    return;
                };
                let items = [first, second].map(|presented| Taking {
                    key: self.legs[leg].clone(),
                    presented,
                    max_attempts: MAX_ATTEMPTS,
                });
                let answers = deliveries::take_batch(&client, &self.policy, &items)
                    .await
                    .expect("take batch");
                assert!(answers[1].is_none(), "a repeated key takes part once");
                for (item, answer) in items.iter().zip(answers) {
                    let before = self.snapshot(leg).await;
                    let take = match answer {
                        Some(taken) => taken,
                        None => deliveries::take(
                            &client,
                            &self.policy,
                            &item.key,
                            item.presented,
                            MAX_ATTEMPTS,
                        )
                        .await
                        .expect("take"),
                    };
                    self.took(leg, &take, &before);
                }
            }
            Op::Renew { leg, token } => {
                let Some(token) = self.token(leg, token) else {
                    return;
                };
                let (policy, key) = (self.policy, self.legs[leg].clone());
                self.guarded(leg, token, |t| async move {
                    let client = shared().pool.get().await.expect("client");
                    deliveries::renew(&client, &policy, &key, t)
                        .await
                        .expect("renew");
                })
                .await;
            }
            Op::Complete { leg, token } => {
                let Some(token) = self.token(leg, token) else {
                    return;
                };
                let key = self.legs[leg].clone();
                self.guarded(leg, token, |t| async move {
                    let mut effect = Effect::new(shared().pool.clone(), key.clone(), t, 1);
                    let ran = write_effect(&mut effect, &key).await;
                    let completion = effect.complete().await.expect("complete");
                    assert!(ran || completion == Completion::Fenced);
                })
                .await;
            }
            Op::FusedComplete {
                leg,
                token,
                skew,
                in_transaction,
            } => {
                let Some((token, published)) = self.published(leg, token) else {
                    return;
                };
                let presented = published + skew;
                if presented < 0 {
                    return;
                }
                let key = self.legs[leg].clone();
                let max = MAX_ATTEMPTS;
                let completed = std::sync::Arc::new(std::sync::Mutex::new(None));
                // Only the store (`a`) stages its event for the statement.
                let in_transaction = in_transaction || leg == 1;
                let before = self
                    .guarded_by(
                        leg,
                        |b| {
                            b.token == token
                                && b.status == Status::Processing
                                && b.attempts == presented
                                && b.attempts < max
                        },
                        fused(
                            key,
                            token,
                            presented,
                            max,
                            in_transaction,
                            completed.clone(),
                        ),
                    )
                    .await;
                let completed = completed.lock().expect("lock").take();
                if completed == Some(true) {
                    let before = before.expect("a row was completed");
                    let after = self.snapshot(leg).await.expect("the completed row");
                    assert_eq!(after.status, Status::Completed);
                    assert_eq!(
                        after.attempts,
                        before.attempts + 1,
                        "a completion that is the take counts its attempt"
                    );
                }
            }
            Op::Fail {
                leg,
                token,
                retryable,
                held,
            } => {
                let Some(token) = self.token(leg, token) else {
                    return;
                };
                let key = self.legs[leg].clone();
                let failure = Failure {
                    class: if held {
                        ErrorClass::Held
                    } else {
                        ErrorClass::Transient
                    },
                    message: "model".to_owned(),
                    retry_in: (retryable || held).then_some(Duration::from_secs(3600)),
                };
                let before = self
                    .guarded_by(
                        leg,
                        |b| b.token == token && b.status == Status::Processing,
                        async {
                            let client = shared().pool.get().await.expect("client");
                            deliveries::fail(&client, &key, token, &failure)
                                .await
                                .expect("fail");
                        },
                    )
                    .await;
                if held
                    && let Some(before) = before
                    && before.token == token
                    && before.status == Status::Processing
                {
                    let after = self.snapshot(leg).await.expect("the held leg");
                    assert_eq!(
                        after.attempts,
                        (before.attempts - 1).max(0),
                        "a failure of the destination gives its attempt back"
                    );
                }
            }
            Op::Expire => {
                client
                    .execute(
                        "update deliveries set lease_until = now() - interval '1 second' \
                         where delivery_id = $1 and status = 'processing'",
                        &[&self.key.delivery_id.as_str()],
                    )
                    .await
                    .expect("expire");
            }
            Op::Schedule => {
                client
                    .execute(
                        "update deliveries set next_attempt_at = now() - interval '1 second' \
                         where delivery_id = $1 and status = 'failed' and retryable",
                        &[&self.key.delivery_id.as_str()],
                    )
                    .await
                    .expect("due");
                deliveries::exhaust_due(&client, &self.policy, 100)
                    .await
                    .expect("exhaust");
                for job in deliveries::schedule_due(&client, &self.policy, 100)
                    .await
                    .expect("schedule")
                {
                    let parked = job.expect("a readable parked row");
                    assert_eq!(parked.envelope.attempts, Some(parked.attempts));
                    for leg in 0..2 {
                        if parked.envelope.key == self.legs[leg] {
                            assert!(
                                !(leg == 1 && self.gated),
                                "the scheduler started a leg whose destination is not closed"
                            );
                            self.model[leg]
                                .tokens
                                .push((parked.envelope.token, parked.attempts));
                        }
                    }
                }
            }
            Op::Replay { leg } => {
                match deliveries::replay(
                    &client,
                    &self.policy,
                    &self.legs[leg],
                    deliveries::Scope::Failed,
                )
                .await
                .expect("replay")
                {
                    deliveries::Replayed::Started(parked) => {
                        assert_eq!(parked.envelope.attempts, Some(0), "a replay starts over");
                        self.model[leg].tokens.push((parked.envelope.token, 0))
                    }
                    deliveries::Replayed::Unreadable(row) => {
                        panic!("a readable parked row: {}", row.reason)
                    }
                    deliveries::Replayed::NoBody | deliveries::Replayed::NotFailed => {}
                }
            }
            Op::ReplayAny { leg } => {
                let before = self.snapshot(leg).await;
                match deliveries::replay(
                    &client,
                    &self.policy,
                    &self.legs[leg],
                    deliveries::Scope::Ended,
                )
                .await
                .expect("replay")
                {
                    deliveries::Replayed::Started(parked) => {
                        let before = before.expect("a replayed leg existed");
                        assert!(
                            matches!(before.status, Status::Completed | Status::Failed),
                            "a replay started a leg that was {:?}",
                            before.status
                        );
                        let after = self.snapshot(leg).await.expect("the replayed leg");
                        assert_eq!(after.status, Status::Processing);
                        assert_eq!(after.attempts, 0, "a replay starts over");
                        assert_eq!(after.replays, before.replays + 1);
                        assert_ne!(after.token, before.token, "a replay takes a new token");
                        assert_eq!(after.token, parked.envelope.token);
                        self.model[leg].tokens.push((parked.envelope.token, 0))
                    }
                    deliveries::Replayed::Unreadable(row) => {
                        panic!("a readable row: {}", row.reason)
                    }
                    deliveries::Replayed::NoBody => {
                        assert!(
                            before
                                .is_some_and(|b| b.status != Status::Processing
                                    && b.status != Status::Filtered),
                            "NoBody for a leg no replay takes"
                        );
                    }
                    deliveries::Replayed::NotFailed => {
                        assert!(
                            before.is_none_or(|b| matches!(
                                b.status,
                                Status::Processing | Status::Filtered
                            )),
                            "a completed or failed leg with its body was not replayed"
                        );
                    }
                }
            }
            Op::LoseMessages => self.lose_messages(&client).await,
            Op::Sweep => {
                // Realistic retention: fresh rows are never swept.
                let retention = deliveries::Retention {
                    completed: Duration::from_secs(30 * 86400),
                    failed: Duration::from_secs(28 * 86400),
                    events: Some(Duration::from_secs(30 * 86400)),
                    bodies: Duration::from_secs(7 * 86_400),
                };
                deliveries::sweep(&client, &retention, 500)
                    .await
                    .expect("sweep");
            }
            Op::Reap => {
                deliveries::reap(&client, Duration::ZERO, 100)
                    .await
                    .expect("reap");
            }
            Op::Gate(open) => {
                let state = if open { "open" } else { "closed" };
                client
                    .execute(
                        "insert into destinations (source, name, kind, state) values ($1, $2, 'model', $3)
                         on conflict (source, name) do update set state = excluded.state",
                        &[&self.key.source.as_str(), &DESTINATIONS[1], &state],
                    )
                    .await
                    .expect("gate");
                self.gated = open;
            }
        }
    }

    async fn check(&mut self) {
        for leg in 0..2 {
            let now = self.snapshot(leg).await;
            let effects = self.effects(leg).await;
            let kept = self.body_kept().await;
            let model = &mut self.model[leg];
            if let Some(row) = &now {
                if row.replays > model.replays {
                    // A replay may start a completed leg again.
                    model.replays = row.replays;
                    model.completed_seen = false;
                }
                assert!(
                    effects <= 1 + i64::from(row.replays),
                    "{effects} effects for a leg replayed {} time(s)",
                    row.replays
                );
                if matches!(row.status, Status::Processing | Status::Failed) {
                    assert!(kept, "a leg that has not ended has no body kept");
                }
                assert!(
                    row.attempts <= MAX_ATTEMPTS,
                    "attempts {} over the maximum",
                    row.attempts
                );
                assert!(row.attempts >= 0, "attempts below zero");
                if model.completed_seen {
                    assert_eq!(row.status, Status::Completed, "completed went back");
                }
                if model.filtered_seen {
                    assert_eq!(row.status, Status::Filtered, "filtered went back");
                }
                if row.status == Status::Completed {
                    model.completed_seen = true;
                }
                if row.status == Status::Filtered {
                    model.filtered_seen = true;
                }
                if row.status == Status::Processing {
                    assert!(row.lease_until.is_some(), "processing without a lease");
                }
            } else {
                assert!(
                    !model.completed_seen,
                    "a completed row vanished before its retention"
                );
            }
            let completed = now.as_ref().is_some_and(|r| r.status == Status::Completed);
            if completed {
                assert!(self.effects(leg).await >= 1, "completed without its effect");
            }
            if now.as_ref().is_some_and(|r| r.status == Status::Filtered) {
                assert_eq!(self.effects(leg).await, 0, "a filtered leg ran its effect");
            }
        }
    }
}

impl Sut {
    /// Whether the delivery's body is in Postgres.
    async fn body_kept(&self) -> bool {
        let client = shared().pool.get().await.expect("client");
        client
            .query_one(
                "select exists (select 1 from bodies where provider = $1 and source = $2
                                and hook_id = $3 and delivery_id = $4)",
                &[
                    &self.key.provider,
                    &self.key.source.as_str(),
                    &self.key.hook_id.as_str(),
                    &self.key.delivery_id.as_str(),
                ],
            )
            .await
            .expect("body")
            .get(0)
    }

    /// The broker loses every message of the delivery; time passes past
    /// every lease and retry; the reaper and the scheduler run. Then each
    /// leg that has not ended, but one behind its closed gate, was published
    /// again under a new token: nothing is left without a message.
    async fn lose_messages(&mut self, client: &deadpool_postgres::Object) {
        let id = self.key.delivery_id.as_str();
        let published_before = [self.model[0].tokens.len(), self.model[1].tokens.len()];
        client
            .execute(
                "update deliveries set lease_until = now() - interval '1 second'
                 where delivery_id = $1 and status = 'processing'",
                &[&id],
            )
            .await
            .expect("leases run out");
        deliveries::reap(client, Duration::ZERO, 100)
            .await
            .expect("reap");
        client
            .execute(
                "update deliveries set next_attempt_at = now() - interval '1 second'
                 where delivery_id = $1 and status = 'failed' and retryable",
                &[&id],
            )
            .await
            .expect("due");
        deliveries::exhaust_due(client, &self.policy, 100)
            .await
            .expect("exhaust");
        for job in deliveries::schedule_due(client, &self.policy, 100)
            .await
            .expect("schedule")
        {
            let job = job.expect("a readable row");
            for leg in 0..2 {
                if job.envelope.key == self.legs[leg] {
                    self.model[leg]
                        .tokens
                        .push((job.envelope.token, job.attempts));
                }
            }
        }
        for (leg, before) in published_before.into_iter().enumerate() {
            let Some(row) = self.snapshot(leg).await else {
                continue;
            };
            let open =
                row.status == Status::Processing || (row.status == Status::Failed && row.retryable);
            if !open || (leg == 1 && self.gated) {
                continue;
            }
            assert!(
                self.model[leg].tokens.len() > before,
                "leg {leg} was left {:?} with its messages lost and nothing published",
                row.status
            );
            assert_eq!(row.status, Status::Processing);
            assert_eq!(
                Some(row.token),
                self.model[leg].tokens.last().map(|(t, _)| *t),
                "published under the row's token"
            );
        }
    }
}

/// Writes the effect in the completing transaction; false when the
/// transaction could not begin (its completion must then be fenced).
async fn write_effect(effect: &mut Effect, key: &LegKey) -> bool {
    match effect.transaction().await {
        Ok(tx) => {
            tx.execute(
                "insert into model_effects (delivery_id, destination) values ($1, $2)",
                &[&key.delivery_id.as_str(), &key.destination.as_str()],
            )
            .await
            .expect("effect");
            true
        }
        Err(_) => false,
    }
}

/// One job on the worker's one-statement path: the handler stages the
/// event (or writes its effect in its transaction), and the completion is
/// the take. Stores whether it completed in `completed`.
async fn fused(
    key: LegKey,
    token: ClaimToken,
    attempts: i32,
    max_attempts: i32,
    in_transaction: bool,
    completed: std::sync::Arc<std::sync::Mutex<Option<bool>>>,
) {
    let mut effect = Effect::taking(
        shared().pool.clone(),
        key.clone(),
        token,
        attempts,
        max_attempts,
    );
    let ran = if in_transaction {
        write_effect(&mut effect, &key).await
    } else {
        effect
            .store_event(StoredEvent {
                event: "push".to_owned(),
                action: None,
                payload: bytes::Bytes::from_static(BODY),
            })
            .await
            .expect("staged");
        true
    };
    let completion = effect.complete().await.expect("complete");
    assert!(ran || completion == Completion::Fenced);
    *completed.lock().expect("lock") = Some(matches!(completion, Completion::Completed { .. }));
}

struct DeliveryStateMachine;

impl StateMachineTest for DeliveryStateMachine {
    type SystemUnderTest = Sut;
    type Reference = Model;

    fn init_test(_: &()) -> Sut {
        // Each case its own source, so that its destination `b`'s gate is
        // its own.
        let source = format!("m{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let key = DeliveryKey::github(
            SourceName::parse(&source).expect("source"),
            HookId::parse(Some(b"1")).expect("hook"),
            DeliveryId::parse(uuid::Uuid::new_v4().to_string().as_bytes()).expect("id"),
        );
        let legs = DESTINATIONS.map(|d| key.clone().leg(DestinationName::parse(d).expect("name")));
        Sut {
            key,
            legs,
            model: Default::default(),
            policy: Policy {
                lease: Duration::from_secs(60),
                max_attempts: MAX_ATTEMPTS,
                publish_timeout: Duration::from_secs(5),
            },
            gated: false,
            claimed: false,
            body: None,
            bodies: [0, 1].map(|_| {
                let mut sha = [0u8; 32];
                sha[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
                sha
            }),
        }
    }

    fn apply(mut sut: Sut, _: &(), op: Op) -> Sut {
        shared().runtime.block_on(async {
            sut.apply(op).await;
            sut.check().await;
        });
        sut
    }
}

prop_state_machine! {
    #![proptest_config(Config {
        cases: hookinbox_tests::proptest_cases(64),
        failure_persistence: None,
        .. Config::default()
    })]

    fn run_every_case(sequential 1..40 => DeliveryStateMachine);
}

prop_state_machine! {
    #![proptest_config(Config {
        cases: 64,
        failure_persistence: None,
        max_shrink_iters: 0,
        .. Config::default()
    })]

    fn run_with_the_planted_bug(sequential 1..40 => DeliveryStateMachine);
}

#[test]
fn delivery_state_machine_keeps_its_invariants() {
    run_every_case();
    // Every case passed: drop the database. A failing case panics above and
    // leaves it for inspection, as the other tests do.
    shared().drop_database();
}

#[test]
fn a_planted_claim_that_writes_no_body_is_caught() {
    hookinbox_tests::expect_planted_bug_caught(
        |on| BUGGY.with(|b| b.set(on)),
        run_with_the_planted_bug,
        "a claim that keeps no body",
    );
    shared().drop_database();
}
