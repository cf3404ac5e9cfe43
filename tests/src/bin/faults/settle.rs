//! After the load stops: GitHub never retries, so what never got a 2xx is
//! brought back by the reconciler alone, the workers' own passes and then
//! passes run here as an operator's cron would, until nothing is open and
//! every delivery GitHub logged got a 2xx or was completed all the same.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::process::Command;

use crate::load::Ledger;
use crate::stack::Suite;

/// What the reconciler did for the deliveries that failed at GitHub.
pub struct Settled {
    /// What was still open when the deadline passed, if anything: the run
    /// fails, after its report.
    pub unsettled: Option<String>,
    /// Deliveries that got no 2xx when sent.
    pub failed_at_github: usize,
    /// Redeliveries the reconciler asked for while the faults hit.
    pub asked_during_the_run: u32,
    /// ...and in all.
    pub reconciler_asked: u32,
    /// Failed at GitHub, then answered 2xx on a redelivery.
    pub brought_back: usize,
    /// Failed at GitHub, never answered 2xx, but completed here.
    pub late_answers: usize,
    /// Failed at GitHub and neither.
    pub never_brought_back: usize,
}

/// Runs reconcile passes until the ledger settles (at most 5 minutes; past
/// that the run goes on to its report and fails), then marks each delivery of `ledger` answered if any attempt at it got
/// a 2xx.
pub async fn settle(suite: &Suite, ledger: &Mutex<Ledger>) -> anyhow::Result<Settled> {
    let check = hookinbox_tests::connect(&suite.database_url()).await;
    let failed_at_github: HashSet<String> = ledger
        .lock()
        .expect("ledger")
        .sent
        .iter()
        .filter(|(_, s)| !s.ok)
        .map(|(id, _)| id.clone())
        .collect();
    let asked_during_the_run = suite.github.fake.redeliveries_total();
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut unsettled = None;
    loop {
        reconcile_pass(suite).await?;
        let open: i64 = check
            .query_one(
                "select count(*) from deliveries where status = 'processing' or (status = 'failed' and retryable)",
                &[],
            )
            .await?
            .get(0);
        // Left over: GitHub saw no 2xx and hookinbox did not complete it.
        // One GitHub saw fail but hookinbox completed (it answered too late)
        // needs nothing, and the reconciler rightly leaves it alone.
        let completed = completed_ids(&check).await?;
        let unanswered = suite
            .github
            .fake
            .guids()
            .iter()
            .filter(|(id, ok)| !**ok && !completed.contains(*id))
            .count();
        if open == 0 && unanswered == 0 {
            break;
        }
        if Instant::now() > deadline {
            let text = format!(
                "did not settle: {open} open deliveries, {unanswered} never answered 2xx at GitHub"
            );
            eprintln!("faults: {text}");
            describe_open(&check, &suite.root).await?;
            describe_broker(suite).await;
            unsettled = Some(text);
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // A delivery is answered once any attempt at it got a 2xx: the
    // suite's own, or a redelivery the reconciler asked for.
    let answered = suite.github.fake.guids();
    for (id, sent) in ledger.lock().expect("ledger").sent.iter_mut() {
        sent.ok = answered.get(id).copied().unwrap_or(false);
    }
    let completed = completed_ids(&check).await?;
    let brought_back = failed_at_github
        .iter()
        .filter(|id| answered.get(*id).copied().unwrap_or(false))
        .count();
    let late_answers = failed_at_github
        .iter()
        .filter(|id| !answered.get(*id).copied().unwrap_or(false) && completed.contains(*id))
        .count();
    Ok(Settled {
        unsettled,
        failed_at_github: failed_at_github.len(),
        asked_during_the_run,
        reconciler_asked: suite.github.fake.redeliveries_total(),
        brought_back,
        late_answers,
        never_brought_back: failed_at_github.len() - brought_back - late_answers,
    })
}

/// One `hookinbox-worker reconcile` pass, as an operator's cron runs it.
async fn reconcile_pass(suite: &Suite) -> anyhow::Result<()> {
    let pass = Command::new(suite.bins.join("hookinbox-worker"))
        .args(["reconcile", "--json", "--max-wait", "30s"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(suite.database_env(false))
        .env("AMQP_URL", suite.amqp_url(suite.rabbits[0].port))
        .env("HOOKINBOX_CONFIG", &suite.config)
        .env("HOOKINBOX_AUTO_MIGRATE", "false")
        .env("HOOKINBOX_QUEUE_PREFIX", "faults")
        .env("RUST_LOG", "warn")
        .output()
        .await?;
    if !pass.status.success() {
        eprintln!(
            "faults: reconcile pass did not complete: {}",
            String::from_utf8_lossy(&pass.stderr).trim()
        );
    }
    Ok(())
}

/// The delivery ids hookinbox completed.
async fn completed_ids(db: &tokio_postgres::Client) -> anyhow::Result<HashSet<String>> {
    Ok(db
        .query(
            "select delivery_id from deliveries where status = 'completed'",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Prints each leg still open, its state and the times that decide what
/// takes it next, then the lines of ingest's and the workers' logs that
/// name it, so a run that did not settle says why (ids, states, times and
/// log lines only: the logs hold no body, header or secret).
async fn describe_open(db: &tokio_postgres::Client, root: &std::path::Path) -> anyhow::Result<()> {
    let rows = db
        .query(
            "select source, destination, delivery_id, status, retryable, coalesce(last_error_class, ''),
                    attempts, coalesce(fair_key, ''), coalesce(order_key, ''),
                    coalesce(round(extract(epoch from lease_until - now()), 1)::text || ' s', '-'),
                    coalesce(round(extract(epoch from next_attempt_at - now()), 1)::text || ' s', '-'),
                    to_char(now() - claimed_at, 'MI:SS.MS'), to_char(now() - created_at, 'MI:SS.MS'),
                    coalesce(to_char(now() - failed_at, 'MI:SS.MS'), '-'), replays,
                    exists (select 1 from bodies b where b.provider = d.provider
                            and b.source = d.source and b.hook_id = d.hook_id
                            and b.delivery_id = d.delivery_id and b.received_at = d.created_at)
             from deliveries d
             where status = 'processing' or (status = 'failed' and retryable)
             order by created_at limit 20",
            &[],
        )
        .await?;
    let mut ids = Vec::new();
    for r in rows {
        ids.push(r.get::<_, String>(2));
        eprintln!(
            "faults: open leg {}/{} {}: status {} retryable {} class '{}' attempts {} fair_key '{}' \
             order_key '{}' lease in {} due in {} claimed {} ago created {} ago failed {} ago \
             replays {} parked body {}",
            r.get::<_, String>(0),
            r.get::<_, String>(1),
            r.get::<_, String>(2),
            r.get::<_, String>(3),
            r.get::<_, bool>(4),
            r.get::<_, String>(5),
            r.get::<_, i32>(6),
            r.get::<_, String>(7),
            r.get::<_, String>(8),
            r.get::<_, String>(9),
            r.get::<_, String>(10),
            r.get::<_, String>(11),
            r.get::<_, String>(12),
            r.get::<_, String>(13),
            r.get::<_, i32>(14),
            r.get::<_, bool>(15),
        );
    }
    for id in ids.iter().take(3) {
        for entry in std::fs::read_dir(root)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".log") {
                continue;
            }
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            for line in text.lines().filter(|l| l.contains(id.as_str())).take(40) {
                eprintln!("faults: {name}: {line}");
            }
        }
    }
    Ok(())
}

/// Prints each broker node's queues (ready and unacked messages,
/// consumers) and channels (unacked messages): a leg whose message is
/// unacked in a channel is held by a worker's job, or by a consumer whose
/// deliveries are never read; one whose message is ready waits for a
/// consumer; one with neither has no message.
async fn describe_broker(suite: &Suite) {
    for rabbit in &suite.rabbits {
        for args in [
            &[
                "list_queues",
                "name",
                "messages_ready",
                "messages_unacknowledged",
                "consumers",
            ][..],
            &[
                "list_channels",
                "connection",
                "number",
                "messages_unacknowledged",
                "prefetch_count",
            ][..],
        ] {
            let out = Command::new("rabbitmqctl")
                .args(["-q", "-n", &rabbit.node])
                .args(args)
                .output()
                .await;
            match out {
                Ok(out) => {
                    for line in String::from_utf8_lossy(&out.stdout).lines() {
                        eprintln!("faults: {} {}: {line}", rabbit.node, args[0]);
                    }
                }
                Err(e) => eprintln!("faults: rabbitmqctl {} on {}: {e}", args[0], rabbit.node),
            }
        }
    }
}
