//! The one-statement path: a job whose whole effect is in the completing
//! transaction ([`crate::Handler::database_only`], such as `store`) needs
//! no separate take. It reads its delivery's body (from the copy a new
//! leg's first message carries, else a read batched with other jobs':
//! `deliveries::bodies::fetch_batch`), its handler runs,
//! staging its writes, and the completion takes and completes the delivery
//! in one statement, batched with other jobs' completions
//! (`deliveries::complete_batch` with `take`). A delivery then costs the
//! database one write besides its claim (and a read) instead of two, and
//! the worker no lease renewals.
//!
//! Why it keeps every guarantee of the full path (`job`):
//!
//! - **Fence before effect.** Nothing reaches Postgres before the
//!   completing statement, and that statement writes the effect only for a
//!   row its compare-and-set matched: processing under the message's own
//!   token, with the attempts the job was published with, and attempts
//!   left. A row taken, reclaimed, reaped or resolved since carries another
//!   token or state, and the statement changes nothing.
//! - **Attempts are counted.** The statement counts the attempt as it
//!   completes. A handler that fails, panics or times out here leaves no
//!   trace, and the job goes the full way at once, where the take counts
//!   the attempt before the handler runs again and the failure is
//!   recorded. A worker that *crashes* here leaves its message unacked; the
//!   broker redelivers it marked `redelivered`, and a redelivered message
//!   always goes the full way. So a job that crashes every worker costs at
//!   most one uncounted attempt per publish, and is still stopped by
//!   `max_attempts` and dead-lettered as poison.
//! - **No lease to keep.** Nobody holds the delivery while the handler
//!   stages its writes: the claim's lease (which covers the time in the
//!   queue) stands, and a copy of the message elsewhere may run the same
//!   handler meanwhile. Only one completion can match the row; the other
//!   finds it completed and acks.
//! - **Ack after commit**, as on the full path.
//!
//! What it costs when it does not complete: a handler that fails here runs
//! twice for that message (here, uncounted, then on the full path), so a
//! handler that hangs holds its slot for up to twice `handler_timeout`;
//! and a copy of a delivery already completed costs this statement as well
//! as the take that then acks it.

use hookinbox::deliveries;
use hookinbox::job::{Envelope, Job};

use super::job::{Ran, at, completed_since, job_of};
use super::{JobOutcome, Stop, Worker};
use crate::handlers::{Completion, Effect};

impl Worker {
    /// Runs the job of `envelope` on the one-statement path when it may:
    /// the setting is on, its message says how many attempts the delivery
    /// had, attempts are left, its body is there, and its handler is
    /// database-only. `None`: not done here; the caller runs the full path,
    /// which decides everything else.
    pub(super) async fn fused(&self, envelope: &Envelope, stop: &Stop) -> Option<JobOutcome> {
        let inner = &self.inner;
        let attempts = envelope.attempts?;
        let lane = inner.lanes.of(&envelope.key);
        // A destination with a breaker goes the full way: its take is the
        // breaker's gate; so does an ordered one: its take is the order's.
        if !inner.config.fused_take
            || attempts >= lane.max_attempts()
            || lane.breaker.is_some()
            || lane.ordered
            || lane.limiter.is_some()
        {
            return None;
        }
        // A handler that says from the leg alone that it is not
        // database-only costs no read of a body it would not use here.
        if inner.handler.database_only_leg(&envelope.key) == Some(false) {
            return None;
        }
        at("fused.read");
        let job = match copied(envelope) {
            Some(job) => job,
            None => self.read_body(envelope).await?,
        };
        let job = &job;
        if !inner.handler.database_only(job) {
            return None;
        }
        at("fused.slot");
        let Ok(_slot) = lane.slots.acquire().await else {
            return Some(JobOutcome::Left);
        };
        tracing::Span::current().record("attempt", attempts + 1);
        let mut effect = Effect::taking(
            inner.pool.clone(),
            job.key.clone(),
            job.token,
            attempts,
            lane.max_attempts(),
        )
        .with_completions(inner.completions.clone());
        // No heartbeat, so no lease to lose.
        let never = tokio_util::sync::CancellationToken::new();
        at("fused.handler");
        let ran = self.run_handler(job, &mut effect, &never, stop).await;
        at("fused.complete");
        let completed = match ran {
            Ran::Returned(Ok(())) => tokio::select! {
                completed = effect.complete() => completed,
                // Whichever way the statement ends, the unacked message
                // comes back and its take finds the delivery completed or
                // takes it.
                _ = stop.hard.cancelled() => return Some(JobOutcome::Left),
            },
            Ran::Shutdown => return Some(JobOutcome::Left),
            // A failure, a panic or a timeout: nothing was written. The
            // full path takes the delivery, counting the attempt, runs the
            // handler again and records what it does.
            _ => {
                effect.rollback().await;
                fell_back("handler");
                return None;
            }
        };
        match completed {
            Ok(Completion::Completed { received_at }) => {
                hookinbox::kill_point!("worker.after_commit");
                completed_since(received_at);
                metrics::counter!(hookinbox::metrics::FUSED, "result" => "completed").increment(1);
                Some(JobOutcome::Completed)
            }
            // The row is not this message's untaken claim any more (taken,
            // reclaimed, reaped, resolved), or Postgres refused the row, or
            // no answer came (the commit may have landed): the full take
            // finds out which.
            Ok(Completion::Fenced) => {
                tracing::info!(
                    "one-statement completion fenced: the claim is not this message's any more; taking it the full way"
                );
                fell_back("fenced");
                None
            }
            Ok(Completion::Refused(refusal)) => {
                tracing::warn!(error = %refusal, "Postgres refused the completion");
                fell_back("refused");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "completion got no answer");
                fell_back("no_answer");
                None
            }
        }
    }
}

impl Worker {
    /// The job of `envelope` with its delivery's body, read with other
    /// jobs' (group commit). `None` when it cannot be read here (Postgres
    /// failed, the leg or its body is not there, or the body does not
    /// decode): the full path's take finds out which.
    async fn read_body(&self, envelope: &Envelope) -> Option<Job> {
        let fetched = match self.inner.fetches.submit(envelope.key.clone()).await {
            Ok(fetched) => fetched,
            Err(e) => {
                tracing::debug!(error = %e, "body not read; taking the leg the full way");
                fell_back("read");
                return None;
            }
        };
        let (stored, replays) = match fetched {
            Some((stored, replays)) => (Some(stored), replays),
            None => (None, 0),
        };
        match job_of(envelope, stored, replays) {
            Ok(job) => Some(job),
            Err(failure) => {
                fell_back(
                    if failure.class == hookinbox::deliveries::ErrorClass::Lost {
                        "no_body"
                    } else {
                        "undecodable"
                    },
                );
                None
            }
        }
    }
}

/// The job of `envelope` with the copy of its body its message carries
/// (a new leg's first message: never replayed), if it carries one that
/// unpacks; else the body is read from Postgres.
fn copied(envelope: &Envelope) -> Option<Job> {
    let stored = deliveries::Stored::from_copy(envelope.copy.clone()?)?;
    match stored.decode() {
        Ok(body) => Some(Job::new(envelope.clone(), body, 0)),
        Err(e) => {
            tracing::debug!(error = %e, "the message's copy of the body does not unpack; reading it");
            None
        }
    }
}

/// Counts a job the one-statement path handed to the full path, and why.
fn fell_back(why: &'static str) {
    metrics::counter!(hookinbox::metrics::FUSED, "result" => why).increment(1);
}
