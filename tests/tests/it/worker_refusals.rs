//! What the worker does when Postgres refuses one of its statements (a
//! real refusal: a trigger of the test's own database raises it): a take
//! batch refused for one row takes its neighbours alone; a completion
//! refused for a reason that is not the row's is retried with backoff as a
//! `db` failure; and a row that cannot become a job is dead-lettered by the
//! scheduler instead of being rescheduled forever.

use std::time::Duration;

use futures::future::join_all;
use hookinbox::deliveries::{self, ErrorClass, Take, group_commit};
use hookinbox::key::ClaimToken;
use hookinbox::postgres::BatchShape;
use hookinbox_tests::{Hook, TestEnv, settle, worker_cli};
use hookinbox_worker::JobOutcome;

/// Makes Postgres refuse, with SQLSTATE `code`, every update of
/// `deliveries` that counts an attempt of the delivery `delivery_id` (a
/// take): the same statement on that row fails again whenever it is tried.
async fn refuse_takes_of(env: &TestEnv, delivery_id: &str, code: &str) {
    env.db
        .batch_execute(&format!(
            "create function refuse_take() returns trigger language plpgsql as $$
             begin
                 if new.delivery_id = '{delivery_id}' and new.attempts > old.attempts then
                     raise exception 'this row is refused' using errcode = '{code}';
                 end if;
                 return new;
             end $$;
             create trigger refuse_take before update on deliveries
                 for each row execute function refuse_take();"
        ))
        .await
        .expect("trigger");
}

/// What a delivery's row says of its failure.
#[derive(Debug)]
struct Failed {
    status: String,
    retryable: bool,
    class: String,
    error: String,
    attempts: i32,
    /// Due after a backoff rather than at once.
    due_later: bool,
    dead_lettered: bool,
    body_kept: bool,
}

async fn failed(env: &TestEnv, delivery_id: &str) -> Failed {
    let row = env
        .db
        .query_one(
            "select status, retryable, last_error_class, last_error, attempts,
                    coalesce(next_attempt_at > failed_at, false), dead_lettered_at is not null,
                    exists (select 1 from bodies b where b.delivery_id = d.delivery_id)
             from deliveries d where delivery_id = $1",
            &[&delivery_id],
        )
        .await
        .expect("row");
    Failed {
        status: row.get(0),
        retryable: row.get(1),
        class: row.get(2),
        error: row.get(3),
        attempts: row.get(4),
        due_later: row.get(5),
        dead_lettered: row.get(6),
        body_kept: row.get(7),
    }
}

/// The take group commit: one statement for many messages. Postgres refuses
/// it as a whole for one row, and nothing of it commits; its messages are
/// then each taken alone, so every neighbour is taken and only the refused
/// row fails.
#[tokio::test]
async fn a_take_batch_refused_for_one_row_takes_each_neighbour_alone() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let hooks: Vec<Hook> = (0..9).map(|_| Hook::fixture("push")).collect();
    for hook in &hooks {
        assert_eq!(ingest.send(hook).await.status, 202);
    }
    // In the middle: whichever way the messages split into batches, the
    // refused row shares one with a neighbour.
    let bad = &hooks[4];
    refuse_takes_of(&env, bad.id(), "23514").await;
    let mut items = Vec::new();
    for hook in &hooks {
        let token: uuid::Uuid = env
            .db
            .query_one(
                "select claim_token from deliveries where delivery_id = $1",
                &[&hook.id()],
            )
            .await
            .expect("claim")
            .get(0);
        items.push((hook.leg(), ClaimToken(token)));
    }

    // One connection, held until every take is queued: the batches wait for
    // it together, so the later ones linger and gather the rest.
    let pool = env.pool(1);
    let held = pool.get().await.expect("connection");
    let policy = env.policy();
    let takes = group_commit::takes(
        pool.clone(),
        policy,
        BatchShape {
            max_batch: 64,
            linger: Duration::from_millis(200),
            observe: |_| {},
        },
    );
    let mut submitted = Box::pin(join_all(items.iter().cloned().map(|(key, presented)| {
        takes.submit(deliveries::Taking {
            key,
            presented,
            max_attempts: policy.max_attempts,
        })
    })));
    // One poll queues every take (each sends before it waits).
    assert!(futures::poll!(&mut submitted).is_pending());
    drop(held);
    let answers = submitted.await;

    let client = pool.get().await.expect("connection");
    let mut alone = 0;
    for ((key, token), answer) in items.iter().zip(answers) {
        // No error reaches a message of the refused batch: it answers
        // "not taken here", and the message is taken on its own.
        let answer = answer.expect("a refused batch answers each message");
        let taken = match answer {
            Some(taken) => Ok(taken),
            None => {
                alone += 1;
                deliveries::take(&client, &policy, key, *token, policy.max_attempts).await
            }
        };
        if key.delivery_id.as_str() == bad.id() {
            let refusal = taken
                .expect_err("the refused row is refused alone too")
                .refusal()
                .expect("Postgres answered");
            assert_eq!(refusal.code, "23514");
        } else {
            assert!(
                matches!(taken, Ok(Take::Taken { attempts: 1, .. })),
                "{taken:?}"
            );
        }
    }
    assert!(
        alone >= 2,
        "the refused row's batch held a neighbour, taken alone ({alone} alone)"
    );
    assert_eq!(
        env.count("select count(*) from deliveries where attempts = 1")
            .await,
        8
    );
    assert_eq!(
        env.count("select count(*) from deliveries where attempts = 0")
            .await,
        1,
        "the refused row is untouched"
    );
    drop(client);
    env.cleanup().await;
}

/// Postgres refuses a completion for a reason that is not the row's data
/// (here a trigger raising SQLSTATE 55000, "object not in prerequisite
/// state"): the same statement may pass later, so the delivery is a `db`
/// failure retried with backoff, not a dead letter; once the cause is gone
/// the retry completes it, with one effect.
#[tokio::test]
async fn a_completion_refused_for_a_reason_not_the_rows_is_retried_with_backoff_as_db() {
    let (env, ingest) = TestEnv::with_ingest().await;
    env.db
        .batch_execute(
            "create function events_closed() returns trigger language plpgsql as $$
             begin
                 raise exception 'github_events is closed for maintenance' using errcode = '55000';
             end $$;
             create trigger events_closed before insert on github_events
                 for each row execute function events_closed();",
        )
        .await
        .expect("trigger");
    let worker = env.store_worker().await;
    let hook = Hook::fixture("push");
    assert_eq!(ingest.send(&hook).await.status, 202);

    let report = worker.drain().await.expect("drain");
    assert_eq!(
        report.outcomes,
        vec![JobOutcome::Failed {
            class: ErrorClass::Db,
            retryable: true
        }]
    );
    let row = failed(&env, hook.id()).await;
    assert_eq!(
        (row.status.as_str(), row.retryable, row.class.as_str()),
        ("failed", true, "db")
    );
    assert!(row.error.contains("55000"), "{row:?}");
    assert!(row.due_later, "due after a backoff, not at once");
    assert_eq!(row.attempts, 1);
    assert!(row.body_kept, "its body is kept for the retry");
    assert_eq!(env.events().await, 0);

    env.db
        .batch_execute("drop trigger events_closed on github_events")
        .await
        .expect("drop trigger");
    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes, vec![JobOutcome::Completed]);
    assert_eq!(
        env.count("select attempts::bigint from deliveries").await,
        2
    );
    assert_eq!(env.events().await, 1);
    env.cleanup().await;
}

/// A due retry whose row cannot become a job (its stored event no
/// longer parses) is dead-lettered by the scheduler, `permanent`, naming
/// why, with its body kept; it is never published nor rescheduled.
#[tokio::test]
async fn the_scheduler_dead_letters_a_row_that_cannot_become_a_job() {
    let (env, ingest) = TestEnv::with_ingest().await;
    let worker = env.store_worker().await;
    let good = Hook::fixture("push");
    let unreadable = Hook::fixture("push");
    for hook in [&good, &unreadable] {
        assert_eq!(ingest.send(hook).await.status, 202);
    }
    // Both fail and are due again at once (their claims wrote their
    // bodies); one of them then holds an event that is no event name.
    env.db
        .batch_execute(
            "update deliveries set status = 'failed', retryable = true, next_attempt_at = now(),
                 failed_at = now(), last_error_class = 'transient', last_error = 'test';",
        )
        .await
        .expect("fail both");
    env.db
        .execute(
            "update deliveries set event = 'Not An Event!' where delivery_id = $1",
            &[&unreadable.id()],
        )
        .await
        .expect("spoil the event");
    // Empty the queue of their first messages: only the scheduler acts.
    let _ = worker.drain().await.expect("drain");

    let published = worker.schedule_once().await.expect("scheduler");
    assert_eq!(published, 1, "the readable retry is published");
    let row = failed(&env, unreadable.id()).await;
    assert_eq!(
        (row.status.as_str(), row.retryable, row.class.as_str()),
        ("failed", false, "permanent")
    );
    assert!(
        row.error.starts_with("the row cannot be read as a job"),
        "{row:?}"
    );
    assert!(row.dead_lettered, "marked dead-lettered");
    assert!(row.body_kept, "Postgres keeps its body");
    // A second pass leaves it alone.
    assert_eq!(worker.schedule_once().await.expect("scheduler"), 0);
    let (code, listed) = worker_cli(&env, &["dlq", "list", "--json"]);
    assert_eq!(code, 0, "{listed}");
    assert!(listed.contains(unreadable.id()), "{listed}");
    let outcomes = settle(&env, &worker).await;
    assert_eq!(outcomes, vec![JobOutcome::Completed]);
    env.cleanup().await;
}
