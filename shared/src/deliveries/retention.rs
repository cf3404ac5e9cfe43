//! Retention: completed and failed rows past their retention are deleted
//! in small batches, and operators purge old dead letters. Processing rows
//! are never swept: the reaper deals with them.

use std::time::Duration;

use deadpool_postgres::GenericClient;

use super::{execute, secs};
use crate::key::DeliveryKey;
use crate::postgres::DbError;

/// Deletes up to `$2` rows of `status` whose `at` column is older than `$1`
/// seconds.
macro_rules! sweep {
    ($status:literal, $at:literal) => {
        concat!(
            "
delete from deliveries
where ctid in (
    select ctid from deliveries
    where status = '",
            $status,
            "' and ",
            $at,
            " < now() - make_interval(secs => $1)
    limit $2
)"
        )
    };
}

const SWEEP_COMPLETED: &str = sweep!("completed", "completed_at");
const SWEEP_FAILED: &str = sweep!("failed", "failed_at");

/// What one sweep deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Completed rows older than their retention.
    pub completed: u64,
    /// Failed rows older than theirs.
    pub failed: u64,
}

/// Retention: deletes completed and failed rows older than their
/// retention, with their parked bodies (cascade), in batches of `batch` so
/// that no statement holds many locks or a long transaction. Processing
/// rows are never swept: the reaper deals with them.
pub async fn sweep(
    client: &impl GenericClient,
    completed: Duration,
    failed: Duration,
    batch: i64,
) -> Result<Swept, DbError> {
    let mut swept = Swept::default();
    for (sql, retention, count) in [
        (SWEEP_COMPLETED, completed, &mut swept.completed),
        (SWEEP_FAILED, failed, &mut swept.failed),
    ] {
        let stmt = client.prepare_cached(sql).await?;
        loop {
            let n = client.execute(&stmt, &[&secs(retention), &batch]).await?;
            *count += n;
            if n < batch as u64 {
                break;
            }
        }
    }
    Ok(swept)
}

const PURGE: &str = "
delete from deliveries
where status = 'failed' and not retryable
  and failed_at < now() - make_interval(secs => $1)
  and ($2::text[] is null or delivery_id = any($2))";

/// Deletes dead letters that failed more than `older_than` ago (and their
/// parked bodies), optionally only these delivery ids.
pub async fn purge_dead(
    client: &impl GenericClient,
    older_than: Duration,
    ids: Option<&[String]>,
) -> Result<u64, DbError> {
    let stmt = client.prepare_cached(PURGE).await?;
    Ok(client.execute(&stmt, &[&secs(older_than), &ids]).await?)
}

const PURGE_ONE: &str = concat!(
    "
delete from deliveries
where ",
    key!(),
    // `status || ''`: the key is the only way in (see the module notes).
    " and status || '' = 'failed' and not retryable"
);

/// Deletes one dead letter (and its parked body), by key; the console's
/// bulk purge runs it item by item. Returns false when the delivery is no
/// longer a dead letter (replayed meanwhile) or is gone.
pub async fn purge(client: &impl GenericClient, key: &DeliveryKey) -> Result<bool, DbError> {
    Ok(execute(client, PURGE_ONE, key, &[]).await? == 1)
}
