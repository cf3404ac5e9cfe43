//! Dead letters: a delivery failed for good gets a copy in the broker's
//! dead-letter queue (its key, and why it failed), for tools and alerts.
//! Postgres stays the record, body included.

use std::time::Duration;

use hookinbox::deliveries::{self, ErrorClass, State};
use hookinbox::job::Envelope;
use hookinbox::postgres::DbError;

use super::heartbeat::reconnect_backoff;
use super::{JobOutcome, Stop, Worker};

impl Worker {
    /// For a delivery failed for good: makes sure its dead-letter copy is in
    /// the broker, then reports it. The steps are ordered so that a crash
    /// between any two loses nothing: the failure is committed first (the
    /// record), the copy is published with a confirm, then the row notes the
    /// copy; a crash before that note republishes the copy (harmless).
    pub(super) async fn ensure_dead_letter_copy(&self, job: &Envelope, stop: &Stop) -> JobOutcome {
        let inner = &self.inner;
        let mut delays = reconnect_backoff();
        loop {
            let row = match inner.pool.get().await {
                Ok(client) => deliveries::get(&client, &job.key).await,
                Err(e) => Err(DbError::from(e)),
            };
            let row = match row {
                Ok(Some(row)) => row,
                Ok(None) => return JobOutcome::Duplicate,
                Err(_) => {
                    if !self.wait_for_db(stop).await {
                        return JobOutcome::Left;
                    }
                    continue;
                }
            };
            let dead = row.dead_letter();
            let class = dead.class;
            if State::of(&row) != State::Dead || row.dead_lettered {
                return if class == ErrorClass::Poison {
                    JobOutcome::Poisoned
                } else {
                    JobOutcome::Duplicate
                };
            }
            match inner.publisher.publish_dead_letter(job, &dead).await {
                Ok(()) => {
                    if let Ok(client) = inner.pool.get().await {
                        let _ = deliveries::mark_dead_lettered(&client, &job.key).await;
                    }
                    return if class == ErrorClass::Poison {
                        JobOutcome::Poisoned
                    } else {
                        JobOutcome::Failed {
                            class,
                            retryable: false,
                        }
                    };
                }
                Err(e) => {
                    let delay = delays.next().unwrap_or(Duration::from_secs(5));
                    tracing::warn!(error = %e, retry_in = ?delay, "dead-letter copy not confirmed; retrying");
                    tokio::select! {
                        _ = stop.hard.cancelled() => return JobOutcome::Left,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }
}
