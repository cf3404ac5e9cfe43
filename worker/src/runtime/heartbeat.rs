//! Keeping a lease, and waiting out an outage: the heartbeat that renews
//! the holder's lease, the wait for Postgres, and the reconnect delays.

use std::time::Duration;

use backon::BackoffBuilder;
use deadpool_postgres::Pool;
use hookinbox::deliveries::{self, Policy};
use hookinbox::key::{ClaimToken, LegKey};
use hookinbox::postgres::{self, DbError};
use tokio_util::sync::CancellationToken;

use super::{Stop, Worker};

/// Delays for reconnecting and for waiting on Postgres: exponential with
/// jitter, capped at 5 s, never giving up.
pub(super) fn reconnect_backoff() -> impl Iterator<Item = Duration> {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times()
        .build()
}

/// Renews the lease about every third of it until aborted. If a renewal
/// finds the token gone, it cancels `lost`, which cancels the handler.
pub(super) async fn heartbeat(
    pool: Pool,
    policy: Policy,
    key: LegKey,
    token: ClaimToken,
    lost: CancellationToken,
) {
    let period = (policy.lease / 3).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(period).await;
        let renewed = match pool.get().await {
            Ok(client) => deliveries::renew(&client, &policy, &key, token).await,
            Err(e) => Err(DbError::from(e)),
        };
        match renewed {
            Ok(true) => {
                tracing::trace!("lease renewed");
                metrics::counter!(hookinbox::metrics::LEASE_RENEWALS).increment(1);
            }
            Ok(false) => {
                metrics::counter!(hookinbox::metrics::LEASES_LOST).increment(1);
                tracing::warn!("lease lost: the token no longer holds the delivery");
                lost.cancel();
                return;
            }
            // Keep trying: completion is guarded by the token alone, so a
            // lapsed lease that nobody took over still lets us finish.
            Err(e) => tracing::warn!(error = %e, "lease renewal failed"),
        }
    }
}

impl Worker {
    /// Waits until Postgres answers. False when the worker is stopping.
    pub(super) async fn wait_for_db(&self, stop: &Stop) -> bool {
        let mut delays = reconnect_backoff();
        loop {
            if postgres::ping(&self.inner.pool).await {
                return true;
            }
            let delay = delays.next().unwrap_or(Duration::from_secs(5));
            tokio::select! {
                _ = stop.hard.cancelled() => return false,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }
}
