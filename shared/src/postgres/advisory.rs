//! Session advisory locks: who migrates, who sweeps, who samples the
//! gauges. They are taken on connections that keep their sessions (never
//! through a transaction pooler: see
//! [`crate::config::CommonConfig::leaders`]), so their statements are plain
//! ones. A session lock dies with its connection, so a crashed holder
//! never blocks the others. Every lock hookinbox takes is named here, so
//! two never share a number.

use deadpool_postgres::GenericClient;

use super::DbError;

/// Migrations: one replica applies them while the others wait.
pub const MIGRATION: i64 = 0x686f_6f6b_696e_6278; // "hookinbx"
/// The retention sweeper's leader.
pub const SWEEP: i64 = 0x686f_6f6b_7377_6570; // "hooksweep"
/// The state-gauge sampler's leader.
pub const SAMPLER: i64 = 0x686f_6f6b_7361_6d70; // "hooksamp"

/// The reconciler's leaders, one per source: the first half of a two-part
/// lock whose second half is the source name's hash.
pub const RECONCILE: i32 = 0x686f_6f6b; // "hook"

/// Takes the two-part lock (`class`, hash of `name`) on this session if
/// nobody holds it; never waits.
pub async fn try_lock_named(
    client: &impl GenericClient,
    class: i32,
    name: &str,
) -> Result<bool, DbError> {
    Ok(client
        .query_one(
            "select pg_try_advisory_lock($1::int4, hashtext($2))",
            &[&class, &name],
        )
        .await?
        .get(0))
}

/// Releases the two-part lock (`class`, hash of `name`).
pub async fn unlock_named(
    client: &impl GenericClient,
    class: i32,
    name: &str,
) -> Result<(), DbError> {
    client
        .execute(
            "select pg_advisory_unlock($1::int4, hashtext($2))",
            &[&class, &name],
        )
        .await?;
    Ok(())
}

/// Waits for the lock `key` on this session.
pub async fn lock(client: &impl GenericClient, key: i64) -> Result<(), DbError> {
    client
        .execute("select pg_advisory_lock($1)", &[&key])
        .await?;
    Ok(())
}

/// Takes the lock `key` on this session if nobody holds it; never waits.
pub async fn try_lock(client: &impl GenericClient, key: i64) -> Result<bool, DbError> {
    Ok(client
        .query_one("select pg_try_advisory_lock($1)", &[&key])
        .await?
        .get(0))
}

/// Releases the lock `key` held by this session.
pub async fn unlock(client: &impl GenericClient, key: i64) -> Result<(), DbError> {
    client
        .execute("select pg_advisory_unlock($1)", &[&key])
        .await?;
    Ok(())
}
