//! Model-based test of the delivery state machine against the real
//! Postgres: random interleavings of claim, take, renew, complete, fail,
//! lease expiry, the scheduler, replay, sweep and reap, with the
//! invariants checked after every step:
//!
//! - at most one completed effect per key;
//! - `completed` never goes back;
//! - a write with a stale token never changes a row;
//! - `attempts` never exceeds the maximum (a replay resets it to 0);
//! - a completion that is also the take (the worker's one-statement path)
//!   changes the row only when it is processing under the presented token
//!   with the presented attempts, fewer than the maximum, and then counts
//!   its attempt.
//!
//! Lease expiry is a transition of its own (it backdates `lease_until`), so
//! the test never waits for a clock.

use std::sync::OnceLock;
use std::time::Duration;

use hookinbox::deliveries::{
    self, ClaimRequest, ErrorClass, Failure, ParkedBody, Policy, Status, StoredEvent, Take,
};
use hookinbox::key::{ClaimToken, DeliveryId, DeliveryKey, HookId, SourceName};
use hookinbox_worker::{Completion, Effect};
use proptest::prelude::*;
use proptest::test_runner::Config;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};

const MAX_ATTEMPTS: i32 = 3;

/// One database and runtime for every case of this test binary; each case
/// works on its own delivery key.
struct Shared {
    runtime: tokio::runtime::Runtime,
    pool: deadpool_postgres::Pool,
    /// The database's name, to drop it once every case passed.
    db_name: String,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let (db_name, pool) = runtime.block_on(async {
            let (name, url) = hookinbox_tests::create_database("hookinbox_model").await;
            let pool =
                hookinbox::postgres::pool(&url, 4, hookinbox::postgres::DEFAULT_REQUEST_TIMEOUT)
                    .expect("pool");
            pool.get()
                .await
                .expect("client")
                .batch_execute(
                    "create table model_effects (delivery_id text not null, at timestamptz not null default now());
                     create index on model_effects (delivery_id)",
                )
                .await
                .expect("effects table");
            (name, pool)
        });
        Shared {
            runtime,
            pool,
            db_name,
        }
    })
}

#[derive(Clone, Debug)]
enum Op {
    /// A GitHub delivery (or a copy with another body) reaches ingest.
    Claim { other_body: bool },
    /// A worker takes the delivery, presenting the n-th token ever seen.
    Take(usize),
    /// Two messages of the delivery, presenting the n-th and m-th tokens,
    /// are taken in one batch, and what the batch did not take goes through
    /// the full take, as the worker does.
    TakeBatched(usize, usize),
    /// A holder renews its lease.
    Renew(usize),
    /// A holder runs the effect and completes.
    Complete(usize),
    /// A worker runs a job without a take: the n-th token, presented with
    /// the attempts it was published with (shifted by `skew`, to present
    /// stale counts too), completed by one statement that is also the take;
    /// the effect staged for the batched completion, or written in the
    /// handler's transaction.
    FusedComplete {
        token: usize,
        skew: i32,
        in_transaction: bool,
    },
    /// A holder records a failure.
    Fail { token: usize, retryable: bool },
    /// Time passes beyond the lease.
    Expire,
    /// Time passes until a retry is due, and the scheduler runs.
    Schedule,
    /// An operator replays a failed delivery.
    Replay,
    /// The retention sweeper runs.
    Sweep,
    /// The reaper runs.
    Reap,
}

struct Model;

impl ReferenceStateMachine for Model {
    type State = ();
    type Transition = Op;

    fn init_state() -> BoxedStrategy<()> {
        Just(()).boxed()
    }

    fn transitions(_: &()) -> BoxedStrategy<Op> {
        prop_oneof![
            3 => any::<bool>().prop_map(|other_body| Op::Claim { other_body }),
            4 => (0..8usize).prop_map(Op::Take),
            2 => (0..8usize, 0..8usize).prop_map(|(n, m)| Op::TakeBatched(n, m)),
            2 => (0..8usize).prop_map(Op::Renew),
            4 => (0..8usize).prop_map(Op::Complete),
            4 => (0..8usize, prop_oneof![6 => Just(0), 1 => Just(-1), 1 => Just(1)], any::<bool>())
                .prop_map(|(token, skew, in_transaction)| Op::FusedComplete { token, skew, in_transaction }),
            3 => (0..8usize, any::<bool>()).prop_map(|(token, retryable)| Op::Fail { token, retryable }),
            2 => Just(Op::Expire),
            2 => Just(Op::Schedule),
            1 => Just(Op::Replay),
            1 => Just(Op::Sweep),
            1 => Just(Op::Reap),
        ]
        .boxed()
    }

    fn apply(state: (), _: &Op) {
        state
    }
}

/// What the row looked like, for the stale-write check.
#[derive(Clone, Debug, PartialEq)]
struct Snapshot {
    status: Status,
    token: ClaimToken,
    attempts: i32,
    retryable: bool,
    lease_until: Option<chrono::DateTime<chrono::Utc>>,
    next_attempt_at: Option<chrono::DateTime<chrono::Utc>>,
    error_class: Option<ErrorClass>,
}

struct Sut {
    key: DeliveryKey,
    policy: Policy,
    /// Every token ever handed out for this key, in order, with the
    /// attempts the row had when it was handed out (what a job published
    /// with it would say).
    tokens: Vec<(ClaimToken, i32)>,
    completed_seen: bool,
    /// The body hash the first claim stored.
    body: Option<[u8; 32]>,
    /// This case's two bodies (its own, so that the replay guard, which
    /// remembers bodies across keys, sees each only under this key).
    bodies: [[u8; 32]; 2],
}

const BODY: &[u8] = b"{\"action\":\"opened\"}";

fn parked() -> ParkedBody<'static> {
    ParkedBody {
        content_type: "application/json",
        headers: &[],
        body: BODY,
    }
}

impl Sut {
    async fn snapshot(&self) -> Option<Snapshot> {
        let client = shared().pool.get().await.expect("client");
        deliveries::get(&client, &self.key)
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
            })
    }

    fn token(&self, n: usize) -> Option<ClaimToken> {
        self.published(n).map(|(token, _)| token)
    }

    /// The n-th token and the attempts it was handed out with.
    fn published(&self, n: usize) -> Option<(ClaimToken, i32)> {
        (!self.tokens.is_empty()).then(|| self.tokens[n % self.tokens.len()])
    }

    /// Effects of either kind: written in a handler's transaction
    /// (`model_effects`) or by the completing statement (`github_events`).
    async fn effects(&self) -> i64 {
        let client = shared().pool.get().await.expect("client");
        client
            .query_one(
                "select (select count(*) from model_effects where delivery_id = $4)
                      + (select count(*) from github_events
                         where provider = $1 and source = $2 and hook_id = $3
                           and delivery_id = $4)",
                &[
                    &self.key.provider,
                    &self.key.source.as_str(),
                    &self.key.hook_id.as_str(),
                    &self.key.delivery_id.as_str(),
                ],
            )
            .await
            .expect("count")
            .get(0)
    }

    /// Runs a token-guarded write and checks the fence: a token that does
    /// not hold the row (by the snapshot before) must change nothing.
    async fn guarded<F, Fut>(&mut self, token: ClaimToken, write: F)
    where
        F: FnOnce(ClaimToken) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        self.guarded_by(
            |b| b.token == token && b.status == Status::Processing,
            write(token),
        )
        .await;
    }

    /// Runs `write` and checks the fence: when `holds` is false of the row
    /// before, the write must change nothing. Returns the row before.
    async fn guarded_by<Fut>(
        &mut self,
        holds: impl FnOnce(&Snapshot) -> bool,
        write: Fut,
    ) -> Option<Snapshot>
    where
        Fut: std::future::Future<Output = ()>,
    {
        let before = self.snapshot().await;
        let effects_before = self.effects().await;
        write.await;
        let holds = before.as_ref().is_some_and(holds);
        if !holds {
            assert_eq!(
                self.snapshot().await,
                before,
                "a stale token changed the row"
            );
            assert_eq!(
                self.effects().await,
                effects_before,
                "a stale token ran an effect"
            );
        }
        before
    }

    async fn apply(&mut self, op: Op) {
        let pool = &shared().pool;
        let client = pool.get().await.expect("client");
        match op {
            Op::Claim { other_body } => {
                let sha = self.bodies[usize::from(other_body)];
                let claim = deliveries::claim(
                    &client,
                    &self.policy,
                    &ClaimRequest {
                        key: self.key.clone(),
                        event: "push".into(),
                        action: None,
                        repository: None,
                        body_sha256: sha,
                        // One key: the guard never refuses it, whatever
                        // happened to the row before.
                        guarded: true,
                        pinned: false,
                    },
                )
                .await
                .expect("claim");
                match claim {
                    deliveries::Claim::Claimed {
                        token, attempts, ..
                    } => {
                        // The first claim fixes the body; later claims must match it.
                        assert_eq!(
                            *self.body.get_or_insert(sha),
                            sha,
                            "a different body was claimed"
                        );
                        self.tokens.push((token, attempts));
                    }
                    deliveries::Claim::Republish { token } => {
                        // The first claim fixes the body; later claims must match it.
                        assert_eq!(
                            *self.body.get_or_insert(sha),
                            sha,
                            "a different body was claimed"
                        );
                        self.tokens.push((token, 0));
                    }
                    deliveries::Claim::Conflict => {
                        assert_ne!(self.body, Some(sha), "the same body reported as a conflict")
                    }
                    deliveries::Claim::Duplicate(_) => {}
                    deliveries::Claim::ReplayedBody | deliveries::Claim::Copy { .. } => {
                        panic!("the replay guard refused the key its body came with")
                    }
                }
            }
            Op::Take(n) => {
                let Some(presented) = self.token(n) else {
                    return;
                };
                if let Take::Taken {
                    token, attempts, ..
                } = deliveries::take(&client, &self.policy, &self.key, presented, parked())
                    .await
                    .expect("take")
                {
                    self.tokens.push((token, attempts));
                }
            }
            Op::TakeBatched(n, m) => {
                let (Some(first), Some(second)) = (self.token(n), self.token(m)) else {
                    return;
                };
                let items = [(self.key.clone(), first), (self.key.clone(), second)];
                let answers = deliveries::take_batch(&client, &self.policy, &items)
                    .await
                    .expect("take batch");
                assert!(answers[1].is_none(), "a repeated key takes part once");
                for ((_, presented), answer) in items.iter().zip(answers) {
                    let take = match answer {
                        Some(taken) => taken,
                        None => {
                            deliveries::take(&client, &self.policy, &self.key, *presented, parked())
                                .await
                                .expect("take")
                        }
                    };
                    if let Take::Taken {
                        token, attempts, ..
                    } = take
                    {
                        self.tokens.push((token, attempts));
                    }
                }
            }
            Op::Renew(n) => {
                let Some(token) = self.token(n) else { return };
                let (policy, key) = (self.policy, self.key.clone());
                self.guarded(token, |t| async move {
                    let client = shared().pool.get().await.expect("client");
                    deliveries::renew(&client, &policy, &key, t)
                        .await
                        .expect("renew");
                })
                .await;
            }
            Op::Complete(n) => {
                let Some(token) = self.token(n) else { return };
                let key = self.key.clone();
                self.guarded(token, |t| async move {
                    let mut effect = Effect::new(shared().pool.clone(), key.clone(), t, 1);
                    let ran = write_effect(&mut effect, &key).await;
                    let completion = effect.complete().await.expect("complete");
                    assert!(ran || completion == Completion::Fenced);
                })
                .await;
            }
            Op::FusedComplete {
                token,
                skew,
                in_transaction,
            } => {
                let Some((token, published)) = self.published(token) else {
                    return;
                };
                let presented = published + skew;
                if presented < 0 {
                    return;
                }
                let key = self.key.clone();
                let max = self.policy.max_attempts;
                let completed = std::sync::Arc::new(std::sync::Mutex::new(None));
                let before = self
                    .guarded_by(
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
                    let after = self.snapshot().await.expect("the completed row");
                    assert_eq!(after.status, Status::Completed);
                    assert_eq!(
                        after.attempts,
                        before.attempts + 1,
                        "a completion that is the take counts its attempt"
                    );
                }
            }
            Op::Fail { token, retryable } => {
                let Some(token) = self.token(token) else {
                    return;
                };
                let key = self.key.clone();
                self.guarded(token, |t| async move {
                    let client = shared().pool.get().await.expect("client");
                    let failure = Failure {
                        class: ErrorClass::Transient,
                        message: "model".to_owned(),
                        retry_in: retryable.then_some(Duration::from_secs(3600)),
                    };
                    deliveries::fail(&client, &key, t, &failure, parked())
                        .await
                        .expect("fail");
                })
                .await;
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
                    assert_eq!(parked.job.attempts, Some(parked.attempts));
                    if parked.job.key == self.key {
                        self.tokens.push((parked.job.token, parked.attempts));
                    }
                }
            }
            Op::Replay => {
                match deliveries::replay(&client, &self.policy, &self.key)
                    .await
                    .expect("replay")
                {
                    deliveries::Replayed::Started(parked) => {
                        assert_eq!(parked.job.attempts, Some(0), "a replay starts over");
                        self.tokens.push((parked.job.token, 0))
                    }
                    deliveries::Replayed::Unreadable(row) => {
                        panic!("a readable parked row: {}", row.reason)
                    }
                    deliveries::Replayed::NoBody | deliveries::Replayed::NotFailed => {}
                }
            }
            Op::Sweep => {
                // Realistic retention: fresh rows are never swept.
                let retention = deliveries::Retention {
                    completed: Duration::from_secs(30 * 86400),
                    failed: Duration::from_secs(28 * 86400),
                    events: Some(Duration::from_secs(30 * 86400)),
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
        }
    }

    async fn check(&mut self) {
        assert!(
            self.effects().await <= 1,
            "more than one effect for one key"
        );
        let now = self.snapshot().await;
        if let Some(row) = &now {
            assert!(
                row.attempts <= MAX_ATTEMPTS,
                "attempts {} over the maximum",
                row.attempts
            );
            if self.completed_seen {
                assert_eq!(row.status, Status::Completed, "completed went back");
            }
            if row.status == Status::Completed {
                self.completed_seen = true;
                assert_eq!(self.effects().await, 1, "completed without its effect");
            }
            if row.status == Status::Processing {
                assert!(row.lease_until.is_some(), "processing without a lease");
            }
        } else {
            assert!(
                !self.completed_seen,
                "a completed row vanished before its retention"
            );
        }
    }
}

/// Writes the effect in the completing transaction; false when the
/// transaction could not begin (its completion must then be fenced).
async fn write_effect(effect: &mut Effect, key: &DeliveryKey) -> bool {
    match effect.transaction().await {
        Ok(tx) => {
            tx.execute(
                "insert into model_effects (delivery_id) values ($1)",
                &[&key.delivery_id.as_str()],
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
    key: DeliveryKey,
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
        let key = DeliveryKey::github(
            SourceName::default_source(),
            HookId::parse(Some(b"1")).expect("hook"),
            DeliveryId::parse(uuid::Uuid::new_v4().to_string().as_bytes()).expect("id"),
        );
        Sut {
            key,
            policy: Policy {
                lease: Duration::from_secs(60),
                max_attempts: MAX_ATTEMPTS,
                publish_timeout: Duration::from_secs(5),
            },
            tokens: Vec::new(),
            completed_seen: false,
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

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

prop_state_machine! {
    #![proptest_config(Config {
        cases: cases(),
        failure_persistence: None,
        .. Config::default()
    })]

    fn run_every_case(sequential 1..40 => DeliveryStateMachine);
}

#[test]
fn delivery_state_machine_keeps_its_invariants() {
    run_every_case();
    // Every case passed: drop the database. A failing case panics above and
    // leaves it for inspection, as the other tests do.
    let shared = shared();
    shared
        .runtime
        .block_on(hookinbox_tests::drop_database(&shared.db_name));
}
