//! The reaper and the retention sweep. Both delete or move rows in small
//! batches; the sweep runs on one worker at a time, under its leader lock.

use deadpool_postgres::Pool;
use hookinbox::config::WorkerConfig;
use hookinbox::deliveries::{self, Swept};
use hookinbox::postgres::{DbError, advisory};

use crate::context::{Context, RuntimeError};

/// Rows per retention or reaper statement.
const SWEEP_BATCH: i64 = 500;

/// One pass of the reaper (see [`deliveries::reap`]). Returns how many
/// claims it turned into `lost`.
pub(crate) async fn reap_once(ctx: &Context) -> Result<u64, RuntimeError> {
    let client = ctx.pool.get().await.map_err(DbError::from)?;
    let mut total = 0;
    loop {
        let n = deliveries::reap(&client, ctx.config.reap_after, SWEEP_BATCH).await?;
        total += n;
        metrics::counter!(hookinbox::metrics::REAPED).increment(n);
        if n < SWEEP_BATCH as u64 {
            return Ok(total);
        }
    }
}

/// One retention sweep under the leader lock: a session advisory lock,
/// taken without waiting, so that one worker at a time sweeps and a dead
/// leader's lock dies with its connection. `None` when another holds it.
pub(crate) async fn sweep(
    pool: &Pool,
    config: &WorkerConfig,
) -> Result<Option<Swept>, RuntimeError> {
    let client = pool.get().await.map_err(DbError::from)?;
    if !advisory::try_lock(&client, advisory::SWEEP).await? {
        return Ok(None);
    }
    let swept = deliveries::sweep(&client, &config.retention, SWEEP_BATCH).await;
    let _ = advisory::unlock(&client, advisory::SWEEP).await;
    Ok(Some(swept?))
}
