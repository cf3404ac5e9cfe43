//! The vacuum horizon: how long the oldest transaction that keeps vacuum
//! from removing dead rows in this database has been open. Every delivery
//! leaves dead row versions (its claim's insert, its completion's update,
//! and their index entries); behind a transaction that holds its snapshot
//! none of them can be removed, and the claim path slows as they pile up
//! (docs/benchmarks.md, "Storage at volume").

use deadpool_postgres::GenericClient;

use super::DbError;

/// Seconds since the start of the oldest transaction in this database that
/// holds a snapshot or a transaction id (a client session, whoever's, or a
/// prepared transaction); 0 when none.
///
/// Only client backends: an (auto)vacuum worker's own snapshot does not
/// hold back other vacuums. A session of another role shows its
/// transaction only to a role with `pg_read_all_stats` (or a superuser):
/// grant it to hookinbox's role for the gauge to see every session
/// (docs/operations.md). The sampler's own session is left out.
const OLDEST_TRANSACTION: &str = "
select greatest(
    coalesce((select extract(epoch from now() - min(xact_start))::float8
              from pg_stat_activity
              where datname = current_database()
                and backend_type = 'client backend'
                and pid <> pg_backend_pid()
                and (backend_xmin is not null or backend_xid is not null)), 0),
    coalesce((select extract(epoch from now() - min(prepared))::float8
              from pg_prepared_xacts
              where database = current_database()), 0),
    0)";

/// Reads [`OLDEST_TRANSACTION`]'s age, in seconds (0 when none is open).
pub async fn oldest_transaction_secs(client: &impl GenericClient) -> Result<f64, DbError> {
    Ok(client.query_one(OLDEST_TRANSACTION, &[]).await?.get(0))
}
